"""GGUF blocks kept on their own grid: a GGUF tensor's raw blocks -> ``Grid`` (codes + scales).

A weight published as Q4_K is already 4-bit: per sub-block of 32 weights ``w = (d * sc) * q -
dmin * m`` (``q`` 0..15, ``d``/``dmin`` fp16 per super-block of 256, ``sc``/``m`` 6-bit per
sub-block). Rounding it onto another grid throws accuracy away for nothing, so this module reads
the blocks as they are (``gguf.GGUFReader``, memory-mapped: one tensor at a time in RAM) and keeps

- codes: the GGUF's own integers (``bits`` 4 or 8, ``(N, K)`` uint8);
- the scale of each block of ``block`` inputs as ``hi[b // per] * lo[b]`` (``hi`` fp16 per group
  of ``per`` blocks, ``lo`` a small integer per block), so the file stays about as small as the
  GGUF and the graph rebuilds the fp32 scales exactly (an fp16 times a 6-bit integer is exact in
  fp32); likewise the minimum (4-bit only).

Dequantised, ``w = scale * codes - minimum`` (4-bit) or ``scale * (codes - 128)`` (8-bit): the
very expression of ``gguf.quants`` for Q4_K, Q4_1, Q6_K and Q8_0 (bit for bit), and within one
rounding for Q4_0. Per type:

- Q4_K, Q4_1, Q4_0: 4-bit, block 32 (MatMulNBits 4-bit with a float minimum per block);
- Q6_K: 8-bit, block 16 (``codes - 128`` is Q6_K's ``q - 32``; one int8 scale per 16): exact,
  and about as fast as blocks of 32 rounded from it (reports/quant_gguf: head 17.7 vs 15.5 ms);
- Q8_0: 8-bit, block 32: exact;
- any other type (Q5_x, F16, ...): dequantised by ``gguf`` and rounded to 8-bit symmetric blocks
  of 32 (``grids.quantize_blocks``): the one place a weight leaves its grid.

Pure numpy (and the ``gguf`` package for the fallback and the Q4_K scale unpacking); no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from omnidraft_deploy.catalog.presets import ModelSpec

QK_K = 256  # super-block of the K-quants
# a GGUF block's linear weights (``blk.<i>.<part>.weight``) -> the eager module in a layer
LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}  # fmt: skip


@dataclass(frozen=True)
class Grid:
    """``w (N, K)`` as integer codes and per-block scales (and minimums at 4 bits)."""

    bits: int  # 4 or 8
    block: int  # inputs per scale: 32 or 16
    codes: np.ndarray  # (N, K) uint8: 0..15 (4-bit) or 0..255 (8-bit, zero point 128)
    scale_hi: np.ndarray  # (N, n_blocks // per) float16 (float32 for re-rounded weights)
    scale_lo: np.ndarray  # (N, n_blocks) uint8 / int8 multiplier of its group's ``scale_hi``
    min_hi: np.ndarray | None = None  # 4-bit: minimum = min_hi[b // per] * min_lo[b]
    min_lo: np.ndarray | None = None
    source: str = ""  # the GGUF type it came from (``Q4_K``), or what it was rounded from

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        if self.bits not in (4, 8) or k % self.block:
            raise ValueError(f"grid: bits {self.bits} / K {k} not in whole blocks {self.block}")
        if self.scale_lo.shape != (n, k // self.block) or (self.bits == 4) != (
            self.min_hi is not None
        ):
            raise ValueError(f"grid {self.source}: scales {self.scale_lo.shape} do not fit {n}x{k}")

    @property
    def per(self) -> int:
        """Blocks sharing one ``scale_hi`` entry."""
        return self.scale_lo.shape[1] // self.scale_hi.shape[1]

    def scales(self) -> np.ndarray:
        """``(N, n_blocks)`` float32 scales: ``hi * lo`` (exact in fp32 for fp16 x 6/8-bit)."""
        return _expand(self.scale_hi, self.per) * self.scale_lo.astype(np.float32)

    def minimums(self) -> np.ndarray:
        """``(N, n_blocks)`` float32 minimums (4-bit): ``w = scale * codes - minimum``."""
        assert self.min_hi is not None and self.min_lo is not None
        return _expand(self.min_hi, self.per) * self.min_lo.astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """``(N, K)`` float32, in the order of operations ``gguf.quants`` uses."""
        n, k = self.codes.shape
        codes = self.codes.reshape(n, -1, self.block).astype(np.float32)
        scale = self.scales()[..., None]
        if self.bits == 8:
            return (scale * (codes - 128.0)).reshape(n, k)
        return (scale * codes - self.minimums()[..., None]).reshape(n, k)

    def packed(self) -> np.ndarray:
        """MatMulNBits' ``B``: ``(N, n_blocks, block * bits / 8)`` uint8, 4-bit low nibble first."""
        n = self.codes.shape[0]
        if self.bits == 8:
            return np.ascontiguousarray(self.codes.reshape(n, -1, self.block))
        c = self.codes.reshape(n, -1, self.block)
        return np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4))

    def rows(self, index: np.ndarray) -> Grid:
        """The grid of ``w[index]`` (a row permutation: llama q/k heads, ``llama_rows``)."""

        def take(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.ascontiguousarray(a[index])

        return Grid(self.bits, self.block, take(self.codes), take(self.scale_hi),  # type: ignore[arg-type]
                    take(self.scale_lo), take(self.min_hi), take(self.min_lo), self.source)  # type: ignore[arg-type]  # fmt: skip

    def nbytes(self) -> int:
        arrays = (self.scale_hi, self.scale_lo, self.min_hi, self.min_lo)
        return self.codes.size * self.bits // 8 + sum(a.nbytes for a in arrays if a is not None)


def llama_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k permutation (``convert_hf_to_gguf``'s ``permute``;
    transformers' ``reverse_permute_weights``): eager row ``r`` is GGUF row ``index[r]``."""
    half = n_rows // n_heads // 2
    return np.arange(n_rows).reshape(n_heads, half, 2).swapaxes(2, 1).reshape(-1)


def _expand(hi: np.ndarray, per: int) -> np.ndarray:
    return np.repeat(hi.astype(np.float32), per, axis=1)


def q4_k(raw: np.ndarray) -> Grid:
    """Q4_K rows ``(N, n_super * 144)`` uint8 -> 4-bit grid, block 32 (exact)."""
    from gguf.quants import Q4_K

    n = raw.shape[0]
    blocks = raw.reshape(-1, 144)  # d, dmin (fp16), 12 bytes of 6-bit sc/m, 128 bytes of codes
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, -1)
    dmin = blocks[:, 2:4].copy().view(np.float16).reshape(n, -1)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])  # (n_super_total, 8) each
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    codes = (qs & np.uint8(15)).reshape(n, -1)  # sub-block 2j low nibbles, 2j+1 high
    return Grid(4, 32, codes, d, sc.reshape(n, -1).astype(np.uint8), dmin,
                m.reshape(n, -1).astype(np.uint8), "Q4_K")  # fmt: skip


