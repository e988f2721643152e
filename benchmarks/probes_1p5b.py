"""Probes behind issue 26's analysis of the 1.5B pair: what a call costs, and what a policy buys.

- ``drafters``: one-token (and 2-, 3-token) calls of drafter graphs, interleaved round-robin in
  one process, each graph its own session with the runtime's threading (``Spin.IN_CALL``). The
  graphs are ONNX files of the bundle's drafter contract (e.g. the SmolLM2 drafter exported with
  other recipes: ``exporters.onnx.export_onnx_graph`` with ``recipe`` int8 / w8a8 / gguf4).
- ``llamacpp``: llama.cpp (``llama-cpp-python``) calls of T tokens after a fixed context, the
  cost of a verification width if llama.cpp ran the target.
- ``policies``: draft-length policies A/B inside one process, the same prompts interleaved with
  target-only: measured speedup and the cost model's modelled speedup of each policy's own steps
  (deterministic for a given profile, so it separates a policy's effect from timing noise).

    python -m benchmarks.probes_1p5b drafters --bundle bundles/q15-w8a8 --graph int8=bundles/q15-w8a8/drafter.onnx
    python -m benchmarks.probes_1p5b llamacpp --gguf <1.5B GGUF>
    python -m benchmarks.probes_1p5b policies --bundle bundles/q15-w8a8 --policies myopic,lookahead,current

Reports: ``reports/probes_1p5b/<probe>.{json,md}`` (command, revision, machine, load average).
Run with every other process paused; these are probes, not the benchmark (``benchmarks.real_pair_bundle``).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.pair_calls import _call

OUT = Path("reports/probes_1p5b")


def cmd_drafters(a: argparse.Namespace) -> dict[str, Any]:
    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph
    from omnidraft_deploy.host.onnx_host import Spin, cpu_session

    info = read_manifest(Path(a.bundle)).graphs["drafter"]
    graphs = {}
    for spec in a.graph:
        name, _, file = spec.partition("=")
        for threads in a.threads:
            session = cpu_session(Path(file), threads=threads, spinning=Spin.IN_CALL)
            graphs[f"{name} x{threads}"] = ExplicitCacheGraph(session, info)
    times: dict[str, list[float]] = collections.defaultdict(list)
    pos = dict.fromkeys(graphs, 32)
    for g in graphs.values():
        _call(g, 0, 32)
    for _ in range(a.rounds):
        for key, g in graphs.items():
            for t in (1, 2, 3):
                times[f"{key} T={t}"].append(_call(g, pos[key], t))
                pos[key] += t
            if pos[key] > info.max_seq_len - 8:
                pos[key] = 32
    return {k: statistics.median(v) for k, v in times.items()}


def cmd_llamacpp(a: argparse.Namespace) -> dict[str, Any]:
    from llama_cpp import Llama

    llm = Llama(model_path=a.gguf, n_ctx=1024, n_threads=a.threads[0],
                n_threads_batch=a.threads[0], n_batch=64, verbose=False)  # fmt: skip
    ctx = llm.tokenize(b"def is_palindrome(s):\n    s = ''.join(c.lower() for c in s)\n" * 3)
    out: dict[str, Any] = {}
    for t in (1, 2, 3, 4, 5, 8):
        runs = []
        for _ in range(a.rounds):
            llm.reset()
            llm.eval(ctx)
            t0 = time.perf_counter()
            llm.eval(ctx[:t])
            runs.append(1e3 * (time.perf_counter() - t0))
        out[f"T={t}"] = statistics.median(runs)
    return out


def cmd_policies(a: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.probes_policies import compare_policies

    return compare_policies(a)


def _markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# {data['probe']}",
        "",
        *meta_lines(data["meta"]),
        "",
        "| what | value |",
        "|---|---|",
    ]
    for k, v in data["result"].items():
        lines.append(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="probe", required=True)
    d = sub.add_parser("drafters")
    d.add_argument("--bundle", required=True, help="whose drafter contract the graphs follow")
    d.add_argument("--graph", action="append", required=True, help="NAME=FILE.onnx (repeat)")
    ll = sub.add_parser("llamacpp")
    ll.add_argument("--gguf", required=True)
    po = sub.add_parser("policies")
    po.add_argument("--bundle", required=True)
    po.add_argument("--policies", default="myopic,lookahead,current")
    po.add_argument("--tasks", default="math,code,chat,summarisation,code_edit")
    po.add_argument("--per-task", type=int, default=2)
    po.add_argument("--max-new-tokens", type=int, default=64)
    for q in (d, ll, po):
        q.add_argument("--threads", type=int, nargs="+", default=[2])
        q.add_argument("--rounds", type=int, default=25)
    a = p.parse_args(argv)
    load_start = os.getloadavg()
    run = {"drafters": cmd_drafters, "llamacpp": cmd_llamacpp, "policies": cmd_policies}
    result = run[a.probe](a)
    data = {"probe": a.probe, "meta": run_meta(threads=a.threads[0], load_avg_start=load_start),
            "result": result}  # fmt: skip
    write_report(OUT / a.probe, data, markdown=_markdown)
    print(_markdown(data))


if __name__ == "__main__":
    main()
