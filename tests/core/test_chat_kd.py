"""Offline distillation on the target's chat replies (``benchmarks.common.chat_kd``): the requests are the
five benchmark shapes and seeded, a training row is what the decoder feeds the drafter, and
training on replies raises the drafter's agreement with them (tiny model, seconds)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.common import chat_kd
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.testing import toy_spec

DOCS = {
    "math": [f"Question: Mia has {i} apples and buys 3 more. How many?\nAnswer: {i + 3}\n" for i in range(8)],
    "instruction": [f"User: What does `os.f{i}` do in Python?\nAssistant: It does {i}.\n" for i in range(8)],
    "summarisation": [f"Summarize.\nText: Cats sleep {i} hours.\nSummary: Cats sleep.\n" for i in range(8)],
}  # fmt: skip
SOURCE = "\n\n".join(
    f'def f{i}(a, b):\n    """Return the sum of a and b plus {i}, as an int."""\n'
    f"    c = a + b\n    d = c + {i}\n    e = int(d)\n    return e\n"
    for i in range(12)
)


class SpellTwice:
    """Target id t is spelled as two drafter ids (2t, 2t+1); the context starts with BOS 0."""

    def drafter_context(self, target_ids: list[int]) -> list[int]:
        return [0, *[d for t in target_ids for d in self.target_to_draft(t)]]

    def target_to_draft(self, target_id: int) -> list[int]:
        return [2 * target_id, 2 * target_id + 1]


def test_request_texts_cover_the_five_shapes_and_are_seeded() -> None:
    got = chat_kd.request_texts(DOCS, [SOURCE], per_task=4, seed=1)
    assert [t for t, _ in got] == [t for t in chat_kd.TASKS for _ in range(4)]
    assert got == chat_kd.request_texts(DOCS, [SOURCE], per_task=4, seed=1)
    assert got != chat_kd.request_texts(DOCS, [SOURCE], per_task=4, seed=2)
    by_task = {t: [x for tt, x in got if tt == t] for t in chat_kd.TASKS}
    assert all(x.endswith("Answer:") for x in by_task["math"])
    assert all(x.startswith("User: ") and x.endswith("\nAssistant:") for x in by_task["chat"])
    assert all(x.endswith("Summary:") for x in by_task["summarisation"])
    assert all("```python\ndef f" in x and '"""' not in x for x in by_task["code_edit"])
    assert all(
        x.startswith(("def f", "Write a Python function that returns")) for x in by_task["code"]
    )


def test_request_texts_refuse_a_pool_too_small() -> None:
    with pytest.raises(ValueError, match="math: only 8 distinct requests, 9 wanted"):
        chat_kd.request_texts(DOCS, [SOURCE], per_task=9, seed=0)


def test_kd_row_is_the_decoders_view_cut_from_the_left() -> None:
    row = chat_kd.kd_row(SpellTwice(), [5, 6], [7], max_len=64)
    assert row.ids == (0, 10, 11, 12, 13, 14, 15) and row.start == 5
    cut = chat_kd.kd_row(SpellTwice(), [5, 6], [7, 8], max_len=6)
    assert cut.ids == (12, 13, 14, 15, 16, 17) and cut.start == 2  # the reply is kept whole
    with pytest.raises(ValueError, match="empty"):
        chat_kd.kd_row(SpellTwice(), [5], [], max_len=8)


def test_lr_schedule_warms_up_then_decays_to_zero() -> None:
    cfg = chat_kd.TrainConfig(lr=1.0, warmup=4)
    lrs = [chat_kd.lr_at(s, 20, cfg) for s in range(21)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0] and lrs[20] == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:], strict=False))


def test_training_on_replies_raises_agreement_with_them() -> None:
    torch.manual_seed(0)
    model = build_model(toy_spec(64, max_seq_len=32), seed=3)
    rows = [
        chat_kd.kd_row(SpellTwice(), [1, 20 + i], [4 + i, 9, 10 + i], max_len=32) for i in range(4)
    ]
    before = chat_kd.reply_agreement(model, rows)
    losses = chat_kd.train_on_replies(
        model, rows, chat_kd.TrainConfig(epochs=60, lr=3e-2, warmup=5)
    )
    after = chat_kd.reply_agreement(model, rows)
    assert before < 0.5 and after > 0.9
    assert sum(losses[-4:]) < 0.2 * sum(losses[:4])
    assert not model.training


def test_train_layers_moves_only_the_last_blocks_and_the_final_norm() -> None:
    model = build_model(dataclasses.replace(toy_spec(64, max_seq_len=32), n_layers=3), seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    row = chat_kd.kd_row(SpellTwice(), [1, 2], [4, 9], max_len=32)
    chat_kd.train_on_replies(model, [row], chat_kd.TrainConfig(epochs=3, lr=1e-2, train_layers=1))
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(k.startswith(("model.layers.2.", "model.norm.")) for k in moved)
