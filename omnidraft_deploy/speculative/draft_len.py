"""Draft-length policies: fixed, the +2/-1 heuristic, and an online acceptance-prediction head.

Each policy is called by the drafter in this order every step: ``next_draft_len()`` (upper bound
k), ``keep_drafting(i, draft_probs)`` after each drafted token (may stop early), then
``update(n_drafted, n_accepted)`` with counts in drafter tokens once the target has verified.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class FixedDraftLen:
    draft_len: int = 4

    def next_draft_len(self) -> int:
        return self.draft_len

    def keep_drafting(self, i: int, draft_probs: Tensor) -> bool:
        return True

    def update(self, n_drafted: int, n_accepted: int) -> None:
        return None


@dataclass
class HeuristicDraftLen:
    """transformers' rule: +2 after a fully accepted draft, -1 otherwise, within [lo, hi]."""

    draft_len: int = 4
    lo: int = 1
    hi: int = 16

    def next_draft_len(self) -> int:
        return self.draft_len

    def keep_drafting(self, i: int, draft_probs: Tensor) -> bool:
        return True

    def update(self, n_drafted: int, n_accepted: int) -> None:
        step = 2 if n_accepted >= n_drafted else -1
        self.draft_len = max(self.lo, min(self.hi, self.draft_len + step))


def confidence_features(draft_probs: Tensor) -> Tensor:
    """(V,) drafter row -> (3,) features: top-1 prob, 1 - normalised entropy, bias."""
    top1 = draft_probs.max()
    ent = -(draft_probs * draft_probs.clamp_min(1e-12).log()).sum() / math.log(draft_probs.numel())
    return torch.stack([top1, 1.0 - ent, torch.ones(())]).float()


class AcceptancePredictorDraftLen:
    """Stop drafting when the predicted probability that the whole draft survives < ``threshold``.

    The head is an online logistic regression on ``confidence_features`` of each drafted token,
    trained with SGD on the verification outcome (accepted draft tokens -> 1, the first rejected
    one -> 0, later ones unobserved). This is the cheap version of the paper's acceptance head: it
    needs no drafter hidden states, so it works with any exported drafter graph.
    """

    def __init__(self, max_len: int = 8, threshold: float = 0.3, lr: float = 0.5) -> None:
        self.max_len, self.threshold, self.lr = max_len, threshold, lr
        self.weights = torch.tensor([2.0, 2.0, -1.0])
        self._feats: list[Tensor] = []
        self._survive = 1.0

    def next_draft_len(self) -> int:
        self._feats, self._survive = [], 1.0
        return self.max_len

    def predict(self, feats: Tensor) -> float:
        return float(torch.sigmoid(feats @ self.weights))

    def keep_drafting(self, i: int, draft_probs: Tensor) -> bool:
        feats = confidence_features(draft_probs)
        self._feats.append(feats)
        self._survive *= self.predict(feats)
        return self._survive >= self.threshold

    def update(self, n_drafted: int, n_accepted: int) -> None:
        labelled = self._feats[: min(n_accepted + 1, n_drafted, len(self._feats))]
        for j, feats in enumerate(labelled):
            label = 1.0 if j < n_accepted else 0.0
            self.weights += self.lr * (label - self.predict(feats)) * feats


POLICIES = {
    "fixed": FixedDraftLen,
    "heuristic": HeuristicDraftLen,
    "predictor": AcceptancePredictorDraftLen,
}


def make_policy(
    name: str, draft_len: int
) -> FixedDraftLen | HeuristicDraftLen | AcceptancePredictorDraftLen:
    """Policy by name; unknown names raise KeyError listing the valid ones."""
    if name == "fixed":
        return FixedDraftLen(draft_len)
    if name == "heuristic":
        return HeuristicDraftLen(draft_len)
    if name == "predictor":
        return AcceptancePredictorDraftLen(max_len=2 * draft_len)
    raise KeyError(f"unknown draft-length policy {name!r}; choose from {sorted(POLICIES)}")
