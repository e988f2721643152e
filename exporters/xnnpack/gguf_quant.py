"""Recipes ``gguf4`` / ``gguf8`` (XNNPACK): the eager model quantised from its GGUF's own blocks.

``gguf8`` holds every matrix as ``gguf4`` holds its 8-bit grids (dequantised, 8da8w per output
channel: the 4-bit blocks re-rounded to 8 bits) and the embedding on its grid; what follows is
``gguf4``, whose 4-bit blocks are not re-rounded.

Every weight is read from the preset's GGUF as stored (``quant.gguf_grid``, one tensor at a time
from a memory map) and checked against the eager model (the export's reference, that GGUF
dequantised; a file that does not match is refused, naming the tensor). Then:

- a 4-bit block (Q4_K / Q4_1 / Q4_0: ``w = scale * q - minimum`` per 32) is an ``Int4GroupLinear``
  on the GGUF's own codes: XNNPACK's symmetric ``qb4w`` kernel on ``q - 8`` with ``step = scale``
  (int8 per-token activations) plus the per-group constant ``8 * scale - minimum`` times the group
  sums of x (fp32). XNNPACK stores the kernel's scales as bf16 (its blockwise format), the one
  rounding of a 4-bit weight on the way;
- an 8-bit grid (Q6_K's blocks of 16, Q8_0, anything else) is torchao 8da8w per output channel of
  the dequantised weight (XNNPACK has no 8-bit blockwise kernel): re-rounded, at 8 bits;
- the lm_head (Q6_K in Q4_K_M; the embedding's grid when tied) likewise at 8da8w;
- the embedding keeps its grid: 4-bit blocks as ``quantized_decomposed.embedding_4bit`` (codes,
  fp32 scale and zero point ``minimum / scale - 8`` per 32: exact up to fp32 rounding), 8-bit
  blocks (Q8_0) as ``embedding_byte`` with a scale per block (exact); other types int8 per row.

With ``outliers`` (the XNNPACK export passes gate / up's, ``outliers.outlier_channels``), those
linears' few outlier input channels skip the int8 activations: ``outliers.OutlierSplitLinear``
(the 4-bit codes unchanged, the channels' columns exact in fp32).

The quantised model is a shell of the eager one: its small parameters (norms, biases) are shared,
not copied, and the fp32 linears are never duplicated, so the quantise stage adds only the
quantised weights (the eager model stays the verification reference).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omnidraft_deploy.exporters.quant.gguf_grid import LINEARS, Grid, checked_grid
from omnidraft_deploy.exporters.xnnpack.eager_quant import Int4GroupLinear, torchao_8da
from torch import Tensor, nn

from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GridShare:
    """What the quantised model holds at 4 bits (the report's figures)."""

    matrices_4bit: int
    matrices: int
    params_4bit: int
    params: int
    embedding: str  # the embedding's form (``4-bit Q4_K``, ...)
    head: str


def gguf_quantized(
    model: Transformer, gguf: Path, outliers: dict[str, Tensor] | None = None,
    four_bit: bool = True,
) -> tuple[nn.Module, GridShare]:  # fmt: skip
    """A quantised shell of ``model`` built from ``gguf``'s blocks (see the module docstring);
    ``outliers``: module path -> input channels taken out of the int8 activations into an exact
    fp32 side matmul (``outliers.OutlierSplitLinear``; the 4-bit codes unchanged);
    ``four_bit`` False (recipe ``gguf8``): 4-bit blocks too at 8da8w, dequantised first."""
    import gguf as gguf_py

    # defines quantized_decomposed::embedding_byte / embedding_4bit (eager + export)
    from executorch.exir.passes import _quant_patterns_and_replacements  # noqa: F401

    tensors = {t.name: t for t in gguf_py.GGUFReader(str(gguf)).tensors}
    quantized = shell(model)
    bits: list[tuple[int, int]] = []
    heads = {"attn_q": model.args.n_heads, "attn_k": model.args.n_kv_heads}
    for i, layer in enumerate(model.model.layers):
        for part, path in LINEARS.items():
            linear = layer.get_submodule(path)
            assert isinstance(linear, nn.Linear)
            grid = checked_grid(
                _tensor(tensors, f"blk.{i}.{part}.weight", gguf),
                linear.weight.detach().numpy(),
                gguf,
                heads.get(part, 0),
            )
            held = grid_linear(grid, linear.bias) if four_bit else _linear8(grid, linear.bias)
            bits.append((grid.bits if four_bit else 8, grid.codes.size))
            _set(quantized, f"model.layers.{i}.{path}", held)
    emb = checked_grid(
        _tensor(tensors, "token_embd.weight", gguf),
        model.model.embed_tokens.weight.detach().numpy(),
        gguf,
    )
    _set(quantized, "model.embed_tokens", grid_embedding(emb))
    head_grid = emb
    if "output.weight" in tensors:
        head_grid = checked_grid(tensors["output.weight"], model.lm_head.weight.detach().numpy(),
                                 gguf)  # fmt: skip
    quantized.lm_head = _linear8(head_grid, None)
    if outliers:
        from omnidraft_deploy.exporters.xnnpack.outliers import split_outliers

        split_outliers(quantized, model, outliers)
    share = GridShare(sum(b == 4 for b, _ in bits), len(bits), sum(n for b, n in bits if b == 4),
                      sum(n for _, n in bits), f"{emb.bits}-bit {emb.source}",
                      f"8da8w from {head_grid.source}")  # fmt: skip
    log.info("gguf4 from %s: %s", gguf.name, share)
    return quantized, share


def shell(model: Transformer) -> Transformer:
    """A deep copy of ``model`` that shares every parameter (nothing large is copied; the
    quantised modules then replace the linears and the embedding in the copy only)."""
    memo: dict[int, Any] = {id(p): p for p in model.parameters()}
    return copy.deepcopy(model, memo)


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    owner, _, attr = path.rpartition(".")
    setattr(model.get_submodule(owner), attr, module)


def _tensor(tensors: dict[str, Any], key: str, gguf: Path) -> Any:
    if key not in tensors:
        raise ValueError(f"{gguf}: no tensor {key!r} (is it this model's GGUF?)")
    return tensors[key]


def grid_linear(grid: Grid, bias: Tensor | None) -> nn.Module:
    """``grid`` as an XNNPACK linear: 4-bit blocks of 32 on their own codes, else 8da8w."""
    if grid.bits == 4:
        codes, step, constant = positive_steps(grid)
        return Int4GroupLinear.from_codes(codes, step, constant, bias, grid.block)
    return _linear8(grid, bias)


def positive_steps(grid: Grid) -> tuple[Tensor, Tensor, Tensor]:
    """``(codes, step, constant)`` with ``w = step * (codes - 8) + constant`` per block and every
    step > 0, as XNNPACK's blockwise kernel requires (it refuses a 0 or negative scale): a block
    with scale 0 (all ``-minimum``) gets codes 8 and step 1; a negative scale (Q4_0's ``d`` may
    be) flips the codes, ``s (q - 8) = (-s) ((15 - q) - 8) + (-s)``. Exact either way."""
    scale, minimum = grid.scales(), grid.minimums()
    codes = grid.codes.reshape(*scale.shape, grid.block).copy()
    constant = 8 * scale - minimum
    zero, neg = scale == 0, scale < 0
    codes[zero] = 8
    codes[neg] = 15 - codes[neg]
    constant = np.where(neg, constant - scale, constant)
    step = np.where(zero, np.float32(1), np.abs(scale))
    n, k = grid.codes.shape
    return (torch.from_numpy(codes.reshape(n, k)), torch.from_numpy(step.astype(np.float32)),
            torch.from_numpy(constant.astype(np.float32)))  # fmt: skip


def _linear8(grid: Grid, bias: Tensor | None) -> nn.Linear:
    """The dequantised ``grid`` at torchao 8da8w (int8 per output channel)."""
    n, k = grid.codes.shape
    linear = nn.Linear(k, n, bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(torch.from_numpy(grid.dequantize()), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
    return torchao_8da(linear, bits=8)


def grid_embedding(grid: Grid) -> nn.Module:
    """The embedding table on its grid: 4-bit blocks (``GridEmbedding4``), 8-bit blocks of a
    Q8_0 (``GridEmbedding8``), else int8 per row of the dequantised table."""
    if grid.bits == 4:
        return GridEmbedding4.from_grid(grid)
    if grid.source in ("Q8_0", "Q6_K"):
        return GridEmbedding8.from_grid(grid)
    from omnidraft_deploy.exporters.xnnpack.eager_quant import Int8Embedding

    n, k = grid.codes.shape
    emb = nn.Embedding(n, k, _weight=torch.from_numpy(grid.dequantize()))
    return Int8Embedding.from_float(emb)


class GridEmbedding4(nn.Module):
    """``quantized_decomposed.embedding_4bit``: row ``v`` is ``(c - 8 - zp) * scale`` per block,
    ``c`` the GGUF code (two a byte, even element in the high nibble), ``zp = minimum / scale - 8``
    so that it is ``scale * c - minimum`` (a block whose scale is 0 is ``-minimum`` throughout:
    codes 0, scale 1, ``zp = minimum - 8``)."""

    def __init__(self, packed: Tensor, scales: Tensor, zero_points: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", packed)  # (V, dim / 2) uint8
        self.register_buffer("scales", scales)  # (V, dim / block) fp32
        self.register_buffer("zero_points", zero_points)  # (V, dim / block) fp32

    @classmethod
    def from_grid(cls, grid: Grid) -> GridEmbedding4:
        scale, minimum = grid.scales(), grid.minimums()
        codes = grid.codes.copy()
        zero = scale == 0  # every weight of the block is -minimum: codes 0, scale 1, zp minimum - 8
        codes.reshape(*zero.shape, -1)[zero] = 0
        scale = np.where(zero, np.float32(1), scale)
        zp = (minimum / scale - 8).astype(np.float32)
        packed = (codes[:, 0::2] << 4) | codes[:, 1::2]
        return cls(torch.from_numpy(packed), torch.from_numpy(scale), torch.from_numpy(zp))

    def forward(self, token_ids: Tensor) -> Tensor:
        return torch.ops.quantized_decomposed.embedding_4bit.dtype(
            self.weight, self.scales, self.zero_points, -8, 7, token_ids, dtype=torch.float32
        )


class GridEmbedding8(nn.Module):
    """``quantized_decomposed.embedding_byte`` with a scale per block: ``(codes - 128) * scale``
    as int8 codes, exact for Q8_0 (and Q6_K)."""

    def __init__(self, weight: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)  # (V, dim) int8
        self.register_buffer("scales", scales)  # (V, dim / block) fp32

    @classmethod
    def from_grid(cls, grid: Grid) -> GridEmbedding8:
        codes = (grid.codes.astype(np.int16) - 128).astype(np.int8)
        return cls(torch.from_numpy(codes), torch.from_numpy(grid.scales()))

    def forward(self, token_ids: Tensor) -> Tensor:
        return torch.ops.quantized_decomposed.embedding_byte.dtype(
            self.weight, self.scales, None, -128, 127, token_ids, dtype=torch.float32
        )
