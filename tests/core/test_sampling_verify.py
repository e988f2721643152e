"""Pure maths: logits_to_probs, residual, verify (exact acceptance probability), draft-len rules."""

from __future__ import annotations

import pytest
import torch

from omnidraft_deploy.speculative.draft_len import (
    AcceptancePredictorDraftLen,
    HeuristicDraftLen,
    make_policy,
)
from omnidraft_deploy.speculative.sampling import logits_to_probs, restrict
from omnidraft_deploy.speculative.verify import residual, verify, verify_greedy


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
    assert verify_greedy([1, 0], logits) == (2, 2)
    assert verify_greedy([1, 2], logits) == (1, 0)
    assert verify_greedy([], logits) == (0, 1)


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
    flat, sharp = (
        torch.full((100,), 0.01),
        torch.nn.functional.one_hot(torch.tensor(3), 100).float(),
    )
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
