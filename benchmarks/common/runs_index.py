"""Repeated runs of one benchmark as rows of one index: ``reports/<benchmark>/runs.json``.

A benchmark writes each run where it is told (``reports/local/`` by default for ad-hoc runs,
ignored by git); a run a page cites is folded into its benchmark's index as one row, keyed by the
report's file stem (``fold``: a row of the same name is replaced, nothing else is touched). The
index is the source; ``runs.md`` beside it is rendered from it (``render``, also run by ``make
reports``): a row per run, each with its command, revision, date, machine, threads and load where
the run recorded them, then its figures as JSON, or the benchmark's own Markdown of it where
``render_reports.RUNS_SECTIONS`` has a renderer for its folder.

    python -m benchmarks.common.runs_index reports/run_stats reports/local/run_stats/palindrome_s12_serve.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.common.machine import describe
from omnidraft_deploy.bundle.atomic import write_text_atomic

Section = Callable[[str, dict[str, Any]], str]  # (row name, row payload) -> Markdown


def fold(folder: Path, reports: Iterable[Path]) -> Path:
    """Add each JSON report as a row of ``folder/runs.json`` (keyed by its stem); return the index."""
    index = folder / "runs.json"
    data = json.loads(index.read_text("utf-8")) if index.exists() else {"runs": {}}
    for path in reports:
        data["runs"][path.stem] = json.loads(path.read_text("utf-8"))
    data["runs"] = dict(sorted(data["runs"].items()))
    write_text_atomic(index, json.dumps(data, indent=1) + "\n")
    return index


def _meta(row: dict[str, Any]) -> dict[str, Any]:
    """Where a run recorded its circumstances: ``meta`` (``common.report.run_meta``) or the top."""
    meta = row.get("meta")
    return meta if isinstance(meta, dict) else row


def meta_line(row: dict[str, Any]) -> str:
    """Command, revision, date, machine, threads and load of one row, as far as it recorded them."""
    m = _meta(row)
    machine = m.get("machine")
    parts = [f"`{m['command']}`" if "command" in m else "command not recorded",
             f"revision {m.get('revision') or m.get('git') or 'not recorded'}",
             f"{m.get('utc_end') or m.get('utc') or 'date not recorded'} UTC",
             describe(machine) if isinstance(machine, dict) else f"machine {machine or 'not recorded'}",
             f"threads {m.get('threads', 'not recorded')}",
             f"load {m.get('load_avg_start', m.get('load_avg', '-'))} -> {m.get('load_avg_end', '-')}"]  # fmt: skip
    return "- " + "; ".join(str(p) for p in parts)


def json_section(name: str, row: dict[str, Any]) -> str:
    body = {k: v for k, v in row.items() if k != "meta"}
    return f"```json\n{json.dumps(body, indent=1)}\n```\n"


def markdown(title: str, data: dict[str, Any], section: Section | None = None) -> str:
    lines = [f"# {title}: every committed run", "",
             "Rendered from [runs.json](runs.json) (`benchmarks/common/runs_index.py`); a run is "
             "folded in with `python -m benchmarks.common.runs_index <this folder> <report.json>`.",
             ""]  # fmt: skip
    for name, row in data["runs"].items():
        body = section(name, row) if section else meta_line(row) + "\n\n" + json_section(name, row)
        lines += [f"## {name}", "", body, ""]
    return "\n".join(lines)


def render(folder: Path, section: Section | None = None) -> Path:
    data = json.loads((folder / "runs.json").read_text("utf-8"))
    out = folder / "runs.md"
    write_text_atomic(out, markdown(folder.name, data, section))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="reports/<benchmark>")
    ap.add_argument("reports", nargs="*", type=Path, help="JSON reports to fold in as rows")
    a = ap.parse_args(argv)
    fold(a.folder, a.reports)
    from benchmarks.render_reports import RUNS_SECTIONS

    print(render(a.folder, RUNS_SECTIONS.get(a.folder.name)))


if __name__ == "__main__":
    main()
