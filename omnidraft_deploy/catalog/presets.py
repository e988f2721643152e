"""The one registry of model presets: real drafter/targets, their tiny offline twins, real small LMs
and the small models this project trains itself.

A preset is data: architecture dimensions, which tokenizer it speaks, and ``source``, where its
weights come from (``resolve.load.load_model`` is the one loader that reads it):

- ``random``: ``tiny-*`` twins keep the family (Llama / Qwen2 block layout, GQA, qkv bias, tied
  embeddings) and the *real* tokenizer and vocabulary size, but use small random-initialised dims
  so everything runs offline on a CPU in seconds (the fast tests);
- ``hf``: a Hugging Face folder or hub id (``hf_id``; no hub is reachable here: pass a folder);
- ``gguf``: a pinned GGUF asset, dequantised once, a safetensors copy cached;
- ``pretrain``: ``trained-*`` models trained by ``distill.pretrain`` on the offline corpus
  (``pretrain`` holds the schedule), cached keyed by config + data hash: the pairs whose
  acceptance is meaningful without any download (the default demo pair);
- ``weights``: not a registered preset: the spec ``resolve.weights_spec`` reads from the user's
  own weights (``omnidraft-export --model X`` without ``--target``), named by their metadata.

Presets are shortcuts that name pinned weights; no export needs one.

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


class Source(StrEnum):
    RANDOM = "random"  # random init from a seed (tiny twins)
    HF = "hf"  # Hugging Face folder / hub id (hf_id)
    GGUF = "gguf"  # pinned GGUF asset (gguf_asset), dequantised, safetensors copy cached
    PRETRAIN = "pretrain"  # trained by distill.pretrain on the offline corpus, cached
    EARLY_EXIT = "early_exit"  # first n_layers of a parent, distilled by distill.offline, cached
    WEIGHTS = "weights"  # the user's own files (--model), named by their metadata: no preset


@dataclass(frozen=True)
class SeqKD:
    """Sequence-level distillation (Kim & Rush 2016, arXiv:1606.07947) for a ``pretrain`` drafter:
    ``teacher``'s greedy continuations of corpus prompts join the drafter's training text, so the
    drafter learns what the target says (greedy speculative decoding accepts exactly that)."""

    teacher: str  # a pretrain-source target preset (trained first when not cached)
    prompts: int = 800  # corpus prompts continued by the teacher
    new_tokens: int = 48  # greedy teacher tokens per prompt (fewer at EOS)
    frac: float = 0.5  # share of training steps drawn from the teacher's text

    def __post_init__(self) -> None:
        if self.prompts < 1 or self.new_tokens < 1 or not 0 < self.frac <= 1:
            raise ValueError(f"bad sequence-level KD settings {self}")


@dataclass(frozen=True)
class PretrainSchedule:
    """How ``distill.pretrain`` trains a ``pretrain``-source preset (one torch thread, CPU)."""

    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 50
    seq_len: int = 128  # packed training window (tokens)
    seed: int = 0
    kd: SeqKD | None = None  # distil from a target's generations as well (drafters)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.lr <= 0 or self.seq_len < 2 or self.warmup < 0:
            raise ValueError(f"bad pretrain schedule {self}")


@dataclass(frozen=True)
class EarlyExitRecipe:
    """How ``distill.offline`` builds an ``early_exit`` preset: the first ``n_layers`` of ``parent``
    (plus its final norm and lm_head), distilled against ``target``'s top-k on the offline corpus
    with the hybrid loss; only the last ``train_layers`` blocks and the final norm train (the
    embedding / tied lm_head and the earlier blocks stay frozen). CPU minutes, cached."""

    parent: str  # preset whose first layers are kept
    target: str  # preset whose top-k distributions are distilled
    windows_per_task: int = 6  # target-token windows per corpus task (top-k precomputed once)
    window: int = 128  # target tokens per window
    topk: int = 8
    steps: int = 20  # optimiser steps (AdamW, warmup + cosine)
    batch_size: int = 2  # windows per step
    lr: float = 1e-3
    warmup: int = 3
    lam: float = 1.0  # L_DM + lam * L_Ngram
    train_layers: int = 1  # the last blocks trained (plus the final norm); the rest stay frozen
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.windows_per_task, self.steps, self.batch_size, self.topk) < 1 or self.lr <= 0:
            raise ValueError(f"bad early-exit recipe {self}")
        if self.window < 2 or self.lam < 0 or self.warmup < 0 or self.train_layers < 0:
            raise ValueError(f"bad early-exit recipe {self}")


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
    gguf_asset: str | None = (
        None  # key in omnidraft_deploy.catalog.assets for a pinned offline GGUF
    )
    gguf_path: str | None = None  # the user's own .gguf the weights were read from (``--model``)
    tiny_of: str | None = None  # for tiny presets: the real preset this one mirrors
    source: Source = Source.HF  # where the weights come from (module docstring)
    pretrain: PretrainSchedule | None = None  # the schedule of a pretrain-source preset
    early_exit: EarlyExitRecipe | None = None  # the recipe of an early_exit-source preset

    def __post_init__(self) -> None:
        need = {Source.HF: self.hf_id, Source.GGUF: self.gguf_asset, Source.PRETRAIN: self.pretrain,
                Source.EARLY_EXIT: self.early_exit}  # fmt: skip
        if self.source in need and need[self.source] is None:
            raise ValueError(f"{self.name}: source {self.source.value} needs its field set")
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

    @property
    def weights_from(self) -> str:
        """Where the weights come from, in words (``omnidraft presets``)."""
        where = {Source.RANDOM: f"random twin of {self.tiny_of}", Source.HF: self.hf_id,
                 Source.GGUF: f"GGUF {self.gguf_asset}", Source.PRETRAIN: "distill.pretrain",
                 Source.EARLY_EXIT: f"distill.offline of {self.early_exit and self.early_exit.parent}",
                 Source.WEIGHTS: "the files passed with --model / --drafter-model"}  # fmt: skip
        return f"{self.source.value}: {where[self.source]}"

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
        source=Source.RANDOM,
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

# The only real small LMs obtainable offline (pinned GGUFs, see omnidraft_deploy.catalog.assets).
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
        source=Source.GGUF,
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
        source=Source.GGUF,
    ),
    ModelSpec(
        "qwen2.5-1.5b",
        Role.TARGET,
        Family.QWEN2,
        "qwen2",
        151936,
        1536,
        28,
        12,
        2,
        8960,
        rope_theta=1e6,
        norm_eps=1e-6,
        tie_embeddings=False,  # the 1.5B has its own output head (Q6_K in the GGUF)
        max_seq_len=2048,
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        gguf_asset="qwen2.5-1.5b-gguf",
        source=Source.GGUF,
    ),
)


def _trained(name: str, role: Role, family: Family, tokenizer: str, vocab: int, *,
             small: bool, rope: float, steps: int, seed: int,
             kd: SeqKD | None = None) -> ModelSpec:  # fmt: skip
    """A ``distill.pretrain`` model: drafter 2 x 128 (4.5M params), target 4 x 192 (GQA)."""
    dims = (128, 2, 4, 4, 384) if small else (192, 4, 4, 2, 512)
    return ModelSpec(name, role, family, tokenizer, vocab, *dims, rope_theta=rope,
                     tie_embeddings=True, max_seq_len=1024, source=Source.PRETRAIN,
                     pretrain=PretrainSchedule(steps=steps, seed=seed, kd=kd))  # fmt: skip


# Trained here on the offline corpus (distill.data), one torch thread on an idle 2-core machine:
# drafter ~2.5 min, the demo target (2000 steps) ~7 min (38 min at nice 10 on a machine at load
# 10-24), each benchmark target (5000 steps) ~15 min; the demo drafter first has the demo target
# continue 800 corpus prompts (12 took 4.4 s at load ~20); cached under <cache>/pretrained keyed by
# config + data hash (+ the teacher's cache file for a distilled drafter).
_TRAINED: tuple[ModelSpec, ...] = (
    _trained("trained-llama2-drafter", Role.DRAFTER, Family.LLAMA, "llama2", 32000,
             small=True, rope=1e4, steps=2000, seed=0),
    _trained("trained-llama3-demo", Role.TARGET, Family.LLAMA, "llama3", 128256,
             small=False, rope=5e5, steps=2000, seed=1),
    # make demo's drafter: the drafter above, also taught the demo target's own greedy text
    _trained("trained-llama2-demo", Role.DRAFTER, Family.LLAMA, "llama2", 32000,
             small=True, rope=1e4, steps=2000, seed=0, kd=SeqKD("trained-llama3-demo")),
    _trained("trained-llama3-target", Role.TARGET, Family.LLAMA, "llama3", 128256,
             small=False, rope=5e5, steps=5000, seed=1),
    _trained("trained-qwen2-target", Role.TARGET, Family.QWEN2, "qwen2", 152064,
             small=False, rope=1e6, steps=5000, seed=2),
)  # fmt: skip


def _early_exit(parent: ModelSpec, n_layers: int, target: str) -> ModelSpec:
    """The first ``n_layers`` of ``parent`` as a drafter, distilled against ``target``."""
    return dataclasses.replace(
        parent, name=f"{parent.name.split('-')[0]}-ee{n_layers}", n_layers=n_layers, hf_id=None,
        gguf_asset=None, source=Source.EARLY_EXIT, early_exit=EarlyExitRecipe(
            # 192 windows x 128 target tokens, 600 steps of 4: ~10 min on 2 quiet cores (the
            # first recipe, 24 windows x 20 steps of 2, took 1 min and reached acceptance 0.00-0.04)
            parent.name, target, windows_per_task=48, steps=600, batch_size=4, warmup=20,
            train_layers=2,
        ),
    )  # fmt: skip


# Early-exit SmolLM2 drafter (issue 9): 8 of 30 layers, 56M params, for the Qwen2.5-0.5B target.
_EARLY_EXIT: tuple[ModelSpec, ...] = (_early_exit(_REAL_SMALL[0], 8, "qwen2.5-0.5b"),)

PRESETS: dict[str, ModelSpec] = {
    s.name: s for s in (*_REAL, *_REAL_SMALL, *(_tiny(r) for r in _REAL), *_TRAINED, *_EARLY_EXIT)
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
