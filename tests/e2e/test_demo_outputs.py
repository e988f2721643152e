"""``make demo`` and ``make demo-toy`` leave a checkout as they found it (issue 28: the first
``make demo`` rewrote two tracked reports). Their recipes run, with the tiny random-weight twins
in place of the real and trained pairs, in a fresh git repository of this checkout's tracked files;
``git status --porcelain`` must then list nothing (no tracked file changed, no file written
outside the ignored folders)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# the tiny twins, few tokens, no parity run (graph parity has its own tests): the same files
TINY = {"DEMO_TARGET": "tiny-qwen2.5-14b", "DEMO_DRAFTER": "tiny-llama-68m", "DEMO_TOKENS": "4",
        "TOY_TARGET": "tiny-llama3-8b", "TOY_DRAFTER": "tiny-llama-68m", "TOY_TOKENS": "4",
        "VALIDATE_TOKENS": "2", "EXPORT_FLAGS": "--no-verify"}  # fmt: skip


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout


def _tracked_copy(dest: Path) -> Path:
    """A new repository holding this checkout's tracked files as they are now, committed."""
    for rel in _git(ROOT, "ls-files", "-z").split("\0"):
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tracked files")
    return dest


def _make(repo: Path, target: str, home: Path) -> None:
    """``make TARGET`` with the tiny twins and this interpreter's console scripts; the venv and
    asset steps are taken as done (``-o``: the test suite already has both)."""
    env = os.environ | {"OMNIDRAFT_STATE": str(home / "state"), "COLUMNS": "200"}
    args = [f"{k}={v}" for k, v in TINY.items()] + [f"BIN={BIN}"]
    done = subprocess.run(["make", "-o", "assets", "-o", "models", "-o", "venv", target, *args], cwd=repo,
                          capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, (
        f"make {target} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


@pytest.mark.parametrize("target", ["demo", "demo-toy"])
def test_make_demo_leaves_the_checkout_clean(target: str, tmp_path: Path) -> None:
    for tool in ("git", "make"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    for script in ("omnidraft", "omnidraft-export"):
        if not (BIN / script).is_file():
            pytest.skip(f"{BIN / script} missing: pip install -e . puts the console scripts there")
    pytest.importorskip("onnxruntime")
    repo = _tracked_copy(tmp_path / "repo")
    _make(repo, target, tmp_path)
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert any((repo / "bundles").iterdir())  # it did write: into the ignored folder
