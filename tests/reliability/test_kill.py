"""SIGKILL at random instants during every crash-safe write (``killing``); nothing may be lost.

Quick run: the bundle publish/swap (a synthetic 40-file export through the exporters'
``atomic_bundle_dir``), the n-gram cache save and the adaptation checkpoint, a few kills each. The
real ``omnidraft-export`` and the drafter weight swap (``exporters.publish``) take ~20 s a run and
are ``slow``, and so is the checkpoint (its child imports torch: seconds a run). ``OMNIDRAFT_RELIABILITY=long`` raises every count (reports/fuzz.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import kill_seed_and_count, record, stop_requested
from killing import KillStats, kill_loop

from omnidraft_deploy.bundle.folder import verify_bundle
from omnidraft_deploy.bundle.manifest import BundleError
from omnidraft_deploy.distill.checkpoint import CheckpointError, load_checkpoint
from omnidraft_deploy.ngram.format import NGramFormatError, load


def _bundle_ok(path: Path) -> bool:
    try:
        verify_bundle(path)
        return True
    except BundleError:
        return False


def _cache_ok(path: Path) -> bool:
    try:
        return len(load(path)[0]) >= 15_000
    except NGramFormatError:
        return False


def _checkpoint_ok(path: Path) -> bool:
    like = {f"w{i}": torch.zeros(256, 256) for i in range(24)}
    try:
        state = load_checkpoint(path, like=like)
    except CheckpointError:
        return False
    version = int(state["w0"].min())  # every tensor of one save holds the same version
    return all(int(t.min()) == version for t in state.values())


def _never(path: Path) -> bool:
    return False


def _report(name: str, seed: int, n: int, s: KillStats) -> None:
    record(name, part=f"seed {seed}", kills=s.kills, killed_mid_write=s.killed_mid_write,
           finished_before_kill=s.finished_first, bundles_missing=s.missing, partial_validated=s.partial_validated,
           junk_after_next_run=s.junk_after_next_run, crashes=s.crashes)  # fmt: skip
    assert (s.missing, s.partial_validated, s.junk_after_next_run) == (0, 0, 0), s.notes
    assert s.kills == n or s.stopped_early, f"only {s.kills} of {n} kills landed on a writer"


@pytest.mark.parametrize(
    ("kind", "check", "quick", "long"),
    [
        ("synthetic_export", _bundle_ok, 8, 200),
        ("cache_save", _cache_ok, 3, 100),
        pytest.param("checkpoint", _checkpoint_ok, 4, 100, marks=pytest.mark.slow),
    ],
)
def test_kills_during_publish_and_saves_lose_nothing(
    tmp_path: Path, kind: str, check, quick: int, long: int
) -> None:
    name = {"synthetic_export": "bundle.json", "cache_save": "cache.bin"}.get(kind, "ckpt.st")
    target = tmp_path / ("bundle" if kind == "synthetic_export" else name)
    partial = _bundle_ok if kind == "synthetic_export" else _never
    seed, n = kill_seed_and_count(quick, long)
    s = kill_loop(
        kind, target, n, check=check, partial_validates=partial, seed=seed, stop=stop_requested
    )
    _report(f"kill: {kind}", seed, n, s)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["export", "weight_swap"])
def test_kills_during_real_export_and_weight_swap_lose_nothing(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("onnxruntime")
    target = tmp_path / "bundle"
    if kind == "weight_swap":
        from killing import run_child

        run_child("export", target, 0, kill_after=None)  # the bundle to publish into
    seed, n = kill_seed_and_count(2, 12)
    s = kill_loop(
        kind,
        target,
        n,
        check=_bundle_ok,
        partial_validates=_bundle_ok,
        seed=seed,
        stop=stop_requested,
    )
    _report(f"kill: {kind} (tiny onnx)", seed, n, s)
