"""Pretraining with sequence-level KD (``distill.pretrain``, ``distill.seqkd``): batched greedy
decoding equals one-sequence greedy, the cache key follows the KD settings and the teacher, and a
tiny distilled drafter trains end to end from a tiny teacher (real tokenizers, seconds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from omnidraft_deploy.catalog.presets import (
    PRESETS,
    Family,
    ModelSpec,
    PretrainSchedule,
    Role,
    SeqKD,
    Source,
    get_preset,
)
from omnidraft_deploy.distill import pretrain
from omnidraft_deploy.distill.seqkd import (
    MARKERS,
    corpus_prompts,
    greedy_batch,
    kd_stream,
    teacher_texts,
)
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.testing import toy_spec
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

DOCS = {
    "math": [f"Question: Mia has {i} apples and buys 3 more. How many?\nAnswer: {i + 3}\n" for i in range(8)],
    "instruction": ["User: What does `os.path.join` do in Python?\nAssistant: Join paths.\n"],
    "code": ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"],
    "summarisation": ["Summarize.\nText: Cats sleep a lot. They also eat.\nSummary: Cats sleep.\n"],
}  # fmt: skip


def _greedy_one(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(model.forward_train(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(ids) :]


def test_greedy_batch_equals_one_sequence_greedy() -> None:
    model = build_model(toy_spec(64, max_seq_len=32), seed=3)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (t,), generator=gen) for t in (1, 5, 9, 3)]
    out = greedy_batch(model, prompts, 7)
    assert out.shape == (4, 7)
    for p, row in zip(prompts, out.tolist(), strict=True):
        assert row == _greedy_one(model, p.tolist(), 7)


def test_teacher_texts_cut_at_eos_and_kd_stream_marks_it() -> None:
    tok = load_tokenizer("llama3")
    prompt = [tok.encode("Question: Mia has")]
    used = torch.tensor(sorted({*prompt[0], *range(100, 160)}))  # compact id i = full used[i]
    model = build_model(toy_spec(len(used), max_seq_len=48), seed=1)
    compact_prompt = [int((used == t).nonzero()) for t in prompt[0]]
    first = greedy_batch(model, [torch.tensor(compact_prompt)], 6)
    eos_at = int(first[0, 2])  # make the third generated id the EOS: the text stops before it
    assert eos_at not in compact_prompt and eos_at not in first[0, :2].tolist()
    used[eos_at] = tok.eos_ids[0]
    (text, ended), = teacher_texts(model, used, tok, prompt, 6)  # fmt: skip
    assert ended and text.startswith("Question: Mia has")
    assert text == tok.decode(prompt[0] + [int(used[t]) for t in first[0, :2]])
    stream = kd_stream([(text, True), ("x", False)], tok)
    assert stream == [tok.bos_id, *tok.encode(text), tok.eos_ids[0], tok.bos_id, *tok.encode("x")]


def test_corpus_prompts_are_seeded_and_cut_at_markers() -> None:
    tok = load_tokenizer("llama3")
    prompts = corpus_prompts(DOCS, tok, 30, seed=0)
    assert prompts == corpus_prompts(DOCS, tok, 30, seed=0) != corpus_prompts(DOCS, tok, 30, seed=1)
    texts = [tok.decode(p) for p in prompts]
    assert len(prompts) == 30 and all(len(p) >= 2 for p in prompts)
    assert any(t.endswith(MARKERS["math"]) for t in texts)
    assert any(t.endswith(MARKERS["instruction"]) for t in texts)


def _spec(name: str, role: Role, tokenizer: str, vocab: int, kd: SeqKD | None = None) -> ModelSpec:
    return ModelSpec(name, role, Family.LLAMA, tokenizer, vocab, 32, 1, 2, 2, 64,
                     tie_embeddings=True, max_seq_len=128, source=Source.PRETRAIN,
                     pretrain=PretrainSchedule(steps=3, warmup=1, seq_len=16, kd=kd))  # fmt: skip


def test_cache_key_follows_kd_and_the_teacher(monkeypatch: pytest.MonkeyPatch) -> None:
    key = pretrain._cache_file
    plain = pretrain.pretrain_config(get_preset("trained-llama2-drafter"))
    kd = pretrain.pretrain_config(get_preset("trained-llama2-demo"))
    assert dataclasses.replace(kd, name=plain.name, kd=None) == plain
    assert key(plain, DOCS, Path("c")) != key(
        dataclasses.replace(kd, name=plain.name), DOCS, Path("c")
    )
    assert repr(plain) == repr(dataclasses.replace(plain, kd=None))  # plain keys did not move
    before = key(kd, DOCS, Path("c"))
    teacher = get_preset("trained-llama3-demo")
    assert teacher.pretrain is not None
    retrained = dataclasses.replace(teacher.pretrain, steps=teacher.pretrain.steps + 1)
    monkeypatch.setitem(PRESETS, teacher.name, dataclasses.replace(teacher, pretrain=retrained))
    assert key(kd, DOCS, Path("c")) != before


def test_tiny_distilled_drafter_trains_and_caches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(PRESETS, "t-teacher", _spec("t-teacher", Role.TARGET, "llama3", 128256))
    kd = SeqKD("t-teacher", prompts=6, new_tokens=5, frac=0.5)
    cfg = pretrain.pretrain_config(_spec("t-drafter", Role.DRAFTER, "llama2", 32000, kd))
    model, used, _ = pretrain.compact_model(cfg, DOCS, tmp_path)
    files = sorted(p.name for p in (tmp_path / "pretrained").glob("*.safetensors"))
    assert [f.split("-")[1] for f in files] == ["drafter", "teacher"]  # the teacher came first
    meta = (tmp_path / "pretrained" / files[0]).with_suffix(".json").read_text()
    assert '"kd_texts": 6' in meta and "kd_generate_s" in meta
    again, used2, _ = pretrain.compact_model(cfg, DOCS, tmp_path, train_if_missing=False)
    assert torch.equal(used, used2)
    ids = torch.tensor([[0, 1, 2]])
    assert torch.allclose(model.forward_train(ids), again.forward_train(ids))
