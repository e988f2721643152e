"""Outlier input channels of a model's linears, measured on held-out calibration text.

Int8 activations with one scale per group of inputs (XNNPACK's ``qd8``: one per token row;
ONNX Runtime's ``MatMulNBits`` at ``accuracy_level`` 4: one per block of 32) lose the group's
other inputs when one channel in it is huge. Qwen2.5's post-attention RMSNorm output, the input
of ``gate_proj`` / ``up_proj``, carries a few such channels (the "attention sink" rows at the
start of a prompt). Both exporters take those channels out of the int8 path into an exact fp32
side matmul (``exporters.xnnpack.outliers.OutlierSplitLinear``, ``exporters.onnx.gguf_grid``).
The channels are a property of the model: the largest max |x| per input channel over one eager
forward of each calibration prompt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

DEFAULT_K = 4  # outlier channels per input (measured: reports/xnnpack_gguf4)
DEFAULT_KINDS = ("gate_proj", "up_proj")  # the linears whose inputs carry the sink rows' error
CALIBRATION_PROMPTS = 8  # held-out prompts (``quant.calibration``), 64 tokens each


def outlier_channels(
    model: nn.Module, prompts: Sequence[Sequence[int]], k: int = DEFAULT_K,
    kinds: Sequence[str] = DEFAULT_KINDS,
) -> dict[str, Tensor]:  # fmt: skip
    """Module path -> the ``k`` input channels of largest max |x| over one eager forward of
    ``model`` per prompt, for every ``nn.Linear`` whose last path part is in ``kinds`` (sorted
    channel ids; linears sharing an input get the same ones)."""
    from omnidraft_deploy.exporters.quant.calibration import input_stats

    modules = {name: m for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in kinds}  # fmt: skip
    if not modules or k <= 0:
        return {}

    def fold(acc: Tensor | None, x: Tensor) -> Tensor:
        peak = x.abs().amax(0).float()
        return peak if acc is None else torch.maximum(acc, peak)

    stats = input_stats(model, [list(p) for p in prompts], modules, fold)
    return {name: peak.topk(min(k, len(peak))).indices.sort().values
            for name, (peak, _) in stats.items()}  # fmt: skip


def calibrated_outliers(
    model: nn.Module, tokenizer: str, vocab_size: int, k: int = DEFAULT_K,
    kinds: Sequence[str] = DEFAULT_KINDS,
) -> tuple[dict[str, Tensor], dict[str, Any]]:  # fmt: skip
    """``outlier_channels`` on the first ``CALIBRATION_PROMPTS`` held-out prompts of
    ``tokenizer``, and the figures an export report records (channels per linear, seconds)."""
    from omnidraft_deploy.exporters.quant.calibration import calibration_ids

    t0 = time.perf_counter()
    prompts = calibration_ids(tokenizer, vocab_size)[:CALIBRATION_PROMPTS]
    channels = outlier_channels(model, prompts, k, kinds)
    figures = {"k": k, "kinds": list(kinds), "prompts": len(prompts),
               "seconds": round(time.perf_counter() - t0, 2),
               "channels": {name: idx.tolist() for name, idx in channels.items()}}  # fmt: skip
    return channels, figures
