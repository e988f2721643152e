"""GPTQ (Frantar et al. 2023): int4 weights whose rounding errors are compensated column by column.

Round-to-nearest int4 in blocks of 32 keeps only 0.84 of Qwen2.5-0.5B's teacher-forced top-1
(``benchmarks/quant_probe.py --study int4``). GPTQ quantises one input column at a time and moves
each column's error onto the columns not yet quantised, weighted by the inverse of the layer's
input Hessian ``H = X^T X`` (from calibration text), so the layer's *output* error is what is
minimised, not the weights'. The grid is the ``int4`` recipe's (``quant.grids.int4_grid``):
16 levels from min to max per block of ``block`` inputs, float offset; block parameters are set
from the weights as they stand when the block's first column is reached.

Pure functions on tensors; ``input_hessians`` runs the eager model over calibration prompts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omnidraft_deploy.exporters.quant.calibration import input_stats
from omnidraft_deploy.exporters.quant.grids import int4_codes, int4_grid
from torch import Tensor, nn


@torch.no_grad()
def input_hessians(
    model: nn.Module, prompts: list[list[int]], kinds: tuple[str, ...]
) -> dict[str, Tensor]:
    """``X^T X / n`` of the input of every ``nn.Linear`` whose attribute name is in ``kinds``,
    keyed by module path, over one forward of each prompt (``model(ids, positions)``)."""
    if not prompts:
        raise ValueError("GPTQ calibration needs at least one prompt")

    def fold(acc: Tensor | None, x: Tensor) -> Tensor:
        x = x.double()
        return x.T @ x if acc is None else acc + x.T @ x

    linears = {name: mod for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in kinds}  # fmt: skip
    stats = input_stats(model, prompts, linears, fold)
    return {name: (xtx / rows).float() for name, (xtx, rows) in stats.items()}


ColumnQuantizer = Callable[[int, Tensor, Tensor], Tensor]  # (column index, column, W[:, i:]) -> q


@torch.no_grad()
def _gptq(w: Tensor, hessian: Tensor, quantize: ColumnQuantizer, *, damp: float,
          cols: int) -> Tensor:  # fmt: skip
    """The GPTQ loop: quantise column by column (``quantize``), spreading each column's error
    over the columns not yet quantised through the upper Cholesky factor of ``H^-1``."""
    n, k = w.shape
    if hessian.shape != (k, k):
        raise ValueError(f"GPTQ: K {k}, H {tuple(hessian.shape)}")
    W = w.detach().float().clone()
    H = hessian.detach().float().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.mean(torch.diag(H)) * torch.eye(k)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    for i1 in range(0, k, cols):
        i2 = min(i1 + cols, k)
        W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            col, d = W1[:, i], Hinv1[i, i]
            q = quantize(i1 + i, col, W1[:, i:])
            Q[:, i1 + i] = q
            err = (col - q) / d
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return Q


def gptq_int4(w: Tensor, hessian: Tensor, *, block: int = 32, damp: float = 0.01,
              cols: int = 128) -> Tensor:  # fmt: skip
    """GPTQ-quantised ``w (N, K)``, dequantised (values on the int4 grid of each block of
    ``block`` inputs). ``hessian (K, K)``: the input's ``X^T X``; ``damp`` x its mean diagonal is
    added for stability; ``cols``: columns per lazy batch (a multiple of ``block``)."""
    k = w.shape[1]
    if k % block or cols % block:
        raise ValueError(f"GPTQ: K {k}, block {block}, cols {cols}, H {tuple(hessian.shape)}")
    grid: list[Tensor] = []

    def quantize(i: int, col: Tensor, rest: Tensor) -> Tensor:
        if i % block == 0:  # the block's grid from the weights as they stand now, per row
            grid[:] = int4_grid(rest[:, :block])
        step, offset = grid
        return int4_codes(col[:, None], step, offset)[:, 0] * step + offset

    return _gptq(w, hessian, quantize, damp=damp, cols=cols)


def per_channel_grid(w: Tensor, bits: int = 8) -> tuple[Tensor, Tensor]:
    """Scale and zero point per row of ``w (N, K)``: symmetric, ``[-max|row|, max|row|]`` on codes
    ``0 .. 2^bits - 1`` around ``2^(bits-1)`` (ONNX Runtime's per-channel uint8 QDQ weights for
    the QNN HTP, whose per-axis weights must be symmetric)."""
    top = 2**bits - 1
    scale = (2 * w.abs().amax(1) / top).clamp(min=1e-12)
    return scale, torch.full_like(scale, float(2 ** (bits - 1)))


def gptq_per_channel(w: Tensor, hessian: Tensor, *, bits: int = 8, damp: float = 0.01,
                     cols: int = 128) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """GPTQ on one fixed grid per output row (``per_channel_grid`` of the original ``w``):
    ``(codes (N, K) in [0, 2^bits - 1], scale (N,), zero_point (N,))``, ``w ~ (codes - zp) * s``."""
    scale, zp = per_channel_grid(w.detach().float(), bits)
    top = float(2**bits - 1)

    def quantize(_i: int, col: Tensor, _rest: Tensor) -> Tensor:
        return (torch.clamp(torch.round(col / scale) + zp, 0, top) - zp) * scale

    q = _gptq(w, hessian, quantize, damp=damp, cols=cols)
    return torch.round(q / scale[:, None] + zp[:, None]), scale, zp
