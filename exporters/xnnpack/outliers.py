"""LLM.int8-style outlier channels for int8 per-token activations (XNNPACK ``qd8``).

XNNPACK's dynamically quantised linears give each token's input row one int8 scale. Qwen2.5's
"attention sink" tokens (position 0 / 1 of a prompt) carry a few massive channels in the
post-attention RMSNorm output, the input of ``gate_proj`` / ``up_proj``. One scale per row then
leaves the row's other channels a few int8 levels (``reports/xnnpack_gguf4``: 21 logits off on
those rows). ``OutlierSplitLinear`` takes a fixed handful of input channels out of the int8 path:

    y = quantised(x * mask) + (x @ P) @ W[:, idx].T

``mask`` zeroes the channels ``idx``, ``P`` is the one-hot ``(K, k)`` selection of them (an fp32
matmul by 0 and 1: exact, and delegated to XNNPACK, where a gather would run in the portable
kernels), ``W[:, idx]`` the exact (dequantised GGUF) columns in fp32. The quantised weights stay
as they are (a GGUF's own 4-bit codes). The channels are a property of the model: the largest
max |x| per input channel over held-out calibration text
(``exporters.quant.outliers``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class OutlierSplitLinear(nn.Module):
    """``inner(x * mask) + (x @ P) @ W_idx.T``: ``inner`` (any quantised linear with bias) sees
    ``x`` without the channels ``idx``; those go through an exact fp32 side matmul."""

    def __init__(self, inner: nn.Module, idx: Tensor, columns: Tensor) -> None:
        super().__init__()
        n, k = columns.shape
        if idx.dim() != 1 or idx.numel() != k:
            raise ValueError(
                f"outlier split: {idx.numel()} channels, columns {tuple(columns.shape)}"
            )
        self.inner = inner
        self.register_buffer("idx", idx.to(torch.long).clone())  # (k,) the channels (report only)
        self.register_buffer("columns", columns.detach().float().contiguous())  # (N, k)
        self.register_buffer("select", torch.empty(0))  # (k, K) one-hot, sized by ``for_input``
        self.register_buffer("mask", torch.empty(0))  # (K,) 0 at idx, else 1

    @classmethod
    def wrap(cls, inner: nn.Module, weight: Tensor, idx: Tensor) -> OutlierSplitLinear:
        """``inner`` split on ``idx``; ``weight`` (N, K) the exact fp32 weight ``inner`` rounds."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        k_in = weight.shape[1]
        module = cls(inner, idx, weight.detach()[:, idx].float())
        select = torch.zeros(len(idx), k_in)
        select[torch.arange(len(idx)), idx] = 1.0
        mask = torch.ones(k_in)
        mask[idx] = 0.0
        module.select, module.mask = select, mask
        return module

    def forward(self, x: Tensor) -> Tensor:
        select: Tensor = self.select  # type: ignore[assignment]
        mask: Tensor = self.mask  # type: ignore[assignment]
        columns: Tensor = self.columns  # type: ignore[assignment]
        side = nn.functional.linear(nn.functional.linear(x, select), columns)
        return self.inner(x * mask) + side


def split_outliers(shell: nn.Module, model: nn.Module, channels: dict[str, Tensor]) -> int:
    """Wrap each of ``shell``'s quantised linears named in ``channels`` in an
    ``OutlierSplitLinear`` whose side columns come from ``model``'s (exact fp32) weight at the
    same path; returns how many were wrapped."""
    for name, idx in channels.items():
        weight = model.get_submodule(name).weight
        assert isinstance(weight, Tensor)
        owner, _, attr = name.rpartition(".")
        parent = shell.get_submodule(owner)
        setattr(parent, attr, OutlierSplitLinear.wrap(getattr(parent, attr), weight, idx))
    return len(channels)
