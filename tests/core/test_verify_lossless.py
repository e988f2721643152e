"""Statistical losslessness, with its power tested: a mutation harness swaps in wrong samplers.

Fixture (``_fixture``): a 7-token target and an 8-token drafter whose vocabularies differ the way
real pairs do: three drafter tokens have no target twin (``cb``, ``ba``, ``bb``: unmapped, 30% of
the drafter's mass) and two drafter ids spell the same target token (``a`` twice: many-to-one).
Both models are tables (``TableLM``), so one sample costs well under a millisecond and the exact
target law of the first ``LENGTH`` tokens comes from enumeration. The drafter is miscalibrated on
purpose: sharper than the target on ``a`` and ``c`` (q > 1.15 p), flatter elsewhere.

The suite's criterion (``_deviation``): Pearson chi-square of the joint law of two tokens (49
cells) and of the first token (7 cells), Wilson-Hilferty z < ``Z_MAX`` for both. ``exact`` mode
must pass it; each wrong sampler in ``MUTANTS`` (the bugs issue 15 found passing the old tests, plus
"accept everything") must fail it with ``N_MUTANT`` <= ``N_SAMPLES`` samples (power only grows
with more samples). ``omnidraft`` mode (merged n-gram probabilities, unrestricted drafter) is
biased by design: its total-variation distance from the target law is measured and held to
``OMNIDRAFT_TV_BOUND``. Default-run cost: ~14k table-model samples (seconds on an idle CPU).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.speculative import decoder as decoder_mod
from omnidraft_deploy.speculative import drafter as drafter_mod
from omnidraft_deploy.speculative import verify as verify_mod
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import FixedDraftLen
from omnidraft_deploy.speculative.drafter import CrossVocabDrafter, Mode, Proposal
from omnidraft_deploy.speculative.lossless import (
    chi_square,
    chi_square_z,
    exact_sequence_probs,
    total_variation,
)
from omnidraft_deploy.speculative.sampling import sample
from omnidraft_deploy.testing import TableTokenizer
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)
LENGTH, DRAFT_LEN, Z_MAX = 2, 2, 4.0  # z > 4: p < 3e-5 for one test
N_SAMPLES, N_MUTANT = 2000, 800
OMNIDRAFT_TV_BOUND = 0.30
TARGET_PIECES = [b"<eos>", b"a", b"b", b"c", b"ab", b"bc", b"ca"]
DRAFTER_PIECES = [b"</s>", b"a", b"b", b"c", b"a", b"cb", b"ba", b"bb"]
# every context: target law p, drafter law q (drafter ids; a twice, cb/ba/bb unmapped)
P = [0.04, 0.35, 0.08, 0.30, 0.08, 0.10, 0.05]
Q = [0.02, 0.16, 0.05, 0.28, 0.16, 0.10, 0.12, 0.08]
Sequences = Counter[tuple[int, ...]]


class TableLM:
    """``CausalLM`` whose next-token logits depend only on the last token: ``rows[last]``."""

    def __init__(self, rows: Tensor, max_seq_len: int = 64) -> None:
        self.rows, self._max = rows, max_seq_len

    @property
    def vocab_size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def max_seq_len(self) -> int:
        return self._max

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        return self.rows[token_ids]


def _fixture() -> tuple[TableLM, TableLM, VocabMapper, list[int]]:
    drafter_tok = TableTokenizer("lossless-drafter", DRAFTER_PIECES)
    target_tok = TableTokenizer("lossless-target", TARGET_PIECES)
    mapper = VocabMapper.from_tokenizers(drafter_tok, target_tok)
    assert mapper.draft_to_target.tolist() == [0, 1, 2, 3, 1, -1, -1, -1]  # as the docstring says
    target = TableLM(torch.tensor(P).log().expand(len(P), -1).contiguous())
    drafter = TableLM(torch.tensor(Q).log().expand(len(Q), -1).contiguous())
    return target, drafter, mapper, target_tok.encode("ab")


@pytest.fixture(scope="module")
def setup() -> tuple[TableLM, TableLM, VocabMapper, list[int], dict[tuple[int, ...], float]]:
    target, drafter, mapper, prompt = _fixture()
    return target, drafter, mapper, prompt, exact_sequence_probs(target, prompt, LENGTH)


def _sample(setup, mode: Mode, n: int, cache: NGramCache | None = None, seed: int = 0) -> Sequences:
    target, drafter, mapper, prompt, _ = setup
    cfg = DecodeConfig(mode=mode, temperature=1.0, max_new_tokens=LENGTH)
    dec = SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(DRAFT_LEN), cache, config=cfg)
    gen = torch.Generator().manual_seed(seed)
    return Counter(tuple(dec.generate(prompt, generator=gen)[0]) for _ in range(n))


def _deviation(counts: Sequences, truth: dict[tuple[int, ...], float]) -> float:
    """The suite's statistic: the larger chi-square z of the joint law and of the first token."""
    first: Sequences = Counter()
    for seq, c in counts.items():
        first[seq[:1]] += c
    truth_first: dict[tuple[int, ...], float] = {}
    for seq, p in truth.items():
        truth_first[seq[:1]] = truth_first.get(seq[:1], 0.0) + p
    return max(
        chi_square_z(*chi_square(counts, truth)), chi_square_z(*chi_square(first, truth_first))
    )


