"""Draft-length policies: fixed, the +2/-1 heuristic, an online acceptance-prediction head, and the
cost-aware rule over a measured ``cost.CostProfile`` (draft one more token only while it pays).

Each policy is called by the drafter in this order every step: ``next_draft_len()`` (upper bound
k), ``keep_drafting(i, features)`` after each drafted token (may stop early; ``features`` are the
drafted token's ``confidence_features``), then ``update(n_drafted, n_accepted)`` with counts in
drafter tokens once the target has verified.

Everything here runs inside the decode loop, between two graph calls, so it is numpy on a few
floats: the one full-vocabulary pass per drafted token is ``confidence_features`` (a max, an exp
and a dot over the drafter's logits row, single-threaded; about 0.1 ms for 49k logits), which
never competes with the ONNX Runtime thread pools the way a multi-threaded torch op does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from omnidraft_deploy.catalog.policies import NEEDS_PROFILE, PolicyName
from omnidraft_deploy.protocols import DraftLengthPolicy
from omnidraft_deploy.speculative.cost import CostProfile, extension_pays, step_ms


@dataclass
class FixedDraftLen:
    draft_len: int = 4

    def next_draft_len(self) -> int:
        return self.draft_len

    def keep_drafting(self, i: int, features: np.ndarray) -> bool:
        return True

    def update(self, n_drafted: int, n_accepted: int) -> None:
        return None

    def new_context(self) -> None:
        return None


@dataclass
class HeuristicDraftLen:
    """transformers' rule: +2 after a fully accepted draft, -1 otherwise, within [lo, hi]."""

    draft_len: int = 4
    lo: int = 1
    hi: int = 16

    def next_draft_len(self) -> int:
        return self.draft_len

    def keep_drafting(self, i: int, features: np.ndarray) -> bool:
        return True

    def update(self, n_drafted: int, n_accepted: int) -> None:
        step = 2 if n_accepted >= n_drafted else -1
        self.draft_len = max(self.lo, min(self.hi, self.draft_len + step))

    def new_context(self) -> None:
        return None  # the length carries over from one text to the next


def confidence_features(logits: np.ndarray) -> np.ndarray:
    """(V,) drafter logits -> (3,) float64 features of the drafter's own (temperature 1)
    distribution ``p = softmax(logits)``: top-1 probability, ``1 - H(p) / log V``, and a bias 1.

    Read from the logits, not from the proposal law: a greedy proposal law is one-hot, whose
    top-1 is always 1 and entropy 0, which would tell the acceptance head nothing. With
    ``z = logits - max``, ``s = sum(exp z)``: ``top1 = 1 / s`` and ``H = log s - sum(exp(z) z) / s``.
    """
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    z = np.maximum(row - row.max(), np.float32(-1e30))  # -inf logits (masks) -> 0 * -1e30 = 0
    e = np.exp(z)
    s = float(e.sum(dtype=np.float64))
    ent = math.log(s) - float(np.dot(e, z)) / s
    return np.array([1.0 / s, 1.0 - ent / math.log(max(row.size, 2)), 1.0])


class AcceptancePredictorDraftLen:
    """Stop drafting when the predicted probability that the whole draft survives < ``threshold``.

    The head is an online logistic regression on ``confidence_features`` of each drafted token,
    trained with SGD on the verification outcome (accepted draft tokens -> 1, the first rejected
    one -> 0, later ones unobserved). This is the cheap version of the paper's acceptance head: it
    needs no drafter hidden states, so it works with any exported drafter graph.
    """

    def __init__(self, max_len: int = 8, threshold: float = 0.3, lr: float = 0.5) -> None:
        self.max_len, self.threshold, self.lr = max_len, threshold, lr
        self.weights = np.array([2.0, 2.0, -1.0])
        self._feats: list[np.ndarray] = []
        self._survive = 1.0

    def next_draft_len(self) -> int:
        self._feats, self._survive = [], 1.0
        return self.max_len

    def predict(self, feats: np.ndarray) -> float:
        return 1.0 / (1.0 + math.exp(-float(feats @ self.weights)))

    def keep_drafting(self, i: int, features: np.ndarray) -> bool:
        feats = np.asarray(features, dtype=np.float64)
        self._feats.append(feats)
        self._survive *= self.predict(feats)
        return self._survive >= self.threshold

    def update(self, n_drafted: int, n_accepted: int) -> None:
        labelled = self._feats[: min(n_accepted + 1, n_drafted, len(self._feats))]
        for j, feats in enumerate(labelled):
            label = 1.0 if j < n_accepted else 0.0
            self.weights += self.lr * (label - self.predict(feats)) * feats

    def new_context(self) -> None:
        return None  # the head's weights are learned across texts


