"""Every run of the 1.5B real-pair benchmark as a row of one index, and how far apart they land.

``real_pair_bundle`` writes one report a run (``reports/local/<name>/<name>.json``, ignored by
git). ``add`` folds such a report, and its ``<name>_lossless.json`` when there is one, into the
canonical index ``reports/real_pair_1p5b/runs.json`` as one row (a row of the same name is
replaced): the run's protocol, every chunk's command, revision, machine, threads and load, the
cost profile, and per method and task the tokens/s, speedups (against our target-only,
llama.cpp, GenAI), identical outputs, acceptance and predicted speedup. ``render`` (the default
verb, also run by ``add``) writes ``runs.md``: every row, then the spread of the best row over
the runs of one protocol (``--per-task 4 --max-new-tokens 64 --prompt-cache system`` by default),
and ``runs.png``: the best speedup against target-only's own milliseconds a token (the machine's
state, not the code, moves most of the spread).

    python -m benchmarks.run_spread add reports/local/real_pair_1p5b_s12/real_pair_1p5b_s12.json
    python -m benchmarks.run_spread render
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common.machine import describe
from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report

INDEX = Path("reports/real_pair_1p5b/runs")  # .json / .md / .png
SPREAD = {"per_task": "4", "max_new_tokens": "64", "prompt_cache": "system"}
CHUNK_KEYS = ("command", "revision", "machine", "threads", "load_avg_start", "load_avg_end",
              "utc_start", "utc_end", "bundle", "kd_bundle", "family_bundle", "target_quant",
              "ort_spinning")  # fmt: skip
FIGURES = ("prompts", "tokens", "wall_s", "tokens_per_s", "speedup", "identical_n",
           "speedup_vs_llamacpp", "speedup_vs_genai", "acceptance", "tokens_per_call",
           "predicted_speedup")  # fmt: skip


def option(command: str, flag: str) -> str | None:
    """The value given to ``flag`` in a recorded command line, or None."""
    found = re.search(rf"{re.escape(flag)}[ =](\S+)", command)
    return found.group(1) if found else None


def _round(v: Any) -> Any:
    """Floats to 4 significant digits, through lists and dicts (the index stays small)."""
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, list):
        return [_round(x) for x in v]
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    return v


def methods(summary: dict[str, Any]) -> dict[str, Any]:
    """Per method and task (and ``overall``) the figures a page may cite; the overall row also
    keeps the step kinds and the cost model's terms."""
    out: dict[str, Any] = {}
    for method, tasks in summary.items():
        out[method] = {t: {k: f[k] for k in FIGURES if k in f} for t, f in tasks.items()}
        for extra in ("steps", "cost_terms"):
            if extra in tasks.get("overall", {}):
                out[method]["overall"][extra] = tasks["overall"][extra]
    return _round(out)


def run_row(name: str, data: dict[str, Any], lossless: Any = None) -> dict[str, Any]:
    """One ``real_pair_bundle report`` JSON -> its row of the index."""
    chunk = data["chunks"][0]
    command = chunk["command"]
    best = data.get("best_configuration")
    summary = data["summary"]
    target = summary["ours_target"]["overall"]
    profile = data.get("profiles", {}).get("", {}).get("target_ms") or []
    overall = summary[best]["overall"] if best else {}
    return {
        "run": name,
        "utc_start": chunk.get("utc_start"),
        "protocol": {"per_task": option(command, "--per-task") or "2",
                     "max_new_tokens": option(command, "--max-new-tokens") or "64",
                     "prompt_cache": option(command, "--prompt-cache"),
                     "modes": option(command, "--modes")},  # fmt: skip
        "drafter_bundle": option(command, "--kd-bundle"),
        "profile_stat": option(command, "--profile-stat") or "median",
        "profile_t1_ms": round(profile[0], 1) if profile else None,
        "profile_t9_ms": round(profile[8], 1) if len(profile) > 8 else None,
        "target_only_ms_per_token": round(1e3 * target["wall_s"] / target["tokens"], 1),
        "best": best,
        "best_speedup": round(overall["speedup"], 3) if best else None,
        "best_tokens_per_s": round(overall["tokens_per_s"], 1) if best else None,
        "identical": f"{overall['identical_n']}/{overall['prompts']}" if best else None,
        "chunks": [{k: c[k] for k in CHUNK_KEYS if k in c} for c in data["chunks"]],
        "profiles": _round(data.get("profiles", {})),
        "methods": methods(summary),
        "lossless": lossless,
    }


def add(index: dict[str, Any], report: Path, note: str | None = None) -> dict[str, Any]:
    """``index`` with ``report`` (a real_pair_bundle JSON) as a row, replacing one of its name."""
    data = json.loads(report.read_text("utf-8"))
    if not isinstance(data, dict) or "chunks" not in data:
        raise ValueError(f"{report} is not a real_pair_bundle report (no 'chunks')")
    side = report.with_name(report.stem + "_lossless.json")
    lossless = json.loads(side.read_text("utf-8")) if side.exists() else None
    row = run_row(report.stem, data, _round(lossless))
    if note:
        row["note"] = note
    runs = [r for r in index.get("runs", []) if r["run"] != row["run"]] + [row]
    return {**index, "runs": sorted(runs, key=lambda r: r["utc_start"] or "")}