def test_exact_mode_matches_target_distribution(setup) -> None:
    counts = _sample(setup, Mode.EXACT, N_SAMPLES)
    z = _deviation(counts, setup[-1])
    assert z < Z_MAX, z
    assert total_variation(counts, setup[-1]) < 0.06


# --- mutation harness: wrong samplers, each must fail the criterion above --------------------


def _unrestricted(mp: pytest.MonkeyPatch) -> None:
    """``exact`` mode drafts from the full drafter row, not the directly mapped tokens."""
    mp.setattr(drafter_mod, "restrict", lambda probs, mask: probs)


def _lenient(mp: pytest.MonkeyPatch) -> None:
    """Accept with min(1, 1.15 p / q)."""
    real = decoder_mod.verify
    mp.setattr(decoder_mod, "verify", lambda ids, q, rows, p, g: real(ids, q / 1.15, rows, p, g))


def _drafted_token_q(mp: pytest.MonkeyPatch) -> None:
    """q = the drafted drafter token's probability, not the sum over every drafter token that
    spells the same target token (many-to-one)."""
    real_draft, real_propose = CrossVocabDrafter.draft, CrossVocabDrafter.propose
    drafted: dict[int, list[float]] = {}

    def draft(self, generator):  # type: ignore[no-untyped-def]
        out = real_draft(self, generator)
        drafted[id(self)] = out[1]
        return out

    def propose(self, generator) -> Proposal:  # type: ignore[no-untyped-def]
        prop = real_propose(self, generator)
        prop.q = torch.tensor(drafted[id(self)][: len(prop.target_ids)])  # exact: 1 token each
        return prop

    mp.setattr(CrossVocabDrafter, "draft", draft)
    mp.setattr(CrossVocabDrafter, "propose", propose)


def _resample_from_p(mp: pytest.MonkeyPatch) -> None:
    """On rejection, sample from p instead of norm(max(0, p - q))."""
    mp.setattr(verify_mod, "residual", lambda p, q: p)


def _one_hot_proposal(mp: pytest.MonkeyPatch) -> None:
    """The residual treats the proposal as one-hot on the proposed token."""
    real = decoder_mod.verify
    mp.setattr(decoder_mod, "verify", lambda ids, q, rows, p, g: real(ids, q, None, p, g))


def _accept_everything(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        decoder_mod,
        "verify",
        lambda ids, q, rows, p, g: (len(ids), sample(p[len(ids)], g)),
    )


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "exact mode not restricted to directly mapped tokens": _unrestricted,
    "acceptance min(1, 1.15 p/q)": _lenient,
    "q of the drafted token, not summed over its spellings": _drafted_token_q,
    "resample from p on rejection": _resample_from_p,
    "one-hot proposal in the residual": _one_hot_proposal,
    "accept everything": _accept_everything,
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutation_harness_rejects_wrong_sampler(setup, name: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        MUTANTS[name](mp)
        counts = _sample(setup, Mode.EXACT, N_MUTANT, seed=1)
    z = _deviation(counts, setup[-1])
    log.info("mutant %r: z = %.1f", name, z)
    assert z > Z_MAX, f"the lossless test cannot tell {name!r} from the real sampler (z={z:.1f})"


def test_harness_leaves_the_real_sampler_alone(setup) -> None:
    """Control: the same seed and sample count without a mutant passes (the patches are undone)."""
    assert _deviation(_sample(setup, Mode.EXACT, N_MUTANT, seed=1), setup[-1]) < Z_MAX


def test_omnidraft_mode_bias_is_measured_and_bounded(setup) -> None:
    """``omnidraft`` mode's bias: TV of its two-token law from the target's, with merged n-grams
    for the target tokens the drafter spells with two tokens. Measured 0.226 at N=2000 (exact
    mode's sampling noise at the same N: ~0.05); ``OMNIDRAFT_TV_BOUND`` fails a change that makes
    the mode more biased. It is biased on purpose: 30% of the drafter's mass is on unmapped tokens,
    which this mode does not renormalise away (``exact`` mode does)."""
    _, _, mapper, _, truth = setup
    cache = NGramCache(max_entries=8)
    for t in (4, 5, 6):  # ab, bc, ca
        cache.update(mapper.target_to_draft(t), t)
    counts = _sample(setup, Mode.OMNIDRAFT, N_SAMPLES, cache, seed=2)
    tv = total_variation(counts, truth)
    log.warning("omnidraft mode: TV=%.4f (bound %.2f)", tv, OMNIDRAFT_TV_BOUND)
    assert tv < OMNIDRAFT_TV_BOUND
    assert _deviation(counts, truth) > Z_MAX  # the bias is real, not sampling noise