class CostAwareDraftLen(AcceptancePredictorDraftLen):
    """Draft one more token only while ``P(draft survives so far) * a * value > marginal cost``.

    ``P(survive so far)`` is the product of the acceptance head's per-token predictions (drafter
    confidence features, trained online as in ``AcceptancePredictorDraftLen``); ``a`` is the running
    conditional acceptance of drafter tokens (an EMA); ``value`` and the marginal cost (one drafter
    call + the wider verification) come from the measured profile (``cost.marginal_ms``). When even
    the first token does not pay, ``next_draft_len`` is 0: a plain target step. After
    ``explore_every`` skipped steps one token is drafted anyway, so the estimate can recover; each
    probe that leaves drafting unprofitable doubles that interval (up to ``explore_max``), since a
    probe costs the drafter's catch-up on every skipped token: on a drafter that does not pay, the
    probes alone cost 5-8% (SmolLM2 -> Qwen2.5 int8, reports/real_pair_nobackoff.md). Drafting
    that pays again resets it. The price: a drafter that starts to pay is noticed late (SmolLM2
    on summarisation after three tasks where it did not: 1.06x without backoff, 0.97x with it;
    a cap of 64 instead of 256 did not bring it back, 0.95x, and left math at 0.94x).
    ``enabled`` False forces k = 0 (the hybrid proposer's lookup / plain steps).

    The value of an accepted token is what a token costs *now* (``value``): the running ratio of
    the drafted steps' modelled cost to the tokens they committed, never more than a target-only
    token. One more draft pays when it raises tokens per millisecond, i.e. when its expected
    tokens times the current cost per token exceed its marginal cost (a ratio objective, as in
    Dinkelbach's method). Valuing a token at the target-only cost instead drafts for gains that a
    step already faster than target-only does not get. The running ratio counts the tokens the
    drafter did not draft too (at a plain step's cost): without them a drafter switched off after
    a paying stretch kept that stretch's low value, so a draft never paid again and only the
    ever rarer probes could bring it back (the distilled SmolLM2 after chat: 478 of 480 code-edit
    steps undrafted, 0.96x; reports/real_pair_1p5b_s8b_128).
    """

    def __init__(self, profile: CostProfile, max_len: int = 8, *, prior: float = 0.6,
                 ema: float = 0.05, explore_every: int = 16, explore_max: int = 256) -> None:  # fmt: skip
        super().__init__(max_len=max_len, threshold=0.0)
        self.profile, self.rate, self.ema, self.explore_every = profile, prior, ema, explore_every
        self.explore_max, self._interval = max(explore_max, explore_every), explore_every
        self.enabled, self._skipped = True, 0
        self._cost_ms, self._tokens = profile.value_ms, 1.0  # EMAs per drafted step

    @property
    def value(self) -> float:
        """ms a committed token costs at the current drafting (at most target-only's)."""
        return min(self.profile.value_ms, self._cost_ms / self._tokens)

    def first_pays(self) -> bool:
        return extension_pays(self.profile, 0, self.max_len, survive=1.0, rate=self.rate,
                              value=self.value)  # fmt: skip

    def next_draft_len(self) -> int:
        super().next_draft_len()
        if not self.enabled:
            return 0
        if self.first_pays():
            self._skipped, self._interval = 0, self.explore_every
            return self.max_len
        if self._skipped >= self._interval:  # a probe; the next one waits twice as long
            self._skipped, self._interval = 0, min(2 * self._interval, self.explore_max)
            return self.max_len
        self._skipped += 1
        return 0

    def new_context(self) -> None:
        """A new generation (``CrossVocabDrafter.reset``): another text may suit the drafter
        where the last did not, so the exploration interval starts short again (the acceptance
        estimate moves only on drafted tokens: a backed-off policy could skip whole prompts)."""
        self._skipped, self._interval = 0, self.explore_every

    def keep_drafting(self, i: int, features: np.ndarray) -> bool:
        super().keep_drafting(i, features)  # records features, multiplies the survival
        return extension_pays(self.profile, i + 1, self.max_len, survive=self._survive,
                              rate=self.rate, value=self.value)  # fmt: skip

    def update(self, n_drafted: int, n_accepted: int) -> None:
        p = self.profile
        if n_drafted <= 0:  # a token this drafter did not draft costs what a plain step costs
            self._cost_ms += self.ema * (p.target(1) - self._cost_ms)
            self._tokens += self.ema * (1.0 - self._tokens)
            return
        super().update(n_drafted, n_accepted)
        cost = step_ms(p, n_drafted, n_drafted, lookup=False)
        self._cost_ms += self.ema * (cost - self._cost_ms)
        self._tokens += self.ema * (n_accepted + 1 - self._tokens)
        for j in range(min(n_accepted + 1, n_drafted)):
            self.rate += self.ema * ((1.0 if j < n_accepted else 0.0) - self.rate)


POLICIES: dict[PolicyName, type[DraftLengthPolicy]] = {
    PolicyName.FIXED: FixedDraftLen,
    PolicyName.HEURISTIC: HeuristicDraftLen,
    PolicyName.PREDICTOR: AcceptancePredictorDraftLen,
    PolicyName.COST: CostAwareDraftLen,
}


def make_policy(name: str, draft_len: int, profile: CostProfile | None = None) -> DraftLengthPolicy:
    """The policy ``name`` (a ``POLICIES`` key) at ``draft_len``. ``predictor`` and ``cost`` draft
    up to 2 * draft_len (one cap for the runtime, the CLI and the benchmarks); ``cost`` needs a
    measured ``profile``. Unknown names raise ``KeyError`` listing the valid ones."""
    if name not in POLICIES:
        raise KeyError(f"unknown draft-length policy {name!r}; choose from {sorted(p.value for p in POLICIES)}")
    policy = PolicyName(name)
    if (profile is None) == (policy in NEEDS_PROFILE):
        need = "needs a cost profile (omnidraft profile BUNDLE)" if profile is None else (
            "takes no cost profile (only the cost policy is steered by one)")  # fmt: skip
        raise ValueError(f"the {name} policy {need}")
    if policy is PolicyName.FIXED:
        return FixedDraftLen(draft_len)
    if policy is PolicyName.HEURISTIC:
        return HeuristicDraftLen(draft_len)
    if policy is PolicyName.PREDICTOR:
        return AcceptancePredictorDraftLen(max_len=2 * draft_len)
    assert profile is not None
    return CostAwareDraftLen(profile, max_len=2 * draft_len)
