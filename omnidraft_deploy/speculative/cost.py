"""Measured cost model of speculative decoding: pure functions over per-call latencies.

A ``CostProfile`` holds the median latency of one target call feeding ``T`` tokens
(``target_ms[T - 1]``), one drafter call feeding ``T`` tokens (``drafter_ms[T - 1]``), the host cost
of a lookup proposal and the host overhead of one speculative step, all measured on the runtime
and provider that will run them (``omnidraft profile BUNDLE``, ``runtime/profile.py``).

One speculative step that sends ``n`` proposals to the target after ``c`` drafter calls costs

    step_ms(c, n) = c * drafter_ms[1] + target_ms[n + 1] + overhead_ms   (+ lookup_ms if lookup)

and yields ``1 + accepted`` tokens; target-only decoding costs ``target_ms[1]`` a token. With
per-position conditional acceptance ``a_1, a_2, ...`` (token ``i`` survives given ``i - 1`` did), the
expected tokens of a ``k``-proposal step are ``1 + sum_i prod_{j<=i} a_j`` (``expected_tokens``).
The draft-one-more rule of ``draft_len.CostAwareDraftLen`` compares the gain of one more proposal,
``P(survive so far) * a * value`` with ``value = target_ms[1]`` (what a token costs the plain way),
against its marginal cost ``drafter_ms[1] + target_ms[n + 2] - target_ms[n + 1]``
(``marginal_ms``). Everything here is arithmetic: unit-tested, no clocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

PROFILE_FILE = "cost_profile.json"


@dataclass(frozen=True)
class CostProfile:
    """Median per-call latencies (ms). ``target_ms[i]`` / ``drafter_ms[i]``: a call of ``i + 1``
    tokens; calls wider than measured are extrapolated linearly from the last two widths."""

    target_ms: tuple[float, ...]
    drafter_ms: tuple[float, ...] = ()
    lookup_ms: float = 0.0  # host cost of one lookup proposal
    overhead_ms: float = 0.0  # host cost of one speculative step (mapping, verify, bookkeeping)
    prefill_ms_per_token: float = 0.0
    drafter_prefill_ms_per_token: float = 0.0  # the drafter reads the prompt too (model drafts)
    # The KV length ``target_ms`` was measured at, and the target's latencies at a longer one:
    # attention reads every cached slot, so a call costs more deep into a long prompt (the
    # batch-invariant Qwen2.5-0.5B w8a8 graph: 31.6 / 45.9 ms for T = 1 / 9 at 64 cached tokens,
    # 36.8 / 55.0 ms at 384; reports/real_pair.md). Without ``target_ms_far``: same cost anywhere.
    context: int = 0
    far_context: int = 0
    target_ms_far: tuple[float, ...] = ()
    fingerprint: str = ""  # what it was measured on (bundle + machine; runtime.profile)

    def __post_init__(self) -> None:
        if not self.target_ms:
            raise ValueError("a cost profile needs the target's 1-token latency at least")
        if self.target_ms_far and (len(self.target_ms_far) != len(self.target_ms)
                                   or not self.far_context > self.context >= 0):  # fmt: skip
            raise ValueError(
                f"target_ms_far needs one latency per width of target_ms ({len(self.target_ms)}) "
                f"and far_context > context, got {len(self.target_ms_far)} widths, contexts "
                f"{self.context} / {self.far_context}"
            )
        for name in ("target_ms", "drafter_ms", "target_ms_far"):
            vals = getattr(self, name)
            if any(not v > 0 for v in vals):  # rejects NaN too
                raise ValueError(f"{name} must be positive latencies, got {list(vals)}")
        for name in (
            "lookup_ms",
            "overhead_ms",
            "prefill_ms_per_token",
            "drafter_prefill_ms_per_token",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def target(self, n_tokens: int) -> float:
        return _width(self.target_ms, n_tokens)

    def target_at(self, n_tokens: int, pos: int | None) -> float:
        """Latency of an ``n_tokens`` call whose first token goes to position ``pos``: linear in
        the KV length between the two measured contexts (``target`` when either is unknown)."""
        near = self.target(n_tokens)
        if pos is None or not self.target_ms_far:
            return near
        slope = (_width(self.target_ms_far, n_tokens) - near) / (self.far_context - self.context)
        return max(near + slope * (pos - self.context), 0.5 * near)

    def drafter(self, n_tokens: int = 1) -> float:
        return _width(self.drafter_ms, n_tokens) if self.drafter_ms else 0.0

    @property
    def value_ms(self) -> float:
        """What one token costs target-only: the time an accepted proposal saves."""
        return self.target_ms[0]

    @property
    def drafter_ratio(self) -> float:
        """Drafter 1-token latency over target 1-token latency (the drafter cost ratio c)."""
        return self.drafter(1) / self.target_ms[0]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "<profile>") -> CostProfile:
        """Parse a profile; any malformed field raises ValueError naming ``source``."""
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            return cls(
                target_ms=tuple(float(v) for v in raw["target_ms"]),
                drafter_ms=tuple(float(v) for v in raw.get("drafter_ms", ())),
                lookup_ms=float(raw.get("lookup_ms", 0.0)),
                overhead_ms=float(raw.get("overhead_ms", 0.0)),
                prefill_ms_per_token=float(raw.get("prefill_ms_per_token", 0.0)),
                drafter_prefill_ms_per_token=float(raw.get("drafter_prefill_ms_per_token", 0.0)),
                context=int(raw.get("context", 0)),
                far_context=int(raw.get("far_context", 0)),
                target_ms_far=tuple(float(v) for v in raw.get("target_ms_far", ())),
                fingerprint=str(raw.get("fingerprint", "")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{source}: not a cost profile ({e})") from None

    @classmethod
    def load(cls, path: Path) -> CostProfile:
        return cls.from_json(path.read_text("utf-8"), source=str(path))


def _width(ms: Sequence[float], n: int) -> float:
    if n < 1:
        raise ValueError(f"a call feeds at least one token, got {n}")
    if n <= len(ms):
        return float(ms[n - 1])
    if len(ms) == 1:
        return float(ms[0]) * n
    slope = max(0.0, float(ms[-1]) - float(ms[-2]))
    return float(ms[-1]) + slope * (n - len(ms))


def expected_tokens(acceptance: Sequence[float]) -> float:
    """Expected tokens of one step: ``1 + sum_i prod_{j<=i} a_j`` over the proposals' conditional
    acceptance ``a_1..a_k`` (the bonus / correction token always comes)."""
    total, survive = 1.0, 1.0
    for a in acceptance:
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"acceptance probabilities lie in [0, 1], got {a}")
        survive *= a
        total += survive
    return total


def step_ms(profile: CostProfile, drafter_calls: int, n_proposed: int, *, lookup: bool,
            pos: int | None = None) -> float:  # fmt: skip
    """Cost of one step: drafter calls, one target call over ``n_proposed + 1`` tokens (at
    position ``pos``: ``CostProfile.target_at``), host."""
    if n_proposed == 0 and drafter_calls == 0 and not lookup:
        return profile.target_at(1, pos)  # a plain target step
    host = profile.overhead_ms + (profile.lookup_ms if lookup else 0.0)
    return drafter_calls * profile.drafter(1) + profile.target_at(n_proposed + 1, pos) + host


def marginal_ms(profile: CostProfile, n_proposed: int, *, model: bool) -> float:
    """Extra cost of proposing one more token after ``n_proposed``: a drafter call (model drafts
    only) plus the wider verification; the first proposal also pays the step's host overhead."""
    widen = profile.target(n_proposed + 2) - profile.target(n_proposed + 1)
    first = profile.overhead_ms if n_proposed == 0 else 0.0
    return (profile.drafter(1) if model else 0.0) + widen + first


