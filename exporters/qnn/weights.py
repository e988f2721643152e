"""Per-channel 8-bit weights for QNN graphs: Gemm instead of MatMul, GPTQ codes pinned.

ONNX Runtime's QNN quantiser gives ``MatMul`` weights one scale per *tensor* ("QNN does not
support per-channel MatMul", ``get_qnn_qdq_config``), which is what the earlier QNN graphs held;
``Gemm`` (the HTP's FullyConnected) takes one scale per output channel and compiles on the HTP
with CPU fallback disabled (toy graph; 16-bit MatMul weights are refused there). So every weight
MatMul becomes ``Reshape -> Gemm(transB) -> Reshape`` (``matmuls_to_gemm``).
Round-to-nearest on that grid costs SmolLM2-135M most of its top-1 (eager, sinked, uint16
activations: 0.926; weights alone 0.933), because its Q4_1 weights vary block by block along a
row. GPTQ on the same grid (``gptq.gptq_per_channel``, Hessians from held-out text through the
sinked model, so the first token's massive activations do not weigh in) keeps 0.961.

ONNX Runtime's QDQ quantiser recomputes each channel's grid from the values it is given, and a
GPTQ'd row does not always reach the codes 0 and 255 of its own grid (23 % of the values moved
when it re-rounded them: top-1 0.949). So the grids are recorded per row (keyed by the row's
bytes) and written back over the quantiser's codes, scales and zero points (``pin_grids``): the
QDQ graph holds exactly the GPTQ codes, the lm_head's vocabulary chunks included.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np
import torch
from omnidraft_deploy.exporters.qnn.lm_head import drop_unused_initializers
from omnidraft_deploy.exporters.quant.gptq import gptq_per_channel, input_hessians
from torch import nn

from omnidraft_deploy.host.threads import FreeCoreThreads

log = logging.getLogger(__name__)
KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
Grids = dict[bytes, tuple[float, int]]  # row bytes digest -> (scale, zero point)


def matmuls_to_gemm(proto: Any) -> int:
    """Rewrite every ``MatMul(x (1, T, K), W (K, N) initializer)`` of ``proto`` in place as
    ``Reshape(x, (-1, K)) -> Gemm(., W.T (N, K), transB=1) -> Reshape(1, -1, N)`` (the same
    function; per-channel weights on axis 0); returns how many were rewritten."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    out, done, added = [], 0, []
    for node in proto.graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if w is None or len(w.dims) != 2:
            out.append(node)
            continue
        k, n = w.dims
        name, y = node.input[1], node.output[0]
        added += [
            numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(w).T), f"{name}.nk"),
            numpy_helper.from_array(np.array([-1, k], np.int64), f"{y}/rows_shape"),
            numpy_helper.from_array(np.array([1, -1, n], np.int64), f"{y}/out_shape"),
        ]
        out += [
            helper.make_node("Reshape", [node.input[0], f"{y}/rows_shape"], [f"{y}/rows"]),
            helper.make_node("Gemm", [f"{y}/rows", f"{name}.nk"], [f"{y}/gemm"], transB=1,
                             name=f"{node.name or y}_gemm"),
            helper.make_node("Reshape", [f"{y}/gemm", f"{y}/out_shape"], [y]),
        ]  # fmt: skip
        done += 1
    del proto.graph.node[:]
    proto.graph.node.extend(out)
    proto.graph.initializer.extend(added)
    drop_unused_initializers(proto)
    return done


def _key(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row, np.float32).tobytes(), digest_size=16).digest()


@torch.no_grad()
def gptq_linears(model: nn.Module, prompts: list[list[int]]) -> Grids:
    """Replace every body linear and the lm_head of ``model`` (in place; a tied head is untied)
    by its GPTQ'd per-channel uint8 values; returns each row's grid for ``pin_grids``."""
    hess = input_hessians(model, prompts, KINDS)
    modules = dict(model.named_modules())
    grids: Grids = {}
    with FreeCoreThreads() as threads:
        for name, h in hess.items():
            threads.adjust()
            lin = modules[name]
            assert isinstance(lin, nn.Linear)
            codes, scale, zp = gptq_per_channel(lin.weight.detach().float(), h)
            w = (codes - zp[:, None]) * scale[:, None]
            lin.weight = nn.Parameter(w, requires_grad=False)
            for row, s, z in zip(w.numpy(), scale.tolist(), zp.tolist(), strict=True):
                grids[_key(row)] = (s, int(z))
    log.info("GPTQ: %d linears, %d rows on fixed per-channel grids", len(hess), len(grids))
    return grids


def pin_grids(qdq: Any, fp32: Any, grids: Grids) -> int:
    """Overwrite the quantiser's uint8 codes / scales / zero points of every per-channel weight
    ``DequantizeLinear`` in ``qdq`` whose float rows (from ``fp32``) have a recorded grid;
    returns how many channels were pinned."""
    from onnx import numpy_helper

    floats = {t.name: t for t in fp32.graph.initializer}
    inits = {t.name: t for t in qdq.graph.initializer}
    pinned = 0
    for node in qdq.graph.node:
        q_name = node.input[0] if node.op_type == "DequantizeLinear" else ""
        base = q_name.removesuffix("_quantized")
        if base == q_name or base not in floats or len(node.input) < 3:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if len(floats[base].dims) != 2:  # matmul weights only (not biases, norms, gathers)
            continue
        w = np.moveaxis(numpy_helper.to_array(floats[base]), axis, 0)  # (channels, ...)
        codes = np.moveaxis(numpy_helper.to_array(inits[q_name]), axis, 0).copy()
        scale = numpy_helper.to_array(inits[node.input[1]]).copy()
        zp = numpy_helper.to_array(inits[node.input[2]]).copy()
        if scale.ndim != 1 or len(scale) != len(w) or codes.dtype != np.uint8:
            continue
        hit = 0
        for c in range(len(w)):
            grid = grids.get(_key(w[c].reshape(-1)))
            if grid is None:
                continue
            s, z = grid
            codes[c] = np.clip(np.round(w[c] / np.float32(s) + z), 0, 255).astype(np.uint8)
            scale[c], zp[c] = s, z
            hit += 1
        if hit:
            for name, arr in ((q_name, np.moveaxis(codes, 0, axis)), (node.input[1], scale),
                              (node.input[2], zp)):  # fmt: skip
                inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr), name))
            pinned += hit
    return pinned
