"""The one assembly of a pair's vocabularies: both tokenizers and the ``VocabMapper`` between them.

``load_pair_vocab(target, drafter, target_weights=..., drafter_weights=...)``: each role's
tokenizer is its weights' own when they carry one (a GGUF's tables, an HF folder's tokenizer:
``from_weights``), else its preset's (``ModelSpec.tokenizer``); the mapper is
``build.build_mapper`` (cached on disk). ``PairVocab.of`` pairs tokenizers already resolved (the
export's, checked by ``inputs.resolve_export``). Models are loaded elsewhere (``reference.load``;
``pipeline.build_pair`` adds them): this is an edge module, where tokenizers may appear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omnidraft_deploy.catalog.presets import ModelSpec

if TYPE_CHECKING:  # protocols and the mapper import torch
    from omnidraft_deploy.protocols import TokenizerLike
    from omnidraft_deploy.vocab.mapper import VocabMapper


@dataclass(frozen=True)
class PairVocab:
    target_tok: TokenizerLike
    drafter_tok: TokenizerLike
    mapper: VocabMapper  # drafter ids <-> target ids

    @classmethod
    def of(cls, target_tok: TokenizerLike, drafter_tok: TokenizerLike) -> PairVocab:
        from omnidraft_deploy.vocab.build import build_mapper

        return cls(target_tok, drafter_tok, build_mapper(drafter_tok, target_tok))


def role_tokenizer(spec: ModelSpec, weights: str | None = None) -> TokenizerLike:
    """The weights' own tokenizer when they carry one, else the preset's. Whether the two agree
    is checked by ``inputs.resolve_role`` (the export refuses a disagreement)."""
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    if weights is not None:
        from omnidraft_deploy.vocab.from_weights import read_weights_vocab

        own = read_weights_vocab(weights).tokenizer
        if own is not None:
            return own
    return load_tokenizer(spec.tokenizer)


def load_pair_vocab(
    target: ModelSpec, drafter: ModelSpec, *, target_weights: str | None = None,
    drafter_weights: str | None = None,
) -> PairVocab:  # fmt: skip
    """Both roles' tokenizers (``role_tokenizer``) and the mapper between them."""
    return PairVocab.of(
        role_tokenizer(target, target_weights), role_tokenizer(drafter, drafter_weights)
    )