def extension_pays(profile: CostProfile, n_proposed: int, k_max: int, *, survive: float,
                   rate: float, value: float) -> bool:  # fmt: skip
    """Whether drafting on from ``n_proposed`` model drafts to some length in ``(n_proposed,
    k_max]`` pays: the expected tokens of the extra drafts (each survives with the survival so
    far times ``rate`` per draft) times ``value`` ms exceed their drafter calls plus the wider
    verification. Looking past the next draft matters: the first extra verification row costs more
    than later ones (and a measured profile need not be convex), so a draft that does not pay
    alone can open a run that does."""
    gain = cost = 0.0
    for j in range(n_proposed, k_max):
        survive *= rate
        gain += survive * value
        cost += marginal_ms(profile, j, model=True)
        if gain > cost:
            return True
    return False


def expected_speedup(profile: CostProfile, acceptance: Sequence[float], *, model: bool) -> float:
    """Steady-state speedup over target-only of steps proposing ``len(acceptance)`` tokens with
    conditional acceptance ``acceptance`` (model drafts: one drafter call per proposal)."""
    k = len(acceptance)
    cost = step_ms(profile, k if model else 0, k, lookup=not model and k > 0)
    return expected_tokens(acceptance) * profile.value_ms / cost


def best_length(
    profile: CostProfile, acceptance: float, k_max: int, *, model: bool, survive: float = 1.0
) -> int:
    """How many more proposals to make: keep adding while the next one's expected gain
    ``survive * acceptance^i * value`` exceeds its marginal cost (0 allowed)."""
    k = 0
    while k < k_max:
        survive *= acceptance
        if survive * profile.value_ms <= marginal_ms(profile, k, model=model):
            break
        k += 1
    return k


