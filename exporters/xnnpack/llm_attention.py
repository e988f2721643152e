"""ExecuTorch LLM attention for XNNPACK ``.pte`` programs: the KV cache updated in place.

The plain stateful graph (``reference.model``'s ``index_copy_`` into ``(1, KV, S, D)`` buffers and
a broadcast GQA matmul) lowers to portable kernels that rewrite every cache functionally
(``index_put``) and widen the KV heads to the query heads over all ``S`` slots (``expand_copy``)
in every call (issue 44: ~1.3 GiB written a call on Qwen2.5-Coder-1.5B). ExecuTorch's LLM recipe
(``examples/models/llama``: ``CustomKVCache``) holds each cache as a mutable program buffer and
writes only the T new rows with ``llama::update_cache`` (``extension/llm/custom_ops``, in the
pinned wheel). Three attention kernels (``kernel``), each with the cache layout it reads:

- ``"prefix"`` (default, targets and drafters): K ``(KV, S, 1, D)`` (update_cache's ``(B, S, H,
  D)`` with the KV heads as its batch), V transposed ``(KV * D, S, 1, 1)``. It reads only the
  first ``L = start + T`` slots, ``L`` given as a shape by the program's third input
  ``cache_slots`` (``graph_contract``: XNNPACK plans only shapes derived from inputs, not a
  length computed from ``input_pos``'s values). Scores and weighted sums are XNNPACK batch
  matmuls grouped per KV head (no head is widened; both take the caches as the GEMM's left
  operand, unpacked, after a portable ``slice_copy`` of the first ``L`` slots: ExecuTorch has no
  view of a prefix, and that copy is what grows with the context, 50 ms a call at 4,000 on the
  1.5B); the softmax is a row max, ``exp`` and a division by a GEMM over the slots
  (``_prefix_attention``), so every row is bitwise what it is over any longer span: a verify
  call's rows equal 1-token calls' (greedy speculative output == target-only's).
- ``"span"``: the same caches as ``prefix``'s K for both, every one of the ``S`` slots read each
  call (an additive mask and XNNPACK's softmax), two inputs: bitwise batch invariant too, but it
  reads and copies all ``2 * S * KV * D * 4`` bytes a layer whatever the position (the kernel of
  the first in-place programs; kept for comparison, ``benchmarks/probes/attention_layer.py``).
- ``"custom_sdpa"``: ``llama::custom_sdpa(q, k, v, start_pos, None, 0, True)`` over caches
  ``(1, S, KV, D)`` (ExecuTorch's own) reads only the slots in use, but its blocked flash
  attention sums rows in an order that depends on ``T`` and ``start_pos``: 1-token rows differ
  from a verify call's (5.8e-6 in fp32, 0.05 logits a layer under 8da4w on a 1.5B layer), and
  its verify calls were slower. Kept as an option, not used by the exporter.

Rollback is free: slots past a row's position are masked or not read, and the next call
overwrites them. Positions must be contiguous (``input_pos = start + arange(T)``), as every
caller of the stateful contract guarantees.

Views name the call's dynamic size as ``-1`` where they can: XNNPACK takes a view with one
inferred size, not one whose size is a symbol, and every view it does not take is a portable op
that splits the layer's XNNPACK partition (a call per partition, and a lowering pass per
partition at export).

``use_llm_attention(model)`` plugs one module into each layer's ``Attention.kv_attend`` of a
``reference.model.Transformer`` (or a quantised shell of one); eager calls run the same ops on
CPU. The ``llama`` ops must be registered wherever such a program is exported or loaded
(``optional.llm_kernels``; ``optional.executorch_runtime`` calls it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from omnidraft_deploy.optional import llm_kernels
from omnidraft_deploy.reference.model import ModelArgs

KERNELS = ("prefix", "span", "custom_sdpa")
MASKED = -1e30  # added to a masked score: exp underflows to exactly 0, no inf arithmetic


class InPlaceKVAttention(nn.Module):
    """``forward(q (1, H, T, D), k (1, KV, T, D), v, input_pos (T,), mask (T, S')) -> (1, T, H*D)``.

    Writes k / v at ``input_pos[0]`` into ``k_cache`` / ``v_cache`` in place, then attends
    (``kernel``: its cache layout and its sums in the module docstring). ``mask`` is the model's
    0/1 slot mask (1 = may attend): ``(T, L)`` from the ``cache_slots`` input when exported, or
    fewer slots than ``S`` in eager calls (``Transformer._span``).
    """

    def __init__(self, max_seq_len: int, n_kv_heads: int, head_dim: int, kernel: str) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"unknown attention kernel {kernel!r}; choose from {KERNELS}")
        self.kernel = kernel
        # update_cache's (B, S, H, D): span and prefix keep each KV head's slots contiguous (the
        # KV heads as its batch); prefix holds V transposed, one row of S slots per (head, channel)
        # (B = KV * D, H = D = 1), so its weighted sum reads V in place as a GEMM's left operand
        # instead of packing it; custom_sdpa reads the layout it takes, (1, S, KV, D)
        k_shape = v_shape = (n_kv_heads, max_seq_len, 1, head_dim)
        if kernel == "custom_sdpa":
            k_shape = v_shape = (1, max_seq_len, n_kv_heads, head_dim)
        elif kernel == "prefix":
            v_shape = (n_kv_heads * head_dim, max_seq_len, 1, 1)
        self.register_buffer("k_cache", torch.zeros(k_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(v_shape), persistent=False)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, input_pos: Tensor, mask: Tensor) -> Tensor:
        _, n_heads, t, head_dim = q.shape
        k_cache: Tensor = self.k_cache  # type: ignore[assignment]
        v_cache: Tensor = self.v_cache  # type: ignore[assignment]
        n_kv, slots = k.shape[1], k_cache.shape[1]
        start = input_pos[0].item()
        torch._check(start >= 0)
        torch._check(t <= slots)  # T's upper bound (memory planning), as the call's limit below
        torch._check(start + t <= slots)
        if self.kernel == "custom_sdpa":
            torch.ops.llama.update_cache(k.transpose(1, 2), k_cache, start)  # (1, T, KV, D)
            torch.ops.llama.update_cache(v.transpose(1, 2), v_cache, start)
            out = torch.ops.llama.custom_sdpa(q.transpose(1, 2), k_cache, v_cache, start,
                                              None, 0, True)  # fmt: skip
            return out.reshape(1, t, n_heads * head_dim)
        torch.ops.llama.update_cache(k[0].unsqueeze(2), k_cache, start)  # (KV, T, 1, D)
        if self.kernel == "prefix":  # over the mask's width: cache_slots' length when exported
            v_t = v.transpose(2, 3).reshape(n_kv * head_dim, -1, 1, 1)  # (KV * D, T, 1, 1)
            torch.ops.llama.update_cache(v_t, v_cache, start)
            torch._check(mask.shape[-1] <= slots)
            torch._check(start + t <= mask.shape[-1])
            return _prefix_attention(q, k_cache, v_cache, mask)
        torch.ops.llama.update_cache(v[0].unsqueeze(2), v_cache, start)
        keys, values = k_cache.view(n_kv, slots, head_dim), v_cache.view(n_kv, slots, head_dim)
        if mask.shape[-1] < slots:  # eager: the call's span only (never when exporting)
            keys, values = keys[:, : mask.shape[-1]], values[:, : mask.shape[-1]]
        rep = n_heads // n_kv
        qg = q[0].contiguous().view(n_kv, rep * t, head_dim) * head_dim**-0.5  # (KV, rep*T, D)
        scores = torch.bmm(keys, qg.transpose(1, 2)).transpose(1, 2).contiguous()  # (KV, rep*T, S)
        bias = (mask - 1.0) * -MASKED  # (T, S): 0 where allowed, MASKED elsewhere
        scores = scores.view(n_kv, rep, t, keys.shape[1]) + bias  # (KV, rep, T, S)
        weights = torch.softmax(scores, dim=-1).view(n_kv, rep * t, keys.shape[1])
        out = torch.bmm(weights, values).view(n_heads, -1, head_dim)  # (H, T, D)
        return out.transpose(0, 1).contiguous().view(1, t, n_heads * head_dim)


def _prefix_attention(q: Tensor, k_cache: Tensor, v_t_cache: Tensor, mask: Tensor) -> Tensor:
    """Attention over the first ``L`` slots (``mask``'s width) of a ``(KV, S, 1, D)`` K cache and
    a ``(KV * D, S, 1, 1)`` transposed V cache, every reduction over the slots done so that slots
    past a row's position change nothing, not a bit: the row max (exact in any order), ``exp``
    elementwise, then the weighted sum of values and the sum of the weights as GEMMs whose
    reduction over the slots runs in slot order (XNNPACK's f32 GEMM micro-kernels accumulate
    along K one element at a time), to which a masked slot adds an exact ``0 * v``. So a row
    equals the same row computed over any longer span, and a verify call's rows equal 1-token
    calls' bit for bit, while a call reads only the slots in use. (XNNPACK's softmax is not
    used: its sum takes the tail of a row in another order than the body.)"""
    _, n_heads, t, head_dim = q.shape
    n_kv, used = k_cache.shape[0], mask.shape[-1]
    rep = n_heads // n_kv
    keys = k_cache[:, :used].reshape(n_kv, used, head_dim)  # (KV, L, D)
    values_t = v_t_cache[:, :used].reshape(n_kv, head_dim, used)  # (KV, D, L)
    qg = q.reshape(n_kv, -1, head_dim) * head_dim**-0.5  # (KV, rep*T, D); -1: module docstring
    scores = torch.bmm(keys, qg.transpose(1, 2)).transpose(1, 2)  # (KV, rep*T, L)
    scores = scores.reshape(n_kv, rep, t, used) + (mask - 1.0) * -MASKED
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True)).reshape(n_kv, rep * t, used)
    weights_t = weights.transpose(1, 2)  # (KV, L, rep*T)
    ones = torch.ones_like(values_t[:, :1])  # (KV, 1, L)
    out_t = torch.bmm(values_t, weights_t) / torch.bmm(ones, weights_t)  # (KV, D, rep*T)
    out = out_t.reshape(n_kv, head_dim, rep, -1).permute(3, 0, 2, 1)  # (T, KV, rep, D)
    return out.reshape(1, -1, n_heads * head_dim)


def takes_cache_slots(kernel: str | None) -> bool:
    """Whether a program on ``kernel`` takes the ``cache_slots`` and ``logit_rows`` inputs
    (``graph_contract``)."""
    return kernel == "prefix"


def use_llm_attention(model: nn.Module, kernel: str = "prefix") -> nn.Module:
    """``model`` (a ``Transformer`` or a quantised shell of one) with every layer's attention on
    ``InPlaceKVAttention``; its own ``(1, KV, S, D)`` buffers, unread on this path, are emptied
    so the program does not carry them. Returns ``model`` (modified in place)."""
    llm_kernels()
    a: ModelArgs = model.args  # type: ignore[assignment]
    layers: Any = model.model.layers  # type: ignore[union-attr]
    for layer in layers:
        layer.self_attn.kv_attend = InPlaceKVAttention(
            a.max_seq_len, a.n_kv_heads, a.head_dim, kernel
        )
    for i in range(2 * a.n_layers):
        setattr(model, f"kv_cache_{i}", torch.zeros(0))
    return model
