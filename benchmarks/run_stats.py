"""``omnidraft run --stats`` as a user runs it: time to the first generated text, and the speedup.

Runs the command ``--runs`` times on one state folder (the first run measures the cost profile
and records the file hashes there; later runs reuse both), each a fresh process, and records for
each: seconds from the process start to the first byte of generated text on stdout, the wall time,
and the ``--stats`` JSON (speedup against target-only decoded in the same process, acceptance,
host overhead).

    python -m benchmarks.run_stats --bundle bundles/q15-w8a8 --runs 3 --name palindrome

``--serve``: starts ``omnidraft serve`` on a fresh state folder first (a child of this command,
so a tool that pauses every other process pauses neither it nor the runs), records its start-up time (open, cost
profile, warm-up) once it prints "serving", then times the runs as clients of it (the server's
``-v`` log must count one served request per run), then one ``--no-server`` run on the same
state folder for comparison; ``reports/local/run_stats/<name>_serve.{json,md}``.

Writes ``reports/local/run_stats/<name>.{json,md}`` (command, git revision, CPU, load average); a
run a page cites is folded into ``reports/run_stats/runs.json`` as a row
(``python -m benchmarks.common.runs_index reports/run_stats <json>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.report import meta_lines, run_meta, write_report

PALINDROME = ("Write a Python function that checks whether a string is a palindrome, ignoring "
              "case and punctuation.")  # fmt: skip
CLI = Path(sys.executable).parent / "omnidraft"


def one_run(bundle: Path, state: Path, prompt: str, max_new: int, *extra: str) -> dict[str, Any]:
    argv = [str(CLI), "run", str(bundle), "--chat", "--prompt", prompt, "--max-new-tokens",
            str(max_new), "--stats", "--state", str(state), *extra]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    first_s = time.perf_counter() - t0
    text = (first + proc.stdout.read()).decode("utf-8", "replace")
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {err[-2000:]}")
    stats = json.loads([ln for ln in err.splitlines() if ln.startswith("{")][-1])
    return {"first_output_s": round(first_s, 2), "wall_s": round(time.perf_counter() - t0, 2),
            "stats": stats, "text": text}  # fmt: skip


def start_server(bundle: Path, state: Path, threads: int, log: Path) -> tuple[Any, float, str]:
    """``omnidraft serve`` as a child: the process, seconds until it printed "serving", the line."""
    argv = [str(CLI), "serve", str(bundle), "--state", str(state), "--threads", str(threads), "-v"]
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("serving "):
            return proc, round(time.perf_counter() - t0, 2), line.strip()
    raise RuntimeError(f"{' '.join(argv)} exited {proc.wait()}: {log.read_text()[-2000:]}")


def serve_main(a: argparse.Namespace) -> None:
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        state, log = Path(tmp) / "state", Path(tmp) / "serve.log"
        server, start_s, ready = start_server(a.bundle, state, a.threads, log)
        try:
            runs = [one_run(a.bundle, state, a.prompt, a.max_new_tokens) for _ in range(a.runs)]
        finally:
            server.terminate()
            server.wait(timeout=60)
        served = log.read_text().count("request: ")
        local = one_run(a.bundle, state, a.prompt, a.max_new_tokens, "--no-server")
    if served != a.runs:
        raise RuntimeError(f"the server served {served} of {a.runs} runs: see its log")
    meta = {**run_meta(threads=a.threads, load_avg_start=load0), "bundle": str(a.bundle),
            "prompt": a.prompt, "max_new_tokens": a.max_new_tokens, "server_start_s": start_s,
            "server_ready_line": ready}  # fmt: skip
    rows = [f"# `omnidraft run --stats` through `omnidraft serve` on {a.bundle}\n",
            *meta_lines(meta),
            f"Prompt (chat template): {a.prompt!r}, {a.max_new_tokens} new tokens. The server "
            f"started on a fresh state folder ({ready}; {start_s} s from its process start, the "
            "cost profile measured on the way), then each run is a fresh `omnidraft run` "
            "process that finds it; the last row runs in-process (`--no-server`) on the same "
            "state folder.\n", *TABLE_HEAD]  # fmt: skip
    rows += [_row(str(i), r) for i, r in enumerate(runs, 1)] + [_row("in-process", local)]
    rows += ["", "Text of the last served run:", "", "```", runs[-1]["text"].strip(), "```"]
    write_report(Path("reports/local/run_stats") / f"{a.name}_serve",
                 {"meta": meta, "runs": runs, "in_process": local},
                 markdown=lambda _: "\n".join(rows) + "\n")  # fmt: skip
    print("\n".join(rows))


TABLE_HEAD = ["| run | first text (s from process start) | wall (s) | speedup vs target-only | "
              "acceptance | target tokens / call | host overhead (s) | identical |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip


def _row(name: str, r: dict[str, Any]) -> str:
    s = r["stats"]
    return (f"| {name} | {r['first_output_s']} | {r['wall_s']} | "
            f"{s.get('speedup_vs_target_only')}x | {s.get('acceptance_rate')} | "
            f"{s.get('tokens_per_target_call')} | {s.get('overhead_s')} | "
            f"{s.get('identical_to_target_only')} |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--prompt", default=PALINDROME)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--name", default="palindrome")
    p.add_argument("--serve", action="store_true", help="the runs as clients of omnidraft serve")
    p.add_argument("--threads", type=int, default=2, help="--serve: the server's ORT threads")
    a = p.parse_args(argv)
    if a.serve:
        serve_main(a)
        return
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as state:
        runs = []
        for i in range(a.runs):
            runs.append(one_run(a.bundle, Path(state), a.prompt, a.max_new_tokens))
            print(f"run {i + 1}/{a.runs}: {json.dumps({k: v for k, v in runs[-1].items() if k != 'text'})}",
                  file=sys.stderr)  # fmt: skip
    meta = {**run_meta(threads=None, load_avg_start=load0), "bundle": str(a.bundle),
            "prompt": a.prompt, "max_new_tokens": a.max_new_tokens}  # fmt: skip
    out = Path("reports/local/run_stats")
    out.mkdir(parents=True, exist_ok=True)
    rows = [f"# `omnidraft run --stats` on {a.bundle}\n", *meta_lines(meta),
            f"Prompt (chat template): {a.prompt!r}, {a.max_new_tokens} new tokens; one state "
            "folder, so run 1 measures the cost profile and hashes the files, later runs reuse "
            "both.\n", *TABLE_HEAD]  # fmt: skip
    rows += [_row(str(i), r) for i, r in enumerate(runs, 1)]
    rows += ["", "Text of the last run:", "", "```", runs[-1]["text"].strip(), "```"]
    write_report(out / a.name, {"meta": meta, "runs": runs},
                 markdown=lambda _: "\n".join(rows) + "\n")  # fmt: skip
    print("\n".join(rows))


if __name__ == "__main__":
    main()
