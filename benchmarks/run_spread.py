"""How far apart the same real-pair benchmark lands from run to run, and why (issue 26).

Reads the committed ``real_pair_bundle`` reports (``reports/<name>/<name>.json``) whose first
chunk ran the same protocol (``--per-task``, ``--max-new-tokens``, ``--prompt-cache``: 20
prompts, 64 tokens, the system turn cached, by default) and tabulates, per run: when it ran, the
drafter bundle, the cost profile's target T = 1 / T = 9 latency (which of the machine's two
states held while the profile was taken), target-only's measured milliseconds a token (which
state the rows ran in), the best row and its speedup. The plot puts the best speedup against
target-only's milliseconds a token: the state, not the code, moves most of the spread.
Nothing is re-run; the figures are the committed ones.

    python -m benchmarks.run_spread --name real_pair_1p5b_spread

Report: ``reports/<name>/<name>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report

REPORTS = Path("reports")


def option(command: str, flag: str) -> str | None:
    """The value given to ``flag`` in a recorded command line, or None."""
    found = re.search(rf"{re.escape(flag)}[ =](\S+)", command)
    return found.group(1) if found else None


def run_row(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """One committed real-pair report -> the figures the spread compares."""
    chunk = data["chunks"][0]
    best = data["best_configuration"]
    overall = data["summary"][best]["overall"]
    target = data["summary"]["ours_target"]["overall"]
    profile = data.get("profiles", {}).get("", {}).get("target_ms") or []
    return {
        "run": name,
        "utc_start": chunk.get("utc_start"),
        "drafter_bundle": option(chunk["command"], "--kd-bundle"),
        "profile_stat": option(chunk["command"], "--profile-stat") or "median",
        "profile_t1_ms": round(profile[0], 1) if profile else None,
        "profile_t9_ms": round(profile[8], 1) if len(profile) > 8 else None,
        "target_only_ms_per_token": round(1e3 * target["wall_s"] / target["tokens"], 1),
        "best": best,
        "best_speedup": round(overall["speedup"], 3),
        "best_tokens_per_s": round(overall["tokens_per_s"], 1),
        "identical": f"{overall['identical_n']}/{overall['prompts']}",
    }


def collect(
    root: Path, prefix: str, per_task: str, tokens: str, cache: str | None
) -> list[dict[str, Any]]:
    """Every report under ``root`` named ``<prefix>*`` whose first chunk ran this protocol."""
    rows = []
    for path in sorted(root.glob(f"{prefix}*/*.json")):
        data = json.loads(path.read_text("utf-8"))
        if not isinstance(data, dict) or "chunks" not in data or path.stem != path.parent.name:
            continue
        command = data["chunks"][0]["command"]
        if (option(command, "--per-task"), option(command, "--max-new-tokens")) != (
            per_task,
            tokens,
        ) or option(command, "--prompt-cache") != cache:
            continue
        rows.append(run_row(path.stem, data))
    return sorted(rows, key=lambda r: r["utc_start"] or "")


def markdown(data: dict[str, Any]) -> str:
    rows = data["runs"]
    speeds = [r["best_speedup"] for r in rows]
    lines = ["# The same benchmark, run after run: the best row's spread\n", *meta_lines(data["meta"]),
             f"Protocol: {data['protocol']}. {len(rows)} committed runs; best row "
             f"{min(speeds):.2f}x-{max(speeds):.2f}x our target-only (median "
             f"{statistics.median(speeds):.2f}x). Target-only's own milliseconds a token say which "
             "of the machine's two states its rows ran in (`benchmarks/state_trace.py`: T=1 about "
             "30 ms in one, 38-41 ms in the other, T=9 the other way round).\n",
             "| run | UTC start | drafter bundle | profile T=1 / T=9 (ms) | target-only ms/token | "
             "best row | speedup | tok/s | identical |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['utc_start']} | {r['drafter_bundle']} | {r['profile_t1_ms']} / "
            f"{r['profile_t9_ms']} ({r['profile_stat']}) | {r['target_only_ms_per_token']} | "
            f"{r['best']} | {r['best_speedup']:.3f}x | {r['best_tokens_per_s']} | "
            f"{r['identical']} |"
        )
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bundles = sorted({r["drafter_bundle"] or "-" for r in data["runs"]})
    for i, bundle in enumerate(bundles):
        rows = [r for r in data["runs"] if (r["drafter_bundle"] or "-") == bundle]
        ax.scatter([r["target_only_ms_per_token"] for r in rows],
                   [r["best_speedup"] for r in rows], label=bundle, color=f"C{i}")  # fmt: skip
        for r in rows:
            ax.annotate(r["run"].rsplit("_", 1)[-1], (r["target_only_ms_per_token"],
                        r["best_speedup"]), fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.axhline(1.6, color="grey", linestyle="--", linewidth=0.8, label="issue 26's 1.6x")
    ax.set_xlabel("target-only, measured ms per token (the state its rows ran in)")
    ax.set_ylabel("best row, speedup vs our target-only")
    ax.set_title("Same benchmark, run after run")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="real_pair_1p5b_s", help="report folders to read")
    ap.add_argument("--per-task", default="4")
    ap.add_argument("--max-new-tokens", default="64")
    ap.add_argument("--prompt-cache", default="system", help="'none' for runs without it")
    ap.add_argument("--name", default="real_pair_1p5b_spread")
    a = ap.parse_args()
    cache = None if a.prompt_cache == "none" else a.prompt_cache
    runs = collect(REPORTS, a.prefix, a.per_task, a.max_new_tokens, cache)
    if not runs:
        raise SystemExit(f"no report under {REPORTS}/{a.prefix}* ran that protocol")
    protocol = (f"`--per-task {a.per_task} --max-new-tokens {a.max_new_tokens} --prompt-cache "
                f"{a.prompt_cache}`, folders `{a.prefix}*`")  # fmt: skip
    payload = {"meta": run_meta(threads=None), "protocol": protocol, "runs": runs}
    out = write_report(REPORTS / a.name / a.name, payload, markdown=markdown, plot=plot)
    print(out)


if __name__ == "__main__":
    main()
