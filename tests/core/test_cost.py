"""Cost model (pure arithmetic) and the cost-aware policy's choices on synthetic profiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from omnidraft_deploy.speculative.cost import (
    CostProfile,
    StepRecord,
    best_length,
    cost_terms,
    expected_speedup,
    expected_tokens,
    extension_pays,
    marginal_ms,
    predicted_speedup,
    predicted_times,
    step_ms,
)
from omnidraft_deploy.speculative.draft_len import (
    CostAwareDraftLen,
    confidence_features,
    make_policy,
)

# this machine's measured shape (issue 9): drafter 0.45 of a target step, verify widths 1.02..1.47
REAL = CostProfile(target_ms=(100.0, 102.0, 112.0, 116.0, 134.0, 147.0), drafter_ms=(45.0, 50.0))
FREE_VERIFY = CostProfile(target_ms=(100.0,) * 9, drafter_ms=(5.0,))
# the 1.5B's shape on the Zen 5: drafter 0.15 of a step, a verification row ~0.1-0.15 of one
CHEAPER = CostProfile(target_ms=(38.0, 43.0, 48.0, 51.0, 55.0), drafter_ms=(5.6,))


def test_expected_tokens_and_width_extrapolation() -> None:
    assert expected_tokens([]) == 1.0
    assert expected_tokens([1.0, 1.0, 1.0]) == 4.0
    assert math.isclose(expected_tokens([0.5, 0.5]), 1.75)
    with pytest.raises(ValueError):
        expected_tokens([1.5])
    assert REAL.target(6) == 147.0 and REAL.target(8) == 147.0 + 2 * 13.0  # linear past measured
    assert REAL.drafter(1) == 45.0 and math.isclose(REAL.drafter_ratio, 0.45)


def test_step_cost_and_marginal() -> None:
    assert step_ms(REAL, 0, 0, lookup=False) == 100.0  # a plain step
    assert step_ms(REAL, 3, 3, lookup=False) == 3 * 45.0 + 116.0
    assert step_ms(REAL, 0, 3, lookup=True) == 116.0
    assert marginal_ms(REAL, 0, model=True) == 45.0 + 2.0
    assert marginal_ms(REAL, 1, model=False) == 10.0


def test_expected_speedup_limits() -> None:
    assert expected_speedup(REAL, [], model=True) == 1.0
    # perfect free lookup at k = 3: 4 tokens for one 4-wide call
    assert math.isclose(expected_speedup(REAL, [1.0] * 3, model=False), 400.0 / 116.0)
    # the SmolLM2 figures: acceptance ~0.5 at k = 4 loses, as measured (0.70-0.74x)
    assert expected_speedup(REAL, [0.5] * 4, model=True) < 0.8
    # a perfect drafter at 0.45 cost still gains at k = 1
    assert expected_speedup(REAL, [1.0], model=True) > 1.3


def test_best_length_stops_when_drafting_does_not_pay() -> None:
    assert best_length(REAL, 0.3, 8, model=True) == 0  # 0.3 * 100 < 47: plain step
    assert best_length(REAL, 0.6, 8, model=True) == 1  # 60 > 47, then 36 < 55
    assert best_length(REAL, 0.9, 8, model=False) >= 4  # cheap lookup drafts long
    assert best_length(FREE_VERIFY, 0.99, 8, model=True) == 8  # capped at k_max
    assert best_length(REAL, 0.0, 8, model=False) == 0


def test_predicted_speedup_of_a_trace() -> None:
    plain = [StepRecord("none", 0, 0, 0)] * 10
    assert math.isclose(predicted_speedup(REAL, plain, prompt_len=20), 1.0)
    look = [StepRecord("lookup", 0, 3, 3)] * 4  # 16 tokens in 4 calls of width 4
    # the first token is the prefill's (free in this profile: no prefill cost), so is the first
    # call's 1-token share: 15 target-only steps against 4 calls less one 1-token call
    assert math.isclose(predicted_speedup(REAL, look, prompt_len=1), 1500.0 / (4 * 116.0 - 100.0))


def test_cost_terms_add_up_to_the_predicted_time() -> None:
    prof = CostProfile(target_ms=(100.0, 110.0, 125.0), drafter_ms=(20.0,), overhead_ms=3.0,
                       lookup_ms=1.0)  # fmt: skip
    steps = [
        StepRecord("model", 2, 2, 1),
        StepRecord("lookup", 0, 1, 1),
        StepRecord("none", 0, 0, 0),
    ]
    t = cost_terms(prof, steps)
    assert t == {"drafter": 40.0, "verify_width": 35.0, "host": 7.0, "target_1": 300.0,
                 "tokens": 5.0}  # fmt: skip
    base, spec = predicted_times(prof, steps, prompt_len=1)  # no prefill cost in this profile
    first = prof.target(1)  # the first step's call is the prefill's last row, in both
    assert math.isclose(t["target_1"] + t["drafter"] + t["verify_width"] + t["host"] - first, spec)
    assert math.isclose((t["tokens"] - 1) * prof.value_ms, base)


def test_calls_deeper_in_the_context_cost_more_linearly_between_the_measured_lengths() -> None:
    prof = CostProfile(target_ms=(30.0, 33.0), context=64, far_context=448,
                       target_ms_far=(35.0, 42.0), overhead_ms=2.0)  # fmt: skip
    assert prof.target_at(1, None) == prof.target(1) == 30.0
    assert prof.target_at(1, 256) == 32.5 and prof.target_at(2, 256) == 37.5  # halfway
    assert prof.target_at(1, 640) == 37.5  # extrapolated past the far length
    assert prof.target_at(1, -10_000) == 15.0  # floored at half the measured latency
    steps = [StepRecord("lookup", 0, 1, 1), StepRecord("none", 0, 0, 0)]
    base, spec = predicted_times(prof, steps, prompt_len=257)  # first call at position 256
    assert math.isclose(spec, (37.5 - 32.5 + 2.0) + prof.target_at(1, 258))  # width, host, next
    assert math.isclose(base, sum(prof.target_at(1, p) for p in (257, 258)))
    t = cost_terms(prof, steps, prompt_len=257)
    assert math.isclose(t["target_1"] + t["verify_width"] + t["host"] - 32.5, spec)
    assert CostProfile.from_json(prof.to_json()) == prof
    with pytest.raises(ValueError, match="far_context"):
        CostProfile(target_ms=(30.0,), context=64, far_context=32, target_ms_far=(35.0,))
    with pytest.raises(ValueError, match="one latency per width"):
        CostProfile(target_ms=(30.0, 33.0), context=64, far_context=448, target_ms_far=(35.0,))


def test_profile_json_round_trip_and_errors() -> None:
    assert CostProfile.from_json(REAL.to_json()) == REAL
    with pytest.raises(ValueError, match="x.json"):
        CostProfile.from_json('{"drafter_ms": [1]}', source="x.json")
    with pytest.raises(ValueError, match="positive"):
        CostProfile(target_ms=(float("nan"),))


def _confident(v: int = 50) -> np.ndarray:
    """Features of a drafter row with 0.99 on one token (from its logits: log-probabilities)."""
    row = np.full(v, 0.01 / (v - 1))
    row[0] = 0.99
    return confidence_features(np.log(row))


def test_cost_policy_choices_on_synthetic_profiles() -> None:
    bad = CostAwareDraftLen(REAL, max_len=8, prior=0.2, explore_every=3, explore_max=12)
    assert [bad.next_draft_len() for _ in range(3)] == [0, 0, 0]
    assert bad.next_draft_len() == 8  # exploration after 3 skipped steps
    bad.update(1, 0)  # the probe's token was rejected: the next probe waits 6, then 12, 12
    probes = [k for k in (bad.next_draft_len() for _ in range(6 + 1 + 12 + 1 + 12 + 1)) if k]
    assert len(probes) == 3
    gaps = []
    for _ in range(40):
        gaps.append(bad.next_draft_len())
    assert gaps.count(8) == 40 // 13  # capped at explore_max
    bad.rate = 0.99  # drafting pays again: every step drafts, and the interval resets
    assert bad.next_draft_len() == 8 and bad._interval == 3
    good = CostAwareDraftLen(FREE_VERIFY, max_len=8, prior=0.9)
    assert good.next_draft_len() == 8
    assert all(good.keep_drafting(i, _confident()) for i in range(3))  # cheap: keep going
    dear = CostAwareDraftLen(REAL, max_len=8, prior=0.6)
    assert dear.next_draft_len() == 8 and not dear.keep_drafting(
        0, confidence_features(np.zeros(50))
    )
    for _ in range(60):  # every first draft token rejected: the rate falls below the cost
        good.next_draft_len()
        good.update(4, 0)
    assert good.rate < 0.1
    dear.enabled = False
    assert dear.next_draft_len() == 0
    assert isinstance(make_policy("cost", 4, REAL), CostAwareDraftLen)
    with pytest.raises(ValueError, match="profile"):
        make_policy("cost", 4)


def test_drafting_on_looks_past_the_next_draft() -> None:
    """The 1.5B's shape: the first extra verification row is dear, the next ones nearly free."""
    prof = CostProfile(target_ms=(100.0, 145.0, 147.0, 149.0, 170.0), drafter_ms=(10.0,))
    # one draft alone: 0.5 * 100 = 50 < 10 + 45; three: 50 + 25 + 12.5 = 87.5 > 30 + 49
    assert marginal_ms(prof, 0, model=True) > 0.5 * 100.0
    assert extension_pays(prof, 0, 3, survive=1.0, rate=0.5, value=100.0)
    assert not extension_pays(prof, 0, 1, survive=1.0, rate=0.5, value=100.0)  # k_max 1
    assert not extension_pays(prof, 0, 3, survive=1.0, rate=0.2, value=100.0)
    assert not extension_pays(prof, 2, 2, survive=1.0, rate=1.0, value=100.0)  # nothing left


