"""Batch-invariant attention from plain ONNX ops, for the fused graph's verifying target.

Greedy speculative output equals target-only output only if a row's logits do not depend on how
many tokens one call feeds (verification feeds ``1 + proposals``, target-only feeds 1).
``GroupQueryAttention`` is not batch-invariant on ONNX Runtime's CPU kernel (a T-token call and T
single calls differ by ~1e-6 per element, measured), and int8 activation quantisation inside the
next ``MatMulNBits`` turns such a difference into a changed int8 code now and then: the int8
Qwen2.5-0.5B graph differed by up to 0.36 in a logit and flipped an argmax in 96 rows
(``reports/batch_invariance_int8.json``). ``MatMulNBits`` at ``accuracy_level=4`` is itself
bitwise batch-invariant (per-row int8 quantisation, exact integer dot products).

This attention gives every query row exactly the same arithmetic whatever T is:

- RoPE (HF rotate-half) and scaling are elementwise;
- this call's keys/values are scattered into a copy of the ``max_seq_len``-slot cache at their
  positions, so a key sits at the same slot whether it came from the cache or from this call;
- scores and the weighted sum are ``MatMul``s whose batch dims hold one query row each
  (``M = 1``): the GEMM kernel and its accumulation order depend on (M, N, K) only, not on T;
- slots after the row's position are masked by ``Where`` before and after ``Softmax`` (exact
  zeros, whatever stale values the slots hold).

Cache contract ``CacheIO.CHUNK`` (``graph_contract``): the graph reads ``cache_i`` and outputs
``cache_out_i (1, KV, T, D)``, this call's rotated keys / values, which the host writes at
``input_pos``. Cost over ``GroupQueryAttention``: attention over all ``max_seq_len`` slots and
one cache copy per layer per call (a few MB: small beside the weights; measured in
``benchmarks/batch_invariance.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from omnidraft_deploy.bundle import graph_contract as gc

SLOTS = "inv/slots"  # (1, KV, T, D) int64: input_pos broadcast, ScatterElements indices
VALID = "inv/valid"  # (1, T, 1, 1, 1, L) bool: slot <= row position
POSITION_IDS = "inv/position_ids"  # (1, T) int64: RotaryEmbedding's positions
SPAN = "inv/span"  # (1,) int64: L, the slots attended to (see ``prepare``)
SPAN_BLOCK = 64  # L is a multiple of this: every kernel's unrolled loops see the same prefix


def prepare(g: Any, *, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
    """Graph-wide nodes and constants every layer reads: rotary positions, scatter indices, the
    causal slot mask, the shapes and scalars of ``attention`` (one initializer each, not per layer).

    Attention spans the first ``L = min(S, ceil((input_pos[-1] + 1) / 64) * 64)`` cache slots, not
    all ``S = max_seq_len``: a row sees the same slot layout in every call, and the slots a longer
    call adds past its position are exact zeros in the softmax and in the weighted sum. L moves in
    whole blocks of 64, so the kernels' vector loops handle every real slot the same way (when
    ``max_seq_len % 64 == 0``: ``exporters.onnx`` checks it). ``g``: an ``onnx.fused.GraphWriter``.
    """

    def c(name: str, value: Any) -> str:
        return g.const(f"inv/{name}", np.array(value, np.int64))

    g.node("Unsqueeze", [gc.INPUT_POS, c("i0", [0])], [POSITION_IDS])
    g.node("Shape", [gc.INPUT_POS], ["inv/t"])  # (1,) = [T]
    g.node("Concat", [c("kv1", [1, n_kv_heads]), "inv/t", c("d", [head_dim])], ["inv/kvtd"], axis=0)
    g.node("Reshape", [gc.INPUT_POS, c("col", [1, 1, -1, 1])], ["inv/pos4"])
    g.node("Expand", ["inv/pos4", "inv/kvtd"], [SLOTS])
    g.node("Shape", [gc.cache_in(0)], ["inv/cache_shape"])
    g.node("Gather", ["inv/cache_shape", c("two", [2])], ["inv/s"])  # (1,) max_seq_len
    g.node("Gather", [gc.INPUT_POS, c("last_idx", [-1])], ["inv/last"])  # (1,)
    block = c("block", [SPAN_BLOCK])  # L = ceil((last + 1) / block) * block
    g.node("Add", ["inv/last", block], ["inv/end_up"])
    g.node("Div", ["inv/end_up", block], ["inv/n_blocks"])
    g.node("Mul", ["inv/n_blocks", block], ["inv/end"])
    g.node("Min", ["inv/end", "inv/s"], [SPAN])
    g.node("Squeeze", [SPAN, "inv/i0"], ["inv/span0"])
    g.node("Range", [c("zero", 0), "inv/span0", c("one", 1)], ["inv/slot_ids"])  # (L,)
    g.node("Unsqueeze", [gc.INPUT_POS, c("ax1", [1])], ["inv/pos_col"])  # (T, 1)
    g.node("LessOrEqual", ["inv/slot_ids", "inv/pos_col"], ["inv/valid2"])  # (T, L)
    g.node("Unsqueeze", ["inv/valid2", c("ax0234", [0, 2, 3, 4])], [VALID])
    h, kv, d = n_heads, n_kv_heads, head_dim
    for name, value in (("qkv_sizes", [h * d, kv * d, kv * d]), ("kv4", [1, -1, kv, d]),
                        ("q6", [1, -1, kv, h // kv, 1, d]), ("out3", [1, -1, h * d]),
                        ("ax13", [1, 3])):  # fmt: skip
        c(name, value)
    g.const("inv/scale", np.array(1 / math.sqrt(d), np.float32))
    g.const("inv/neg_inf", np.array(-np.inf, np.float32))
    g.const("inv/zero_f", np.array(0.0, np.float32))


def attention(g: Any, qkv: str, layer: int, *, n_heads: int, n_kv_heads: int) -> str:
    """Attention of one layer from the packed ``qkv (1, T, (H + 2 KV) D)``: returns ``(1, T, H D)``
    and outputs ``cache_out_{2 layer}`` / ``cache_out_{2 layer + 1}`` (this call's k / v). Reads
    the nodes and constants of ``prepare``."""
    p = f"layers.{layer}.inv"
    g.node("Split", [qkv, "inv/qkv_sizes"], [f"{p}/q", f"{p}/k", f"{p}/v"], axis=-1)
    for name, heads in (("q", n_heads), ("k", n_kv_heads)):  # HF rotate-half RoPE, per token
        g.node("RotaryEmbedding", [f"{p}/{name}", POSITION_IDS, "cos_cache", "sin_cache"],
               [f"{p}/{name}_rot"], num_heads=heads, interleaved=0)  # fmt: skip
    for name, src in (("k", f"{p}/k_rot"), ("v", f"{p}/v")):
        g.node("Reshape", [src, "inv/kv4"], [f"{p}/{name}4"])  # (1, T, KV, D)
    k_new, v_new = gc.cache_chunk_out(2 * layer), gc.cache_chunk_out(2 * layer + 1)
    g.node("Transpose", [f"{p}/k4"], [k_new], perm=[0, 2, 1, 3])  # (1, KV, T, D)
    g.node("Transpose", [f"{p}/v4"], [v_new], perm=[0, 2, 1, 3])
    for name, new, idx in (("k", k_new, 2 * layer), ("v", v_new, 2 * layer + 1)):
        g.node("Slice", [gc.cache_in(idx), "inv/i0", SPAN, "inv/two"], [f"{p}/{name}_span"])
        g.node("ScatterElements", [f"{p}/{name}_span", SLOTS, new], [f"{p}/{name}_all"], axis=2)
    # one query row per GEMM, T-major: q (1, T, KV, G, 1, D) against keys (1, 1, KV, 1, D, L)
    g.node("Reshape", [f"{p}/q_rot", "inv/q6"], [f"{p}/q6"])
    g.node("Mul", [f"{p}/q6", "inv/scale"], [f"{p}/qs"])
    g.node("Transpose", [f"{p}/k_all"], [f"{p}/kt"], perm=[0, 1, 3, 2])  # (1, KV, D, L)
    g.node("Unsqueeze", [f"{p}/kt", "inv/ax13"], [f"{p}/kt6"])
    g.node("MatMul", [f"{p}/qs", f"{p}/kt6"], [f"{p}/scores"])  # (1, T, KV, G, 1, L)
    g.node("Where", [VALID, f"{p}/scores", "inv/neg_inf"], [f"{p}/masked"])
    g.node("Softmax", [f"{p}/masked"], [f"{p}/probs_raw"], axis=-1)
    g.node("Where", [VALID, f"{p}/probs_raw", "inv/zero_f"], [f"{p}/probs"])  # 0 past the row
    g.node("Unsqueeze", [f"{p}/v_all", "inv/ax13"], [f"{p}/v6"])  # (1, 1, KV, 1, L, D)
    g.node("MatMul", [f"{p}/probs", f"{p}/v6"], [f"{p}/ctx"])  # (1, T, KV, G, 1, D)
    g.node("Reshape", [f"{p}/ctx", "inv/out3"], [f"{p}/out"])
    return f"{p}/out"
