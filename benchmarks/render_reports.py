"""Render reports/<benchmark>/*.md and *.png from the JSON beside them (``make reports``).

The JSON a benchmark writes is the source; this script re-renders what can be rendered from it
alone, so a table or plot never drifts from its numbers. It needs only the stdlib and matplotlib,
and the benchmarks' own renderers where a kind has one (early_exit's plot); a benchmark that writes
a kind below renders its md with the same function at run time (``common.report.write_report``).

Kinds (the folder names the kind):
- export_report, batch_invariance, matmul_kernels, fuzz: md rendered from the JSON.
- real_pair, runtime_speed, early_exit: png rendered; md kept as written, because it also holds
  what the JSON does not (the cost model's terms, the run's notes, the exact command).
- ``runs.json``: an index of repeated runs (``common.runs_index``; ``real_pair_1p5b``'s is
  ``run_spread``'s): ``runs.md`` rendered from it (and ``runs.png`` for the real-pair index).
Every other md/png (no JSON beside it) is listed as "md kept as written".

Each rendered md names the command, machine and load average where the JSON records them, and
the git revision that last changed the JSON.

    .venv/bin/python -m benchmarks.render_reports [--reports reports]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.common import runs_index
from benchmarks.common.machine import describe
from benchmarks.common.report import pyplot, save_figure
from benchmarks.common.runs_index import meta_line

TASKS = ("math", "code", "chat", "summarisation", "code_edit")  # their order in the plots
MD_FROM_JSON = ("export_report", "batch_invariance", "matmul_kernels", "fuzz")
PNG_FROM_JSON = ("real_pair", "runtime_speed", "early_exit")


def revision(path: Path) -> str:
    """The short hash and date of the last commit that changed ``path`` (renames skipped)."""
    cmd = ["git", "log", "--follow", "--diff-filter=AM", "--format=%h %cs", "-1", "--", path.name]
    try:
        out = subprocess.run(cmd, cwd=path.parent, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "not in git"
    return out.stdout.strip() or "not committed"


def _load(v: Any) -> str:
    """A load average as written: a [1, 5, 15] list, a number or a string."""
    if isinstance(v, list):
        return " ".join(f"{x:.2f}" for x in v)
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def header(title: str, src: Path, *, command: str | None = None, machine: str | None = None,
           load: tuple[Any, Any] | None = None, extra: list[str] | None = None) -> list[str]:  # fmt: skip
    lines = [f"# {title}", "", f"Rendered by `make reports` from [{src.name}]({src.name}) "
             f"(JSON last changed in {revision(src)}); edit the JSON's benchmark, not this file.",
             ""]  # fmt: skip
    if command:
        lines.append(f"- command: `{command}`")
    if machine:
        lines.append(f"- machine: {machine}")
    if load:
        lines.append(f"- load average: {_load(load[0])} at the start, {_load(load[1])} at the end")
    return lines + (extra or []) + [""]


def _num(v: Any, spec: str = ".3g") -> str:
    """A table cell: "-" for missing, integers with separators, floats by ``spec``."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else format(v, spec)


# --- md from JSON -----------------------------------------------------------------------------


