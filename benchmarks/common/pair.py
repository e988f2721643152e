"""The pair and decoder factory: models, vocabularies, prompts and speculative decoders, built once.

- ``load_pair``: both eager models from the library's one loader (``resolve.load.load_model``)
  and the pair's tokenizers and mapper from its one vocabulary assembly (``vocab.pair``). The
  ``Transformer`` modules are kept (training, export and copies need them); ``lms`` wraps them
  behind ``CausalLM``. ``pair_vocab`` is the vocabulary half alone (drafters that run as graphs).
- ``make_decoder``: a ``SpeculativeDecoder`` as every benchmark builds one, from a policy name.
- ``prompt_texts`` / ``task_prompts``: the real-pair prompt set (24 prompts, four tasks, shipped in
  ``omnidraft_deploy/data``), plus the code-editing prompts of ``code_edit_prompts.json``.

An edge module: tokenizers appear here and in the scripts; the decoders see target ids only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM, TokenizerLike
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.resolve.load import load_model
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen, make_policy
from omnidraft_deploy.speculative.lookup import LookupConfig, LookupProposer
from omnidraft_deploy.vocab.mapper import VocabMapper
from omnidraft_deploy.vocab.pair import PairVocab, load_pair_vocab

CODE_EDIT_PROMPTS = Path(__file__).resolve().parents[1] / "code_edit_prompts.json"


@dataclass(frozen=True)
class BenchPair:
    """Both eager models of a pair and its vocabularies (tokenizers + mapper)."""

    target: Transformer
    drafter: Transformer
    vocab: PairVocab

    @property
    def mapper(self) -> VocabMapper:
        return self.vocab.mapper

    @property
    def target_tok(self) -> TokenizerLike:
        return self.vocab.target_tok

    def lms(self) -> tuple[CausalLM, CausalLM]:
        """(target, drafter) behind the ``CausalLM`` protocol (the eager reference runtime)."""
        return EagerLM(self.target), EagerLM(self.drafter)


def pair_vocab(target: str, drafter: str) -> PairVocab:
    """Tokenizers and mapper of two presets (``vocab.pair.load_pair_vocab``)."""
    return load_pair_vocab(get_preset(target), get_preset(drafter))


def load_pair(target: str, drafter: str, *, max_seq_len: int | None = None,
              drafter_max_seq_len: int | None = None) -> BenchPair:  # fmt: skip
    """The two presets' models and vocabularies; ``max_seq_len`` sizes the target's KV cache,
    ``drafter_max_seq_len`` the drafter's (None: the preset's own)."""
    t_spec, d_spec = get_preset(target), get_preset(drafter)  # resolved once
    return BenchPair(load_model(t_spec, max_seq_len=max_seq_len),
                     load_model(d_spec, max_seq_len=drafter_max_seq_len),
                     load_pair_vocab(t_spec, d_spec))  # fmt: skip


def make_decoder(target: CausalLM, drafter: CausalLM | None, mapper: VocabMapper,
                 cfg: DecodeConfig, *, policy: str = "fixed", draft_len: int = 4,
                 profile: CostProfile | None = None, ngram_cache: NGramCache | None = None,
                 lookup: bool = False) -> SpeculativeDecoder:  # fmt: skip
    """A speculative decoder. ``policy``: a ``draft_len.make_policy`` name at ``draft_len``, or
    ``"cost"``: cost-aware drafting of up to ``draft_len`` tokens steered by the measured
    ``profile``, which then also picks per step between the drafter, lookup and no draft.
    ``drafter`` None: lookup drafts only. ``lookup``: a fresh ``LookupProposer`` over each
    prompt's own text (``keep_history=False``: repeated runs never see earlier outputs)."""
    if policy == "cost":
        if profile is None:
            raise ValueError("the cost policy needs a measured profile")
        chosen: Any = CostAwareDraftLen(profile, draft_len)
    elif profile is not None:
        raise ValueError(f"a cost profile steers the cost policy only, not {policy!r}")
    else:
        chosen = make_policy(policy, draft_len)
    look = LookupProposer(LookupConfig(keep_history=False)) if lookup else None
    return SpeculativeDecoder(target, drafter, mapper, chosen, ngram_cache, config=cfg,
                              lookup=look, profile=profile)  # fmt: skip


def prompt_texts(*, code_edit: bool = False) -> list[dict[str, str]]:
    """The real-pair prompts (``{"task", "text"}``, file order), plus the code-editing ones."""
    raw = json.loads(resources.files("omnidraft_deploy").joinpath(
        "data/real_pair_prompts.json").read_text("utf-8"))  # fmt: skip
    if code_edit:
        raw += json.loads(CODE_EDIT_PROMPTS.read_text("utf-8"))
    return list(raw)


def task_prompts(tok: TokenizerLike, tasks: Iterable[str]) -> list[tuple[str, list[int]]]:
    """(task, target ids) of every real-pair prompt of ``tasks``, in file order, encoded plainly."""
    keep = set(tasks)
    return [(p["task"], tok.encode(p["text"])) for p in prompt_texts() if p["task"] in keep]
