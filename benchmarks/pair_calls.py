"""What one call of a bundle's graphs costs when a drafter and a target take turns on the cores.

Issue 26's decode loop alternates k drafter calls (one token each) with one target call of
width T. ONNX Runtime's thread pools decide how much the two sessions cost each other:
``calls`` times that alternation for every wait mode of ``host.onnx_host.Spin`` (and ORT's
defaults), each mode in its own process, the modes interleaved round-robin; ``ops`` splits a
target call of width 1 and of width T into ONNX Runtime's per-operator time (its profiler), which
shows where the verification width is paid.

    python -m benchmarks.pair_calls calls --bundle bundles/q15-w8a8 --rounds 2
    python -m benchmarks.pair_calls ops --bundle bundles/q15-w8a8 --width 5 [--name pair_calls_ops_x]

Reports: ``reports/pair_calls/pair_calls.{json,md}`` and ``pair_calls_ops.{json,md}``, with the
command, git revision, CPU and load average. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.bundle.folder import read_manifest
from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph
from omnidraft_deploy.host.onnx_host import Spin, cpu_session

MODES = ("in-call", "off", "on", "default")
OUT = Path("reports/pair_calls")


def _graph(root: Path, role: str, threads: int, mode: str, profile: bool = False) -> Any:
    info = read_manifest(root).graphs[role]
    spin = None if mode == "default" else Spin(mode)
    session = cpu_session(root / info.file, threads=threads, spinning=spin, profile=profile)
    return ExplicitCacheGraph(session, info)


def _call(graph: Any, pos: int, t: int) -> float:
    ids = np.full((1, t), 500, np.int64)
    t0 = time.perf_counter()
    graph.run(ids, np.arange(pos, pos + t, dtype=np.int64))
    return 1e3 * (time.perf_counter() - t0)


def one_mode(root: Path, mode: str, *, threads: int, k: int, width: int, steps: int) -> dict:
    """Medians (ms) over ``steps`` rounds of: k drafter calls, then a target call of width 1 and
    (after k more drafter calls) of ``width``; and a target call with no drafter call before."""
    target, drafter = (_graph(root, r, threads, mode) for r in ("target", "drafter"))
    for g in (target, drafter):
        _call(g, 0, 32)
    rows: dict[str, list[float]] = collections.defaultdict(list)
    pos = 32
    for _ in range(steps):
        for t in (1, width):
            rows["drafter"] += [_call(drafter, pos + i, 1) for i in range(k)]
            rows[f"target_T{t}_after_drafter"].append(_call(target, pos, t))
        rows["target_T1_alone"] += [_call(target, pos + i, 1) for i in range(2)]
        pos += 2
    return {name: round(statistics.median(v), 2) for name, v in rows.items()}


def _meta(a: argparse.Namespace, load_avg_start: tuple[float, ...]) -> dict[str, Any]:
    return {**run_meta(threads=a.threads, load_avg_start=load_avg_start), "bundle": str(a.bundle)}


def cmd_calls(a: argparse.Namespace) -> None:
    load0 = os.getloadavg()
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:  # rotated each round
            argv = [sys.executable, __file__, "one", "--bundle", str(a.bundle), "--mode", mode,
                    "--threads", str(a.threads), "--k", str(a.k), "--width", str(a.width)]  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            results[mode].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {r + 1}/{a.rounds} {mode}: {results[mode][-1]}", file=sys.stderr)
    med = {m: {k: round(statistics.median(x[k] for x in rs), 2) for k in rs[0]}
           for m, rs in results.items()}  # fmt: skip
    meta = {**_meta(a, load0), "k": a.k, "width": a.width}
    lines = ["# Drafter and target calls taking turns, per ORT wait mode\n", *meta_lines(meta),
             f"Medians over {a.rounds} processes per mode (each: medians of its calls), modes "
             "rotated round-robin.\n",
             "| mode | drafter call (ms) | target T=1 after drafter | target T="
             f"{a.width} after drafter | target T=1 alone |", "|---|---|---|---|---|"]  # fmt: skip
    for m, row in med.items():
        lines.append(f"| {m} | {row['drafter']} | {row['target_T1_after_drafter']} | "
                     f"{row[f'target_T{a.width}_after_drafter']} | {row['target_T1_alone']} |")  # fmt: skip
    _write("pair_calls", {"meta": meta, "per_process": results, "median": med}, lines)


def cmd_ops(a: argparse.Namespace) -> None:
    """Per-operator time of target calls of width 1 and ``width`` (ORT's profiler)."""
    load0 = os.getloadavg()
    target = _graph(a.bundle, "target", a.threads, "in-call", profile=True)
    _call(target, 0, 32)
    widths, pos = [1, a.width] * a.reps, 32
    for t in widths:
        _call(target, pos, t)
        pos += 1
    trace = Path(target.session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    runs = [e for e in events if e.get("name") == "model_run"][1:]  # the prefill left out
    per: dict[int, dict[str, float]] = {
        1: collections.defaultdict(float),
        a.width: collections.defaultdict(float),
    }
    wall: dict[int, list[float]] = {1: [], a.width: []}
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    for run, t in zip(runs, widths, strict=True):
        wall[t].append(run["dur"] / 1e3)
        for e in kernels:
            if run["ts"] <= e["ts"] <= run["ts"] + run["dur"]:
                per[t][e["args"]["op_name"]] += e["dur"] / 1e3 / a.reps
    ops = sorted(per[a.width], key=lambda o: -per[a.width][o])[:8]
    meta = {**_meta(a, load0), "width": a.width, "reps": a.reps}
    lines = [f"# Where a target call's time goes, width 1 against {a.width}\n", *meta_lines(meta),
             f"ORT profiler, mean per call over {a.reps} calls of each width.\n",
             f"| | T=1 (ms) | T={a.width} (ms) | ratio |", "|---|---|---|---|",
             f"| whole call (median) | {statistics.median(wall[1]):.1f} | "
             f"{statistics.median(wall[a.width]):.1f} | "
             f"{statistics.median(wall[a.width]) / statistics.median(wall[1]):.2f} |"]  # fmt: skip
    for o in ops:
        one, wide = per[1][o], per[a.width][o]
        lines.append(f"| {o} | {one:.1f} | {wide:.1f} | {wide / max(one, 1e-9):.2f} |")
    data = {"meta": meta, "wall_ms": wall, "op_ms": {str(t): dict(v) for t, v in per.items()}}
    _write(a.name or "pair_calls_ops", data, lines)


def _write(name: str, data: dict, lines: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_report(OUT / name, data, markdown=lambda _: "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    for verb in ("calls", "ops", "one"):
        q = sub.add_parser(verb)
        q.add_argument("--bundle", type=Path, required=True)
        q.add_argument("--threads", type=int, default=2)
        q.add_argument("--width", type=int, default=5, help="the wide target call's T")
        q.add_argument("--k", type=int, default=3, help="drafter calls before each target call")
        q.add_argument("--rounds", type=int, default=2, help="processes per mode (calls)")
        q.add_argument("--reps", type=int, default=8, help="calls of each width (ops)")
        q.add_argument("--mode", choices=MODES, default="in-call", help="(one)")
        q.add_argument("--steps", type=int, default=24, help="(one)")
        q.add_argument("--name", default="", help="(ops) report name, default pair_calls_ops")
    a = p.parse_args(argv)
    if a.verb == "one":
        r = one_mode(a.bundle, a.mode, threads=a.threads, k=a.k, width=a.width, steps=a.steps)
        print(json.dumps(r))
    else:
        {"calls": cmd_calls, "ops": cmd_ops}[a.verb](a)


if __name__ == "__main__":
    main()
