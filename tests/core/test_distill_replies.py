"""``omnidraft distill``'s pieces without a bundle: the replies file (appends, a torn last line,
resume keys, the held-out split), the request sources, the replies as the drafter sees them, and
the one learner (``distill.adapt.train_offline``) raising agreement on them (tiny model, seconds)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from omnidraft_deploy.distill import replies as rp
from omnidraft_deploy.distill import reply_rows as rr
from omnidraft_deploy.distill import requests as rq
from omnidraft_deploy.distill.adapt import AdaptConfig, make_distiller, train_offline
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.testing import toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper

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


def _reply(i: int, *, topk: bool = True) -> rp.Reply:
    reply = [4 + i % 2, 6, 9]  # toy_pair target ids: 4, 5 map directly, 6 and 9 are n-grams
    ids = [[t, 1, 2] for t in reply] if topk else []
    probs = [[0.7, 0.2, 0.1] for _ in reply] if topk else []
    return rp.Reply(rp.request_key("user", f"q{i}", 8, False), "user", f"q{i}", "bundle:x",
                    [1, 2 + i % 2], reply, ids, probs)  # fmt: skip


def test_replies_append_resume_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / rp.REPLIES
    assert rp.load_replies(path) == []
    for i in range(3):
        rp.append_reply(path, _reply(i))
    whole = path.read_bytes()
    with open(path, "ab") as f:  # a writer killed mid-line
        f.write(json.dumps(dataclasses.asdict(_reply(3)))[:40].encode())
    got = rp.load_replies(path)
    assert got == [_reply(i) for i in range(3)]
    assert path.read_bytes() == whole  # the torn line is cut, so the next append starts clean
    rp.append_reply(path, _reply(3))
    assert rp.load_replies(path) == [_reply(i) for i in range(4)]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", ":2: not a JSON reply record"),
        ('{"key": "k"}', ":2: a reply record needs"),
        ('{"key":"k","task":"t","text":"x","teacher":"b","prompt":[1],"reply":["a"]}', "integer"),
        ('{"key":"k","task":"t","text":"x","teacher":"b","prompt":[1],"reply":[2],'
         '"topk_ids":[[2],[3]],"topk_probs":[[1.0],[1.0]]}', "2 top-k rows for 1"),
    ],
)  # fmt: skip
def test_a_damaged_line_is_an_error_naming_the_file_and_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / rp.REPLIES
    rp.append_reply(path, _reply(0))
    with open(path, "a") as f:
        f.write(line + "\n")
    with pytest.raises(ValueError, match=problem) as err:
        rp.load_replies(path)
    assert str(path) in str(err.value)


def test_request_keys_and_the_held_out_split_are_stable() -> None:
    assert rp.request_key("t", "x", 8, True) == rp.request_key("t", "x", 8, True)
    assert rp.request_key("t", "x", 8, True) != rp.request_key("t", "x", 9, True)
    replies = [_reply(i) for i in range(40)]
    train, held = rp.heldout(replies)
    assert held and len(train) + len(held) == 40 and not {r.key for r in train} & {r.key for r in held}
    grown_train, grown_held = rp.heldout(replies + [_reply(i) for i in range(40, 60)])
    assert {r.key for r in held} <= {r.key for r in grown_held}  # a held-out reply stays held out
    assert len(rp.heldout(replies[:2])[1]) == 1


def test_user_requests_from_a_file_a_jsonl_file_and_a_folder(tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_text("first request\n\n  second one\n")
    assert [r.text for r in rq.user_requests(tmp_path / "lines.txt")] == ["first request", "  second one"]
    (tmp_path / "rows.jsonl").write_text('{"text": "a\\nb", "task": "code"}\n{"text": "c"}\n')
    got = rq.user_requests(tmp_path / "rows.jsonl")
    assert [(r.task, r.text) for r in got] == [("code", "a\nb"), ("user", "c")]
    folder = tmp_path / "many"
    folder.mkdir()
    (folder / "b.md").write_text("two\nlines")
    (folder / "a.txt").write_text("one")
    assert [r.text for r in rq.user_requests(folder)] == ["one", "two\nlines"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n[1]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON object"):
        rq.user_requests(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no requests"):
        rq.user_requests(tmp_path / "empty.txt")


def test_request_texts_cover_the_five_shapes_and_are_seeded() -> None:
    got = rq.request_texts(DOCS, [SOURCE], per_task=4, seed=1)
    assert [t for t, _ in got] == [t for t in rq.TASKS for _ in range(4)]
    assert got == rq.request_texts(DOCS, [SOURCE], per_task=4, seed=1)
    assert got != rq.request_texts(DOCS, [SOURCE], per_task=4, seed=2)
    by_task = {t: [x for tt, x in got if tt == t] for t in rq.TASKS}
    assert all(x.endswith("Answer:") for x in by_task["math"])
    assert all(x.startswith("User: ") and x.endswith("\nAssistant:") for x in by_task["chat"])
    assert all(x.endswith("Summary:") for x in by_task["summarisation"])
    assert all("```python\ndef f" in x and '"""' not in x for x in by_task["code_edit"])
    assert all(x.startswith(("def f", "Write a Python function that returns")) for x in by_task["code"])
    with pytest.raises(ValueError, match="math: only 8 distinct requests, 9 wanted"):
        rq.request_texts(DOCS, [SOURCE], per_task=9, seed=0)
    assert len(rq.packaged_prompt_texts()) >= 12


