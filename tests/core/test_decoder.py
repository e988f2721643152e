"""Speculative loop on the toy mismatched pair: greedy equality and cache synchronisation."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import (
    AcceptancePredictorDraftLen,
    FixedDraftLen,
    HeuristicDraftLen,
)
from omnidraft_deploy.testing import toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper


class CheckedLM:
    """Wraps a CausalLM and records which token sits in every KV slot (a shadow cache)."""

    def __init__(self, inner: EagerLM) -> None:
        self.inner, self.shadow = inner, []
        self.vocab_size, self.max_seq_len = inner.vocab_size, inner.max_seq_len  # fixed by inner

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        assert start_pos <= len(self.shadow), "forward left a gap in the KV cache"
        self.shadow = self.shadow[:start_pos] + token_ids.tolist()
        return self.inner.forward(token_ids, start_pos)


class TailRecorder(CheckedLM):
    """Records ``(method, T, start, rows)`` of every call; has ``forward_tail`` (``TailRowsLM``)."""

    def __init__(self, inner: EagerLM) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, int, int, int]] = []

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        self.calls.append(("forward", len(token_ids), start_pos, len(token_ids)))
        return super().forward(token_ids, start_pos)

    def forward_tail(self, token_ids: Tensor, start_pos: int, rows: int) -> Tensor:
        self.calls.append(("forward_tail", len(token_ids), start_pos, rows))
        return super().forward(token_ids, start_pos)[-rows:]


def _pair(seed: int = 0):
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = EagerLM(build_model(toy_spec(tt.vocab_size), seed=seed + 1, init_std=0.5))
    drafter = EagerLM(build_model(toy_spec(dt.vocab_size), seed=seed + 2, init_std=0.5))
    return dt, tt, mapper, target, drafter


def test_greedy_equals_target_only_across_policies_and_cache() -> None:
    _, tt, mapper, target, drafter = _pair()
    cfg = DecodeConfig(max_new_tokens=40)
    for prompt in ("ab ca", "c", " abc abc", "bbbb"):
        ids = tt.encode(prompt)
        ref, _ = generate_target_only(target, ids, cfg)
        for policy in (
            FixedDraftLen(1),
            FixedDraftLen(5),
            HeuristicDraftLen(2),
            AcceptancePredictorDraftLen(6),
        ):
            for cache in (None, NGramCache(max_entries=4)):
                out, stats = SpeculativeDecoder(
                    target, drafter, mapper, policy, cache, config=cfg
                ).generate(ids)
                assert out == ref, (prompt, policy)
                assert stats.n_generated == len(ref)


def test_greedy_with_trained_like_drafter_accepts() -> None:
    """A drafter that IS the target (same weights, DM vocab) must be accepted almost always."""
    _, tt, _, target, _ = _pair()
    identity = VocabMapper.from_tokenizers(tt, tt)
    cfg = DecodeConfig(max_new_tokens=30)
    ids = tt.encode("ab ca")
    out, stats = SpeculativeDecoder(
        target, target, identity, FixedDraftLen(4), config=cfg
    ).generate(ids)
    assert out == generate_target_only(target, ids, cfg)[0]
    assert stats.acceptance_rate > 0.9
    assert stats.tokens_per_target_call > 3.0


def test_calls_request_only_the_rows_they_read() -> None:
    """The first step is the prompt's prefill: one call of the whole prompt and the first
    proposals that asks for the proposals' rows (plus the next token's) only; every later target
    call asks for all its rows (all are verification rows); every drafter call and target-only
    decoding ask for the last row (``protocols.tail_logits``). The output is target-only's."""
    _, tt, mapper, target, drafter = _pair()
    t_lm, d_lm, ref_lm = TailRecorder(target), TailRecorder(drafter), TailRecorder(target)
    ids, cfg = tt.encode(" abc abc"), DecodeConfig(max_new_tokens=12)
    out, stats = SpeculativeDecoder(t_lm, d_lm, mapper, FixedDraftLen(3), config=cfg).generate(ids)
    method, t, start, rows = t_lm.calls[0]
    assert (method, start) == ("forward_tail", 0) and t == len(ids) + rows - 1
    assert len(t_lm.calls) == stats.target_calls  # no prefill call of its own
    assert all(t == rows for _, t, _, rows in t_lm.calls[1:])
    assert d_lm.calls and {(m, r) for m, _, _, r in d_lm.calls} == {("forward_tail", 1)}
    assert max(t for _, t, _, _ in d_lm.calls) > 1  # the drafter's prefill is one of them
    ref, _ = generate_target_only(ref_lm, ids, cfg)
    assert out == ref and {(m, r) for m, _, _, r in ref_lm.calls} == {("forward_tail", 1)}


