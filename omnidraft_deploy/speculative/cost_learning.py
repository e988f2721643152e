"""Costs learned in the decode loop: the profile the draft policy prices with, kept current.

A ``CostProfile`` is measured once (``omnidraft profile``, or on a bundle's first ``run``) and the
cost-aware policy prices every draft with it. Two things make a fixed profile wrong for a whole
session: its medians come from a few interleaved repetitions (a width can read 5-10% off what the
loop pays: ``reports/inloop_calls/inloop_calls_kdg.md``, T = 9 profiled at 74.7 ms, paid 68.4 ms),
and a shared machine moves between states in minutes (a 1-token target call ~38 ms in one, ~30 ms
in the other, with 9-token calls the other way round: ``docs/known-limits.md``), so a profile from
one state drafts wrongly in the other.

``CostLearner`` follows what the loop pays. Every verification call of width ``T`` at position
``pos`` gives the ratio ``measured / profile.target_at(T, pos)``; every step that ran the drafter
gives the ratio of its mean call to ``profile.drafter(1)`` (its catch-up calls of 2-3 tokens
included: what a drafted token costs in the loop). Each ratio is clipped to ``[1/CLIP, CLIP]`` (one
preempted call must not swing the policy) and folded into an exponential moving average per width
(``weight`` each, starting from the profile's own figure). ``profile()`` is the measured profile
with each width's latencies (near and far) scaled by its ratio; a width never observed takes the
ratio interpolated between the nearest observed widths (a state change moves neighbouring widths
alike), the drafter its own. What the learner never touches: the host overhead, lookup and
prefill figures (they are not on the loop's per-step path or are measured in it already) and the
fingerprint.

Arithmetic only: the decoder passes in the milliseconds it measured (``SpeculativeDecoder``).

Opt-in (``DecodeConfig.learn_costs``), not ``run``'s default: on the 1.5B pair, timed side by side
with the same row priced by the profile as measured, it read +8% in one run whose profile had
been taken in another machine state and between -3.4% and +2.0% in six others
(``reports/real_pair_1p5b_s10*``, row ``ours_hybrid_smollm2_kd_learn``; in the run where it lost
most it made 103 plain steps against 33). Not shown to pay, it is not the default
(docs/results/decoding.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from omnidraft_deploy.speculative.cost import CostProfile

CLIP = 2.0  # an observation counts as at most 2x / at least 1/2 the profile's latency


class CostLearner:
    """Per-width moving ratios of paid to profiled latency; ``profile()`` applies them."""

    def __init__(self, base: CostProfile, *, weight: float = 0.1) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight lies in (0, 1], got {weight}")
        self.base, self.weight = base, weight
        self.target_ratio: list[float | None] = [None] * len(base.target_ms)
        self.drafter_ratio: float | None = None
        self.observations = 0

    def _fold(self, old: float | None, ratio: float) -> float:
        """The moving ratio after one more observation; the profile (ratio 1) is the prior, so
        one slow first call moves a width by ``weight`` of its excess, not all of it."""
        ratio = min(max(ratio, 1.0 / CLIP), CLIP)
        old = 1.0 if old is None else old
        return old + self.weight * (ratio - old)

    def observe_target(self, width: int, pos: int, ms: float) -> None:
        """One verification call of ``width`` tokens starting at ``pos`` took ``ms``. Calls wider
        than the profile measured (a prompt's prefill) are not followed."""
        if not 1 <= width <= len(self.target_ratio) or not ms > 0:
            return
        i = width - 1
        self.target_ratio[i] = self._fold(
            self.target_ratio[i], ms / self.base.target_at(width, pos)
        )
        self.observations += 1

    def observe_drafter(self, calls: int, ms: float) -> None:
        """A step's ``calls`` drafter calls took ``ms`` together."""
        if calls <= 0 or not ms > 0 or not self.base.drafter_ms:
            return
        self.drafter_ratio = self._fold(self.drafter_ratio, ms / calls / self.base.drafter(1))
        self.observations += 1

    def ratios(self) -> list[float]:
        """Each width's ratio: observed, else interpolated between the nearest observed widths
        (the nearest one's beyond the last), else 1."""
        seen = [(i, r) for i, r in enumerate(self.target_ratio) if r is not None]
        if not seen:
            return [1.0] * len(self.target_ratio)
        xs, ys = zip(*seen, strict=True)
        return [float(v) for v in np.interp(range(len(self.target_ratio)), xs, ys)]

    def profile(self) -> CostProfile:
        """The base profile with the learned ratios applied (the base itself before any
        observation)."""
        if not self.observations:
            return self.base
        r = self.ratios()
        b = self.base
        far = (
            tuple(ms * k for ms, k in zip(b.target_ms_far, r, strict=True))
            if b.target_ms_far
            else ()
        )
        d = self.drafter_ratio or 1.0
        return dataclasses.replace(
            b,
            target_ms=tuple(ms * k for ms, k in zip(b.target_ms, r, strict=True)),
            target_ms_far=far,
            drafter_ms=tuple(ms * d for ms in b.drafter_ms),
        )