def _q4_legacy(raw: np.ndarray, with_min: bool) -> Grid:
    """Q4_0 (``d``, 16 bytes) / Q4_1 (``d``, ``m``, 16 bytes) per 32 -> 4-bit grid."""
    n, width = raw.shape[0], 20 if with_min else 18
    blocks = raw.reshape(-1, width)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, -1)
    qs = blocks[:, width - 16 :].reshape(-1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
    codes = (qs & np.uint8(15)).reshape(n, -1)  # low nibbles are elements 0..15, high 16..31
    ones = np.ones(d.shape, np.uint8)
    if with_min:  # w = d * q + m: minimum -m (fp16 negation is exact)
        m = blocks[:, 2:4].copy().view(np.float16).reshape(n, -1)
        return Grid(4, 32, codes, d, ones, -m, ones, "Q4_1")
    return Grid(4, 32, codes, d, ones, d, ones * np.uint8(8), "Q4_0")  # w = d*q - 8d


def q6_k(raw: np.ndarray) -> Grid:
    """Q6_K rows ``(N, n_super * 210)`` -> 8-bit grid, block 16 (exact)."""
    n = raw.shape[0]
    blocks = raw.reshape(-1, 210)  # 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8, d
    ql = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & np.uint8(15)).reshape(-1, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
        1, 1, 4, 1
    )
    q = ql | ((qh & np.uint8(3)) << np.uint8(4))  # (n_super, 2, 4, 32): 0..63, q - 32 signed
    codes = (q.reshape(n, -1) + np.uint8(96)).astype(np.uint8)  # codes - 128 = q - 32
    sc = blocks[:, 192:208].copy().view(np.int8).reshape(n, -1)
    d = blocks[:, 208:210].copy().view(np.float16).reshape(n, -1)
    return Grid(8, 16, codes, d, sc, source="Q6_K")