def _machine(row: dict[str, Any]) -> str:
    m = row["chunks"][0].get("machine") or {}
    return describe(m) if isinstance(m, dict) else str(m)


def _vs_llamacpp(row: dict[str, Any]) -> str:
    best = row["methods"].get(row["best"] or "", {}).get("overall", {})
    llama = row["methods"].get("llamacpp_target", {}).get("overall", {})
    if "speedup_vs_llamacpp" not in best:
        return "-"
    return f"{best['speedup_vs_llamacpp']:.2f}x ({llama.get('tokens_per_s', 0):.1f} tok/s)"


def _protocol(row: dict[str, Any]) -> str:
    p = row["protocol"]
    return f"{p['per_task']}x{p['max_new_tokens']}" + (f" {p['prompt_cache']}" if p["prompt_cache"] else "")


def spread_rows(index: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in index["runs"] if all(r["protocol"][k] == v for k, v in SPREAD.items())]


def markdown(data: dict[str, Any]) -> str:
    rows, spread = data["runs"], spread_rows(data)
    speeds = [r["best_speedup"] for r in spread]
    lines = ["# The 1.5B real-pair benchmark, run after run\n", *meta_lines(data["meta"]),
             f"{len(rows)} runs of `benchmarks/real_pair_bundle.py` (Qwen2.5-Coder-1.5B target, "
             "2 threads). Protocol: prompts a task x new tokens, and whether the chat template's "
             "system turn was cached. Each row's command, revision, machine and load are in "
             "[runs.json](runs.json) (`chunks`), with every method's figures per task.\n"]  # fmt: skip
    if speeds:
        lines.append(
            f"Spread over the {len(spread)} runs of `--per-task 4 --max-new-tokens 64 "
            f"--prompt-cache system`: best row {min(speeds):.2f}x-{max(speeds):.2f}x our "
            f"target-only (median {statistics.median(speeds):.2f}x). Target-only's own ms a token "
            "says which of the machine's two states its rows ran in (`benchmarks/state_trace.py`): "
            "the best ratios come from the runs whose target-only was slowest.\n")  # fmt: skip
    lines += ["| run | UTC start | rev | protocol | drafter bundle | profile T=1 / T=9 ms | "
              "target-only ms/token | best row | speedup | tok/s | vs llama.cpp | identical |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['utc_start']} | {r['chunks'][0].get('revision')} | "
            f"{_protocol(r)} | {r['drafter_bundle'] or '-'} | {r['profile_t1_ms']} / "
            f"{r['profile_t9_ms']} ({r['profile_stat']}) | {r['target_only_ms_per_token']} | "
            f"{r['best']} | {r['best_speedup']}x | {r['best_tokens_per_s']} | {_vs_llamacpp(r)} | "
            f"{r['identical']} |")  # fmt: skip
    notes = [f"- `{r['run']}`: {r['note']}" for r in rows if r.get("note")]
    machines = sorted({_machine(r) for r in rows})
    return "\n".join([*lines, "", "Notes:", *notes, "", "Machines recorded: " + "; ".join(machines)
                      + ". Runs before this index recorded no CPU flags.", ""])  # fmt: skip


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = spread_rows(data)
    bundles = sorted({r["drafter_bundle"] or "-" for r in rows})
    for i, bundle in enumerate(bundles):
        mine = [r for r in rows if (r["drafter_bundle"] or "-") == bundle]
        ax.scatter([r["target_only_ms_per_token"] for r in mine],
                   [r["best_speedup"] for r in mine], label=bundle, color=f"C{i}")  # fmt: skip
        for r in mine:
            ax.annotate(r["run"].rsplit("_", 1)[-1], (r["target_only_ms_per_token"],
                        r["best_speedup"]), fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set_xlabel("target-only, measured ms per token (the state its rows ran in)")
    ax.set_ylabel("best row, speedup vs our target-only")
    ax.set_title("Same benchmark, run after run (" + ", ".join(f"{k} {v}" for k, v in SPREAD.items()) + ")")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", nargs="?", choices=("add", "render"), default="render")
    ap.add_argument("reports", nargs="*", type=Path, help="add: real_pair_bundle report JSONs")
    ap.add_argument("--note", default=None, help="add: what this run changed, in one line")
    ap.add_argument("--index", type=Path, default=INDEX, help="the index, without suffix")
    a = ap.parse_args(argv)
    src = a.index.with_suffix(".json")
    index = json.loads(src.read_text("utf-8")) if src.exists() else {"runs": []}
    for report in a.reports if a.verb == "add" else []:
        index = add(index, report, a.note)
    index["meta"] = run_meta(threads=None, argv=argv)
    print(write_report(a.index, index, markdown=markdown, plot=plot))


if __name__ == "__main__":
    main()
