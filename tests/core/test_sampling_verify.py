"""Pure maths: logits_to_probs, residual, verify (exact acceptance probability), draft-len rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnidraft_deploy.speculative.draft_len import (
    AcceptancePredictorDraftLen,
    HeuristicDraftLen,
    confidence_features,
    make_policy,
)
from omnidraft_deploy.speculative.sampling import logits_to_probs, restrict
from omnidraft_deploy.speculative.verify import accept_greedy, greedy_ids, residual, verify


def test_logits_to_probs_filters() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    assert logits_to_probs(logits, 0.0).tolist() == [0, 1, 0, 0]
    p = logits_to_probs(logits, 1.0, top_k=2)
    assert p[0] == 0 and p[3] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))
    p = logits_to_probs(logits, 1.0, top_p=0.5)
    assert p.tolist() == [0, 1, 0, 0]  # top-1 already holds >= 50%


def test_restrict_renormalises() -> None:
    p = restrict(torch.tensor([0.5, 0.25, 0.25]), torch.tensor([False, True, True]))
    assert torch.allclose(p, torch.tensor([0.0, 0.5, 0.5]))


def test_residual() -> None:
    r = residual(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.8, 0.1, 0.1]))
    assert torch.allclose(r, torch.tensor([0.0, 1.0, 0.0]))


def test_verify_acceptance_probability_is_min_one_p_over_q() -> None:
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q_rows = torch.tensor([[0.6, 0.4]])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    acc = sum(verify([0], torch.tensor([0.6]), q_rows, p, gen)[0] for _ in range(n))
    assert abs(acc / n - 0.2 / 0.6) < 0.015
    # on rejection the residual is all on token 1
    outs = {verify([0], torch.tensor([0.6]), q_rows, p, gen) for _ in range(200)}
    assert {o for o in outs if o[0] == 0} == {(0, 1)}


def test_verify_rejects_zero_probability_proposal() -> None:
    with pytest.raises(ValueError, match="proposal probability"):
        verify([0], torch.tensor([0.0]), None, torch.tensor([[1.0], [1.0]]), None)


def test_verify_greedy() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    assert accept_greedy([1, 0], greedy_ids(logits)) == (2, 2)
    assert accept_greedy([1, 2], greedy_ids(logits)) == (1, 0)
    assert accept_greedy([], greedy_ids(logits)) == (0, 1)


def test_heuristic_draft_len() -> None:
    pol = HeuristicDraftLen(4, lo=1, hi=7)
    pol.update(4, 4)
    assert pol.next_draft_len() == 6
    pol.update(6, 6)
    assert pol.next_draft_len() == 7
    for _ in range(10):
        pol.update(7, 0)
    assert pol.next_draft_len() == 1


def test_acceptance_predictor_learns_to_stop_on_flat_rows() -> None:
    pol = AcceptancePredictorDraftLen(max_len=8, threshold=0.5)
    # features of a flat drafter row and of a sharp one (logits: 20 on one id, 0 elsewhere)
    flat, sharp = confidence_features(np.zeros(100)), confidence_features(20.0 * np.eye(100)[3])
    for _ in range(200):  # sharp rows accepted, flat rows rejected
        pol.next_draft_len()
        pol.keep_drafting(0, sharp)
        pol.keep_drafting(1, flat)
        pol.update(2, 1)
    pol.next_draft_len()
    assert pol.keep_drafting(0, sharp)
    assert not pol.keep_drafting(1, flat)


def test_unknown_policy_lists_valid() -> None:
    with pytest.raises(KeyError, match="choose from"):
        make_policy("nope", 4)


def test_confidence_features_match_the_softmax_definition() -> None:
    """top-1 probability and 1 - H / log V of softmax(logits), computed in one numpy pass."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    p = torch.softmax(logits.double(), -1)
    ent = -(p * p.log()).sum() / np.log(1000)
    feats = confidence_features(logits.numpy())
    assert feats[0] == pytest.approx(float(p.max()), rel=1e-5)
    assert feats[1] == pytest.approx(float(1 - ent), rel=1e-4)
    assert feats[2] == 1.0
    masked = logits.clone()
    masked[10:] = float("-inf")  # masked ids count as probability 0, not NaN
    assert np.isfinite(confidence_features(masked.numpy())).all()


def test_greedy_ids_masks_padding_and_refuses_broken_rows() -> None:
    logits = torch.zeros(3, 12)
    logits[0, 11] = 5.0  # a padded id (>= limit 10) never wins
    logits[1, 4] = 1.0
    assert greedy_ids(logits, 10) == [0, 4, 0]
    assert greedy_ids(logits) == [11, 4, 0]
    for bad in (float("nan"), float("inf")):
        broken = logits.clone()
        broken[2, 3] = bad
        with pytest.raises(FloatingPointError, match=r"rows \[2\]"):
            greedy_ids(broken, 10)
    masked = logits.clone()
    masked[1, :10] = float("-inf")  # every real id masked: no token to pick
    with pytest.raises(FloatingPointError, match=r"rows \[1\]"):
        greedy_ids(masked, 10)