class SpellTwice:
    """Target id t is spelled as two drafter ids (2t, 2t+1); the context starts with BOS 0."""

    def drafter_context(self, target_ids: list[int]) -> list[int]:
        return [0, *[d for t in target_ids for d in self.target_to_draft(t)]]

    def target_to_draft(self, target_id: int) -> list[int]:
        return [2 * target_id, 2 * target_id + 1]


def test_kd_row_is_the_decoders_view_cut_from_the_left() -> None:
    row = rr.kd_row(SpellTwice(), [5, 6], [7], max_len=64)
    assert row.ids == (0, 10, 11, 12, 13, 14, 15) and row.start == 5
    cut = rr.kd_row(SpellTwice(), [5, 6], [7, 8], max_len=6)
    assert cut.ids == (12, 13, 14, 15, 16, 17) and cut.start == 2  # the reply is kept whole
    with pytest.raises(ValueError, match="empty"):
        rr.kd_row(SpellTwice(), [5], [], max_len=8)


def test_a_reply_without_top_k_is_its_own_token_with_probability_one() -> None:
    soft, hard = rr.reply_observations([_reply(0), _reply(0, topk=False)], max_context=8, vocab=10)
    assert soft.topk_ids.shape == hard.topk_ids.shape == (3, 8)
    assert torch.equal(hard.topk_ids[:, 0], torch.tensor([4, 6, 9])) and hard.topk_probs[:, 0].eq(1).all()
    assert hard.topk_probs[:, 1:].eq(0).all() and soft.topk_probs[0, :3].tolist() == pytest.approx([0.7, 0.2, 0.1])
    capped = rr.reply_observations([_reply(0)], max_context=8, vocab=5)[0]  # ids >= 5: probability 0
    assert capped.topk_probs[1].sum() == pytest.approx(0.3)


def _mapper() -> VocabMapper:
    drafter_tok, target_tok = toy_pair()  # 6 drafter ids, 10 target ids (6..9: n-grams)
    return VocabMapper.from_tokenizers(drafter_tok, target_tok)


def _learn(cfg: AdaptConfig, replies: list[rp.Reply]) -> tuple[float, float]:
    torch.manual_seed(0)
    model = build_model(toy_spec(6, max_seq_len=32), seed=3)
    mapper = _mapper()
    rows = rr.held_rows(mapper, replies, 32)
    before = rr.reply_agreement(model, rows)
    obs = rr.reply_observations(replies, max_context=32, vocab=10)
    distiller = make_distiller(model, mapper, dataclasses.replace(cfg, buffer_size=len(obs)))
    report = train_offline(distiller, obs, epochs=40)
    assert report.optimizer_steps == report.planned_updates and not report.stopped_early
    assert sum(report.losses[-3:]) < sum(report.losses[:3])
    return before, rr.reply_agreement(model, rows)


@pytest.mark.parametrize("seqkd", [0.0, 1.0])
def test_the_adapt_learner_trained_on_replies_raises_agreement_with_them(seqkd: float) -> None:
    cfg = AdaptConfig(lr=3e-2, batch_size=2, steps_per_update=1, seq_len=32, guard=False, seqkd=seqkd)
    before, after = _learn(cfg, [_reply(i) for i in range(4)])
    assert after > 0.9 and after > before + 0.3


def test_train_layers_moves_only_the_last_blocks_and_the_final_norm() -> None:
    model = build_model(dataclasses.replace(toy_spec(6, max_seq_len=32), n_layers=3), seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mapper = _mapper()
    cfg = AdaptConfig(lr=1e-2, batch_size=1, seq_len=32, guard=False, train_layers=1)
    distiller = make_distiller(model, mapper, cfg)
    train_offline(distiller, rr.reply_observations([_reply(0)], max_context=32, vocab=10), epochs=3)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(k.startswith(("model.layers.2.", "model.norm.")) for k in moved)
    with pytest.raises(ValueError, match="guard"):
        train_offline(make_distiller(model, mapper, AdaptConfig()), [], epochs=1)


def test_a_passed_deadline_stops_training_before_the_next_update() -> None:
    import time

    model = build_model(toy_spec(6, max_seq_len=32), seed=1)
    cfg = AdaptConfig(lr=1e-2, batch_size=1, steps_per_update=1, seq_len=32, guard=False)
    obs = rr.reply_observations([_reply(0), _reply(1)], max_context=32, vocab=10)
    report = train_offline(make_distiller(model, _mapper(), cfg), obs, epochs=5,
                           deadline=time.monotonic() - 1)  # fmt: skip
    assert report.stopped_early and report.optimizer_steps == 0 and report.planned_updates == 10
