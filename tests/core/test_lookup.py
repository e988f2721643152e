"""Lookup proposer (bounded memory), hybrid proposer: greedy == target-only, exact stays exact."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen, FixedDraftLen
from omnidraft_deploy.speculative.drafter import Mode
from omnidraft_deploy.speculative.hybrid import HybridProposer
from omnidraft_deploy.speculative.lookup import LookupConfig, LookupProposer
from omnidraft_deploy.speculative.lossless import chi_square, chi_square_z, exact_sequence_probs
from omnidraft_deploy.testing import TableTokenizer, toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper

CHEAP = CostProfile(target_ms=(100.0, 101.0, 102.0, 103.0, 104.0), drafter_ms=(10.0,))
DEAR = CostProfile(target_ms=(100.0, 102.0, 112.0, 116.0, 134.0), drafter_ms=(45.0,))


def test_lookup_proposes_the_latest_continuation_longest_match_first() -> None:
    lk = LookupProposer(LookupConfig(min_ngram=1, max_ngram=3, keep_history=False))
    lk.reset([1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3])
    assert lk.propose(2) == ([4, 9], 3)  # the longest match, "1 2 3", wins over "2 3"
    lk.reset([2, 3, 4, 8, 2, 3, 5, 6, 2, 3])
    assert lk.propose(3) == ([5, 6, 2], 2)  # the latest "2 3"
    lk.reset([7, 8])
    assert lk.propose(4) == ([], 0)  # history dropped, nothing seen twice
    assert lk.propose(0) == ([], 0)


def test_lookup_memory_is_bounded_and_history_carries() -> None:
    cfg = LookupConfig(min_ngram=2, max_ngram=4, max_tokens=64)
    lk = LookupProposer(cfg)
    for i in range(50):
        lk.reset([i % 7, (i * 3) % 11, 5, 6])
        lk.extend([(i * j) % 13 for j in range(20)])
        assert len(lk) <= cfg.max_tokens
        assert lk.index_size <= cfg.max_tokens * (cfg.max_ngram - cfg.min_ngram + 1)
    lk2 = LookupProposer(cfg)
    lk2.reset([10, 11, 12, 13])
    lk2.reset([10, 11])  # history kept: the earlier prompt continues this one
    assert lk2.propose(2) == ([12, 13], 2)
    with pytest.raises(ValueError):
        LookupConfig(min_ngram=3, max_ngram=2)


def _pair(seed: int = 0):
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = EagerLM(build_model(toy_spec(tt.vocab_size), seed=seed + 1, init_std=0.5))
    drafter = EagerLM(build_model(toy_spec(dt.vocab_size), seed=seed + 2, init_std=0.5))
    return tt, mapper, target, drafter


@pytest.mark.parametrize("profile", [CHEAP, DEAR])
def test_greedy_equality_lookup_only_and_hybrid(profile: CostProfile) -> None:
    tt, mapper, target, drafter = _pair()
    cfg = DecodeConfig(max_new_tokens=40)
    sources: Counter[str] = Counter()
    for prompt in ("ab ca ab ca ab", "c", " abc abc abc", "bbbb"):
        ids = tt.encode(prompt)
        ref, _ = generate_target_only(target, ids, cfg)
        lookup_only = SpeculativeDecoder(target, None, mapper, FixedDraftLen(4), config=cfg,
                                         lookup=LookupProposer(), profile=profile)  # fmt: skip
        assert lookup_only.generate(ids)[0] == ref
        hybrid = SpeculativeDecoder(target, drafter, mapper, CostAwareDraftLen(profile, 4),
                                    NGramCache(), config=cfg, lookup=LookupProposer(),
                                    profile=profile)  # fmt: skip
        out, stats = hybrid.generate(ids)
        assert out == ref and stats.n_generated == len(ref)
        assert isinstance(hybrid.drafter, HybridProposer)
        sources.update(s.source for s in hybrid.drafter.trace)
    assert sources["lookup"] > 0 and sources["model"] + sources["none"] > 0


def test_hybrid_refuses_a_non_cost_policy() -> None:
    tt, mapper, target, drafter = _pair()
    with pytest.raises(TypeError):
        SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(4), lookup=LookupProposer(),
                           profile=CHEAP)  # fmt: skip
    with pytest.raises(ValueError, match="cost profile"):
        SpeculativeDecoder(target, None, mapper, FixedDraftLen(4), lookup=LookupProposer())


class TableLM:
    """Next-token logits depend only on the last token."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    @property
    def vocab_size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def max_seq_len(self) -> int:
        return 64

    def forward(self, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        return self.rows[token_ids]


def test_exact_mode_with_lookup_proposals_is_lossless() -> None:
    """Lookup proposals are deterministic (q = 1 on the proposed id): the sampled law is the
    target's. Same chi-square criterion (z < 4) as tests/core/test_verify_lossless.py."""
    pieces_t = [b"<eos>", b"a", b"b", b"c", b"ab", b"bc", b"ca"]
    pieces_d = [b"</s>", b"a", b"b", b"c", b"a", b"cb", b"ba", b"bb"]
    mapper = VocabMapper.from_tokenizers(
        TableTokenizer("d", pieces_d), TableTokenizer("t", pieces_t)
    )
    g = torch.Generator().manual_seed(3)
    target = TableLM(torch.randn(7, 7, generator=g))  # context-dependent law
    drafter = TableLM(torch.randn(8, 8, generator=g))
    prompt, length = [1, 2, 3, 1, 2, 3, 1, 2], 3
    truth = exact_sequence_probs(target, prompt, length)
    cfg = DecodeConfig(mode=Mode.EXACT, temperature=1.0, max_new_tokens=length)
    # a drafter at 0.2 of a target call: both proposers win steps (at 0.1 the model, valued at
    # what a token costs once it drafts well, takes all but ~1% of them)
    mixed = CostProfile(target_ms=CHEAP.target_ms, drafter_ms=(20.0,))
    dec = SpeculativeDecoder(target, drafter, mapper, CostAwareDraftLen(mixed, 2), config=cfg,
                             lookup=LookupProposer(LookupConfig(min_ngram=1, keep_history=False)),
                             profile=mixed)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    counts: Counter[tuple[int, ...]] = Counter()
    sources: Counter[str] = Counter()
    assert isinstance(dec.drafter, HybridProposer)
    for _ in range(2000):
        counts[tuple(dec.generate(prompt, generator=gen)[0])] += 1
        sources.update(s.source for s in dec.drafter.trace if s.proposed)
    assert sources["lookup"] > 100, sources
    assert chi_square_z(*chi_square(counts, truth)) < 4.0


class _ScriptedLookup(LookupProposer):
    """A lookup that always proposes ``ids`` (match length 2), whatever the context."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(LookupConfig(keep_history=False))
        self.ids = ids

    def propose(self, k: int) -> tuple[list[int], int]:
        return self.ids[:k], 2


def test_hybrid_scores_lookup_candidates_on_model_steps() -> None:
    """The lookup EMA learns from the committed ids on every step, also when the model drafted:
    a candidate the target never follows drops below the prior without ever being chosen, and
    one it always follows climbs and is then chosen (``HybridProposer._score_lookup``)."""
    tt, mapper, target, drafter = _pair()
    cfg = DecodeConfig(max_new_tokens=24)
    ids = tt.encode("ab ca ab ca ab")
    ref, _ = generate_target_only(target, ids, cfg)
    wrong = next(t for t in range(tt.vocab_size) if t not in ref)  # never a target token here
    dec = SpeculativeDecoder(target, drafter, mapper, CostAwareDraftLen(CHEAP, 4), NGramCache(),
                             config=cfg, lookup=_ScriptedLookup([wrong] * 4),
                             profile=CHEAP)  # fmt: skip
    hybrid = dec.drafter
    assert isinstance(hybrid, HybridProposer)
    assert dec.generate(ids)[0] == ref
    assert hybrid.lookup_rate[2] < 0.05 < hybrid.prior  # every step scored a rejection
    # the first step drafts no model tokens (``hybrid``: the drafter's prefill waits until after
    # the first text), so the prior's lookup is tried there; never again once the model drafts
    assert all(s.source != "lookup" for s in hybrid.trace[1:])
    # a candidate that is always the target's continuation: learned on model steps, then chosen
    oracle = _OracleLookup(ref, len(ids))
    dec = SpeculativeDecoder(target, drafter, mapper, CostAwareDraftLen(CHEAP, 4), NGramCache(),
                             config=cfg, lookup=oracle, profile=CHEAP)  # fmt: skip
    assert dec.generate(ids)[0] == ref
    assert isinstance(dec.drafter, HybridProposer)
    assert dec.drafter.lookup_rate[2] > 0.9
    assert sum(s.source == "lookup" for s in dec.drafter.trace) >= 2


def test_the_first_step_waits_for_no_drafter_call() -> None:
    """The first text comes after the target's prefill alone: the first step makes no drafter
    call (its prefill of the prompt comes on the second step), with or without a lookup match;
    later steps draft, and the output is still target-only's."""
    tt, mapper, target, drafter = _pair()
    cfg = DecodeConfig(max_new_tokens=24)
    later: Counter[str] = Counter()
    for prompt in ("ab ca ab ca ab", "c", "bbbb"):
        ids = tt.encode(prompt)
        ref, _ = generate_target_only(target, ids, cfg)
        dec = SpeculativeDecoder(target, drafter, mapper, CostAwareDraftLen(CHEAP, 4),
                                 NGramCache(), config=cfg, lookup=LookupProposer(),
                                 profile=CHEAP)  # fmt: skip
        hybrid = dec.drafter
        assert isinstance(hybrid, HybridProposer)
        seen: list[int] = []  # drafter calls made when each step's text came
        dec.generate(ids, observer=lambda *_, s=seen, h=hybrid: s.append(h.calls))
        out, _ = dec.generate(ids)  # a second generation starts afresh: again no first draft
        assert out == ref and seen[0] == 0
        assert hybrid.trace[0].source != "model" and hybrid.trace[0].drafter_calls == 0
        later.update(s.source for s in hybrid.trace[1:])
    assert later["model"] > 0  # the drafter does draft after the first step


class _OracleLookup(LookupProposer):
    """Proposes the target's own greedy continuation (``ref``) from the current position."""

    def __init__(self, ref: list[int], n_prompt: int) -> None:
        super().__init__(LookupConfig(keep_history=False))
        self.ref, self.n_prompt, self.pos = ref, n_prompt, 0

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self.pos = 0

    def extend(self, ids: list[int]) -> None:
        super().extend(ids)
        self.pos += len(ids)

    def propose(self, k: int) -> tuple[list[int], int]:
        return self.ref[self.pos : self.pos + k], 2