def export_report_md(d: dict[str, Any], src: Path) -> str:
    m = d["meta"]
    unrecorded = ["- command and load: not recorded in the JSON (see "
                  "docs/results/exports-and-quantisation.md)"] if "command" not in m else []  # fmt: skip
    lines = header(f"Export report: {src.stem}", src, command=m.get("command"),
                   machine=_machine(m.get("machine")),
                   load=(m["load_avg_start"], m["load_avg_end"]) if "load_avg_end" in m else None,
                   extra=[f"- torch {m.get('torch')}, {m.get('threads')} threads, max_seq_len "
                          f"{m.get('max_seq_len')}, {m.get('prompts')} prompts per model; parity "
                          "over prefill, single steps and a rollback", *unrecorded])  # fmt: skip
    lines += ["| model | backend | quant | graph MiB | export s (stages) | peak RSS MB | verify s | "
              "max abs diff | max logit | top-1 | pass | decode tok/s | placement |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["rows"]:
        lines.append("| " + " | ".join(_export_cells(r)) + " |")
    ops = sorted(
        {o for r in d["rows"] for o in r.get("op_coverage", {}).get("non_delegated_ops", [])}
    )
    if ops:
        lines += ["", "Ops left to the portable runtime (not XNNPACK): " + ", ".join(ops)]
    return "\n".join(lines) + "\n"


def _export_cells(r: dict[str, Any]) -> list[str]:
    par, spd = r.get("parity", {}), r.get("speed", {})
    stages = r.get("stages", {})
    secs = {k: (v["seconds"] if isinstance(v, dict) else v) for k, v in stages.items()}
    export = _num(r.get("export_s"), ".1f")
    if secs:
        export += " (" + ", ".join(f"{k} {v:.0f}" for k, v in secs.items()) + ")"
    place = "-"
    if "op_coverage" in r:
        oc = r["op_coverage"]
        place = f"XNNPACK {oc.get('delegated_nodes')}/{oc.get('non_delegated_nodes')} nodes"
    elif r.get("backend") == "qnn":
        place = "HTP " + (
            "100 %" if not r.get("htp_cpu_nodes") else f"CPU nodes {r['htp_cpu_nodes']}"
        )
        if "htp_parity" in r:
            hp = r["htp_parity"]
            place += (f"; on HTP: diff {hp['max_abs_logit_diff']:.3g}, "
                      f"top-1 {hp['top1_agreement']:.3f}")  # fmt: skip
    return [r["model"], r["backend"], r["quantization"], _num(r.get("graph_bytes", 0) / 2**20, ".1f"),
            export, _num(r.get("export_peak_rss_mb"), ".1f"), _num(r.get("verify_s"), ".1f"),
            _num(par.get("max_abs_logit_diff")), _num(par.get("max_abs_logit"), ".1f"),
            _num(par.get("top1_agreement"), ".3f"), _num(r.get("passed")),
            _num(spd.get("speed_decode_tok_s"), ".1f"), place]  # fmt: skip


def _machine(v: Any) -> str | None:
    """A machine as a run recorded it: ``{"cpu", "cpus", "flags"}`` (``common.machine``) or text."""
    return describe(v) if isinstance(v, dict) else v


def batch_invariance_md(d: dict[str, Any], src: Path) -> str:
    m = d["meta"]
    run = [f"- run at revision {m['revision']}"] if "revision" in m else []
    lines = header(f"Batch invariance: {src.stem}", src, command=m.get("command"),
                   machine=_machine(m.get("machine")),
                   load=(m.get("load_avg_start"), m.get("load_avg_end")),
                   extra=[*run, f"- {m.get('prompts')} prompts, {m.get('utc')} UTC"])  # fmt: skip
    lines += ["Rows whose logits differ (bitwise) between a 1-token call and a T-token call.", "",
              "| graph | width T | rows | rows not bitwise equal | max abs diff | argmax changes |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for g in d["graphs"]:
        for w, c in g["widths"].items():
            lines.append(f"| {g['graph']} | {w} | {c['rows']} | {c['rows_not_bitwise_equal']} | "
                         f"{_num(c['max_abs_diff'])} | {c['argmax_changes']} |")  # fmt: skip
    lines.append("")
    for g in d["graphs"]:
        lines.append(f"- {g['graph']}: batch-invariant **{g['batch_invariant']}**, top-1 vs eager "
                     f"{_num(g.get('top1_vs_eager'), '.3f')}")  # fmt: skip
    return "\n".join(lines) + "\n"


def matmul_kernels_md(d: dict[str, Any], src: Path) -> str:
    m = d.get("meta", {})  # runs since the benchmarks package record their command and machine
    lines = header("One weight matmul of each Qwen2.5 shape, per kernel and row count", src,
                   command=m.get("command"), machine=_machine(m.get("machine")),
                   load=(d.get("load_avg_start"), d.get("load_avg_end")),
                   extra=[f"- {d.get('threads')} threads; ms, interleaved"])  # fmt: skip
    rows = sorted({r for v in d["ms"].values() for r in v}, key=int)
    lines += ["| kernel / matmul | " + " | ".join(f"{r} rows" for r in rows) + " |",
              "|---|" + "---|" * len(rows)]  # fmt: skip
    for name, v in d["ms"].items():
        lines.append(f"| {name} | " + " | ".join(_num(v.get(r), ".2f") for r in rows) + " |")
    return "\n".join(lines) + "\n"


FUZZ_COLS = ("inputs", "accepted", "rejected", "crashes", "invalid_accepted", "kills",
             "killed_mid_write", "finished_before_kill", "bundles_missing", "partial_validated",
             "junk_after_next_run", "seconds")  # fmt: skip


def fuzz_md(d: dict[str, Any], src: Path) -> str:
    lines = header("Reliability: fuzzing and SIGKILL runs (long mode)", src, extra=[
        "- each run below names its command, date, machine and load average"])  # fmt: skip
    lines += [
        "| target | " + " | ".join(FUZZ_COLS) + " | runs |",
        "|---" * (len(FUZZ_COLS) + 2) + "|",
    ]
    for name, row in sorted(d["results"].items()):
        lines.append(f"| {name} | " + " | ".join(_num(row.get(c), ".0f" if c == "seconds" else ".3g") for c in FUZZ_COLS)
                     + f" | {row.get('run')} |")  # fmt: skip
    lines += ["", "Parts (a row is the sum of its parts):", ""]
    for name, parts in sorted(d["parts"].items()):
        lines.append(f"- {name}: " + "; ".join(
            f"{p} ({row.get('inputs', row.get('kills'))}, run {row['run']})"
            for p, row in parts.items()))  # fmt: skip
    lines += ["", "Runs:", ""]
    used = {str(r) for row in d["results"].values() for r in str(row.get("run")).split(",")}
    for i, r in enumerate(d["runs"]):
        lines.append(f"{i}. `{r['command']}` ({r['date']}, {r['machine']}, load average "
                     f"{r['load_before']} before, {r['load_after']} after)"
                     + ("" if str(i) in used else " (superseded)"))  # fmt: skip
    return "\n".join(lines) + "\n"


# --- png from JSON ----------------------------------------------------------------------------


def ordered_tasks(tasks: Iterable[str]) -> list[str]:
    """The distinct ``tasks`` in the canonical order (``TASKS``), unknown ones after."""
    seen = list(dict.fromkeys(tasks))
    return [t for t in TASKS if t in seen] + [t for t in seen if t not in TASKS]


def real_pair_png(d: dict[str, Any], src: Path) -> list[Path]:
    """One plot per task of a real-pair report (``benchmarks.real_pair_report``): measured and
    predicted speedup of every configuration over our target-only."""
    plt, out = pyplot(), []
    summ, meta = d["summary"], d["chunks"][0]
    quant, target = meta.get("target_quant", "int8"), meta.get("target", "Qwen2.5-Coder-0.5B")
    modes = meta.get("modes", "greedy")  # greedy rows, or greedy,exact (sampled rows too)
    for task in ordered_tasks(t for per in summ.values() for t in per if t != "overall"):
        names = [m for m, per in summ.items() if task in per and m != "ours_target"]
        if not names:
            continue
        fig, ax = plt.subplots(figsize=(9, 3.6))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [summ[m][task]["speedup"] for m in names], 0.4,
               label="measured")  # fmt: skip
        ax.bar([x + 0.2 for x in xs],
               [summ[m][task].get("predicted_speedup", float("nan")) for m in names], 0.4,
               label="predicted (cost model)")  # fmt: skip
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("speedup vs our ORT target-only")
        ax.set_title(f"{src.stem}, {task}: {target} {quant} ORT, {modes.replace(',', ' + ')}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        out.append(save_figure(fig, src.with_name(f"{src.stem}_{task}.png")))
    return out


def runtime_speed_png(d: dict[str, Any], src: Path) -> list[Path]:
    plt, groups = pyplot(), d["groups"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    names = sorted({n for g in groups.values() for n in g})
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        vals = [g.get(name, {}).get("decode_tok_s", 0) for g in groups.values()]
        axes[0].bar([i + j * width for i in range(len(groups))], vals, width, label=name)
    axes[0].set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], list(groups), rotation=20)
    axes[0].set_ylabel("1-token decode tok/s")
    axes[0].legend(fontsize=7)
    for key, g in groups.items():
        for name, e in g.items():
            ts = sorted(e["verify_ms"], key=int)
            axes[1].plot([int(t) for t in ts], [e["verify_ms"][t] for t in ts], marker="o",
                         label=f"{key} {name}")  # fmt: skip
    axes[1].set_xlabel("tokens per call (T)")
    axes[1].set_ylabel("verify-call latency ms")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=6)
    fig.suptitle(f"load {_load(d.get('load_before'))} -> {_load(d.get('load_after'))}", fontsize=8)
    fig.tight_layout()
    return [save_figure(fig, src.with_suffix(".png"), dpi=120)]


