"""The one place a ``SpeculativeDecoder`` is built: ``build_decoder``.

The runtime, the CLI, the ``bench`` verb and the benchmarks hand over their models, the pair's
``VocabMapper`` and a policy (a ``draft_len.POLICIES`` name at a draft length, or a policy object).
What the pair decides is derived here, never copied by a caller: the target's vocabulary limit
(padded embedding rows are never sampled) and its EOS ids come from the mapper (``pair_config``,
which target-only baselines use too). ``cost`` drafts up to 2 x draft_len wherever it is built
(``draft_len.make_policy``), and a cost profile also lets each step choose between drafter,
lookup and no draft (``speculative.hybrid``).
"""

from __future__ import annotations

import dataclasses

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM, DraftLengthPolicy
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import make_policy
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.vocab.mapper import VocabMapper


def pair_config(mapper: VocabMapper, config: DecodeConfig | None = None, *,
                stop_at_eos: bool = True) -> DecodeConfig:  # fmt: skip
    """``config`` (default ``DecodeConfig()``) with the pair's target vocabulary limit and EOS ids
    (``mapper.target_vocab_size`` / ``target_eos``); ``stop_at_eos=False``: no EOS stops a
    generation (timings that must run their full length)."""
    return dataclasses.replace(config or DecodeConfig(), vocab_limit=mapper.target_vocab_size,
                               eos_ids=mapper.target_eos if stop_at_eos else ())  # fmt: skip


def build_decoder(
    target: CausalLM,
    drafter: CausalLM | None,
    mapper: VocabMapper,
    *,
    policy: str | DraftLengthPolicy = "heuristic",
    draft_len: int = 4,
    config: DecodeConfig | None = None,
    profile: CostProfile | None = None,
    ngram_cache: NGramCache | None = None,
    lookup: LookupProposer | None = None,
    stop_at_eos: bool = True,
) -> SpeculativeDecoder:
    """A speculative decoder of ``target`` (target ids only) with ``drafter`` (None: lookup drafts
    only) through ``mapper``. ``policy``: a ``POLICIES`` name built at ``draft_len`` (``cost``
    needs ``profile``), or a policy object as is. With a ``profile`` every step also chooses
    between the drafter, ``lookup`` and no draft. ``config`` supplies mode, temperature, token
    budget and threads; vocabulary limit and EOS ids are the pair's (``pair_config``)."""
    if isinstance(policy, str):
        policy = make_policy(policy, draft_len, profile)
    cfg = pair_config(mapper, config, stop_at_eos=stop_at_eos)
    return SpeculativeDecoder(target, drafter, mapper, policy, ngram_cache, config=cfg,
                              lookup=lookup, profile=profile)  # fmt: skip
