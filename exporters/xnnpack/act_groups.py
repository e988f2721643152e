"""Finer int8 activation scales for XNNPACK's dynamically quantised linears (``qd8``).

XNNPACK quantises a dynamically quantised linear's input with one int8 scale per row (token).
ONNX ``MatMulNBits`` (accuracy_level 4) uses one per block of 32 inputs, and on the 1.5B's
``gguf4`` this is most of the top-1 gap between the two (``reports/xnnpack_gguf4``).
``GroupedActLinear`` gives each row ``G`` scales, one per equal group of input columns, without
slicing (XNNPACK refuses a ``slice_copy`` whose input has a dynamic dimension):

    y = sum_g inner(x * m_g)

``m_g`` is the 0/1 mask of group ``g``'s columns. The ``G`` masked copies of each row are stacked
into ``G`` rows of one ``(T * G, K)`` input: XNNPACK's per-row quantisation then sees one group's
columns per row (zeros are exact in its asymmetric int8), the weight is read once, and the ``G``
partial outputs are summed by an fp32 ``linear`` with a ``(1, G)`` weight of ones (a ``sum``
would run in the portable kernels). Every node is delegated: ``mul``, ``view_copy`` (one inferred
dimension), the quantised ``linear``, ``permute_copy`` and the fp32 ``linear`` (the tiny test's
export leaves the same non-delegated ops as without groups). The weight and its
grid are unchanged; the cost is ``G`` rows per token in the quantised GEMM (a decode step is
memory-bound on the weight, read once either way) and the small fp32 sum.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn


class GroupedActLinear(nn.Module):
    """``sum_g inner(x * m_g) + bias``: ``inner`` (a dynamically quantised linear without bias)
    applied to ``G`` masked copies of each row, one per group of ``K / G`` input columns."""

    def __init__(self, inner: nn.Module, in_features: int, groups: int,
                 bias: Tensor | None) -> None:  # fmt: skip
        super().__init__()
        if groups < 2 or in_features % groups:
            raise ValueError(f"activation groups: {in_features} inputs into {groups} groups")
        self.inner, self.groups = inner, groups
        masks = torch.zeros(groups, in_features)
        for g, cols in enumerate(torch.arange(in_features).chunk(groups)):
            masks[g, cols] = 1.0
        self.register_buffer("masks", masks)  # (G, K)
        self.register_buffer("ones", torch.ones(1, groups))  # (1, G): the fp32 sum
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)

    @classmethod
    def wrap(cls, linear: nn.Module, groups: int) -> GroupedActLinear:
        """A (torchao-quantised) ``nn.Linear`` with ``groups`` activation scales per row; its
        bias moves to the wrapper (added once, not per group)."""
        assert isinstance(linear, nn.Linear)
        bias = linear.bias
        linear.bias = None  # type: ignore[assignment]
        return cls(linear, linear.in_features, groups, bias)

    def forward(self, x: Tensor) -> Tensor:
        masks: Tensor = self.masks  # type: ignore[assignment]
        ones: Tensor = self.ones  # type: ignore[assignment]
        k = x.shape[-1]
        # a view, not unsqueeze (XNNPACK refuses an unsqueeze of a dynamic shape)
        stacked = (x.reshape(-1, 1, k) * masks).view(-1, k)  # (rows * G, K)
        part = self.inner(stacked)  # (rows * G, N)
        n = part.shape[-1]
        y = nn.functional.linear(part.view(-1, self.groups, n).permute(0, 2, 1), ones)
        y = y.view(*x.shape[:-2], -1, n) if x.dim() > 2 else y.view(-1, n)
        return y if self.bias is None else y + self.bias


def quantised_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Module path -> every torchao-quantised ``nn.Linear`` of ``model`` (the ones XNNPACK runs
    with int8 per-token activations: an ``Int4GroupLinear``'s ``centred``, an 8da8w linear)."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and type(m.weight) not in (Tensor, nn.Parameter)}  # fmt: skip


def group_activations(model: nn.Module, groups: Mapping[str, int]) -> int:
    """Wrap each of ``model``'s quantised linears whose kind (``q_proj`` ... ``lm_head``: the
    nearest path part ending in ``proj`` or ``lm_head``) is in ``groups`` in a
    ``GroupedActLinear`` with that many groups; returns how many were wrapped."""
    wrapped = 0
    for name, linear in quantised_linears(model).items():
        kind = linear_kind(name)
        if groups.get(kind, 1) > 1:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, GroupedActLinear.wrap(linear, groups[kind]))
            wrapped += 1
    return wrapped


def linear_kind(name: str) -> str:
    """``model.layers.3.mlp.gate_proj.inner.centred`` -> ``gate_proj``."""
    return next((p for p in reversed(name.split(".")) if p.endswith("proj") or p == "lm_head"), "")
