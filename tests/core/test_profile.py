"""``omnidraft_deploy.host.profile``: the measurement's shape and the session-folder round trip (no
speed asserted: only that every figure is a positive latency and lands where the decoder reads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnidraft_deploy.host.profile import load_profile, measure, physical_cores, save_profile
from omnidraft_deploy.speculative.cost import PROFILE_FILE


class CountingLM:
    """Logits depend on the last token; records every (T, start) call."""

    def __init__(self, vocab: int = 16) -> None:
        self.rows, self.calls = torch.randn(vocab, vocab), list[tuple[int, int]]()

    @property
    def vocab_size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def max_seq_len(self) -> int:
        return 128

    def forward(self, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        self.calls.append((int(token_ids.shape[0]), start_pos))
        return self.rows[token_ids % self.vocab_size]


def test_measure_interleaves_every_width_and_saves_to_the_state_folder(tmp_path: Path) -> None:
    target, drafter = CountingLM(), CountingLM()
    profs = measure(target, {"d": drafter}, k_max=3, context=8, reps=3)
    assert set(profs) == {"", "d"}
    p = profs["d"]
    assert len(p.target_ms) == 4 and len(p.drafter_ms) == 3 and p.drafter_ratio > 0
    widths = {t for t, pos in target.calls if pos == 8}
    assert widths >= {1, 2, 3, 4}  # T = 1..k_max+1 at the context position
    assert sum(1 for t, pos in drafter.calls if (t, pos) == (1, 8)) == 3  # once per round
    assert (p.context, p.far_context) == (8, 96) and len(p.target_ms_far) == 4  # 3/4 of 128
    assert {t for t, pos in target.calls if pos == 96} >= {1, 2, 3, 4}
    assert all(pos != 96 for _, pos in drafter.calls)  # the drafters are timed near only
    path = save_profile(p, tmp_path)
    assert path == tmp_path / PROFILE_FILE and load_profile(tmp_path) == p
    assert load_profile(tmp_path / "none") is None
    path.write_text("{}")
    with pytest.raises(ValueError, match=PROFILE_FILE):
        load_profile(tmp_path)
    assert physical_cores() >= 1


def test_far_context_must_fit_the_target_and_can_be_turned_off() -> None:
    with pytest.raises(ValueError, match="max_seq_len 128"):
        measure(CountingLM(), {}, k_max=3, context=8, far_context=126, reps=1)
    prof = measure(CountingLM(), {}, k_max=3, context=8, far_context=0, reps=1)[""]
    assert prof.target_ms_far == () and prof.far_context == 0


class TailCountingLM(CountingLM):
    """Also has ``forward_tail``; records its calls apart."""

    def __init__(self) -> None:
        super().__init__()
        self.last_calls = list[tuple[int, int]]()

    def forward_tail(self, token_ids: torch.Tensor, start_pos: int, rows: int) -> torch.Tensor:
        self.last_calls.append((int(token_ids.shape[0]), start_pos))
        return self.rows[token_ids[-rows:] % self.vocab_size]


def test_prefills_are_timed_as_the_decoder_runs_them_last_row_only() -> None:
    """``prefill_ms_per_token`` (target and drafter) times ``forward_tail``, the decoder's prefill;
    the step calls (verification widths, drafter steps) time ``forward``."""
    target, drafter = TailCountingLM(), TailCountingLM()
    measure(target, {"d": drafter}, k_max=3, context=8, far_context=0, reps=2)
    for lm in (target, drafter):
        assert (8, 0) in lm.last_calls and (8, 0) not in lm.calls
        assert all(pos == 8 for _, pos in lm.calls)  # every timed step call is at the context


def test_each_call_is_summarised_by_the_statistic_asked_for() -> None:
    """``stat``: the median by default, the mean where a run's sum of calls is to be predicted."""
    seen: list[int] = []

    def stat(values: list[float]) -> float:
        seen.append(len(values))
        return 7.0

    prof = measure(CountingLM(), {"d": CountingLM()}, k_max=3, context=8, far_context=0, reps=4,
                   stat=stat)["d"]  # fmt: skip
    assert prof.target_ms == (7.0,) * 4 and prof.drafter_ms == (7.0,) * 3
    assert prof.prefill_ms_per_token == 7.0 and set(seen) == {4}
