"""What one weight matmul costs on ONNX Runtime's (or XNNPACK's) CPU kernels as the row count T grows.

    .venv/bin/python -m benchmarks.matmul_kernels [--threads 2] [--out reports/matmul_kernels/matmul_kernels.json]
    .venv/bin/python -m benchmarks.matmul_kernels --executorch --out reports/matmul_kernels/matmul_kernels_xnnpack.json

Verification feeds T = 1 + proposals rows where decoding feeds 1, so a kernel's cost per extra row
is the verification-width term of the cost model. Each single-node graph multiplies (1, T, K) by a
Qwen2.5-0.5B weight shape: gate|up 896x9728, down 4864x896, lm_head 896x151936, as

- ``nbits8`` / ``nbits4``: ``MatMulNBits`` at accuracy level 4 (blockwise int8 activations), the
  ``int8`` / ``int4`` recipes;
- ``w8a8``: the ``w8a8`` recipe's ``MatMulInteger`` with per-row int8 activations
  (``onnx_fused.GraphWriter.linear_rows``, the same nodes);
- ``fp32``: ``MatMul``.

``--executorch``: a one-linear ``.pte`` (T dynamic, lowered by ExecuTorch's XNNPACK
partitioner, run through its runtime) of each Qwen2.5-1.5B shape (q|o 1536x1536, gate|up
1536x8960, down 8960x1536), as the XNNPACK recipes hold it:

- ``qb4w``: ``gguf4``'s 4-bit form (``eager_quant.Int4GroupLinear``: XNNPACK's blockwise int4
  GEMM on int8 per-token activations, groups of 32, plus the fp32 group-constant matmul);
- ``qc8w``: ``gguf8``'s and the lm_head's torchao 8da8w (int8 per output channel);
- ``fp32``: the plain linear.

Rows are timed round-robin over (kernel, T) (``common.timer.interleaved``), medians of ``--reps``
rounds; the load average is recorded beside them (the ``.md`` is rendered from the JSON by
``render_reports.matmul_kernels_md``).
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
from omnidraft_deploy.exporters.onnx.fused import GraphWriter

from benchmarks.common.report import run_meta, write_report
from benchmarks.common.timer import interleaved
from benchmarks.render_reports import matmul_kernels_md
from omnidraft_deploy.host.profile import ort_session

SHAPES = {"gate_up": (896, 9728), "down": (4864, 896), "lm_head": (896, 151936)}
KERNELS = {"nbits8": (8, False), "nbits4": (4, False), "w8a8": (8, True), "fp32": (0, False)}
XNN_SHAPES = {"q_o": (1536, 1536), "gate_up": (1536, 8960), "down": (8960, 1536)}
XNN_KERNELS = ("qb4w", "qc8w", "fp32")


def one_matmul(kernel: str, k: int, n: int, path: Path) -> Path:
    """A graph ``y = x @ W`` (``x (1, T, k)``) written by the exporter's own ``GraphWriter``."""
    import onnx
    from onnx import TensorProto, helper

    bits, rows = KERNELS[kernel]
    g = GraphWriter(bits, 32, act_rows=rows)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02
    out = g.linear("w", "x", w)
    g.node("Identity", [out], ["y"])
    graph = g.model.graph
    graph.node.extend(g.nodes)
    graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", k]))
    graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    g.model.ir_version = onnx.IR_VERSION
    g.model.opset_import.extend(
        [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save(g.model, str(path))
    return path


def one_pte(kernel: str, k: int, n: int, path: Path) -> Path:
    """A ``.pte`` of ``y = linear(x)`` (``x (1, T, k)``, T dynamic up to 16) as ``kernel`` holds
    the weight (module docstring), lowered to XNNPACK."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from omnidraft_deploy.exporters.xnnpack.eager_quant import Int4GroupLinear, torchao_8da
    from torch import nn

    linear = nn.Linear(k, n, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02)
    held: nn.Module = linear
    if kernel == "qb4w":
        held = Int4GroupLinear.from_float(linear, 32)
    elif kernel == "qc8w":
        held = torchao_8da(linear, bits=8)
    t = torch.export.Dim("t", min=1, max=16)
    ep = torch.export.export(nn.Sequential(held).eval(), (torch.randn(1, 4, k),),
                             dynamic_shapes=({1: t},))  # fmt: skip
    program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(program.buffer)
    return path


def xnnpack_calls(work: Path, threads: int) -> dict[tuple[str, str], Any]:
    """(kernel, shape) -> ``call(t)``: ms of one ``forward`` of a (1, t, k) input (the mean of 10
    after a warm one)."""
    from executorch.extension.pybindings import portable_lib

    from omnidraft_deploy.optional import executorch_runtime

    executorch_runtime()
    portable_lib._unsafe_reset_threadpool(threads)

    def timer(module: Any, k: int) -> Any:
        def call(t: int) -> float:
            x = (torch.randn(1, t, k),)
            module.forward(x)
            t0 = time.perf_counter()
            for _ in range(10):
                module.forward(x)
            return (time.perf_counter() - t0) * 100

        return call

    return {(kern, shape): timer(portable_lib._load_for_executorch(
                str(one_pte(kern, k, n, work / f"{kern}-{shape}.pte"))), k)
            for kern in XNN_KERNELS for shape, (k, n) in XNN_SHAPES.items()}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--executorch", action="store_true",
                    help="XNNPACK .pte kernels (ExecuTorch) instead of ONNX Runtime's")  # fmt: skip
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("reports/matmul_kernels/matmul_kernels.json"))
    ap.add_argument("--work", type=Path, default=Path(".bench/matmul_kernels"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = [int(t) for t in a.rows.split(",")]
    load0 = os.getloadavg()
    if a.executorch:
        calls = xnnpack_calls(a.work, a.threads)
        times = interleaved({(kern, shape, t): partial(call, t) for t in rows
                             for (kern, shape), call in calls.items()}, a.reps)  # fmt: skip
        kernels, shapes = XNN_KERNELS, tuple(XNN_SHAPES)
    else:
        times = ort_times(a.work, a.threads, rows, a.reps)
        kernels, shapes = tuple(KERNELS), tuple(SHAPES)
    meta = run_meta(threads=a.threads, load_avg_start=load0)
    result: dict[str, Any] = {"meta": meta, "threads": a.threads, "load_avg_start": load0,
                              "load_avg_end": meta["load_avg_end"],
                              "runtime": "executorch" if a.executorch else "onnxruntime",
                              "ms": {}}  # fmt: skip
    print(f"{'kernel':8} {'shape':8} " + " ".join(f"T={t:<6}" for t in rows) + "  (ms, median)")
    for kern in kernels:
        for shape in shapes:
            ms = {t: float(np.median(times[kern, shape, t])) for t in rows}
            result["ms"][f"{kern}/{shape}"] = ms
            print(f"{kern:8} {shape:8} " + " ".join(f"{ms[t]:<8.3f}" for t in rows))
    print(f"load average {load0} -> {result['load_avg_end']}")
    write_report(a.out.with_suffix(""), result, markdown=lambda d: matmul_kernels_md(d, a.out))


def ort_times(work: Path, threads: int, rows: list[int], reps: int) -> dict[Any, list[float]]:
    """(kernel, shape, T) -> ms per round of the ONNX Runtime single-node graphs."""
    sessions = {(kern, shape): ort_session(one_matmul(kern, k, n, work / f"{kern}-{shape}.onnx"),
                                           threads=threads)
                for kern in KERNELS for shape, (k, n) in SHAPES.items()}  # fmt: skip
    rng = np.random.default_rng(0)

    def call(sess: Any, t: int, k: int) -> float:
        """ms of one call: the mean of 10 after a warm one, on fresh random rows."""
        x = {"x": rng.standard_normal((1, t, k)).astype(np.float32)}
        sess.run(None, x)
        t0 = time.perf_counter()
        for _ in range(10):
            sess.run(None, x)
        return (time.perf_counter() - t0) * 100

    return interleaved({(kern, shape, t): partial(call, sess, t, SHAPES[shape][0]) for t in rows
                        for (kern, shape), sess in sessions.items()}, reps)  # fmt: skip


if __name__ == "__main__":
    main()
