"""Probe: what a Qwen2.5-Coder-1.5B layer costs in a ``.pte`` per attention kernel, by context.

    python -m benchmarks.probes.attention_layer --recipes fp32,8da4w --threads 1

One random-weight layer of the 1.5B's shape (dim 1536, 12 query / 2 KV heads of 128, FFN 8960,
4,096 KV slots; a 512-id vocabulary so the lm_head is negligible) is exported per attention kernel
(``none``: the reference model's functional cache writes, the path before issue 44; ``span`` and
``custom_sdpa``: ``exporters.xnnpack.llm_attention``) and recipe. Per context (64, 512, 4,000):
the median of 16 one-token calls, one 8-token verify call after a warm-up of that width, and
whether the verify call's rows equal eight 1-token calls' bit for bit (what greedy speculative ==
target-only needs). A row holds the call's fixed costs too (embedding, RoPE tables, the
(T, S) mask, the head), so it is not a 28th of a model's call: compare kernels, not totals. Writes
``reports/xnnpack_llm/attention_layer.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.report import meta_lines, run_meta, write_report

WORK, OUT = Path(".bench/attention_layer"), Path("reports/xnnpack_llm")
CONTEXTS = (64, 512, 4000)


def layer_pte(kernel: str, recipe: str) -> Path:
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import Source, get_preset
    from omnidraft_deploy.resolve.load import load_model

    path = WORK / f"layer-{kernel}-{recipe}.pte"
    if not path.exists():
        spec = dataclasses.replace(get_preset("qwen2.5-1.5b"), n_layers=1, vocab_size=512,
                                   source=Source.RANDOM)  # fmt: skip
        WORK.mkdir(parents=True, exist_ok=True)
        export_pte(load_model(spec, max_seq_len=4096), path, recipe=get_recipe("xnnpack", recipe),
                   eos_ids=(2,), attention=None if kernel == "none" else kernel)  # fmt: skip
    return path


def measure(path: Path, context: int) -> dict[str, Any]:
    from omnidraft_deploy.bundle import graph_contract as gc
    from omnidraft_deploy.optional import pte_program

    method = pte_program(path).load_method(gc.PTE_FORWARD)

    def call(ids: list[int], start: int) -> np.ndarray:
        return gc.pte_step(method, np.array([ids], np.int64), gc.contiguous_positions(start, len(ids)))

    call([5 + (i * 37) % 300 for i in range(context)], 0)
    tail = [7 + i for i in range(8)]
    one, rows = [], []
    for i, tok in enumerate(tail):
        t0 = time.perf_counter()
        rows.append(call([tok], context + i)[0])
        one.append(time.perf_counter() - t0)
    one += [_timed(call, [7], context + 8 + i) for i in range(8)]
    call(tail, context)  # the 8-wide shape once (XNNPACK re-plans on a new shape)
    t0 = time.perf_counter()
    verify = call(tail, context)
    verify_s = time.perf_counter() - t0
    return {"one_token_ms": 1e3 * statistics.median(one), "verify8_ms": 1e3 * verify_s,
            "rows_bitwise_equal": bool(np.array_equal(np.stack(rows), verify)),
            "max_row_diff": float(np.abs(np.stack(rows) - verify).max()),
            "load_avg_1m": os.getloadavg()[0]}  # fmt: skip


def _timed(call: Any, ids: list[int], start: int) -> float:
    t0 = time.perf_counter()
    call(ids, start)
    return time.perf_counter() - t0


def markdown(data: dict[str, Any]) -> str:
    lines = ["# One Qwen2.5-Coder-1.5B layer as a .pte, per attention kernel", "",
             *meta_lines(data["meta"]),
             "| recipe | kernel | context | 1-token ms | 8-token verify ms | rows bitwise | load |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in data["rows"]:
        lines.append(f"| {r['recipe']} | {r['kernel']} | {r['context']} | {r['one_token_ms']:.2f} "
                     f"| {r['verify8_ms']:.2f} | {r['rows_bitwise_equal']} "
                     f"({r['max_row_diff']:.1e}) | {r['load_avg_1m']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default="fp32,8da4w")
    ap.add_argument("--kernels", default="none,span,custom_sdpa")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(a.threads)
    load0, rows = os.getloadavg(), []
    for recipe in a.recipes.split(","):
        paths = {k: layer_pte(k, recipe) for k in a.kernels.split(",")}
        for context in CONTEXTS:  # kernels interleaved per context
            for kernel, path in paths.items():
                rows.append({"recipe": recipe, "kernel": kernel, "context": context}
                            | measure(path, context))  # fmt: skip
                print(rows[-1], flush=True)
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "rows": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    print(write_report(OUT / "attention_layer", payload, markdown=markdown))


if __name__ == "__main__":
    main()