def test_first_step_proposals_are_verified_inside_the_prefill() -> None:
    """A drafter that is the target itself proposes at the first step (FixedDraftLen: no cost
    model holding it back): the prefill call carries those proposals and verifies them, so the
    first call already yields more than one token, and the output is still target-only's."""
    _, tt, _, target, _ = _pair()
    identity = VocabMapper.from_tokenizers(tt, tt)
    t_lm, ids = TailRecorder(target), tt.encode("ab ca")
    cfg = DecodeConfig(max_new_tokens=20)
    out, stats = SpeculativeDecoder(t_lm, target, identity, FixedDraftLen(4), config=cfg).generate(
        ids
    )
    _, t, start, rows = t_lm.calls[0]
    assert start == 0 and rows == 5 and t == len(ids) + 4
    assert stats.accept_counts[0] == 4
    assert out == generate_target_only(target, ids, cfg)[0]


def _text(tok, ids: list[int]) -> bytes:
    """Bytes of ids with every special token (EOS/BOS) shown as one marker."""
    return b"".join(b"<S>" if i in tok.special_ids else tok.token_bytes(i) for i in ids)


class ScriptedTarget(CheckedLM):
    """Target whose argmax accepts or rejects each proposal by a seeded coin; replacements random."""

    def __init__(self, inner: EagerLM, seed: int, p_accept: float) -> None:
        super().__init__(inner)
        self.gen, self.p_accept = torch.Generator().manual_seed(seed), p_accept

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        super().forward(token_ids, start_pos)
        v, ids = self.vocab_size, token_ids.tolist()
        logits = torch.zeros(len(ids), v)
        for i in range(len(ids)):
            nxt = ids[i + 1] if i + 1 < len(ids) else None
            accept = nxt is not None and float(torch.rand((), generator=self.gen)) < self.p_accept
            choice = nxt if accept else int(torch.randint(1, v, (), generator=self.gen))
            logits[i, choice] = 10.0
        return logits


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    p_accept=st.floats(0.0, 1.0),
    k=st.integers(1, 6),
    cache_cap=st.sampled_from([0, 1, 3, 50]),
)
def test_caches_never_desynchronise(seed: int, p_accept: float, k: int, cache_cap: int) -> None:
    """Random accept/reject sequences: both KV caches always hold exactly the committed text."""
    dt, tt, mapper, target, drafter = _pair(seed % 3)
    t_lm = ScriptedTarget(target, seed, p_accept)
    d_lm = CheckedLM(drafter)
    cache = NGramCache(max_entries=cache_cap) if cache_cap else None
    dec = SpeculativeDecoder(
        t_lm, d_lm, mapper, FixedDraftLen(k), cache, config=DecodeConfig(max_new_tokens=30)
    )
    steps = []

    def check(ctx: list[int], new: list[int], *_: Tensor) -> None:
        # target cache holds the committed context; drafter cache holds a prefix of its text
        assert t_lm.shadow[: len(ctx)] == ctx
        d = dec.drafter
        assert d_lm.shadow[: d.kv_len] == d.draft_ids[: d.kv_len]
        assert d.kv_len < len(d.draft_ids)
        assert _text(tt, ctx) == _text(dt, d.draft_ids)
        steps.append(len(new))

    out, _ = dec.generate(tt.encode("ab c"), observer=check)
    assert len(steps) >= 1 and sum(steps) >= len(out)


class NaNAfter(CheckedLM):
    """A target whose logits turn NaN from KV slot ``at`` on (an overflowing model)."""

    def __init__(self, inner: EagerLM, at: int) -> None:
        super().__init__(inner)
        self.at = at

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        logits = super().forward(token_ids, start_pos).clone()
        logits[max(0, self.at - start_pos) :] = float("nan")
        return logits


def test_non_finite_target_logits_raise_instead_of_decoding() -> None:
    """NaN logits would argmax to token 0 in both paths, which would then "agree"."""
    import pytest

    _, tt, mapper, target, drafter = _pair()
    ids, cfg = tt.encode("ab ca"), DecodeConfig(max_new_tokens=12)
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        generate_target_only(NaNAfter(target, len(ids) + 3), ids, cfg)
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        SpeculativeDecoder(
            NaNAfter(target, len(ids) + 3), drafter, mapper, FixedDraftLen(3), config=cfg
        ).generate(ids)


class PaddedLM:
    """A drafter whose graph has ``pad`` rows past its tokenizer (every Qwen embedding), the
    padded ids given the highest logits: they must never be drafted."""

    def __init__(self, inner: EagerLM, pad: int) -> None:
        self.inner, self.pad = inner, pad

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size + self.pad

    @property
    def max_seq_len(self) -> int:
        return self.inner.max_seq_len

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        logits = self.inner.forward(token_ids, start_pos)
        big = logits.amax(-1, keepdim=True) + 10.0
        return torch.cat([logits, big.expand(*logits.shape[:-1], self.pad)], -1)


def test_padded_drafter_rows_are_never_drafted() -> None:
    _, tt, mapper, target, drafter = _pair()
    cfg = DecodeConfig(max_new_tokens=24)
    padded = PaddedLM(drafter, pad=7)
    for prompt in ("ab ca", " abc abc"):
        ids = tt.encode(prompt)
        ref, _ = generate_target_only(target, ids, cfg)
        dec = SpeculativeDecoder(target, padded, mapper, FixedDraftLen(3), NGramCache(), config=cfg)
        out, stats = dec.generate(ids)
        assert out == ref and stats.proposed > 0
