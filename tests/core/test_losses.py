"""Hybrid distillation loss and target->drafter alignment: hand-computed values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from omnidraft_deploy.distill.align import (
    TokenKind,
    build_example,
    dm_inverse,
    stack_examples,
    token_kind,
    translate,
)
from omnidraft_deploy.distill.losses import (
    dm_kl_rows,
    dm_loss,
    hybrid_loss_rows,
    map_topk_to_draft,
    ngram_loss,
    ngram_nll_rows,
)


@dataclass
class TinyMapper:
    """Synthetic mapper tables. Drafter: 0 <pad>, 1 a, 2 b, 3 c, 4 d, 5 x.
    Target: 0 a, 1 b, 2 cd (n-gram -> drafter [3, 4]), 3 c, 4 <special> (no encoding)."""

    draft_to_target: Tensor
    target_to_draft_offsets: Tensor
    target_to_draft_flat: Tensor
    draft_vocab_size: int = 6
    target_vocab_size: int = 5


def tiny_mapper() -> TinyMapper:
    return TinyMapper(
        torch.tensor([-1, 0, 1, 3, -1, -1]),
        torch.tensor([0, 1, 2, 4, 5, 5]),
        torch.tensor([1, 2, 3, 4, 3]),
    )


def test_translate_spans() -> None:
    ids, spans = translate(tiny_mapper(), [0, 2, 4, 1])
    assert ids == [1, 3, 4, 2]
    assert spans == [(0, 1), (1, 3), (3, 3), (3, 4)]


def test_token_kind_and_inverse() -> None:
    m = tiny_mapper()
    assert token_kind(m, 0, [1]) is TokenKind.DM
    assert token_kind(m, 2, [3, 4]) is TokenKind.NGRAM
    assert token_kind(m, 4, []) is TokenKind.SKIP
    assert dm_inverse(m.draft_to_target, 5).tolist() == [1, 2, -1, 3, -1]


def test_map_topk_to_draft_renormalises_over_dm_mass() -> None:
    inverse = torch.tensor([1, 2, -1, 3, -1])
    ids, probs, mass = map_topk_to_draft(
        torch.tensor([0, 2, 1]), torch.tensor([0.5, 0.3, 0.2]), inverse
    )
    assert ids.tolist() == [1, 0, 2]
    torch.testing.assert_close(probs, torch.tensor([0.5 / 0.7, 0.0, 0.2 / 0.7]))
    assert float(mass) == pytest.approx(0.7)


def test_dm_kl_hand_values() -> None:
    logits = torch.zeros(2, 4)  # uniform drafter: log p = -log 4
    ids = torch.tensor([[1, 2], [3, 0]])
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    kl = dm_kl_rows(logits, ids, probs)
    torch.testing.assert_close(kl, torch.tensor([math.log(2.0), math.log(4.0)]))
    assert float(dm_kl_rows(logits, ids, torch.zeros(2, 2)).abs().max()) == 0.0


def test_dm_kl_equals_dense_kl_div() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, generator=gen)
    ids = torch.tensor([[0, 3, 5], [1, 2, 6], [4, 0, 1]])
    probs = torch.softmax(torch.randn(3, 3, generator=gen), -1)
    dense = torch.zeros(3, 7).scatter(-1, ids, probs)
    expected = F.kl_div(F.log_softmax(logits, -1), dense, reduction="none").sum(-1)
    torch.testing.assert_close(dm_kl_rows(logits, ids, probs), expected)


def test_ngram_nll_and_weighted_losses() -> None:
    logits = torch.log(torch.tensor([[1.0, 3.0], [2.0, 2.0]]))  # p = [.25,.75], [.5,.5]
    nll = ngram_nll_rows(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(nll, torch.tensor([-math.log(0.75), math.log(2.0)]))
    w = torch.tensor([0.4, 0.1])
    expected = 0.4 * -math.log(0.75) + 0.1 * math.log(2.0)
    assert float(ngram_loss(logits, torch.tensor([1, 0]), w)) == pytest.approx(expected)
    dm = dm_loss(logits, torch.tensor([[0, 1], [0, 1]]), torch.tensor([[1.0, 0.0], [0.5, 0.5]]), w)
    assert float(dm) == pytest.approx(0.4 * math.log(4.0) + 0.1 * 0.0, abs=1e-6)


def test_hybrid_is_dm_plus_lambda_ngram() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 6, generator=gen)
    ids = torch.randint(0, 6, (1, 4, 3), generator=gen)
    probs = torch.softmax(torch.randn(1, 4, 3, generator=gen), -1)
    dm_w, ng_w = torch.tensor([[0.5, 0.5, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 0.3, 0.3]])
    nxt = torch.tensor([[1, 2, 3, 4]])
    total = hybrid_loss_rows(logits, ids, probs, dm_w, nxt, ng_w, 0.25)
    expected = dm_loss(logits, ids, probs, dm_w) + 0.25 * ngram_loss(logits, nxt, ng_w)
    torch.testing.assert_close(total, expected)
    assert float(hybrid_loss_rows(logits, ids, probs, dm_w, nxt, ng_w, 0.0)) == pytest.approx(
        float(dm_loss(logits, ids, probs, dm_w))
    )


def test_build_example_rows() -> None:
    m = tiny_mapper()
    # context "a"; committed "cd" (n-gram, target prob 0.6) then "b" (DM, top-k a/b/cd)
    topk_ids = torch.tensor([[2, 0, 3], [1, 0, 2]])
    topk_probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.25, 0.25]])
    ex = build_example(m, [0], [2, 1], topk_ids, topk_probs, seq_len=6)
    assert ex.draft_ids.tolist() == [1, 3, 4, 2, 0, 0]
    assert ex.next_draft_ids.tolist() == [3, 4, 2, 0, 0, 0]
    torch.testing.assert_close(ex.ngram_weight, torch.tensor([0.6, 0.6, 0, 0, 0, 0]))
    assert ex.dm_weight.tolist() == [0, 0, 1, 0, 0, 0] and ex.ngram_spans == 1
    assert ex.topk_draft_ids[2].tolist() == [2, 1, 0]
    torch.testing.assert_close(ex.topk_probs[2], torch.tensor([0.5 / 0.75, 0.25 / 0.75, 0.0]))
    # truncation keeps the end; the span that starts at drafter position 0 has no predictor
    short = build_example(m, [0], [2, 1], topk_ids, topk_probs, seq_len=3)
    assert short.draft_ids.tolist() == [3, 4, 2]
    assert short.ngram_weight.tolist() == [0, 0, 0] and short.dm_weight.tolist() == [0, 1, 0]


def test_stack_examples_normalises_weights() -> None:
    m = tiny_mapper()
    ex = build_example(
        m,
        [0],
        [2, 1],
        torch.tensor([[2, 0], [1, 0]]),
        torch.tensor([[0.6, 0.4], [0.5, 0.5]]),
        seq_len=6,
    )
    ex2 = build_example(m, [1], [0], torch.tensor([[0, 1]]), torch.tensor([[0.9, 0.1]]), seq_len=6)
    batch = stack_examples([ex, ex2])
    assert batch["draft_ids"].shape == (2, 6)
    assert float(batch["dm_weight"].sum()) == pytest.approx(1.0)  # 2 DM rows -> 1/2 each
    torch.testing.assert_close(batch["ngram_weight"][0, :2], torch.tensor([0.6, 0.6]))
    with pytest.raises(ValueError, match="no examples"):
        stack_examples([])


def test_build_example_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="topk rows"):
        build_example(
            tiny_mapper(),
            [0],
            [1, 1],
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2),
            seq_len=4,
        )
    with pytest.raises(ValueError, match="target id 9"):
        translate(tiny_mapper(), [9])
