"""ExecuTorch LLM attention for XNNPACK ``.pte`` programs: the KV cache updated in place.

The plain stateful graph (``reference.model``'s ``index_copy_`` into ``(1, KV, S, D)`` buffers and
a broadcast GQA matmul) lowers to portable kernels that rewrite every cache functionally
(``index_put``) and widen the KV heads to the query heads over all ``S`` slots (``expand_copy``)
in every call (issue 44: ~1.3 GiB written a call on Qwen2.5-Coder-1.5B). ExecuTorch's LLM recipe
(``examples/models/llama``: ``CustomKVCache``) holds each cache as a mutable program buffer and
writes only the T new rows with ``llama::update_cache`` (``extension/llm/custom_ops``, in the
pinned wheel). Two attention kernels (``kernel``), each with the cache layout it reads:

- ``"span"`` (default): caches ``(KV, S, 1, D)`` (update_cache's ``(B, S, H, D)`` with the KV
  heads as its batch: each head's slots one contiguous ``(S, D)`` matrix the delegated matmuls
  read in place); scores over all ``S`` slots as XNNPACK batch matmuls, grouped per KV head
  (``(KV, S, D) @ (KV, D, rep * T)``: no head is widened), an additive mask for the slots past
  each row's position, XNNPACK's softmax, ``(KV, rep * T, S) @ (KV, S, D)``. Every row is
  computed over the same ``S`` slots with the same kernels whatever ``T`` is, so a verify call's
  rows equal 1-token calls' bit for bit (greedy speculative output == target-only's). It reads
  all ``S`` slots of K and V per layer (fp32: ``2 * S * KV * D * 4`` B) whatever the position.
- ``"custom_sdpa"``: ``llama::custom_sdpa(q, k, v, start_pos, None, 0, True)`` over caches
  ``(1, S, KV, D)`` reads only the first ``start_pos + T`` slots, but its blocked flash
  attention sums rows in an order that depends on ``T`` and ``start_pos`` (measured: 1-token
  rows differ from a verify call's in the last bits). A target on it would not guarantee greedy
  speculative == target-only; a drafter does not need that (its rows only propose: the target
  verifies), so drafters take it (``kernel_for_role``).

Rollback is free either way: slots past a row's position are masked (span) or not read (custom),
and the next call overwrites them. Positions must be contiguous (``input_pos = start +
arange(T)``), as every caller of the stateful contract guarantees.

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

KERNELS = ("span", "prefix", "custom_sdpa")
MASKED = -1e30  # added to a masked score: exp underflows to exactly 0, no inf arithmetic


class InPlaceKVAttention(nn.Module):
    """``forward(q (1, H, T, D), k (1, KV, T, D), v, input_pos (T,), mask (T, S')) -> (1, T, H*D)``.

    Writes k / v at ``input_pos[0]`` into ``k_cache`` / ``v_cache`` ``(KV, S, 1, D)`` in place,
    then attends (``kernel``, module docstring). ``mask`` is the model's 0/1 slot mask (1 = may
    attend); eager calls may pass fewer slots ``S' < S`` (``Transformer._span``).
    """

    def __init__(self, max_seq_len: int, n_kv_heads: int, head_dim: int, kernel: str) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"unknown attention kernel {kernel!r}; choose from {KERNELS}")
        self.kernel = kernel
        # update_cache's (B, S, H, D): span keeps each KV head's slots contiguous (the KV heads
        # as its batch), custom_sdpa reads the layout it takes, (1, S, KV, D)
        shape = (n_kv_heads, max_seq_len, 1, head_dim)
        if kernel == "custom_sdpa":
            shape = (1, max_seq_len, n_kv_heads, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

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
        torch.ops.llama.update_cache(v[0].unsqueeze(2), v_cache, start)
        if self.kernel == "prefix":  # the mask's width: the cache_slots input's length when exported
            torch._check(mask.shape[-1] <= slots)
            torch._check(start + t <= mask.shape[-1])
            return _prefix_attention(q, k_cache, v_cache, mask.shape[-1], mask)
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


def _prefix_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, used: Any, mask: Tensor) -> Tensor:
    """Attention over the first ``used`` slots of ``(KV, S, 1, D)`` caches, with every reduction
    over the slots done so that slots past a row's position change nothing, not a bit: the row
    max (exact in any order), ``exp`` elementwise, then the weighted sum of values and the sum of
    the weights as GEMMs whose reduction over the slots runs in slot order (XNNPACK's f32 GEMM
    micro-kernels accumulate along K one element at a time), where a masked slot adds an exact
    ``0 * v``. So a row equals the same row computed over any longer span, and a verify call's
    rows equal 1-token calls' bit for bit, while a call reads only the slots in use."""
    _, n_heads, t, head_dim = q.shape
    n_kv = k_cache.shape[0]
    rep = n_heads // n_kv
    keys = k_cache[:, :used].reshape(n_kv, -1, head_dim)  # (KV, L, D)
    values = v_cache[:, :used].reshape(n_kv, -1, head_dim)
    qg = q[0].contiguous().view(n_kv, rep * t, head_dim) * head_dim**-0.5  # (KV, rep*T, D)
    scores = torch.bmm(keys, qg.transpose(1, 2)).transpose(1, 2)  # (KV, rep*T, L)
    bias = (mask[:, :used] - 1.0) * -MASKED  # (T, L)
    scores = scores.reshape(n_kv, rep, t, -1) + bias
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True)).reshape(n_kv, rep * t, -1)
    ones = torch.ones_like(values[:, :, :1])  # (KV, L, 1)
    out = torch.bmm(weights, values) / torch.bmm(weights, ones)  # (KV, rep*T, D)
    out = out.view(n_heads, t, head_dim)
    return out.transpose(0, 1).contiguous().view(1, t, n_heads * head_dim)


def kernel_for_role(role: str) -> str:
    """``"prefix"`` for a target (its rows must not depend on the call's width; it reads the
    slots in use), ``"custom_sdpa"`` for a drafter (proposals only)."""
    return "custom_sdpa" if role == "drafter" else "prefix"


def takes_cache_slots(kernel: str | None) -> bool:
    """Whether a program on ``kernel`` takes the ``cache_slots`` input (``graph_contract``)."""
    return kernel == "prefix"


def use_llm_attention(model: nn.Module, kernel: str = "span") -> nn.Module:
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