def q8_0(raw: np.ndarray) -> Grid:
    """Q8_0 rows (``d`` fp16 + 32 int8 per block) -> 8-bit grid, block 32 (exact)."""
    n = raw.shape[0]
    blocks = raw.reshape(-1, 34)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, -1)
    codes = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, -1)
    return Grid(8, 32, codes, d, np.ones(d.shape, np.int8), source="Q8_0")


def rounded8(w: np.ndarray, source: str, block: int = 32) -> Grid:
    """A float ``w (N, K)`` on the 8-bit symmetric block grid (``grids.quantize_blocks``)."""
    import torch
    from omnidraft_deploy.exporters.quant.grids import quantize_blocks

    q, scales, _ = quantize_blocks(torch.from_numpy(np.ascontiguousarray(w, np.float32)), 8, block)
    n = w.shape[0]
    ones = np.ones((n, scales.size // n), np.int8)
    return Grid(8, block, q.reshape(n, -1), scales.reshape(n, -1), ones, source=f"{source}->8")


READERS = {"Q4_K": q4_k, "Q6_K": q6_k, "Q8_0": q8_0,
           "Q4_0": lambda r: _q4_legacy(r, False), "Q4_1": lambda r: _q4_legacy(r, True)}  # fmt: skip


def tensor_grid(tensor: Any) -> Grid:
    """A ``gguf.ReaderTensor`` of a 2-D weight -> its ``Grid`` (``READERS``, else ``rounded8``)."""
    kind = tensor.tensor_type.name
    raw = np.asarray(tensor.data)
    if kind in READERS and raw.dtype == np.uint8:
        return READERS[kind](raw)  # type: ignore[no-any-return]
    from gguf.quants import dequantize

    return rounded8(dequantize(raw, tensor.tensor_type), kind)


CHECK_ROWS = 64  # rows of each tensor compared with the eager model


def checked_grid(tensor: Any, weight: np.ndarray, gguf: Path, n_heads: int = 0) -> Grid:
    """``tensor``'s grid, after checking that it dequantises to the eager ``weight`` on
    ``CHECK_ROWS`` rows spread over the matrix (a wrong file or layout differs everywhere; a full
    comparison would dequantise the whole model once more). A grid read as stored must match to
    fp32 rounding; one re-rounded to 8 bits (``rounded8``: Q5_0, F16, ...) within half its step,
    what rounding to nearest leaves. ``n_heads``: a q/k projection, which llama GGUFs store with
    permuted rows (tried second). Raises ``ValueError`` naming the file and the tensor."""
    grid = tensor_grid(tensor)
    n = grid.codes.shape[0]
    sample = np.unique(np.linspace(0, n - 1, min(n, CHECK_ROWS)).astype(np.int64))

    def same(g: Grid) -> bool:
        if g.codes.shape != weight.shape:
            return False
        rows = g.rows(sample)
        tol: np.ndarray | float = 1e-6
        if "->" in g.source:  # re-rounded: each weight moved by at most half a step
            tol = 1e-6 + np.repeat(np.abs(rows.scales()), g.block, axis=1) / 2
        return bool(np.all(np.abs(rows.dequantize() - weight[sample]) <= tol))

    if same(grid):
        return grid
    if n_heads and same(g := grid.rows(llama_rows(n, n_heads))):
        return g
    raise ValueError(
        f"{gguf}: tensor {tensor.name} ({grid.source} {grid.codes.shape}) does not match the "
        f"loaded model's weight {weight.shape}: export gguf4 from the GGUF the model was loaded from"
    )


def gguf_file(spec: ModelSpec) -> Path:
    """The GGUF whose blocks a ``gguf_grid`` recipe reads: the user's own file the weights came
    from (``--model X.gguf``), else the preset's pinned one. Every tensor is then checked against
    the loaded model, so weights of another file are refused, naming the tensor."""
    if spec.gguf_path:
        return Path(spec.gguf_path)
    if not spec.gguf_asset:
        raise ValueError(
            f"{spec.name!r} has no GGUF: a gguf_grid recipe (gguf4, gguf8) reads the weights' own "
            "blocks; export from a .gguf file (--model X.gguf) or choose another --quantization"
        )
    from omnidraft_deploy.catalog.assets import asset_path

    return asset_path(spec.gguf_asset)
