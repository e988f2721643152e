"""Replay buffer + online distiller: bounded storage, loss goes down, weights publish, decoder hook."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.online import BufferPolicy, OnlineDistiller, ReplayBuffer
from omnidraft_deploy.reference.model import Transformer, build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import FixedDraftLen
from omnidraft_deploy.testing import toy_pair
from omnidraft_deploy.vocab.mapper import VocabMapper


def _model(vocab: int, seed: int, name: str = "tiny-llama-68m") -> Transformer:
    spec = dataclasses.replace(
        get_preset(name), vocab_size=vocab, dim=32, n_layers=1, intermediate_size=64
    )
    return build_model(spec, seed=seed, max_seq_len=64, init_std=0.2)


def _mapper() -> VocabMapper:
    drafter_tok, target_tok = toy_pair()
    return VocabMapper.from_tokenizers(drafter_tok, target_tok)


def _obs(i: int) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    return [1, 2], [i % 10], torch.tensor([[i % 10, 1]]), torch.tensor([[0.7, 0.3]])


def test_buffer_fifo_keeps_latest_and_validates() -> None:
    buf = ReplayBuffer(3, policy=BufferPolicy.FIFO, max_context=1)
    for i in range(5):
        buf.observe(*_obs(i))
    assert len(buf) == 3 and buf.n_seen == 5
    kept = sorted(o.new_ids[0] for o in buf.sample(10))
    assert kept == [2, 3, 4]
    assert all(o.context_ids == (2,) for o in buf.sample(3))
    with pytest.raises(ValueError, match="do not match"):
        buf.observe([1], [1, 2], torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)


def test_buffer_reservoir_is_bounded_and_mixes_old_and_new() -> None:
    buf = ReplayBuffer(50, policy=BufferPolicy.RESERVOIR, seed=1)
    for i in range(1000):
        buf([i], [i % 10], torch.tensor([[i % 10]]), torch.tensor([[1.0]]))
    ctx = [o.context_ids[0] for o in buf.sample(50)]
    assert len(ctx) == 50 and min(ctx) < 500 < max(ctx)  # FIFO would keep only >= 950


def test_distiller_lowers_loss_and_publishes_weights() -> None:
    mapper = _mapper()
    drafter = _model(mapper.draft_vocab_size, seed=0)
    before = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    dist = OnlineDistiller(
        drafter,
        mapper,
        lr=3e-2,
        lam=1.0,
        batch_size=4,
        steps_per_update=5,
        optimizer="adamw",
        seq_len=16,
    )
    # target ids: 1 a, 2 b, 5 ab (DM), 6 bc / 9 abc (n-gram for the drafter)
    for ctx, new in (([1, 2], [6]), ([5], [9, 1]), ([2, 1], [2]), ([9], [5])):
        topk = torch.tensor([[t, 3] for t in new])
        dist.observe(ctx, new, topk, torch.tensor([[0.8, 0.2]] * len(new)))
    first = dist.update()
    assert first.steps == 5 and first.dm_rows > 0 and first.ngram_spans > 0
    assert any(not torch.equal(before[n], p) for n, p in drafter.named_parameters())
    for _ in range(4):
        last = dist.update()
    assert last.loss < 0.5 * first.loss
    with pytest.raises(KeyError, match="unknown optimizer"):
        OnlineDistiller(drafter, mapper, optimizer="lion")
    with pytest.raises(ValueError, match="drafter vocab"):
        OnlineDistiller(_model(7, seed=0), mapper)


def _observe_all(dist: OnlineDistiller, steps: list[tuple[list[int], list[int]]]) -> None:
    for ctx, new in steps:
        topk = torch.tensor([[t, 3] for t in new])
        dist.observe(ctx, new, topk, torch.tensor([[0.8, 0.2]] * len(new)))


# target ids: 1 a, 2 b, 5 ab (DM), 6 bc / 9 abc (n-gram for the drafter)
STEPS = [([1, 2], [6]), ([5], [9, 1]), ([2, 1], [2]), ([9], [5])]


def test_guard_holds_new_traffic_out_then_keeps_an_update_that_generalises() -> None:
    mapper = _mapper()
    drafter = _model(mapper.draft_vocab_size, seed=0)
    dist = OnlineDistiller(drafter, mapper, lr=3e-2, lam=1.0, batch_size=4, steps_per_update=5,
                           seq_len=16, guard=True)  # fmt: skip
    _observe_all(dist, STEPS)
    assert len(dist.buffer) == 0  # held out until the next update
    first = dist.update()  # nothing older to train on: the held-out traffic joins the buffer
    assert first.steps == 0 and len(dist.buffer) == len(STEPS)
    _observe_all(dist, STEPS)  # the same patterns again: training on the old ones generalises
    second = dist.update()
    assert second.steps == 5 and second.kept and second.heldout_after < second.heldout_before
    assert len(dist.buffer) == 2 * len(STEPS)


def test_guard_rolls_back_an_update_that_hurts_the_held_out_traffic() -> None:
    mapper = _mapper()
    drafter = _model(mapper.draft_vocab_size, seed=0)
    dist = OnlineDistiller(drafter, mapper, lr=0.5, lam=1.0, batch_size=4, steps_per_update=5,
                           seq_len=16, guard=True)  # fmt: skip
    _observe_all(dist, STEPS[:2])
    dist.update()
    weights = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    # new traffic contradicts the old: after "1 2" the target now says 2, not 6
    _observe_all(dist, [([1, 2], [2]), ([5], [1, 1])])
    stats = dist.update()
    assert stats.steps == 5 and not stats.kept and stats.heldout_after >= stats.heldout_before
    assert all(torch.equal(weights[n], p) for n, p in drafter.named_parameters())


def test_empty_buffer_update_is_a_no_op() -> None:
    mapper = _mapper()
    drafter = _model(mapper.draft_vocab_size, seed=0)
    stats = OnlineDistiller(drafter, mapper).update()
    assert stats.steps == 0


def test_decoder_feeds_buffer_and_background_update_runs() -> None:
    mapper = _mapper()
    target = EagerLM(_model(mapper.target_vocab_size, seed=1))
    drafter_model = _model(mapper.draft_vocab_size, seed=2)
    dist = OnlineDistiller(drafter_model, mapper, lr=1e-2, batch_size=2, seq_len=32)
    decoder = SpeculativeDecoder(
        target,
        EagerLM(drafter_model),
        mapper,
        FixedDraftLen(3),
        config=DecodeConfig(max_new_tokens=12, observer_topk=4),
    )
    out, stats = decoder.generate([1, 2, 3], observer=dist)
    assert len(dist.buffer) == stats.target_calls  # one per step (the first step is the prefill)
    obs = dist.buffer.sample(1)[0]
    assert obs.topk_ids.shape == (len(obs.new_ids), 4)
    worker = threading.Thread(target=dist.update)
    worker.start()
    with dist.weights_lock:  # the decoder side: read-only forward under the lock
        decoder.generate([1, 2, 3])
    worker.join()


def test_expand_vocab_keeps_used_logits_and_argmax() -> None:
    from omnidraft_deploy.catalog.presets import Family, Role
    from omnidraft_deploy.distill.pretrain import PretrainConfig, expand_vocab

    cfg = PretrainConfig(
        "t", Role.TARGET, Family.LLAMA, "llama2", 40, dim=32, n_layers=1, intermediate_size=64
    )
    compact = build_model(cfg.spec(6), seed=0, max_seq_len=16, init_std=0.3)
    used = torch.tensor([3, 7, 11, 20, 21, 39])
    full = expand_vocab(compact, used, cfg, counts=torch.tensor([9, 1, 5, 5, 2, 8]))
    ids = torch.tensor([[0, 1, 2, 5]])
    with torch.no_grad():
        small, big = compact.forward_train(ids)[0], full.forward_train(used[ids])[0]
    torch.testing.assert_close(big[:, used], small)
    assert torch.equal(big.argmax(-1), used[small.argmax(-1)])
    unused = torch.ones(40, dtype=torch.bool)
    unused[used] = False
    torch.testing.assert_close(big[:, unused][:, 0], small[:, 1])  # rarest used row (count 1)


def test_math_generator_is_deterministic_and_correct() -> None:
    from omnidraft_deploy.distill.data import is_heldout, math_problems

    a, b = math_problems(20, seed=3), math_problems(20, seed=3)
    assert a == b and a != math_problems(20, seed=4)
    for text in a:
        assert text.startswith("Question: ") and "\n#### " in text
    assert is_heldout(a[0], 0.999999) and not is_heldout(a[0], 1e-9)
