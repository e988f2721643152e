"""SIGKILL harness: run a writer in a child process, kill it at a random instant, check the disk.

Each writer is a small program (``CHILDREN``) run with ``python -c``; it takes a target path and
a version number and writes that version with the project's own crash-safe code:
``synthetic_export`` stages ~40 files and a manifest through ``folder.atomic_bundle_dir`` (the
exporters' publish/swap); ``cache_save`` saves an n-gram cache (``ngram.format.save``);
``checkpoint`` saves adapted weights (``distill.checkpoint``); ``export`` and ``weight_swap`` are
the real ``omnidraft-export`` (tiny preset, onnx) and ``exporters.publish.publish_drafter``.
After every kill the parent checks: the last good version is whole at the target path (read with
the project's reader: ``verify_bundle`` / ``load`` / ``load_checkpoint``), and no leftover
staging folder validates as a bundle; after the next completed run, no file or folder of ours
is left beside the target.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SYNTHETIC_EXPORT = """
import sys, random
from pathlib import Path
from omnidraft_deploy.bundle.manifest import Manifest
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.bundle.folder import atomic_bundle_dir
from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.atomic import write_bytes_atomic, write_text_atomic
out, version = Path(sys.argv[1]), int(sys.argv[2])
rng = random.Random(version)
with atomic_bundle_dir(out) as tmp:
    files = {}
    for i in range(40):
        rel = ("drafter.onnx", "target.onnx")[i] if i < 2 else f"part{i}.bin"
        write_bytes_atomic(tmp / rel, rng.randbytes(rng.randint(1, 200_000)))
        files[rel] = ("drafter_graph", "target_graph")[i] if i < 2 else "extra"
    graphs = {r: GraphInfo(f"{r}.onnx", p, "llama", t, 1000, 64, None, 2, 2, 16, "fp32")
              for r, p, t in (("drafter", "tiny-llama-68m", "llama2"),
                              ("target", "tiny-llama3-8b", "llama3"))}
    m = Manifest(backend="onnx", draft_len=4, mapping_hash=f"{version:064x}", graphs=graphs,
                 files={r: file_entry(tmp, r, role) for r, role in files.items()})
    write_text_atomic(tmp / "manifest.json", m.to_json())
"""

_CACHE_SAVE = """
import sys, random
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import save
path, version = sys.argv[1], int(sys.argv[2])
rng = random.Random(version)
cache = NGramCache(max_entries=200_000)
for _ in range(20_000 + version % 7):
    cache.update([rng.randrange(32000) for _ in range(rng.randint(2, 4))], rng.randrange(128256))
save(cache, path, draft_vocab_size=32000, target_vocab_size=128256)
"""

_CHECKPOINT = """
import sys, torch
from omnidraft_deploy.distill.checkpoint import save_checkpoint
path, version = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(version)
save_checkpoint(path, {f"w{i}": torch.full((256, 256), float(version)) + torch.rand(256, 256, generator=g)
                       for i in range(24)})
"""

_EXPORT = """
import sys
from omnidraft_deploy.exporters.bundle import ExportConfig
from omnidraft_deploy.exporters.export import export_pair
export_pair(ExportConfig(target="tiny-llama3-8b", drafter="tiny-llama-68m", backend="onnx",
                         out_dir=sys.argv[1], max_seq_len=32, draft_len=3, seed=int(sys.argv[2])))
