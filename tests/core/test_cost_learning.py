"""Costs learned in the decode loop (``speculative/cost_learning.py``) and their wiring."""

from __future__ import annotations

import time

import pytest
import torch

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.cost_learning import CLIP, CostLearner
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen, FixedDraftLen
from omnidraft_deploy.speculative.hybrid import HybridProposer
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.testing import toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper

BASE = CostProfile(target_ms=(40.0, 44.0, 48.0, 52.0, 56.0), drafter_ms=(6.0, 7.0, 7.5))


def test_no_observation_leaves_the_profile_as_measured() -> None:
    learner = CostLearner(BASE)
    assert learner.profile() is BASE
    learner.observe_target(9, 100, 80.0)  # wider than profiled (a prefill): not followed
    learner.observe_drafter(0, 5.0)  # a step without drafter calls
    assert learner.profile() is BASE and learner.observations == 0


def test_a_width_converges_to_what_the_loop_pays_and_neighbours_follow() -> None:
    learner = CostLearner(BASE, weight=0.2)
    for _ in range(60):
        learner.observe_target(1, 64, 30.0)  # the 1-token call got cheaper (a state change)
        learner.observe_target(5, 64, 70.0)  # the 5-token call dearer
    p = learner.profile()
    assert p.target_ms[0] == pytest.approx(30.0, rel=1e-3)
    assert p.target_ms[4] == pytest.approx(70.0, rel=1e-3)
    # unobserved widths: ratios interpolated between widths 1 (0.75) and 5 (1.25)
    assert p.target_ms[2] == pytest.approx(48.0 * 1.0, rel=1e-3)
    assert p.target_ms[1] == pytest.approx(44.0 * 0.875, rel=1e-3)
    assert p.drafter_ms == BASE.drafter_ms  # not observed


def test_one_outlier_moves_a_width_by_a_bounded_step() -> None:
    learner = CostLearner(BASE, weight=0.1)
    learner.observe_target(3, 64, 48.0 * 100)  # a call preempted for seconds
    assert learner.profile().target_ms[2] == pytest.approx(48.0 * (1 + 0.1 * (CLIP - 1)))
    learner.observe_drafter(4, 4 * 3.0)  # drafter calls at half the profile's cost
    assert learner.profile().drafter_ms[0] == pytest.approx(6.0 * (1 - 0.1 * 0.5))


def test_the_far_latencies_scale_with_their_width() -> None:
    base = CostProfile(target_ms=(40.0, 50.0), context=64, far_context=512,
                       target_ms_far=(60.0, 80.0))  # fmt: skip
    learner = CostLearner(base, weight=1.0)
    learner.observe_target(2, 512, 40.0)  # half of what the profile says at that position
    p = learner.profile()
    assert p.target_ms == (20.0, 25.0) and p.target_ms_far == (30.0, 40.0)


def test_weight_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match="weight"):
        CostLearner(BASE, weight=0.0)


class _Slow:
    """A causal LM that takes ``delay`` seconds longer per call than it would (``forward`` only,
    so ``tail_logits`` goes through it)."""

    def __init__(self, lm: EagerLM, delay: float) -> None:
        self.lm, self.delay = lm, delay

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "forward_tail":
            raise AttributeError(name)
        return getattr(self.lm, name)

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        time.sleep(self.delay)
        return self.lm.forward(ids, start)


def test_the_decoder_prices_drafts_with_what_its_calls_cost() -> None:
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = EagerLM(build_model(toy_spec(tt.vocab_size), seed=1, init_std=0.5))
    drafter = EagerLM(build_model(toy_spec(dt.vocab_size), seed=2, init_std=0.5))
    # the profile says a target call costs ~1 ms; every call sleeps 20 ms
    cheap = CostProfile(target_ms=(1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8), drafter_ms=(0.1,))
    cfg = DecodeConfig(max_new_tokens=30, learn_costs=True)
    policy = CostAwareDraftLen(cheap, 4)
    dec = SpeculativeDecoder(_Slow(target, 0.02), drafter, mapper, policy, NGramCache(),  # type: ignore[arg-type]
                             config=cfg, lookup=LookupProposer(), profile=cheap)  # fmt: skip
    ids = tt.encode("ab ca ab ca ab")
    ref, _ = generate_target_only(target, ids, DecodeConfig(max_new_tokens=30))
    out, stats = dec.generate(ids)
    assert out == ref  # learning steers proposals only
    assert dec.costs is not None and dec.costs.observations >= stats.target_calls - 1 > 0
    learned = dec.costs.profile()
    assert learned.target_ms[0] > cheap.target_ms[0]  # the loop paid more than profiled
    assert isinstance(dec.drafter, HybridProposer)
    assert dec.drafter.profile == learned and policy.profile == learned


def test_learning_without_a_profile_is_refused() -> None:
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = EagerLM(build_model(toy_spec(tt.vocab_size), seed=1))
    drafter = EagerLM(build_model(toy_spec(dt.vocab_size), seed=2))
    with pytest.raises(ValueError, match="learn_costs needs a cost profile"):
        SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(4),
                           config=DecodeConfig(learn_costs=True))  # fmt: skip


def test_a_learner_passed_in_carries_across_decoders() -> None:
    """What a served session would keep across requests: one learner, every decoder feeding it."""
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = EagerLM(build_model(toy_spec(tt.vocab_size), seed=1, init_std=0.5))
    drafter = EagerLM(build_model(toy_spec(dt.vocab_size), seed=2, init_std=0.5))
    learner = CostLearner(BASE)
    cfg = DecodeConfig(max_new_tokens=12, learn_costs=True)
    seen = [0]
    for _ in range(2):
        dec = SpeculativeDecoder(target, drafter, mapper, CostAwareDraftLen(BASE, 4), NGramCache(),
                                 config=cfg, lookup=LookupProposer(), profile=BASE, costs=learner)  # fmt: skip
        dec.generate(tt.encode("ab ca ab"))
        assert dec.costs is learner and learner.observations > seen[-1]
        seen.append(learner.observations)
