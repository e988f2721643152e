"""Issue 47: in ``exact`` mode a drafter row with no mass on the directly mapped tokens proposes
nothing for that step; the target samples it, and the output law stays exactly the target's.

Before, ``restrict`` kept the all-zero row and ``sample`` raised ``IndexError: index -32001``
(``omnidraft generate --mode exact --temperature 1e-30``; with real models a lead of more than
~10 logits at T = 0.1 is enough). The rows here are the lossless suite's tables
(``test_verify_lossless``) with the drafter's mapped tokens pushed ``gap`` logits below its
unmapped ones in some contexts, so their probabilities underflow to exactly 0.
"""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verify_lossless import (
    DRAFTER_PIECES,
    LENGTH,
    N_SAMPLES,
    TARGET_PIECES,
    Z_MAX,
    TableLM,
    _deviation,
    _fixture,
)

from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import FixedDraftLen
from omnidraft_deploy.speculative.drafter import CrossVocabDrafter, Mode
from omnidraft_deploy.speculative.lossless import exact_sequence_probs
from omnidraft_deploy.speculative.sampling import logits_to_probs, restrict, sample

UNMAPPED = [5, 6, 7]  # cb, ba, bb: no target twin (the fixture's mapper)


def _drafter(contexts: set[int], gap: float) -> TableLM:
    """The lossless drafter, except that after each token of ``contexts`` every mapped drafter
    token sits ``gap`` logits below the unmapped ones."""
    rows = torch.zeros(len(DRAFTER_PIECES), len(DRAFTER_PIECES))
    for c in contexts:
        rows[c] = -gap
        rows[c, UNMAPPED] = 0.0
    return TableLM(rows)


@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(
    contexts=st.sets(st.integers(0, len(DRAFTER_PIECES) - 1), min_size=1),
    gap=st.floats(200.0, 1e6),
    temperature=st.sampled_from([1e-30, 1e-6, 0.1, 1.0, 2.0]),
    seed=st.integers(0, 2**32),
)
def test_exact_mode_never_samples_a_row_without_mass(
    contexts: set[int], gap: float, temperature: float, seed: int
) -> None:
    target, _, mapper, prompt = _fixture()
    drafter = _drafter(contexts, gap)
    cfg = DecodeConfig(mode=Mode.EXACT, temperature=temperature, max_new_tokens=6)
    dec = SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(3), None, config=cfg)
    out, stats = dec.generate(prompt, generator=torch.Generator().manual_seed(seed))
    assert 1 <= len(out) <= 6 and all(0 <= t < len(TARGET_PIECES) for t in out)
    from omnidraft_deploy.speculative.sampling import has_mass

    # the rows the decode went through had no mass on the mapped tokens (the case under test)
    row = logits_to_probs(drafter.forward(torch.tensor([next(iter(contexts))]), 0)[0], temperature)
    assert not has_mass(restrict(row, mapper.dm_draft_mask))


def test_a_zero_mass_first_row_proposes_nothing() -> None:
    _, _, mapper, _ = _fixture()
    drafter = CrossVocabDrafter(_drafter(set(range(len(DRAFTER_PIECES))), 1e4), mapper,
                                FixedDraftLen(3), mode=Mode.EXACT, target_vocab=len(TARGET_PIECES),
                                temperature=1.0)  # fmt: skip
    drafter.reset([1, 2])
    proposal = drafter.propose(torch.Generator().manual_seed(0))
    assert proposal.target_ids == [] and proposal.n_drafted == 0


def test_sample_refuses_a_row_without_mass_by_name() -> None:
    for row in (torch.zeros(5), torch.full((5,), float("nan"))):
        try:
            sample(row, torch.Generator().manual_seed(0))
        except ValueError as e:
            assert "no probability mass" in str(e)
        else:
            raise AssertionError(f"sampled from {row}")


def test_tiny_temperatures_give_a_law_not_nan() -> None:
    logits = torch.tensor([30.0, 29.0, -5.0, float("-inf")])
    for t in (1e-30, 1e-38, 1e-45):
        probs = logits_to_probs(logits, t)
        assert torch.isfinite(probs).all() and probs.tolist() == [1.0, 0.0, 0.0, 0.0], (t, probs)


def test_output_law_stays_the_targets_when_some_rows_have_no_mass() -> None:
    """The lossless suite's criterion (chi-square z of the two-token joint law and of the first
    token below ``Z_MAX``) with the drafter's mapped mass underflowing after ``a`` and ``c``."""
    target, _, mapper, prompt = _fixture()
    drafter = _drafter({1, 3, 4}, 1e4)  # after a (both spellings) and c
    cfg = DecodeConfig(mode=Mode.EXACT, temperature=1.0, max_new_tokens=LENGTH)
    dec = SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(2), None, config=cfg)
    gen = torch.Generator().manual_seed(3)
    counts = Counter(tuple(dec.generate(prompt, generator=gen)[0]) for _ in range(N_SAMPLES))
    z = _deviation(counts, exact_sequence_probs(target, prompt, LENGTH))
    assert z < Z_MAX, z