"""

_WEIGHT_SWAP = """
import sys, torch
from omnidraft_deploy.exporters.publish import publish_drafter
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.resolve.load import load_model
drafter = load_model(get_preset("tiny-llama-68m"), seed=int(sys.argv[2]), max_seq_len=32)
publish_drafter(sys.argv[1], drafter)
"""

CHILDREN = {
    "synthetic_export": _SYNTHETIC_EXPORT,
    "cache_save": _CACHE_SAVE,
    "checkpoint": _CHECKPOINT,
    "export": _EXPORT,
    "weight_swap": _WEIGHT_SWAP,
}


@dataclass(frozen=True)
class ChildRun:
    seconds: float  # wall
    killed: bool  # SIGKILL landed on the running writer (False: it finished first)
    mid_write: bool  # a temp file or staging folder of ours existed at the kill
    write_start: float | None  # seconds until one first appeared (polled every 20 ms)


def run_child(kind: str, target: Path, version: int, *, kill_after: float | None) -> ChildRun:
    """Run one writer; SIGKILL it ``kill_after`` seconds in (None: let it finish)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILDREN[kind], str(target), str(version)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = t0 + (900.0 if kill_after is None else kill_after)
    write_start: float | None = None
    while proc.poll() is None and time.perf_counter() < deadline:
        if write_start is None and ours_beside(target):
            write_start = time.perf_counter() - t0
        time.sleep(min(0.02, max(0.0, deadline - time.perf_counter())))
    mid_write = False
    if proc.poll() is None:
        if kill_after is None:
            proc.kill()
            raise RuntimeError(f"{kind} ran over 900 s")
        mid_write = bool(ours_beside(target))  # a kill now lands inside the write
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    killed = proc.returncode == -signal.SIGKILL
    if not killed and proc.returncode != 0:
        raise RuntimeError(f"{kind} failed: {err.decode()[-2000:]}")
    return ChildRun(time.perf_counter() - t0, killed, mid_write and killed, write_start)


def ours_beside(target: Path) -> list[str]:
    """Names beside ``target`` that a writer of ``target`` made (temp files, staging, .old)."""
    prefix = f".{target.name}."
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(prefix))


@dataclass
class KillStats:
    kills: int = 0
    killed_mid_write: int = 0  # a temp file / staging folder of ours existed at the kill
    finished_first: int = 0  # writers that finished before their kill instant (not kills)
    stopped_early: bool = False  # ``stop()`` ended the loop (a long run out of time)
    missing: int = 0  # the target held no whole version right after a kill
    partial_validated: int = 0
    junk_after_next_run: int = 0
    crashes: int = 0
    notes: list[str] = field(default_factory=list)


def kill_loop(
    kind: str,
    target: Path,
    n_kills: int,
    *,
    check: Callable[[Path], bool],
    partial_validates: Callable[[Path], bool],
    seed: int = 0,
    stop: Callable[[], bool] = lambda: False,
) -> KillStats:
    """Write version 0 whole, then until ``n_kills`` SIGKILLs have landed on a running writer:
    start the next version, kill it at a random instant, check the target; finally one whole run
    and the junk check.

    Three kills in four aim at a uniform instant of the write itself (from the first temp file
    or staging folder to the end, as timed by the latest run that finished; the real export
    spends most of its time importing and tracing before it writes), the rest anywhere in the
    run. A writer that finishes before its instant (the machine got faster) is not counted as a
    kill; its timing becomes the new estimate. ``stop()`` true ends the kills early."""
    rng = random.Random(seed)
    stats = KillStats()
    version = seed * 100_000
    first = run_child(kind, target, version, kill_after=None)  # the last good version
    full, start = first.seconds, min(first.write_start or 0.0, first.seconds)
    for _ in range(4 * n_kills + 10):
        if stats.kills == n_kills or stop():
            stats.stopped_early = stats.kills < n_kills
            break
        lo = start * 0.95 if rng.random() < 0.75 else 0.05
        delay = rng.uniform(lo, full * 1.05)
        version += 1
        run = run_child(kind, target, version, kill_after=delay)
        if not run.killed:
            stats.finished_first += 1
            full, start = run.seconds, min(run.write_start or 0.0, run.seconds)
        stats.kills += run.killed
        stats.killed_mid_write += run.mid_write
        if not check(target):
            stats.missing += 1
            stats.notes.append(f"version {version} at {delay:.2f}s: {ours_beside(target)}")
        for name in ours_beside(target):
            if partial_validates(target.parent / name):
                stats.partial_validated += 1
    run_child(kind, target, version + 1, kill_after=None)  # the next run
    if not check(target):
        stats.missing += 1
    left = ours_beside(target)
    stats.junk_after_next_run = len(left)
    if left:
        stats.notes.append(f"left after the next run: {left}")
    return stats