@dataclass(frozen=True)
class StepRecord:
    """What one speculative step did: which proposer, drafter calls, proposals, accepted."""

    source: str  # "model" | "lookup" | "none"
    drafter_calls: int
    proposed: int
    accepted: int


def predicted_times(
    profile: CostProfile, steps: Sequence[StepRecord], prompt_len: int, reused: int = 0
) -> tuple[float, float]:
    """(target-only ms, speculative ms) the profile predicts for a generation that took ``steps``.
    Both prefill the prompt and read the first token from its last row, so the first step's
    1-token call is that row (a prefill row; its verification width is costed as any step's), and
    every other call is costed at its position (``CostProfile.target_at``: the first step feeds
    position ``prompt_len - 1``). The speculative time is the sum of ``cost_terms`` less the first
    step's call plus, when the drafter ran at all, its own prefill of the prompt (as many drafter
    tokens: the spellings' count is close). ``reused``: leading prompt tokens both sides found in
    their caches (``kv_reuse``), prefilled by neither."""
    prefill = (prompt_len - reused) * profile.prefill_ms_per_token
    start = max(0, prompt_len - 1)
    first = profile.target_at(1, start) if steps else 0.0  # inside the prefill
    t = cost_terms(profile, steps, prompt_len)
    spec = prefill - first + t["target_1"] + t["drafter"] + t["verify_width"] + t["host"]
    if any(s.source == "model" for s in steps):
        spec += (prompt_len - reused) * profile.drafter_prefill_ms_per_token
    n = int(t["tokens"])
    base = prefill + sum(profile.target_at(1, p) for p in range(start + 1, start + n))
    return base, spec


def predicted_speedup(profile: CostProfile, steps: Sequence[StepRecord], prompt_len: int) -> float:
    """Speedup the profile predicts for a generation that took ``steps`` (``predicted_times``)."""
    base, spec = predicted_times(profile, steps, prompt_len)
    return base / spec if spec > 0 else 0.0


def cost_terms(profile: CostProfile, steps: Sequence[StepRecord],
               prompt_len: int | None = None) -> dict[str, float]:  # fmt: skip
    """Where a generation's predicted time goes, in ms summed over ``steps``: ``drafter`` (drafter
    calls), ``verify_width`` (target calls beyond a 1-token call's cost), ``host`` (per-step
    overhead and lookups), ``target_1`` (one 1-token target call per step), and ``tokens`` made.
    With ``prompt_len``, calls are costed at their positions, as in ``predicted_times``.
    ``tokens * value_ms / (target_1 + drafter + verify_width + host)`` is the decode speedup."""
    out = {"drafter": 0.0, "verify_width": 0.0, "host": 0.0, "target_1": 0.0, "tokens": 0.0}
    pos = None if prompt_len is None else max(0, prompt_len - 1)
    for s in steps:
        total = step_ms(profile, s.drafter_calls, s.proposed, lookup=s.source == "lookup", pos=pos)
        one = profile.target_at(1, pos)
        drafter = s.drafter_calls * profile.drafter(1)
        width = profile.target_at(s.proposed + 1, pos) - one
        out["drafter"] += drafter
        out["verify_width"] += width
        out["host"] += total - drafter - width - one
        out["target_1"] += one
        out["tokens"] += s.accepted + 1
        if pos is not None:
            pos += s.accepted + 1
    return out
