"""What a cache of S = 512 / 2,048 / 4,096 slots holds in memory at a short context: resident MiB
a cache adds, our target graph and ONNX Runtime GenAI's (issue 28; ``benchmarks/kv_slots.py``
times the steps). Needs ``kv_slots prepare`` first.

    .venv/bin/python -m benchmarks.kv_slots_rss --model qwen2.5-1.5b --threads 2

Per engine, one process (one model, as in ``kv_slots time``): a throwaway cache takes a prompt of
the longest C and a step first (ORT's arena and GenAI's first-call buffers grow there), then
per S, a fresh cache: resident memory (``exporters.memory.current_rss_mb``) before it exists, and after a C-token prompt
and one decode step, for each C of ``--contexts`` in turn (the same cache; C grows). The
difference is what that cache made resident. Writes ``reports/kv_slots/kv_slots_rss.{json,md}``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.memory import current_rss_mb

from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.kv_slots import _engines, engines, kv_mib


def _measure(kind: str, path: str, slots: list[int], contexts: list[int], threads: int,
             conn: Any) -> None:  # fmt: skip
    """(S, C) -> resident MiB that S's cache added after a C-token prompt and one step."""
    warm = -(-(max(contexts) + 2) // 64) * 64  # the throwaway cache: whole blocks of 64 slots
    while warm in slots:  # a cache of its own, not one of those measured
        warm += 64
    found = _engines(kind, Path(path), [warm, *slots], threads)
    found[warm].steps([(i * 7877) % 1000 + 100 for i in range(max(contexts))], 1)
    out = {}
    for s in slots:
        before = current_rss_mb()
        for c in contexts:
            found[s].steps([(i * 7919) % 1000 + 100 for i in range(c)], 1)
            out[f"{s}|{c}"] = round(current_rss_mb() - before, 1)
    conn.send(out)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    rows = []
    for name, (kind, path) in engines(args).items():  # one at a time: one model in memory
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_measure,
                           args=(kind, str(path), args.slots, args.contexts, args.threads, child))  # fmt: skip
        proc.start()
        got = parent.recv()
        proc.join()
        rows += [{"engine": name, "slots": int(k.split("|")[0]), "context": int(k.split("|")[1]),
                  "resident_mib": v} for k, v in got.items()]  # fmt: skip
    return rows


def to_markdown(r: dict[str, Any]) -> str:
    ctxs = sorted({x["context"] for x in r["rows"]})
    lines = [f"# Resident MiB a KV cache of S slots adds: {r['model']} {r['precision']}", "",
             *meta_lines(r["meta"]),
             "Resident memory after a C-token prompt and one decode step, minus that before the cache "
             "existed (after a warm-up on another cache). KV MiB: fp32 K + V at S slots.", "",
             "| engine | slots S | KV MiB | " + " | ".join(f"ctx {c}" for c in ctxs) + " |",
             "|---|---|---|" + "---|" * len(ctxs)]  # fmt: skip
    for name in dict.fromkeys(x["engine"] for x in r["rows"]):
        for s in sorted({x["slots"] for x in r["rows"]}):
            got = {x["context"]: x["resident_mib"] for x in r["rows"]
                   if x["engine"] == name and x["slots"] == s}  # fmt: skip
            cells = " | ".join(str(got.get(c, "-")) for c in ctxs)
            lines.append(f"| {name} | {s} | {r['kv_mib'][str(s)]} | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-1.5b")
    p.add_argument("--precision", default="int8")
    p.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")],
                   default=[512, 2048, 4096])  # fmt: skip
    p.add_argument("--forms", type=lambda s: s.split(","), default=["invariant", "gqa"])
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[64, 448])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("reports/kv_slots/kv_slots_rss"))
    args = p.parse_args()
    result = {"model": args.model, "precision": args.precision, "rows": measure(args),
              "kv_mib": {s: kv_mib(args.model, s) for s in args.slots},
              "meta": run_meta(threads=args.threads)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(write_report(args.out, result, markdown=to_markdown))


if __name__ == "__main__":
    main()
