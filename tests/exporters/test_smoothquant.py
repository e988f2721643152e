"""SmoothQuant folding (``exporters.quant.smoothquant``): the fp32 function is unchanged, per-row int8
activations lose less, and the scales follow the formula."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omnidraft_deploy.exporters.quant.smoothquant import (
    activation_absmax,
    smoothed,
    smoothing_scales,
)

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384, tie_embeddings=True)
PROMPTS = [[5, 9, 100, 3, 44, 17, 250, 31], [7, 8, 300, 12]]


def _outlier_model() -> torch.nn.Module:
    """A tiny model whose norms feed a few channels 30x larger than the rest (real LLMs do)."""
    model = build_model(SPEC, seed=3, max_seq_len=64)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[:3] *= 30.0
            layer.post_attention_layernorm.weight[:3] *= 30.0
        model.model.norm.weight[:3] *= 30.0
    return model


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]), torch.arange(len(ids)))[0]


def test_smoothing_keeps_the_fp32_function_and_the_embedding_table() -> None:
    model = _outlier_model()
    table = model.model.embed_tokens.weight.detach().clone()
    sm = smoothed(model, activation_absmax(model, PROMPTS))
    for ids in PROMPTS:
        torch.testing.assert_close(_logits(sm, ids), _logits(model, ids), rtol=1e-4, atol=1e-4)
    assert torch.equal(sm.model.embed_tokens.weight, table)  # the tied head was untied first
    assert sm.lm_head.weight is not sm.model.embed_tokens.weight
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the original is untouched


def _row_quant_error(x: torch.Tensor) -> float:
    s = x.abs().amax(-1, keepdim=True) / 127
    return float((torch.round(x / s) * s - x).norm() / x.norm())


def test_smoothing_shrinks_per_row_quantisation_error_of_outlier_inputs() -> None:
    model = _outlier_model()
    sm = smoothed(model, activation_absmax(model, PROMPTS))
    seen: dict[str, torch.Tensor] = {}
    for name, m in (("before", model), ("after", sm)):
        h = m.model.layers[0].mlp.gate_proj.register_forward_hook(
            lambda _m, i, _o, name=name: seen.__setitem__(name, i[0].detach()))  # fmt: skip
        _logits(m, PROMPTS[0])
        h.remove()
    assert _row_quant_error(seen["after"]) < 0.75 * _row_quant_error(
        seen["before"]
    )  # 0.011 vs 0.016


def test_scales_follow_the_formula_and_idle_channels_keep_one() -> None:
    x = torch.tensor([4.0, 1.0, 0.0])
    w = torch.tensor([[1.0, 4.0, 2.0], [0.5, -1.0, 1.0]])
    s = smoothing_scales(x, [w], alpha=0.5)
    torch.testing.assert_close(s, torch.tensor([2.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="alpha"):
        smoothing_scales(x, [w], alpha=1.5)
    with pytest.raises(ValueError, match="at least one prompt"):
        activation_absmax(_outlier_model(), [])
