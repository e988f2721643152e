"""Early-exit drafters: layer truncation, the offline distillation pieces, the preset."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omnidraft_deploy.catalog.presets import EarlyExitRecipe, Source, get_preset
from omnidraft_deploy.distill.align import build_example, stack_examples
from omnidraft_deploy.distill.offline import (
    TopK,
    batch_hybrid_loss,
    cut_windows,
    distill,
    examples_from_topk,
    lr_at,
    recipe_of,
)
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.truncate import truncate_layers, truncated_param_count
from omnidraft_deploy.testing import toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper

SPEC = dataclasses.replace(get_preset("tiny-llama-68m"), n_layers=4, vocab_size=300)


def _parent():
    spec = dataclasses.replace(SPEC, tie_embeddings=True)
    return build_model(spec, seed=3, max_seq_len=32)


def test_truncation_keeps_the_first_layers_and_the_head() -> None:
    parent = _parent()
    ids = torch.tensor([[5, 9, 100, 3, 44]])
    child = truncate_layers(parent, 2)
    assert child.args.n_layers == 2 and len(child.model.layers) == 2
    assert child.lm_head.weight is child.model.embed_tokens.weight  # still tied
    # the child's logits are the parent's hidden state after layer 2 read out by norm + lm_head
    h = parent.model.embed_tokens(ids)
    cos, sin = parent.rope_cos[:5], parent.rope_sin[:5]
    mask = torch.ones(5, 5).tril()
    with torch.no_grad():
        for layer in list(parent.model.layers)[:2]:
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, mask, None, None, False)[0]
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        want = parent.lm_head(parent.model.norm(h))
        got = child.forward_train(ids)
    torch.testing.assert_close(got, want)
    assert sum(p.numel() for p in child.parameters()) == truncated_param_count(parent, 2)


def test_truncation_copies_weights_and_checks_the_depth() -> None:
    parent = _parent()
    child = truncate_layers(parent, 4)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(child.forward_train(ids), parent.forward_train(ids))
        child.get_parameter("model.layers.0.mlp.up_proj.weight").add_(1.0)
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(child.get_parameter(name), parent.get_parameter(name))
    for bad in (0, 5):
        with pytest.raises(ValueError, match="n_layers"):
            truncate_layers(parent, bad)


def test_cached_step_equals_training_pass_after_truncation() -> None:
    child = truncate_layers(_parent(), 3, max_seq_len=16)
    ids = torch.tensor([[7, 8, 9, 10]])
    with torch.no_grad():
        full = child.forward_train(ids)
        child.reset_cache()
        a = child(ids[:, :3], torch.arange(3))
        b = child(ids[:, 3:], torch.tensor([3]))
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=1e-5)


def test_the_preset_is_an_early_exit_of_smollm2() -> None:
    spec = get_preset("smollm2-ee8")
    parent = get_preset("smollm2-135m")
    assert spec.source is Source.EARLY_EXIT and spec.n_layers == 8
    assert (spec.dim, spec.vocab_size, spec.tokenizer) == (parent.dim, parent.vocab_size, "smollm2")
    assert recipe_of(spec).parent == "smollm2-135m" and recipe_of(spec).target == "qwen2.5-0.5b"
    assert 50e6 < spec.n_params() < 60e6
    with pytest.raises(ValueError, match="not an early-exit"):
        recipe_of(parent)
    with pytest.raises(ValueError, match="needs its field"):
        dataclasses.replace(spec, early_exit=None)
    with pytest.raises(ValueError, match="bad early-exit recipe"):
        EarlyExitRecipe("a", "b", steps=0)


def test_cut_windows_are_evenly_spaced_and_full_length() -> None:
    streams = {"a": list(range(100)), "b": list(range(10)), "c": list(range(30))}
    w = cut_windows(streams, 3, 20)
    assert [t for t, _ in w] == ["a", "a", "a", "c"]
    assert [x[0] for _, x in w] == [0, 40, 80, 0] and all(len(x) == 20 for _, x in w)


def test_lr_schedule_warms_up_then_decays() -> None:
    lrs = [lr_at(s, 20, 1.0, 4) for s in range(20)]
    assert lrs[0] == 0.25 and lrs[3] == 1.0 and lrs[-1] < lrs[10] < lrs[4] and lrs[-1] >= 0.1


def _toy_topk(target, ids: list[list[int]], k: int = 3) -> TopK:
    x = torch.tensor(ids)
    rows = [torch.softmax(target.forward_train(x[i : i + 1])[0, :-1], -1).topk(k, -1)
            for i in range(len(ids))]  # fmt: skip
    return TopK(x, torch.stack([r.indices for r in rows]).int(),
                torch.stack([r.values for r in rows]), ("a",) * len(ids))  # fmt: skip


def test_offline_rows_equal_the_online_rows_and_training_lowers_the_loss() -> None:
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = build_model(toy_spec(tt.vocab_size), seed=1, init_std=0.5)
    drafter = truncate_layers(build_model(
        dataclasses.replace(toy_spec(dt.vocab_size), n_layers=2), seed=2, init_std=0.5), 1)  # fmt: skip
    texts = ["ab ca bc abc", "cab cab ab", "bbbb abc ca"]
    ids = [tt.encode(t)[:6] for t in texts]
    with torch.no_grad():
        topk = _toy_topk(target, ids)
    examples = examples_from_topk(mapper, topk, seq_len=24)
    same = build_example(mapper, ids[0][:1], ids[0][1:], topk.topk_ids[0].long(),
                         topk.topk_probs[0], seq_len=24)  # fmt: skip
    assert torch.equal(examples[0].dm_weight, same.dm_weight)
    assert torch.equal(examples[0].topk_draft_ids, same.topk_draft_ids)
    batch = stack_examples(examples)
    embed = drafter.model.embed_tokens.weight.detach().clone()
    with torch.no_grad():
        before = float(batch_hybrid_loss(drafter, batch, 1.0))
    recipe = EarlyExitRecipe("p", "t", steps=40, batch_size=3, lr=1e-2, warmup=2)
    losses = distill(drafter, examples, recipe)
    with torch.no_grad():
        after = float(batch_hybrid_loss(drafter, batch, 1.0))
    assert len(losses) == 41 and after < 0.8 * before and losses[0] <= before + 1e-4
    assert torch.equal(drafter.model.embed_tokens.weight, embed)  # embeddings stay frozen


def test_scale_calibration_folds_the_best_scale_into_the_norm() -> None:
    from omnidraft_deploy.distill.offline import SCALES, calibrate_scale

    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = build_model(toy_spec(tt.vocab_size), seed=1, init_std=0.5)
    drafter = build_model(toy_spec(dt.vocab_size), seed=2, init_std=2.0)  # over-confident
    with torch.no_grad():
        examples = examples_from_topk(
            mapper, _toy_topk(target, [tt.encode("ab ca bc")]), seq_len=16
        )
    norm = drafter.model.norm.weight.detach().clone()
    batch = stack_examples(examples)
    with torch.no_grad():
        before = float(batch_hybrid_loss(drafter, batch, 1.0))
    c, loss = calibrate_scale(drafter, examples, 1.0)
    with torch.no_grad():
        after = float(batch_hybrid_loss(drafter, batch, 1.0))
    assert c in SCALES and c < 1.0 and after < before
    assert abs(after - loss) < 1e-4 * max(1.0, loss)
    torch.testing.assert_close(drafter.model.norm.weight, norm * c)
