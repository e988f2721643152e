"""Quantisation recipes: lookup errors, validation, eager transforms (numerics, no mutation)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from omnidraft_deploy.exporters import EXPORTERS, get_exporter, register
from omnidraft_deploy.exporters.onnx.file_quant import quantize_onnx_file
from omnidraft_deploy.exporters.xnnpack.eager_quant import (
    Int4GroupLinear,
    Int8WeightOnlyLinear,
    linear_scheme,
    quantize_eager,
)
from torch import nn

from omnidraft_deploy.catalog.backends import (
    RECIPES,
    Backend,
    QuantRecipe,
    get_recipe,
    recipe_names,
)
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model


def test_every_backend_has_fp32_and_a_quantized_recipe() -> None:
    assert {"fp32", "8da4w", "8da4w-emb8", "int8w", "8da8w"} <= set(recipe_names("xnnpack"))
    assert {"fp32", "int8", "int4"} <= set(recipe_names("onnx"))
    for (backend, name), r in RECIPES.items():
        assert r.backend is backend and r.name == name
        assert (r.tolerance <= 1e-3) == (name == "fp32")  # quantised recipes get looser bounds


def test_recipes_with_int8_per_token_activations_are_smoothed() -> None:
    # the exporters read ``recipe.smooth``, not the name: the registry is the one place for it
    smoothed = {(r.backend.value, r.name) for r in RECIPES.values() if r.smooth}
    assert smoothed == {("xnnpack", "8da8w"), ("onnx", "w8a8")}


def test_unknown_quantization_lists_valid_names() -> None:
    with pytest.raises(KeyError, match=r"unknown quantization 'int3'.*'8da4w'"):
        get_recipe("xnnpack", "int3")
    with pytest.raises(KeyError, match=r"unknown quantization '8da4w'.*'int4'"):
        get_recipe("onnx", "8da4w")  # exists, but for another backend


def test_unknown_backend_lists_backends() -> None:
    with pytest.raises(KeyError, match=r"unknown backend 'tflite'.*'onnx'"):
        get_recipe("tflite", "fp32")


def test_recipe_validation() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        QuantRecipe("x", Backend.ONNX, 0.0, 0.5)
    with pytest.raises(ValueError, match="linear scheme"):
        QuantRecipe("x", Backend.XNNPACK, 1.0, 0.5, linear="int3")
    with pytest.raises(ValueError, match="embedding_bits"):
        QuantRecipe("x", Backend.XNNPACK, 1.0, 0.5, embedding_bits=4)


def test_wrong_backend_recipe_is_rejected(tmp_path) -> None:
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="not an eager"):
        quantize_eager(model, get_recipe("onnx", "int8"))
    with pytest.raises(ValueError, match="not an ONNX file recipe"):
        quantize_onnx_file(tmp_path / "a.onnx", tmp_path / "b.onnx", get_recipe("onnx", "fp32"))


def _small_model() -> nn.Module:
    spec = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=256)  # qkv biases
    return build_model(spec, seed=3, max_seq_len=16)


def test_fp32_is_identity_and_int8w_copies() -> None:
    model = _small_model()
    assert quantize_eager(model, get_recipe("xnnpack", "fp32")) is model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize_eager(model, get_recipe("xnnpack", "int8w"))
    assert q is not model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert isinstance(q.model.layers[0].self_attn.q_proj, Int8WeightOnlyLinear)
    assert q.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2 bias kept
    ids = torch.tensor([[1, 5, 9, 200]])
    ref, out = model.forward_train(ids), q.forward_train(ids)
    assert 0 < float((out - ref).abs().max()) < 0.05


def test_int8_weight_only_linear_matches_float() -> None:
    lin = nn.Linear(64, 32)
    q = Int8WeightOnlyLinear.from_float(lin)
    x = torch.randn(3, 64)
    err = (q(x) - lin(x)).abs().max()
    assert q.weight.dtype == torch.int8 and float(err) < 0.02


def test_recipes_name_the_lm_head_and_fp32_linears_per_module() -> None:
    four, eight = get_recipe("xnnpack", "8da4w"), get_recipe("xnnpack", "8da8w")
    assert linear_scheme(four, "model.layers.3.mlp.down_proj") == "8da4w"
    assert linear_scheme(four, "lm_head") == "8da8w"  # the head keeps 8 bits
    assert linear_scheme(eight, "model.layers.3.mlp.down_proj") == "none"  # SwiGLU outliers
    assert linear_scheme(eight, "model.layers.3.self_attn.v_proj") == "none"
    assert linear_scheme(eight, "model.layers.3.mlp.up_proj") == "8da8w"
    assert linear_scheme(eight, "lm_head") == "8da8w"
    with pytest.raises(ValueError, match="unknown linear scheme 'int3'"):
        QuantRecipe("x", Backend.XNNPACK, 1.0, 0.5, linear="8da8w", head="int3")


def test_int4_groups_keep_an_asymmetric_grid_exactly() -> None:
    pytest.importorskip("torchao")
    from omnidraft_deploy.exporters.quant.grids import int4_rtn
    from omnidraft_deploy.exporters.xnnpack.eager_quant import torchao_8da

    torch.manual_seed(0)
    lin = nn.Linear(64, 16).requires_grad_(False)
    with torch.no_grad():  # skewed groups on a Q4_1-style grid (what a GGUF model loads as)
        lin.weight.copy_(int4_rtn(lin.weight.abs() + 0.05 * torch.randn(16, 64), 32))
    q = Int4GroupLinear.from_float(lin, 32)
    held = q.centred.weight.dequantize() + q.constant.repeat_interleave(32, 1)
    assert float((held - lin.weight).abs().max()) < 1e-6  # every weight back on its own grid
    sym = torchao_8da(copy.deepcopy(lin), bits=4)  # torchao's own rounding: amax / 7.5 per group
    assert float((sym.weight.dequantize() - lin.weight).abs().max()) > 1e-3  # symmetric cannot
    x = torch.randn(5, 64)
    err = float((q(x) - lin(x)).abs().max())  # only the int8 activation rounding is left
    assert 0 < err < 0.02 * float(lin(x).abs().max())


def test_8da4w_and_int8_embedding_quantize_eagerly() -> None:
    pytest.importorskip("torchao")
    pytest.importorskip("executorch")
    model = _small_model()
    q = quantize_eager(model, get_recipe("xnnpack", "8da4w-emb8"))
    assert q.model.embed_tokens.weight.dtype == torch.int8
    ids = torch.tensor([[1, 5, 9, 200]])
    assert float((q.forward_train(ids) - model.forward_train(ids)).abs().max()) < 0.5


def test_registry_error_path_and_no_silent_override() -> None:
    assert {"xnnpack", "onnx", "qnn"} <= set(EXPORTERS)
    with pytest.raises(KeyError, match=r"unknown exporter 'tflite'; choose from \[.*'onnx'"):
        get_exporter("tflite")
    with pytest.raises(ValueError, match="registered twice"):
        register("onnx")(lambda *a, **k: None)
