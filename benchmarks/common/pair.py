"""The pair: models, vocabularies and prompts, built once (decoders: ``speculative.factory``).

- ``load_pair``: both eager models from the library's one loader (``resolve.load.load_model``)
  and the pair's tokenizers and mapper from its one vocabulary assembly (``vocab.pair``). The
  ``Transformer`` modules are kept (training, export and copies need them; ``EagerLM`` puts one
  behind ``CausalLM``). ``pair_vocab`` is the vocabulary half alone (drafters that run as graphs).
- ``fresh_lookup``: the lookup proposer a benchmark's decoder takes (no history across runs); the
  decoder itself comes from the library's one factory, ``speculative.factory.build_decoder``.
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

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.resolve.load import load_model
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


def fresh_lookup() -> LookupProposer:
    """Lookup drafts over each prompt's own text only (``keep_history=False``): repeated runs of a
    benchmark never see earlier outputs. Decoders come from ``speculative.factory.build_decoder``."""
    return LookupProposer(LookupConfig(keep_history=False))


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
