"""Time ``omnidraft distill`` end to end on a bundle, and keep what it printed (issue 48).

The verb runs as a user types it (a child process: ``python -m omnidraft_deploy.cli.main distill
BUNDLE ARGS``); this records the wall time, the teaching and training figures and the held-out
agreement before and after, as the verb printed them, and whether it published.

    python -m benchmarks.distill_cli bundles/demo --name demo_40 -- --replies 40 --threads 1

Report: ``reports/local/distill_cli/<name>.{json,md}`` (command, revision, machine, load average);
a run a page cites is copied to ``reports/distill_cli/``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common.report import meta_lines, run_meta, write_report

OUT = Path("reports/local/distill_cli")
FIGURES = {  # what the verb prints -> named figures
    "taught": r"taught (\d+) replies \((\d+) tokens\) in (\d+) s",
    "asked": r"distill: (\d+) replies in .*, (\d+) to ask",
    "trained": r"\((\d+) replies held out, (\d+) trained on, (\d+) steps in (\d+) s",
    "agreement": r"before ([0-9.]+) -> after ([0-9.]+)",
}


def parse(text: str) -> dict[str, Any]:
    """The figures of ``FIGURES`` found in the verb's output (numbers), and the result line."""
    got: dict[str, Any] = {}
    for name, pattern in FIGURES.items():
        m = re.search(pattern, text)
        got[name] = [float(x) if "." in x else int(x) for x in m.groups()] if m else None
    last = [line for line in text.splitlines() if line.startswith(("published", "not published"))]
    got["result"] = last[-1] if last else None
    return got


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--name", default="distill_cli")
    args = sys.argv[1:] if argv is None else list(argv)
    cut = args.index("--") if "--" in args else len(args)  # after --: the verb's own flags
    a, verb = p.parse_args(args[:cut]), args[cut + 1 :]
    threads = int(verb[verb.index("--threads") + 1]) if "--threads" in verb else None
    load0, t0 = os.getloadavg(), time.perf_counter()
    cmd = [sys.executable, "-m", "omnidraft_deploy.cli.main", "distill", a.bundle, *verb]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)  # fmt: skip
    wall = time.perf_counter() - t0
    text = proc.stdout
    lines = [line.rsplit("\r", 1)[-1] for line in text.splitlines() if line.strip()]
    payload = {"meta": run_meta(threads=threads, load_avg_start=load0), "bundle": a.bundle,
               "verb": "omnidraft distill " + " ".join([a.bundle, *verb]), "status": proc.returncode,
               "wall_s": round(wall, 1), **parse(text), "output": lines[-40:]}  # fmt: skip
    print(f"wall {wall:.0f} s, exit {proc.returncode}: {payload['result']}")
    write_report(OUT / a.name, payload, markdown=_md)


def _md(p: dict[str, Any]) -> str:
    before, after = p["agreement"] or ("-", "-")
    taught, trained = p["taught"] or ["-"] * 3, p["trained"] or ["-"] * 4
    return "\n".join([
        "# `omnidraft distill`, end to end", "", *meta_lines(p["meta"]), "",
        f"- verb: `{p['verb']}` (exit {p['status']})",
        f"- wall: {p['wall_s']} s; taught {taught[0]} replies ({taught[1]} tokens) in {taught[2]} s;"
        f" trained on {trained[1]} replies, {trained[2]} steps in {trained[3]} s",
        f"- held-out agreement ({trained[0]} replies held out): {before} -> {after}",
        f"- result: {p['result']}", "", "Output (its last lines):", "", "```",
        *p["output"], "```", ""])  # fmt: skip


if __name__ == "__main__":
    main()