def early_exit_png(d: dict[str, Any], src: Path) -> list[Path]:
    """The benchmark's own plot (``benchmarks.early_exit.plot``) from its JSON."""
    from benchmarks.early_exit import plot

    out = src.with_suffix(".png")
    plot(d, out)
    return [out]


MD: dict[str, Callable[[dict[str, Any], Path], str]] = {
    "export_report": export_report_md, "batch_invariance": batch_invariance_md,
    "matmul_kernels": matmul_kernels_md, "fuzz": fuzz_md,
}  # fmt: skip
PNG: dict[str, Callable[[dict[str, Any], Path], list[Path]]] = {
    "real_pair": real_pair_png, "runtime_speed": runtime_speed_png, "early_exit": early_exit_png,
}  # fmt: skip


def _demoted(md: str) -> str:
    """A report's own Markdown as a section of an index page (its headings one level down)."""
    return "\n".join("#" + ln if ln.startswith("#") else ln for ln in md.splitlines())


def run_stats_section(name: str, row: dict[str, Any]) -> str:
    if "requests" in row:  # benchmarks.first_text
        from benchmarks.first_text import _markdown

        return _demoted(_markdown(row))
    from benchmarks.run_stats import TABLE_HEAD, _row

    m = row["meta"]
    lines = [meta_line(row), "", f"Bundle {m.get('bundle')}, prompt {m.get('prompt')!r}, "
             f"{m.get('max_new_tokens')} new tokens; {'served' if 'in_process' in row else 'in-process'} "
             "runs, each a fresh `omnidraft run` process.", "", *TABLE_HEAD]  # fmt: skip
    lines += [_row(str(i), r) for i, r in enumerate(row["runs"], 1)]
    if "in_process" in row:
        lines.append(_row("in-process", row["in_process"]))
    return "\n".join(lines) + "\n"


