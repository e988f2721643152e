"""Composition helpers shared by the CLI and benchmarks: a resolved preset pair -> models (through
``resolve.load``), tokenizers and the mapper.

This is an edge module: it may touch tokenizers (lazily) because it sits between user text and the
target-id-only decoding core.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omnidraft_deploy.catalog.presets import ModelSpec
from omnidraft_deploy.protocols import CausalLM, TokenizerLike
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)


@dataclass
class Pair:
    target: CausalLM
    drafter: CausalLM
    target_tok: TokenizerLike
    drafter_tok: TokenizerLike
    mapper: VocabMapper


def build_pair(
    target: ModelSpec,
    drafter: ModelSpec,
    *,
    seed: int = 0,
    max_seq_len: int | None = None,
    target_weights: str | None = None,
    drafter_weights: str | None = None,
) -> Pair:
    """Both eager models (``resolve.load``, the one model loader) and the pair's tokenizers and
    mapper (``vocab.pair.load_pair_vocab``, the one vocabulary assembly)."""
    from omnidraft_deploy.resolve.load import load_lm
    from omnidraft_deploy.vocab.pair import load_pair_vocab

    vocab = load_pair_vocab(
        target, drafter, target_weights=target_weights, drafter_weights=drafter_weights
    )
    return Pair(
        target=load_lm(target, seed=seed, max_seq_len=max_seq_len, weights=target_weights),
        drafter=load_lm(drafter, seed=seed + 1, max_seq_len=max_seq_len, weights=drafter_weights),
        target_tok=vocab.target_tok,
        drafter_tok=vocab.drafter_tok,
        mapper=vocab.mapper,
    )