def test_a_token_is_valued_at_what_it_costs_now() -> None:
    """Once drafting makes tokens cheaper than target-only, a draft must beat that cheaper cost."""
    pol = CostAwareDraftLen(REAL, max_len=4, prior=0.8)
    assert pol.value == REAL.value_ms
    for _ in range(200):  # steps of 4 drafts, all accepted: 5 tokens per modelled step
        pol.next_draft_len()
        pol.update(4, 4)
    step = step_ms(REAL, 4, 4, lookup=False)
    assert math.isclose(pol.value, step / 5, rel_tol=1e-3)
    for _ in range(200):  # nothing accepted: a token costs more than target-only; capped there
        pol.next_draft_len()
        pol.update(4, 0)
    assert pol.value == REAL.value_ms


def test_undrafted_tokens_bring_the_value_back_to_target_only() -> None:
    """After a stretch where drafting paid (tokens cheap) and then stopped paying, plain steps
    raise the token's value back towards target-only, so a draft at a middling rate pays again
    without waiting for an exploration probe."""
    pol = CostAwareDraftLen(CHEAPER, max_len=4, prior=0.9, explore_every=1000)
    for _ in range(200):  # all accepted: a token costs far less than target-only
        pol.next_draft_len()
        pol.update(4, 4)
    pol.rate = 0.5  # then acceptance fell (as on chat)
    assert pol.value < 0.5 * CHEAPER.value_ms and pol.next_draft_len() == 0
    steps = 0
    while pol.next_draft_len() == 0 and steps < 100:
        pol.update(0, 0)  # the plain step's token
        steps += 1
    assert steps < 30 and pol.value > 0.5 * CHEAPER.value_ms  # back well before any probe


