"""What a shallower drafter would cost per call: a drafter's fused int8 graph cut to N layers.

Issue 26: once the 1.5B target's call fell to ~38 ms (int8 weights, u8 x s8), SmolLM2-135M's
~5.5 ms call is 0.15 of it. This measures what depth costs: the drafter (``--weights``, a
Hugging Face folder such as ``kd_drafter``'s ``drafter-hf``, or the preset's own weights) is
truncated to its first N blocks (``reference.truncate.truncate_layers``), each exported as the
bundle's fused ``int8`` graph (``exporters.onnx.fused``), and a 1-token call after a 120-token
prefill is timed, the graphs interleaved call by call on the same cores (``Spin.IN_CALL``, as
the runtime opens them). Speed only: a truncated drafter would have to be distilled again, and
its acceptance is not measured here.

    python -m benchmarks.drafter_depth --weights .bench/kd/q15e/drafter-hf --layers 30,20,15,10

Writes ``reports/drafter_depth/<name>.{json,md}`` (command, revision, machine, load average).
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.common.timer import interleaved

OUT = Path("reports/drafter_depth")
PREFILL = 120


def _graphs(a: argparse.Namespace, depths: list[int]) -> dict[int, Any]:
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.fused import build_graph

    from omnidraft_deploy.bundle import graph_contract as gc
    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.host.onnx_host import Spin, cpu_session
    from omnidraft_deploy.reference.truncate import truncate_layers
    from omnidraft_deploy.resolve.load import load_model

    spec = get_preset(a.preset)
    full = load_model(spec, max_seq_len=a.max_seq_len, weights=a.weights)
    out = {}
    for n in depths:
        model = (
            full if n == full.args.n_layers else truncate_layers(full, n, max_seq_len=a.max_seq_len)
        )
        with torch.no_grad():
            data = build_graph(model, get_recipe("onnx", "int8")).SerializeToString()
        info = graph_info(model, spec, file="drafter.onnx", quantization="int8", seq_len=None)
        session = cpu_session(data, threads=a.threads, spinning=Spin.IN_CALL)
        out[n] = gc.ExplicitCacheGraph(session, info)
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    from omnidraft_deploy.bundle import graph_contract as gc

    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    depths = [int(x) for x in a.layers.split(",")]
    graphs = _graphs(a, depths)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 40000, size=(1, PREFILL))
    for g in graphs.values():
        g.run(prompt, gc.contiguous_positions(0, PREFILL), rows=1)

    def call(g: Any) -> float:
        token = rng.integers(100, 40000, size=(1, 1))
        t0 = time.perf_counter()
        g.run(token, gc.contiguous_positions(PREFILL, 1), rows=1)
        return 1e3 * (time.perf_counter() - t0)

    # interleaved: every depth sees the same machine state
    times = interleaved({n: partial(call, g) for n, g in graphs.items()}, a.reps)
    rows = [{"layers": n, "ms_t1": round(float(np.median(v)), 2)} for n, v in times.items()]
    meta = run_meta(threads=a.threads, load_avg_start=load0)
    return {"meta": meta, "weights": a.weights or a.preset, "prefill": PREFILL, "rows": rows}


def to_markdown(r: dict[str, Any]) -> str:
    lines = [f"# Drafter call vs depth: {r['weights']}", "", *meta_lines(r["meta"]),
             f"One-token call after a {r['prefill']}-token prefill, fused int8 graph, median.", "",
             "| layers | ms a call |", "|---|---|"]  # fmt: skip
    lines += [f"| {row['layers']} | {row['ms_t1']} |" for row in r["rows"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--weights", default=None, help="a Hugging Face folder (else the preset's)")
    p.add_argument("--layers", default="30,20,15,10")
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--name", default="drafter_depth")
    a = p.parse_args()
    write_report(OUT / a.name, run(a), markdown=to_markdown)
    print(OUT / f"{a.name}.md")


if __name__ == "__main__":
    main()
