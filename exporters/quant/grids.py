"""Quantisation grids as pure functions over tensors: what every recipe's weights are rounded to.

- int4: 16 levels from min to max per block of ``block`` inputs (``int4_grid``), GGUF Q4_1's layout;
  ``int4_blocks`` / ``int4_rtn`` apply it, ``quantize_blocks`` packs it (and the symmetric 8-bit
  block grid) for ONNX Runtime's ``MatMulNBits``;
- int8: symmetric per row (``per_row_int8``).

The graph writers (``exporters.onnx.fused``), the eager XNNPACK modules
(``exporters.xnnpack.eager_quant``), GPTQ and the int4 plan import these; this module imports none
of them (torch and numpy only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn


def int4_grid(w: Tensor) -> tuple[Tensor, Tensor]:
    """Step and float offset of the int4 grid of each block ``w (..., block)`` (last dim): the 16
    levels ``offset + step * j`` spanning the block's min..max, GGUF Q4_1's layout (and Q4_K's
    per sub-block). A model published in those formats (SmolLM2-135M's Q4_1 GGUF, the Q4_K
    ffn_down layers of Qwen2.5-Coder-0.5B's) comes back on its own grid, exactly."""
    lo, hi = w.amin(-1), w.amax(-1)
    return ((hi - lo) / 15.0).clamp(min=1e-8), lo


def int4_codes(w: Tensor, step: Tensor, offset: Tensor) -> Tensor:
    """Codes 0..15 of ``w (..., block)`` on the grid ``offset + step * j`` (per block)."""
    return torch.round((w - offset[..., None]) / step[..., None]).clamp(0, 15)


def int4_blocks(w: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """``w (N, K)`` in blocks of ``block`` inputs (a padded last block padded with the minimum):
    codes ``(N, n_blocks, block)`` and the grid's step and offset ``(N, n_blocks)``."""
    n, k = w.shape
    n_blocks = -(-k // block)
    wb = torch.nn.functional.pad(w.float(), (0, n_blocks * block - k), value=float(w.min()))
    wb = wb.view(n, n_blocks, block)
    step, offset = int4_grid(wb)
    return int4_codes(wb, step, offset), step, offset


def int4_rtn(w: Tensor, block: int) -> Tensor:
    """``w (N, K)`` rounded to its int4 grid per block of ``block`` inputs (what the graph holds)."""
    codes, step, offset = int4_blocks(w, block)
    deq = codes * step[..., None] + offset[..., None]
    return deq.view(w.shape[0], -1)[:, : w.shape[1]]


def quantize_blocks(w: Tensor, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """``w (N, K)`` -> MatMulNBits ``B (N, n_blocks, block*bits/8) uint8``, ``scales (N*n_blocks,)``
    and a third array: 8-bit None (zero point 128); 4-bit the float offsets ``(N, n_blocks)``.

    8-bit: symmetric per block (``q = round(w/s) + 128``). 4-bit: ``int4_grid`` (step and float
    offset per block, ``w ~ offset + step * q``); MatMulNBits holds ``step * (q - 8)`` (its
    default zero point) and ``offset + 8 * step`` is added by the graph (``GraphWriter.linear``).
    Two 4-bit values per byte, low first. A padded last block is padded with its own minimum.
    """
    n, k = w.shape
    n_blocks = -(-k // block)
    if bits == 8:  # in place where it can be: 3x faster, the same bytes (Qwen2.5's head: 1.1 s)
        wb = w.float()
        if n_blocks * block != k:
            wb = torch.nn.functional.pad(wb, (0, n_blocks * block - k))
        wb = wb.reshape(n, n_blocks, block)
        scale = torch.maximum(wb.amax(-1), wb.amin(-1).neg_()).clamp_(min=1e-8).div_(127.0)
        q = torch.div(wb, scale[..., None]).round_().add_(128).clamp_(0, 255).to(torch.uint8)
        return q.numpy(), scale.reshape(-1).numpy(), None  # scale: (N, nb) -> (N * nb,)
    codes, step, offset = int4_blocks(w, block)
    q = codes.to(torch.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()  # (N, nb, block/2)
    return packed.numpy(), step.reshape(-1).numpy(), offset.numpy()


def per_row_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: (rows, cols) fp32 -> int8 (rows, cols), scales (rows,)."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight / scales[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scales.float()


def swap_modules(model: nn.Module, kind: type[nn.Module], make: object) -> None:
    """Replace every ``kind`` submodule by ``make(old)`` (tied weights are quantised per user)."""
    for name, child in list(model.named_children()):
        if isinstance(child, kind):
            setattr(model, name, make(child))  # type: ignore[operator]
        else:
            swap_modules(child, kind, make)