def test_a_new_prompt_restarts_the_exploration_interval() -> None:
    """Backed off to a probe every 12 steps on one prompt, the policy probes after 3 again on the
    next (``CrossVocabDrafter.reset`` calls ``new_context``)."""
    pol = CostAwareDraftLen(REAL, max_len=8, prior=0.2, explore_every=3, explore_max=12)
    for _ in range(60):
        if pol.next_draft_len():
            pol.update(1, 0)  # every probe rejected: the interval doubles to the cap
    assert pol._interval == 12
    pol.new_context()
    assert [pol.next_draft_len() for _ in range(4)] == [0, 0, 0, 8]
    from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
    from omnidraft_deploy.testing import toy_models

    target, drafter, mapper = toy_models()
    calls: list[int] = []
    pol.new_context = lambda: calls.append(1)  # type: ignore[method-assign]
    dec = SpeculativeDecoder(target, drafter, mapper, pol, config=DecodeConfig(max_new_tokens=3))
    dec.generate([1, 2, 3])
    dec.generate([4, 5])
    assert calls == [1, 1]  # once per generation, at the drafter's reset


def test_the_drafter_prefill_is_predicted_when_the_drafter_ran() -> None:
    prof = CostProfile(target_ms=(100.0, 110.0), drafter_ms=(20.0,), prefill_ms_per_token=10.0,
                       drafter_prefill_ms_per_token=2.0)  # fmt: skip
    model = [StepRecord("model", 1, 1, 1)]
    plain = [StepRecord("none", 0, 0, 0)]
    # 11 prefill rows (the last one the first step's call) + width 10 + drafter 20 + its prefill
    assert math.isclose(predicted_times(prof, model, 11)[1], 110.0 + 30.0 + 22.0)
    assert math.isclose(predicted_times(prof, plain, 11)[1], 110.0)
    assert CostProfile.from_json(prof.to_json()) == prof
