"""``DecodeStats``: what one generation did, returned (never printed) by the decoders."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    n_generated: int = 0
    target_calls: int = 0
    drafter_calls: int = 0
    proposed: int = 0  # target-vocabulary proposals sent to verification
    accepted: int = 0
    merged_proposed: int = 0  # proposals that came from the n-gram cache
    merged_accepted: int = 0
    accept_counts: list[int] = field(default_factory=list)  # accepted proposals per step
    draft_len_trace: list[int] = field(default_factory=list)  # drafter tokens drafted per step
    target_s: float = 0.0
    drafter_s: float = 0.0
    overhead_s: float = 0.0  # mapping, n-gram cache, verification maths
    wall_s: float = 0.0
    stopped_by_capacity: bool = False  # the KV capacity ended it before max_new_tokens / EOS
    prompt_reused: int = 0  # leading prompt tokens already in the target's cache (not prefilled)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.n_generated / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.wall_s if self.wall_s else 0.0

    @property
    def overhead_fraction_of_drafter(self) -> float:
        """Mapper + cache + verify time as a fraction of drafter forward time."""
        return self.overhead_s / self.drafter_s if self.drafter_s else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "n_generated": self.n_generated,
            "target_calls": self.target_calls,
            "drafter_calls": self.drafter_calls,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_target_call": self.tokens_per_target_call,
            "merged_proposed": self.merged_proposed,
            "merged_accepted": self.merged_accepted,
            "tokens_per_s": self.tokens_per_s,
            "wall_s": self.wall_s,
            "target_s": self.target_s,
            "drafter_s": self.drafter_s,
            "overhead_s": self.overhead_s,
            "overhead_fraction_of_drafter": self.overhead_fraction_of_drafter,
            "prompt_reused": self.prompt_reused,
        }
