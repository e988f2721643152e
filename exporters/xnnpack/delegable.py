"""The two per-layer steps of ``reference.model`` that ExecuTorch 1.5.1's XNNPACK partitioner does
not take, in forms it does, for ``.pte`` programs.

Every op left to the portable kernels between delegated ones splits a layer's XNNPACK partition:
one more delegate call each call (measured ~14 us apiece on SmolLM2-135M's 453 a call, where
its XNNPACK operators sum to 12 ms of an 18.7 ms delegate time: ``benchmarks.pte_profile``), and
one more partition to lower at export (~3 s each). Two steps did so in every layer:

- RMSNorm's ``mean`` over the last dim (XNNPACK's mean takes 4-D inputs over dims -1 and -2
  only): here the sum of squares is a matmul by a row of ones, then a division;
- RoPE's rotate-half, ``cat(-x[..., D/2:], x[..., :D/2])``: XNNPACK takes no slice of a tensor
  with a dynamic size (T). Here it is ``x @ R``, ``R`` the (D, D) signed permutation: each output
  is one input times +-1 plus exact zeros, so the rotation is exact.

Both compute what the reference modules compute up to fp32 summation order (the norm's sum runs
in another order than ``mean``'s); a row never depends on the other rows of its call, so the
program stays batch invariant. ``delegable(model)`` swaps them into a ``Transformer`` or a
quantised shell of one, in place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from omnidraft_deploy.reference.model import RMSNorm


class SumRMSNorm(nn.Module):
    """``RMSNorm`` with the mean of squares as ``linear(x * x, ones) / dim``; shares the weight."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.weight, self.eps, self.dim = norm.weight, norm.eps, float(norm.weight.numel())
        self.register_buffer("ones", torch.ones(1, norm.weight.numel()), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        ones: Tensor = self.ones  # type: ignore[assignment]
        mean_sq = nn.functional.linear(x * x, ones) / self.dim
        return self.weight * (x * torch.rsqrt(mean_sq + self.eps))


class RotateHalf(nn.Module):
    """``cat(-x[..., D/2:], x[..., :D/2])`` as ``linear(x, R.T)``: ``R`` maps input ``D/2 + j`` to
    output ``j`` with sign -1 and input ``j`` to output ``D/2 + j`` with +1."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        half = head_dim // 2
        r = torch.zeros(head_dim, head_dim)  # (out, in), as nn.Linear's weight
        r[torch.arange(half), torch.arange(half) + half] = -1.0
        r[torch.arange(half) + half, torch.arange(half)] = 1.0
        self.register_buffer("weight", r, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        weight: Tensor = self.weight  # type: ignore[assignment]
        return nn.functional.linear(x, weight)


def delegable(model: nn.Module) -> nn.Module:
    """``model`` with every ``RMSNorm`` a ``SumRMSNorm`` and each attention's RoPE rotation a
    ``RotateHalf`` (modified in place; returned)."""
    norms = [(name, m) for name, m in model.named_modules() if isinstance(m, RMSNorm)]
    for name, norm in norms:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attr, SumRMSNorm(norm))
    layers: Any = model.model.layers  # type: ignore[union-attr]
    for layer in layers:
        layer.self_attn.rotate = RotateHalf(layer.self_attn.head_dim)
    return model
