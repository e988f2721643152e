"""Q4_K's float minimum in MatMulNBits: three forms on real GGUF tensors, error and speed.

A Q4_K block is ``w = scale * q - minimum``. MatMulNBits (4-bit, blocks of 32) computes
``scale * (q - zp)``; the forms compared, on the tensors of Qwen2.5-Coder-1.5B's Q4_K_M GGUF:

- ``table`` (recipe ``gguf4``): default zero point 8, plus the exact ``8 * scale - minimum`` per
  block as block sums of x times an ``(n_blocks, N)`` table (``exporters.onnx.gguf_grid``);
- ``float_zp``: zero points of the scales' type, ``minimum / scale`` (exact up to one division);
- ``uint8_zp``: integer zero points, ``round(minimum / scale)`` clipped to 0..15, packed 4-bit.

And Q6_K at 8 bits: its exact blocks of 16 (``q6k_block16``) against blocks of 32 rounded from
them (``q6k_rounded_block32``, what ``gguf4`` ships), on a down_proj and the output head.

Error: max and RMS of ``y - x @ w.T`` relative to the RMS of ``x @ w.T`` (float64 on the GGUF's
dequantised weights), x from a fixed normal draw. Speed: median ms per call, T = 1 and T = 5,
``--threads`` intra-op threads. Run with every other process paused:

    PYTHONPATH=$PWD python -m benchmarks.gguf_zero_points --threads 2 --out reports/quant_gguf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from omnidraft_deploy.exporters.onnx.fused import MS, GraphWriter
from omnidraft_deploy.exporters.onnx.gguf_grid import grid_linear
from omnidraft_deploy.exporters.quant.gguf_grid import READERS, Grid, rounded8, tensor_grid

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.catalog.assets import asset_path

TENSORS = ("blk.5.attn_q.weight", "blk.5.ffn_gate.weight")
Q6_TENSORS = ("blk.0.ffn_down.weight", "output.weight")  # Q6_K: 8-bit blocks of 16 vs 32


def _model(g: GraphWriter, out: str, k: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    g.model.graph.node.extend(g.nodes)
    g.model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", k]))
    g.model.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    g.model.ir_version = onnx.IR_VERSION
    g.model.opset_import.extend([helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    return bytes(g.model.SerializeToString())


def zp_graph(grid: Grid, integer: bool) -> bytes:
    """MatMulNBits with zero points (float ``minimum / scale`` or its rounded uint8)."""
    n, k = grid.codes.shape
    scale, minimum = grid.scales(), grid.minimums()
    zp = minimum / scale
    g = GraphWriter(4, 32)
    if integer:
        z = np.clip(np.round(zp), 0, 15).astype(np.uint8)
        z = np.pad(z, ((0, 0), (0, z.shape[1] % 2)))
        zp_in = g.const("zp", np.ascontiguousarray(z[:, 0::2] | (z[:, 1::2] << 4)))
    else:
        zp_in = g.const("zp", zp.astype(np.float32).reshape(-1))
    ins = ["x", g.const("q", grid.packed()), g.const("s", scale.reshape(-1)), zp_in]
    g.node("MatMulNBits", ins, ["y"], K=k, N=n, bits=4, block_size=32, accuracy_level=4)
    return _model(g, "y", k)


def table_graph(grid: Grid) -> bytes:
    g = GraphWriter(4, 32)
    return _model(g, grid_linear(g, "w", "x", [grid]), grid.codes.shape[1])


def measure(model: bytes, x: np.ndarray, ref: np.ndarray, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": x})[0].astype(np.float64)
    rms = float(np.sqrt((ref**2).mean()))
    out: dict[str, Any] = {"max_rel_err": float(np.abs(y - ref).max()) / rms,
                           "rms_rel_err": float(np.sqrt(((y - ref) ** 2).mean())) / rms}  # fmt: skip
    one = sess.run(None, {"x": x[:, 1:2]})[0]
    out["row_invariant"] = bool(np.array_equal(one[0, 0], y[0, 1].astype(np.float32)))
    for t in (1, 5):
        xt = x[:, :t]
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            sess.run(None, {"x": xt})
            times.append(time.perf_counter() - t0)
        out[f"ms_T{t}"] = statistics.median(times[5:]) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--out", type=Path, default=Path("reports/local"))
    args = ap.parse_args()
    import gguf

    path = asset_path("qwen2.5-1.5b-gguf")
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    rows: list[dict[str, Any]] = []
    for name in TENSORS:
        grid = tensor_grid(tensors[name])
        n, k = grid.codes.shape
        x = np.random.default_rng(0).standard_normal((1, 5, k)).astype(np.float32)
        ref = x.astype(np.float64) @ grid.dequantize().astype(np.float64).T
        forms = {"table": table_graph(grid), "float_zp": zp_graph(grid, False),
                 "uint8_zp": zp_graph(grid, True)}  # fmt: skip
        for form, model in forms.items():
            rows.append({"tensor": name, "N": n, "K": k, "form": form,
                         **measure(model, x, ref, args.threads)})  # fmt: skip
            print(rows[-1], flush=True)
    for name in Q6_TENSORS:  # exact blocks of 16 against blocks of 32 rounded from them
        exact = READERS["Q6_K"](np.asarray(tensors[name].data))
        n, k = exact.codes.shape
        x = np.random.default_rng(0).standard_normal((1, 5, k)).astype(np.float32)
        ref = (x @ exact.dequantize().T).astype(np.float64)  # fp32: the head is 151936 x 1536
        for form, grid in (
            ("q6k_block16", exact),
            ("q6k_rounded_block32", rounded8(exact.dequantize(), "Q6_K")),
        ):
            rows.append({"tensor": name, "N": n, "K": k, "form": form,
                         **measure(table_graph(grid), x, ref, args.threads)})  # fmt: skip
            print(rows[-1], flush=True)
    doc = {"rows": rows, "threads": args.threads, "load_avg": os.getloadavg(),
           "gguf": path.name, "onnxruntime": __import__("onnxruntime").__version__}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "zero_points.json", json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
