"""The target's call latencies traced over time in one process: does the machine change under a run?

Opens a bundle as ``run`` does (weights on huge pages), then every few seconds times a batch of
1-token and ``--width``-token target calls at a fixed position, for ``--seconds``, and records the
medians with the time since the process started. A cost profile is measured once, in the first
seconds of a benchmark; if the latencies move later within the same process (same session, same
pages), the profile and the rows timed after it see different machines.

    python -m benchmarks.state_trace --bundle bundles/q15s2 --seconds 130

Report: ``reports/state_trace/<name>.{json,md}`` plus a plot (latency against time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report
from omnidraft_deploy.protocols import last_logits

OUT = Path("reports/state_trace")


def anon_huge_mb() -> float:
    """This process's anonymous memory on huge pages (MB; 0 where /proc does not say)."""
    try:
        for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def trace(a: argparse.Namespace) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle

    start, load0 = time.time(), os.getloadavg()
    target = open_bundle(a.bundle, threads=a.threads).target
    ids = torch.arange(a.position + a.width) * 7 % 5000 + 100
    last_logits(target, ids[: a.position], 0)

    def call(n: int) -> float:
        t0 = time.perf_counter()
        target.forward(ids[a.position : a.position + n], a.position)
        return 1e3 * (time.perf_counter() - t0)

    points = []
    while time.time() - start < a.seconds:
        one = statistics.median(call(1) for _ in range(a.calls))
        wide = statistics.median(call(a.width) for _ in range(a.calls))
        points.append({"s": round(time.time() - start, 1), "t1_ms": one, "wide_ms": wide,
                       "anon_huge_mb": anon_huge_mb()})  # fmt: skip
        print(
            f"{points[-1]['s']:6.1f} s  T=1 {one:5.1f} ms  T={a.width} {wide:5.1f} ms", flush=True
        )
        time.sleep(a.every)
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "bundle": str(a.bundle),
               "width": a.width, "position": a.position, "calls": a.calls, "points": points}  # fmt: skip
    write_report(OUT / a.name, payload, markdown=_md, plot=_plot)


def _md(p: dict[str, Any]) -> str:
    w = p["width"]
    head = [f"# Target call latency over one process's life ({p['bundle']})", "",
            *meta_lines(p["meta"]), "",
            f"Medians of {p['calls']} calls at position {p['position']} per point.", "",
            f"| s since start | T=1 (ms) | T={w} (ms) | anonymous memory on huge pages (MB) |",
            "|---|---|---|---|"]  # fmt: skip
    rows = [f"| {q['s']:.0f} | {q['t1_ms']:.1f} | {q['wide_ms']:.1f} | "
            f"{q['anon_huge_mb']:.0f} |" for q in p["points"]]  # fmt: skip
    return "\n".join(head + rows) + "\n"


def _plot(p: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    s = [q["s"] for q in p["points"]]
    ax.plot(s, [q["t1_ms"] for q in p["points"]], "o-", label="T=1")
    ax.plot(s, [q["wide_ms"] for q in p["points"]], "s-", label=f"T={p['width']}")
    ax.set_xlabel("seconds since the process started")
    ax.set_ylabel("ms per target call (median)")
    ax.set_title(f"target call latency over time: {p['bundle']}")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=130.0)
    p.add_argument("--every", type=float, default=3.0, help="seconds idle between points")
    p.add_argument("--calls", type=int, default=5, help="calls per width per point")
    p.add_argument("--width", type=int, default=9)
    p.add_argument("--position", type=int, default=100)
    p.add_argument("--name", default="state_trace")
    trace(p.parse_args(argv))


if __name__ == "__main__":
    main()
