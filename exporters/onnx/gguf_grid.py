"""Recipe ``gguf4``: the fused ONNX graph with every weight on its own GGUF grid.

Prepare: each weight of the preset's GGUF is read as it is stored (``quant.gguf_grid``: Q4_K /
Q4_0 / Q4_1 stay 4-bit with their float minimums, Q6_K and Q8_0 become exact 8-bit blocks, other
types are rounded to 8 bits) and checked against the eager model (the export's reference, the
same GGUF dequantised): a file that does not match the model is refused, naming the tensor.
Export (``fused.GraphWriter`` calls ``grid_linear`` / ``grid_embedding`` for the names it holds):

- a matmul is ``MatMulNBits`` on the GGUF's own codes (``accuracy_level`` 4), one node per run of
  parts sharing a width and block (a fused q|k|v whose v is Q6_K is q|k at 4 bits + v at 8 bits,
  concatenated), plus, at 4 bits, the float minimums as block sums times a table (as the int4
  recipe adds its offsets, ``GraphWriter.block_offsets``): exact; with one zero row appended
  (``ROW_PAD``), as ONNX Runtime's 4-bit kernel gives 1-row calls other bits than T-row calls;
- the scales and minimums are stored as the GGUF stores them (fp16 per super-block times a small
  integer per block) and multiplied out by graph nodes on constants, which ONNX Runtime folds when
  the session loads (and then prepacks: 1.5 ms a gate call, 42 ms unfolded): the file stays the
  GGUF's size, the kernel sees exact fp32 scales;
- the embedding (Q4_K in Qwen2.5-Coder-1.5B's Q4_K_M) is gathered as packed codes and dequantised
  per token in the graph (the fp32 table would be 0.9 GB of a 1.5B);
- gate|up's outlier input channels (``exporters.quant.outliers``, passed as ``outliers``) leave
  its int8 activation blocks for an exact fp32 side matmul (``_split``): without it the 1.5B's
  export is refused on an AVX-512 VNNI CPU (reports/quant_gguf).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from omnidraft_deploy.exporters.quant.gguf_grid import LINEARS, Grid, checked_grid

from omnidraft_deploy.reference.model import Transformer


class GraphWriter(Protocol):
    """What this module needs of ``fused.GraphWriter`` (which imports this module)."""

    def const(self, name: str, value: Any) -> str: ...
    def shared(self, name: str, value: np.ndarray) -> str: ...
    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> list[str]: ...


log = logging.getLogger(__name__)
# ONNX Runtime 1.32's 4-bit MatMulNBits (accuracy level 4) sums a 1-row call in another order
# than any call of 2 or more rows, which agree bit for bit with each other (measured on the 1.5B's
# Q4_K gate: reports/quant_gguf). So every 4-bit matmul takes one zero row more and drops its
# output: decode (T = 1) and verification (T = k + 1) rows are then the same bits, and greedy
# speculative output is target-only output. The 8-bit kernel needs no pad (invariant as it is).
ROW_PAD = 1
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations per block, integer dot products
_PARTS = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
          "gate_up": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}  # fmt: skip


def gguf_grids(model: Transformer, gguf: Path) -> dict[str, list[Grid]]:
    """Graph name (``fused``'s: ``layers.<i>.qkv_proj``, ``lm_head``, ``embed_tokens``) -> its
    parts' grids, read one tensor at a time from ``gguf`` and each checked against ``model``."""
    import gguf as gguf_py

    reader = gguf_py.GGUFReader(str(gguf))
    tensors = {t.name: t for t in reader.tensors}
    eager = dict(model.named_parameters(remove_duplicate=False))  # a tied head too
    wanted: dict[str, list[tuple[str, str]]] = {}
    for i in range(model.args.n_layers):
        for fused, parts in _PARTS.items():
            wanted[f"layers.{i}.{fused}"] = [
                (f"blk.{i}.{p}.weight", f"model.layers.{i}.{LINEARS[p]}.weight") for p in parts
            ]
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    wanted["lm_head"] = [(head, "lm_head.weight")]
    wanted["embed_tokens"] = [("token_embd.weight", "model.embed_tokens.weight")]
    heads = {"attn_q": model.args.n_heads, "attn_k": model.args.n_kv_heads}
    out: dict[str, list[Grid]] = {}
    for name, pairs in wanted.items():
        out[name] = []
        for key, param in pairs:
            if key not in tensors:
                raise ValueError(f"{gguf}: no tensor {key!r} for {name} (is it this model's GGUF?)")
            n_heads = heads.get(key.split(".")[-2], 0)
            out[name].append(
                checked_grid(tensors[key], eager[param].detach().numpy(), gguf, n_heads)
            )
    return out


def share_at_4_bits(grids: dict[str, list[Grid]]) -> dict[str, int]:
    """Body weight matrices and graph matmuls at 4 bits (and of how many): the report's figures."""
    body = [g for name, gs in grids.items() if name.startswith("layers.") for g in gs]
    nodes = [_runs(gs) for name, gs in grids.items() if name.startswith("layers.")]
    flat = [r[0].bits for runs in nodes for r in runs]
    params = sum(g.codes.size for g in body)
    return {"matrices_4bit": sum(g.bits == 4 for g in body), "matrices": len(body),
            "matmuls_4bit": flat.count(4), "matmuls": len(flat),
            "params_4bit": sum(g.codes.size for g in body if g.bits == 4), "params": params}  # fmt: skip


def _runs(parts: list[Grid]) -> list[list[Grid]]:
    """Consecutive parts sharing (bits, block, scale grouping): one MatMulNBits each."""
    runs: list[list[Grid]] = []
    for p in parts:
        last = runs[-1][0] if runs else None
        if last is not None and (last.bits, last.block, last.per) == (p.bits, p.block, p.per):
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _stack(run: list[Grid]) -> Grid:
    if len(run) == 1:
        return run[0]

    def cat(field: str) -> np.ndarray | None:
        arrays = [getattr(p, field) for p in run]
        return None if arrays[0] is None else np.concatenate(arrays)

    first = run[0]
    return Grid(first.bits, first.block, cat("codes"), cat("scale_hi"), cat("scale_lo"),  # type: ignore[arg-type]
                cat("min_hi"), cat("min_lo"), "+".join(p.source for p in run))  # fmt: skip


def _folded(g: GraphWriter, name: str, hi: np.ndarray, lo: np.ndarray) -> str:
    """``(N, n_blocks)`` fp32 ``hi[:, b // per] * lo[:, b]`` as nodes on constants (folded by
    ONNX Runtime when the session loads; exact for fp16 x small integers)."""
    n, n_hi = hi.shape
    per = lo.shape[1] // n_hi
    g.node("Cast", [g.const(f"{name}_hi", hi)], [f"{name}/hi"], to=1)
    g.node("Cast", [g.const(f"{name}_lo", lo)], [f"{name}/lo"], to=1)
    g.node("Reshape", [f"{name}/hi", g.const(f"{name}/hi_shape", np.array([n, n_hi, 1]))],
           [f"{name}/hi3"])  # fmt: skip
    g.node("Reshape", [f"{name}/lo", g.const(f"{name}/lo_shape", np.array([n, n_hi, per]))],
           [f"{name}/lo3"])  # fmt: skip
    g.node("Mul", [f"{name}/hi3", f"{name}/lo3"], [f"{name}/prod"])
    shape = np.array([n, n_hi * per], np.int64)
    g.node("Reshape", [f"{name}/prod", g.const(f"{name}/shape", shape)], [name])
    return name


def _matmul(g: GraphWriter, name: str, x: str, grid: Grid) -> str:
    """``x (1, T, K) @ w.T`` for one run: MatMulNBits, plus the minimums' term at 4 bits."""
    n, k = grid.codes.shape
    if grid.bits == 4:  # one zero row more: never a 1-row call (``ROW_PAD``)
        pad = g.shared(f"grid/zero_row{k}", np.zeros((1, 1, k), np.float32))
        g.node("Concat", [x, pad], [x := f"{name}/padded"], axis=1)
    scales = _folded(g, f"{name}.scales", grid.scale_hi, grid.scale_lo)
    g.node("Reshape", [scales, g.shared("grid/flat", np.array([-1], np.int64))], [f"{scales}/1d"])
    ins = [x, g.const(f"{name}.qweight", grid.packed()), f"{scales}/1d"]
    out = f"{name}/nbits"
    g.node("MatMulNBits", ins, [out], K=k, N=n, bits=grid.bits, block_size=grid.block,
           accuracy_level=ACCURACY_LEVEL)  # fmt: skip
    if grid.bits == 8:
        return out
    assert grid.min_hi is not None and grid.min_lo is not None
    # w = scale * q - minimum = scale * (q - 8) + (8 * scale - minimum): MatMulNBits holds the
    # first term (its default zero point 8), the second is a constant per block
    mins = _folded(g, f"{name}.minimums", grid.min_hi, grid.min_lo)
    g.node("Mul", [scales, g.shared("grid/eight", np.array(8.0, np.float32))], [f"{name}/s8"])
    g.node("Sub", [f"{name}/s8", mins], [f"{name}/const"])
    g.node("Transpose", [f"{name}/const"], [f"{name}/table"], perm=[1, 0])  # (n_blocks, N)
    nb = k // grid.block
    shape = g.shared(f"blocks/shape{nb}", np.array([1, -1, nb, grid.block], np.int64))
    g.node("Reshape", [x, shape], [f"{name}/split"])
    last = g.shared("rows/last_axis", np.array([-1], np.int64))
    g.node("ReduceSum", [f"{name}/split", last], [f"{name}/sums"], keepdims=0)
    g.node("MatMul", [f"{name}/sums", f"{name}/table"], [f"{name}/offsets"])
    g.node("Add", [out, f"{name}/offsets"], [f"{name}/sum"])
    ends = g.shared("grid/drop_last", np.array([-1], np.int64))
    g.node("Slice", [f"{name}/sum", g.shared("grid/zero", np.array([0], np.int64)), ends,
                     g.shared("grid/axis1", np.array([1], np.int64))], [f"{name}/out"])  # fmt: skip
    return f"{name}/out"


def grid_linear(
    g: GraphWriter, name: str, x: str, parts: list[Grid], outliers: np.ndarray | None = None
) -> str:
    """``x @ cat(parts).T``: one ``_matmul`` per run of alike parts, concatenated. ``outliers``:
    input channels taken out of the int8-activation path (``_split``)."""
    if outliers is not None and len(outliers):
        return _split(g, name, x, parts, np.asarray(outliers, np.int64))
    runs = [_stack(r) for r in _runs(parts)]
    outs = [_matmul(g, name if len(runs) == 1 else f"{name}.{j}", x, r) for j, r in enumerate(runs)]
    if len(outs) == 1:
        return outs[0]
    g.node("Concat", outs, [f"{name}/cat"], axis=-1)
    return f"{name}/cat"


def _split(g: GraphWriter, name: str, x: str, parts: list[Grid], idx: np.ndarray) -> str:
    """``(x * mask) @ w.T + x[..., idx] @ w[:, idx].T``: MatMulNBits quantises its input per
    block of 32 channels to int8, so one huge channel (Qwen2.5's attention-sink rows carry a few
    in gate|up's input) leaves its block's other 31 a few levels; those channels are zeroed in
    the grid matmul's input and go through an fp32 side matmul on the exact (dequantised) GGUF
    columns. The 4-bit codes stay as they are; the side weights are ``len(idx) x N`` floats."""
    k = parts[0].codes.shape[1]
    mask = np.ones((k,), np.float32)
    mask[idx] = 0.0
    g.node("Mul", [x, g.const(f"{name}.inlier_mask", mask)], [f"{name}/inliers"])
    main = grid_linear(g, name, f"{name}/inliers", parts)
    columns = np.concatenate([p.dequantize()[:, idx] for p in parts])  # (N, len(idx))
    g.node("Gather", [x, g.const(f"{name}.outlier_ids", idx)], [f"{name}/outliers"], axis=2)
    side = g.const(f"{name}.outlier_columns", np.ascontiguousarray(columns.T, np.float32))
    g.node("MatMul", [f"{name}/outliers", side], [f"{name}/side"])
    g.node("Add", [main, f"{name}/side"], [f"{name}/with_outliers"])
    return f"{name}/with_outliers"


def outlier_names(channels: dict[str, Any]) -> dict[str, np.ndarray]:
    """``quant.outliers`` channels of the eager ``model.layers.<i>.mlp.gate_proj`` -> the fused
    graph's ``layers.<i>.gate_up`` (gate and up read the same input: one set of channels)."""
    out = {}
    for path, idx in channels.items():
        parts = path.split(".")
        if parts[-1] == "gate_proj" and parts[:2] == ["model", "layers"]:
            out[f"layers.{parts[2]}.gate_up"] = np.asarray(idx, np.int64)
    return out


def grid_embedding(g: GraphWriter, ids: str, grid: Grid, out: str) -> str:
    """``out (1, T, K)``: the rows ``ids`` of a 4-bit (or 8-bit) grid table, dequantised."""
    n, k = grid.codes.shape
    nb = k // grid.block
    p = "embed_tokens"
    g.node("Gather", [g.const(f"{p}.qweight", grid.packed()), ids], [f"{p}/packed"])
    if grid.bits == 4:  # low nibble = even element, high = odd (``Grid.packed``)
        lo_mask = g.const(f"{p}/mask", np.array(15, np.uint8))
        g.node("BitwiseAnd", [f"{p}/packed", lo_mask], [f"{p}/even"])
        four = g.const(f"{p}/four", np.array(4, np.uint8))
        g.node("BitShift", [f"{p}/packed", four], [f"{p}/odd"], direction="RIGHT")
        axis = g.const(f"{p}/axis", np.array([-1], np.int64))
        g.node("Unsqueeze", [f"{p}/even", axis], [f"{p}/even1"])
        g.node("Unsqueeze", [f"{p}/odd", axis], [f"{p}/odd1"])
        g.node("Concat", [f"{p}/even1", f"{p}/odd1"], [f"{p}/pairs"], axis=-1)
        codes = f"{p}/pairs"
    else:
        codes = f"{p}/packed"
    g.node("Cast", [codes], [f"{p}/codes_f"], to=1)
    shape = g.const(f"{p}/blocks", np.array([1, -1, nb, grid.block], np.int64))
    g.node("Reshape", [f"{p}/codes_f", shape], [f"{p}/codes"])
    scales = _folded(g, f"{p}.scales", grid.scale_hi, grid.scale_lo)
    g.node("Gather", [scales, ids], [f"{p}/scale"])
    g.node("Unsqueeze", [f"{p}/scale", g.const(f"{p}/axis2", np.array([-1], np.int64))],
           [f"{p}/scale1"])  # fmt: skip
    if grid.bits == 4:
        assert grid.min_hi is not None and grid.min_lo is not None
        g.node("Mul", [f"{p}/scale1", f"{p}/codes"], [f"{p}/scaled"])
        mins = _folded(g, f"{p}.minimums", grid.min_hi, grid.min_lo)
        g.node("Gather", [mins, ids], [f"{p}/min"])
        g.node("Unsqueeze", [f"{p}/min", f"{p}/axis2"], [f"{p}/min1"])
        g.node("Sub", [f"{p}/scaled", f"{p}/min1"], [f"{p}/deq"])
    else:
        c128 = g.const(f"{p}/c128", np.array(128.0, np.float32))
        g.node("Sub", [f"{p}/codes", c128], [f"{p}/centred"])
        g.node("Mul", [f"{p}/scale1", f"{p}/centred"], [f"{p}/deq"])
    g.node("Reshape", [f"{p}/deq", g.const(f"{p}/shape", np.array([1, -1, k], np.int64))], [out])
    log.debug("embedding %dx%d gathered from its %s grid", n, k, grid.source)
    return out


def grid_bytes(grids: dict[str, list[Grid]]) -> int:
    """Bytes the grids take in the file (codes, the GGUF's scale parts)."""
    return sum(p.nbytes() for parts in grids.values() for p in parts)
