"""Rotary position tables, with Llama-3.x frequency scaling (``rope_type: llama3``).

Llama-3.1 / 3.2 rescale the rotary frequencies by wavelength (Meta's ``apply_scaling``;
transformers ``modeling_rope_utils._compute_llama3_parameters``). With ``L =
original_max_position_embeddings``, ``inv_freq_i = theta ** (-2i / head_dim)`` and
``wavelen_i = 2 pi / inv_freq_i``::

    wavelen_i < L / high_freq_factor   -> inv_freq_i                      (high frequencies kept)
    wavelen_i > L / low_freq_factor    -> inv_freq_i / factor             (low frequencies slowed)
    otherwise, s = (L / wavelen_i - low_freq_factor) / (high_freq_factor - low_freq_factor)
                                       -> (1 - s) * inv_freq_i / factor + s * inv_freq_i

Sources: an HF ``config.json`` carries the four numbers in ``rope_parameters`` (transformers 5)
or ``rope_scaling`` (older); a GGUF written by llama.cpp carries the per-frequency divisors as the
tensor ``rope_freqs.weight`` (``inv_freq_i / rope_freqs_i``), which ``llama3_from_freq_factors``
turns back into the four numbers (checked, never guessed). Every other scaled ``rope_type``
(linear, dynamic, yarn, longrope) is refused by name rather than silently run unscaled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

LLAMA3_DEFAULTS = (1.0, 4.0, 8192)  # low_freq_factor, high_freq_factor, original context (3.1/3.2)


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.x frequency scaling (the only scaled RoPE supported)."""

    factor: float  # 8 for Llama-3.1, 32 for Llama-3.2
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192  # the pre-training context L

    def __post_init__(self) -> None:
        if not self.factor >= 1.0 or not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(f"invalid llama3 rope scaling {self}")
        if self.original_max_position_embeddings < 1:
            raise ValueError(
                f"original_max_position_embeddings {self.original_max_position_embeddings}"
            )

    def to_config(self, theta: float) -> dict[str, Any]:
        """The HF ``rope_parameters`` dict (transformers 5) describing this scaling."""
        return {"rope_type": "llama3", "rope_theta": theta, "factor": self.factor,
                "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}  # fmt: skip


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> Tensor:
    """(head_dim // 2,) float32 rotary inverse frequencies, Llama-3 scaled when ``scaling``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is None:
        return inv_freq
    s = scaling
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[Tensor, Tensor]:
    """cos, sin tables (max_seq_len, head_dim) in HF's rotate-half layout."""
    inv_freq = inv_frequencies(head_dim, theta, scaling)
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def scaling_from_config(cfg: Mapping[str, Any]) -> RopeScaling | None:
    """The RoPE scaling of an HF ``config.json`` dict: None (default RoPE) or ``RopeScaling``.

    Raises ``ValueError`` naming any other ``rope_type``."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ValueError(f"rope_type {rope_type!r} not supported (default and llama3 only)")
    original = rope.get("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    if original is None:
        raise ValueError("rope_type 'llama3' without original_max_position_embeddings")
    return RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(original),
    )  # fmt: skip


def llama3_from_freq_factors(
    freq_factors: Sequence[float], head_dim: int, theta: float, *, original: int | None = None
) -> RopeScaling:
    """The Llama-3 scaling whose divisors are a GGUF's ``rope_freqs.weight`` (llama.cpp stores
    ``inv_freq / inv_freq_scaled`` per frequency). ``factor`` is the largest divisor; the other
    three numbers are Llama-3.1/3.2's (``original`` from the GGUF if it says). Raises
    ``ValueError`` if these numbers do not reproduce every divisor (a scaling we do not know)."""
    got = torch.tensor([float(f) for f in freq_factors], dtype=torch.float32)
    if got.shape != (head_dim // 2,):
        raise ValueError(
            f"rope_freqs has {got.numel()} values; head_dim {head_dim} needs {head_dim // 2}"
        )
    low, high, context = LLAMA3_DEFAULTS
    scaling = RopeScaling(float(got.max()), low, high, original or context)
    base = inv_frequencies(head_dim, theta)
    want = base / inv_frequencies(head_dim, theta, scaling)
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
        raise ValueError(
            f"rope_freqs {got.tolist()} are not Llama-3 scaling ({scaling}): not supported"
        )
    return scaling
