"""``masked_softmax`` (the NPU-friendly attention softmax) equals a -inf masked softmax, stays
finite when every real score is far below zero (Qwen2.5 attention: the case that once gave NaN),
and ignores whatever the masked slots hold."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnidraft_deploy.reference.model import masked_softmax


def _reference(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(mask == 0, float("-inf")), dim=-1)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    offset=st.sampled_from([0.0, -50.0, -150.0, -1e4, 80.0, 1e4]),
    scale=st.sampled_from([0.1, 1.0, 30.0]),
    slots=st.integers(1, 24),
)
def test_matches_inf_masked_softmax(seed: int, offset: float, scale: float, slots: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scores = offset + scale * torch.randn(3, 5, slots, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 5, slots, generator=g) < 0.6).double()
    mask[..., torch.randint(0, slots, (1,), generator=g)] = 1.0  # every row has a real slot
    got = masked_softmax(scores, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _reference(scores, mask), atol=1e-9, rtol=1e-7)
    stale = scores + (1 - mask) * 1e6 * torch.randn(scores.shape, generator=g, dtype=torch.float64)
    torch.testing.assert_close(masked_softmax(stale, mask), got, atol=0, rtol=0)


def test_all_real_scores_very_negative_in_float32() -> None:
    scores = torch.tensor([[-300.0, -310.0, 5.0, 7.0]])  # last two slots masked (later tokens)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    got = masked_softmax(scores, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _reference(scores, mask))