def kd_drafter_section(name: str, row: dict[str, Any]) -> str:
    from benchmarks.kd_drafter import _agree_md, _train_md

    return _demoted((_agree_md if name.endswith("_agree") else _train_md)(row))


def export_report_section(name: str, row: dict[str, Any]) -> str:
    return _demoted(export_report_md(row, Path("runs.json")))


# index folders (reports/<benchmark>/runs.json, benchmarks/common/runs_index.py) whose rows have
# a renderer of their own; the others show each row's figures as JSON
RUNS_SECTIONS: dict[str, runs_index.Section] = {
    "run_stats": run_stats_section, "kd_drafter": kd_drafter_section,
    "export_report": export_report_section,
}


def render(reports: Path) -> tuple[list[Path], list[Path]]:
    """Render every JSON of a known kind and every runs index; return (written files, files kept
    as written)."""
    written: list[Path] = []
    for src in sorted(reports.glob("*/*.json")):
        kind = src.parent.name
        if src.name == "runs.json":
            written += _render_index(src)
            continue
        data = json.loads(src.read_text("utf-8"))
        if kind in MD:
            md = src.with_suffix(".md")
            md.write_text(MD[kind](data, src), "utf-8")
            written.append(md)
        if kind in PNG:
            written += PNG[kind](data, src)
    done = set(written)
    kept = [p for p in sorted(reports.glob("*/*")) if p.suffix in (".md", ".png", ".txt")
            and p not in done]  # fmt: skip
    return written, kept


def _render_index(src: Path) -> list[Path]:
    if src.parent.name == "real_pair_1p5b":  # the real-pair index has its own table and plot
        from benchmarks import run_spread

        data = json.loads(src.read_text("utf-8"))
        md, png = src.with_suffix(".md"), src.with_suffix(".png")
        md.write_text(run_spread.markdown(data), "utf-8")
        run_spread.plot(data, png)
        return [md, png]
    return [runs_index.render(src.parent, RUNS_SECTIONS.get(src.parent.name))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reports", type=Path, default=Path(__file__).resolve().parents[1] / "reports")
    a = ap.parse_args(argv)
    written, kept = render(a.reports)
    for p in written:
        print(f"rendered            {p.relative_to(a.reports)}")
    for p in kept:
        print(f"{p.suffix[1:]} kept as written  {p.relative_to(a.reports)}")
    print(f"{len(written)} files rendered from JSON, {len(kept)} kept as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
