"""The one registry of model presets: real drafter/targets, their tiny offline twins, real small LMs.

A preset is data: architecture dimensions, which tokenizer it speaks, where the real weights come
from. ``tiny-*`` presets keep the family (Llama / Qwen2 block layout, GQA, qkv bias, tied
embeddings) and the *real* tokenizer and vocabulary size, but use small random-initialised dims so
everything runs offline on a CPU in seconds.

Lookup is loud: an unknown name raises ``KeyError`` listing every valid name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    LLAMA = "llama"  # RMSNorm, RoPE (rotate-half), SwiGLU, optional GQA
    QWEN2 = "qwen2"  # Llama block + bias on q/k/v projections


class Role(StrEnum):
    DRAFTER = "drafter"
    TARGET = "target"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    role: Role
    family: Family
    tokenizer: str  # key of omnidraft_deploy.vocab.tokenizers registry
    vocab_size: (
        int  # rows of the embedding (may exceed the tokenizer's id count, e.g. Qwen2 152064)
    )
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_seq_len: int = 2048
    hf_id: str | None = (
        None  # Hugging Face model id of the real weights (needs a hub or local copy)
    )
    gguf_asset: str | None = None  # key in omnidraft_deploy.assets for a pinned offline GGUF
    tiny_of: str | None = None  # for tiny presets: the real preset this one mirrors

    def __post_init__(self) -> None:
        for field in (
            "vocab_size",
            "dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "intermediate_size",
        ):
            value = getattr(self, field)
            if value <= 0:
                raise ValueError(f"{self.name}: {field} must be positive, got {value}")
        if self.dim % self.n_heads:
            raise ValueError(f"{self.name}: dim {self.dim} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.name}: n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def qkv_bias(self) -> bool:
        return self.family is Family.QWEN2

    @property
    def is_tiny(self) -> bool:
        return self.tiny_of is not None

    def n_params(self) -> int:
        """Parameter count implied by the dimensions (embeddings included)."""
        kv = self.n_kv_heads * self.head_dim
        attn = self.dim * (self.dim + 2 * kv) + self.dim * self.dim
        if self.qkv_bias:
            attn += self.dim + 2 * kv
        mlp = 3 * self.dim * self.intermediate_size
        per_layer = attn + mlp + 2 * self.dim
        emb = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + emb + self.dim


_TINY_DIMS = dict(dim=64, n_layers=2, n_heads=4, intermediate_size=128, max_seq_len=512)


def _tiny(spec: ModelSpec) -> ModelSpec:
    kv = 4 if spec.n_kv_heads == spec.n_heads else 2  # keep GQA where the real model has it
    return dataclasses.replace(
        spec,
        name=f"tiny-{spec.name}",
        n_kv_heads=kv,
        hf_id=None,
        gguf_asset=None,
        tiny_of=spec.name,
        **_TINY_DIMS,  # type: ignore[arg-type]
    )


_REAL: tuple[ModelSpec, ...] = (
    # The paper's drafter: JackFram/llama-68m, Llama-2 SentencePiece vocabulary.
    ModelSpec(
        "llama-68m",
        Role.DRAFTER,
        Family.LLAMA,
        "llama2",
        32000,
        768,
        2,
        12,
        12,
        3072,
        hf_id="JackFram/llama-68m",
    ),
    # Same vocabulary as the drafter: the same-vocabulary control pair.
    ModelSpec(
        "vicuna-7b",
        Role.TARGET,
        Family.LLAMA,
        "vicuna",
        32000,
        4096,
        32,
        32,
        32,
        11008,
        max_seq_len=4096,
        hf_id="lmsys/vicuna-7b-v1.5",
    ),
    ModelSpec(
        "qwen2-7b",
        Role.TARGET,
        Family.QWEN2,
        "qwen2",
        152064,
        3584,
        28,
        28,
        4,
        18944,
        rope_theta=1e6,
        norm_eps=1e-6,
        max_seq_len=32768,
        hf_id="Qwen/Qwen2-7B-Instruct",
    ),
    ModelSpec(
        "llama3-8b",
        Role.TARGET,
        Family.LLAMA,
        "llama3",
        128256,
        4096,
        32,
        32,
        8,
        14336,
        rope_theta=5e5,
        max_seq_len=8192,
        hf_id="meta-llama/Meta-Llama-3-8B-Instruct",
    ),
    ModelSpec(
        "qwen2.5-14b",
        Role.TARGET,
        Family.QWEN2,
        "qwen2",
        152064,
        5120,
        48,
        40,
        8,
        13824,
        rope_theta=1e6,
        norm_eps=1e-6,
        max_seq_len=32768,
        hf_id="Qwen/Qwen2.5-14B-Instruct",
    ),
    ModelSpec(
        "qwen2.5-32b",
        Role.TARGET,
        Family.QWEN2,
        "qwen2",
        152064,
        5120,
        64,
        40,
        8,
        27648,
        rope_theta=1e6,
        norm_eps=1e-6,
        max_seq_len=32768,
        hf_id="Qwen/Qwen2.5-32B-Instruct",
    ),
)

# The only real small LMs obtainable offline (pinned GGUFs, see omnidraft_deploy.assets).
_REAL_SMALL: tuple[ModelSpec, ...] = (
    ModelSpec(
        "smollm2-135m",
        Role.DRAFTER,
        Family.LLAMA,
        "smollm2",
        49152,
        576,
        30,
        9,
        3,
        1536,
        rope_theta=1e5,
        tie_embeddings=True,
        max_seq_len=2048,
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_asset="smollm2-135m-gguf",
    ),
    ModelSpec(
        "qwen2.5-0.5b",
        Role.TARGET,
        Family.QWEN2,
        "qwen2",
        151936,
        896,
        24,
        14,
        2,
        4864,
        rope_theta=1e6,
        norm_eps=1e-6,
        tie_embeddings=True,
        max_seq_len=2048,
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        gguf_asset="qwen2.5-0.5b-gguf",
    ),
)

PRESETS: dict[str, ModelSpec] = {
    s.name: s for s in (*_REAL, *_REAL_SMALL, *(_tiny(r) for r in _REAL))
}

DEFAULT_DRAFTER = "tiny-llama-68m"
DEFAULT_TARGET = "tiny-llama3-8b"


def get_preset(name: str) -> ModelSpec:
    """Return the preset called ``name``; unknown names raise ``KeyError`` listing valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}") from None


def list_presets(role: Role | None = None) -> list[ModelSpec]:
    return [s for s in PRESETS.values() if role is None or s.role is role]
