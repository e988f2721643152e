"""``omnidraft distill`` on tiny bundles, as a user types it (issue 48).

The target answers a prompt file through the bundle; the replies file grows one fsynced line per
reply; the drafter is trained and published only when its held-out agreement rises; a rerun
resumes (no request asked twice, training starts from the published drafter). SIGKILL while
teaching and while publishing loses no finished reply, leaves a bundle that opens and validates,
and the next run resumes. On a multi-target bundle only the chosen target's state folder changes:
the bundle and every other target's drafter stay bit for bit as they were.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = [
    f"def f{i}(x):\n" if i % 2 else f"Add {i} and {i}." for i in range(40)
]  # short: 48 slots
# hard labels: a random target's top-k is nearly flat, so L_DM alone barely moves the argmax
TRAIN = ["--max-new-tokens", "6", "--threads", "1", "--epochs", "20", "--lr", "1e-2", "--seqkd", "1"]
MULTI_TARGETS = ("tiny-llama3-8b", "tiny-qwen2-7b", "tiny-vicuna-7b")  # conftest's multi_bundle
ASKED = re.compile(r"distill: (\d+) replies in .*, (\d+) to ask")
AGREEMENT = re.compile(r"before ([0-9.]+) -> after ([0-9.]+)")


def _prompts(tmp: Path, n: int) -> Path:
    """``n`` requests: each text twice, under two task names (two keys, one greedy reply), so a
    held-out reply has a twin to learn from: a tiny random target's replies are noise otherwise."""
    path = tmp / "prompts.jsonl"
    rows = [{"text": REQUESTS[i // 2], "task": f"t{i % 2}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _copy(bundle: Path, tmp: Path) -> Path:
    out = tmp / "bundle"
    shutil.copytree(bundle, out)
    return out


def _distill(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from omnidraft_deploy.cli.main import main

    status = main(["distill", *argv])
    got = capsys.readouterr()
    return status, got.out + got.err


def _replies(state: Path) -> list[str]:
    from omnidraft_deploy.distill.replies import REPLIES

    path = state / REPLIES
    return path.read_text().splitlines() if path.exists() else []


def _opens_and_validates(bundle: Path, state: Path) -> None:
    from omnidraft_deploy.cli.main import main

    assert main(["validate", str(bundle), "--max-new-tokens", "6", "--state", str(state)]) == 0


def test_distill_teaches_publishes_when_better_and_resumes(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnidraft_deploy.bundle.drafter_weights import DISTILLED_DRAFTER
    from omnidraft_deploy.bundle.folder import verify_bundle

    bundle, state = _copy(cli_bundle, tmp_path), tmp_path / "state"
    before = verify_bundle(bundle)
    args = [str(bundle), "--state", str(state), "--prompts", str(_prompts(tmp_path, 10)),
            "--replies", "10", *TRAIN]  # fmt: skip
    status, out = _distill(capsys, *args)
    assert status == 0 and ASKED.search(out).groups() == ("0", "10"), out  # type: ignore[union-attr]
    first = [float(x) for x in AGREEMENT.search(out).groups()]  # type: ignore[union-attr]
    assert len(_replies(state)) == 10 and first[1] > first[0] and "published:" in out, out
    after = verify_bundle(bundle)
    d_file = before.graphs["drafter"].file
    assert after.files[d_file].sha256 != before.files[d_file].sha256
    assert after.files[before.graphs["target"].file] == before.files[before.graphs["target"].file]
    assert (state / DISTILLED_DRAFTER).is_file()
    _opens_and_validates(bundle, state)
    # a rerun asks nothing again and starts from the published drafter: before == last after
    status, out = _distill(capsys, *args, "--lr", "1e-9", "--epochs", "0.05")
    assert status == 0 and ASKED.search(out).groups() == ("10", "0"), out  # type: ignore[union-attr]
    again = [float(x) for x in AGREEMENT.search(out).groups()]  # type: ignore[union-attr]
    assert again[0] == pytest.approx(first[1]) and again[1] <= again[0] + 1e-9
    assert "not published (held-out agreement did not rise)" in out
    assert verify_bundle(bundle).files == after.files  # not better: the bundle is unchanged


def _child(argv: list[str], tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    code = "import sys; from omnidraft_deploy.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, "distill", *argv], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_sigkill_while_teaching_loses_no_reply_and_the_rerun_resumes(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnidraft_deploy.bundle.folder import verify_bundle
    from omnidraft_deploy.distill.replies import REPLIES, load_replies

    bundle, state = _copy(cli_bundle, tmp_path), tmp_path / "state"
    args = [str(bundle), "--state", str(state), "--prompts", str(_prompts(tmp_path, 40)),
            "--replies", "40", "--teach-only", *TRAIN]  # fmt: skip
    proc, t0 = _child(args, tmp_path), time.monotonic()
    while len(_replies(state)) < 3 and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    _kill(proc)
    with open(
        state / REPLIES, "a"
    ) as f:  # and a reply torn mid-line, as a kill mid-write leaves it
        f.write('{"key": "0123456789abcdef", "task": "user", "te')
    kept = load_replies(state / REPLIES)
    assert 3 <= len(kept) < 40 and len({r.key for r in kept}) == len(kept)
    verify_bundle(bundle)
    status, out = _distill(capsys, *args)
    assert status == 0, out
    assert ASKED.search(out).groups() == (str(len(kept)), str(40 - len(kept))), out  # type: ignore[union-attr]
    final = load_replies(state / REPLIES)
    assert final[: len(kept)] == kept and len({r.key for r in final}) == 40 == len(final)


def test_sigkill_while_publishing_leaves_a_bundle_that_validates(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, state = _copy(cli_bundle, tmp_path), tmp_path / "state"
    args = [str(bundle), "--state", str(state), "--prompts", str(_prompts(tmp_path, 10)),
            "--replies", "10", *TRAIN]  # fmt: skip
    proc, lines = _child(args, tmp_path), []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "distill: publishing" in line:
            time.sleep(0.5)  # into the drafter's re-export
            break
    _kill(proc)
    assert any("distill: publishing" in line for line in lines), "".join(lines)
    assert len(_replies(state)) == 10
    _opens_and_validates(bundle, state)
    status, out = _distill(capsys, *args, "--teach-only")
    assert status == 0 and ASKED.search(out).groups() == ("10", "0"), out  # type: ignore[union-attr]


def test_distilling_one_target_leaves_the_bundle_and_the_others_bitwise(
    multi_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle

    from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER

    bundle, state = _copy(multi_bundle, tmp_path), tmp_path / "state"
    files = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    probe = torch.tensor([1, 5, 9, 14, 30, 2, 7])
    shipped = {n: open_bundle(bundle, target=n).drafter.forward(probe, 0) for n in MULTI_TARGETS}
    picked = MULTI_TARGETS[1]
    status, out = _distill(capsys, str(bundle), "--target", picked, "--state", str(state),
                           "--prompts", str(_prompts(tmp_path, 10)), "--replies", "10", *TRAIN)  # fmt: skip
    before, after = (float(x) for x in AGREEMENT.search(out).groups())  # type: ignore[union-attr]
    assert status == 0 and after > before and "published:" in out, out
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == files
    held = sorted(p.relative_to(state).as_posix() for p in state.rglob(ADAPTED_DRAFTER))
    assert held == [f"targets/{picked}/{ADAPTED_DRAFTER}"]
    for name in MULTI_TARGETS:
        got = open_bundle(bundle, target=name, state=state / "targets" / name).drafter.forward(
            probe, 0
        )
        assert torch.equal(got, shipped[name]) == (name != picked), name
