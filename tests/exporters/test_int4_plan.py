"""The int4 recipe's mixed-precision plan (``exporters.quant.int4_plan``): weights already on an int4
grid stay int4, the eager simulation computes what the ONNX graph computes, and the plan's bits
are the graph's."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import torch
from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.quant import int4_plan
from omnidraft_deploy.exporters.quant.grids import int4_rtn

from omnidraft_deploy.catalog.backends import Backend, get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)
PROMPTS = [[(7 * i + 3 * j) % 384 for j in range(20)] for i in range(4)]


def _model(seed: int = 5):  # type: ignore[no-untyped-def]
    return build_model(SPEC, seed=seed, max_seq_len=32).eval()


def test_weights_on_their_int4_grid_have_no_error_and_all_go_to_int4() -> None:
    model = _model()
    with torch.no_grad():  # as a Q4_1 GGUF publishes them
        for _, linears in int4_plan.fused_linears(model):
            for m in linears:
                m.weight.copy_(int4_rtn(m.weight, 32))
    errors = int4_plan.relative_errors(model, PROMPTS, 32)
    assert len(errors) == 4 * SPEC.n_layers and max(errors.values()) <= int4_plan.EXACT
    # 8 bits could only round them off their grid: int4 even where no budget is met
    plan = int4_plan.plan(model, PROMPTS, max_diff=1e-9, backend=Backend.XNNPACK)
    assert set(plan.values()) == {4}


def test_the_search_finds_the_longest_acceptable_prefix_in_log_steps() -> None:
    ranked = [f"m{i}" for i in range(40)]
    for limit in (0, 1, 17, 39, 40):
        asked: list[int] = []

        def accept(chosen: set[str], _limit: int = limit, _asked: list[int] = asked) -> bool:
            _asked.append(len(chosen))
            return len(chosen) <= _limit

        assert int4_plan.longest_prefix(ranked, accept) == limit
        assert len(asked) <= 7 and 0 not in asked  # the empty prefix is never evaluated


def test_plan_names_every_fused_matmul_with_4_or_8_bits() -> None:
    model = _model()
    plan = int4_plan.plan(model, PROMPTS)
    assert list(plan) and set(plan) == {n for n, _ in int4_plan.fused_linears(model)}
    assert set(plan.values()) <= {4, 8}
    # a logit-difference budget no quantised graph meets keeps every matmul at 8 bits
    assert set(int4_plan.plan(model, PROMPTS, max_diff=1e-9).values()) == {8}


def test_relative_errors_rank_a_coarse_matmul_last() -> None:
    model = _model()
    with torch.no_grad():  # one matmul with a wide weight range: int4 rounding costs it most
        model.model.layers[1].mlp.down_proj.weight[:, 0] *= 50.0
    errors = int4_plan.relative_errors(model, PROMPTS, 32)
    assert max(errors, key=errors.__getitem__) == "layers.1.down_proj"


def test_simulation_computes_what_the_onnx_graph_computes(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.onnx.fused import build_graph, save_model

    from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph, contiguous_positions
    from omnidraft_deploy.host.onnx_host import cpu_session

    model = _model()
    plan = {name: 4 if i % 3 else 8 for i, (name, _) in enumerate(int4_plan.fused_linears(model))}
    path = tmp_path / "target.onnx"
    with torch.no_grad():
        save_model(build_graph(model, get_recipe("onnx", "int4"), plan=plan), path)
    info = graph_info(model, SPEC, file=path.name, quantization="int4", seq_len=None)
    graph = ExplicitCacheGraph(cpu_session(path), info)
    ids = np.array([PROMPTS[0]], np.int64)
    onnx_logits = torch.from_numpy(graph.run(ids, contiguous_positions(0, ids.shape[1])))  # (T, V)
    sim = int4_plan.Simulator(model, 32)
    sim.score({n for n, b in plan.items() if b == 4}, PROMPTS[:1], [torch.zeros(20, 384)])
    with torch.no_grad():
        sim_logits = sim.work.forward_train(torch.from_numpy(ids))[0]
        eager = model.forward_train(torch.from_numpy(ids))[0]
    quant_error = float((onnx_logits - eager).abs().max())
    assert quant_error > 1e-3  # the graph is quantised ...
    assert float((onnx_logits - sim_logits).abs().max()) < 0.1 * quant_error  # ... as simulated


def test_xnnpack_numerics_compute_what_the_eager_8da_linears_compute() -> None:
    """The plan's XNNPACK simulation (per-token int8 activations; int4 groups, or int8 per
    channel) against the eager modules the .pte is exported from (torchao's 8da8w,
    ``Int4GroupLinear``)."""
    from omnidraft_deploy.exporters.xnnpack.eager_quant import Int4GroupLinear, torchao_8da

    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 48)
    x = torch.randn(5, 128) * torch.linspace(0.1, 3.0, 128)  # uneven channels, as real ones
    rounding, int8 = int4_plan.NUMERICS[Backend.XNNPACK]
    sim = int4_plan.SimLinear(linear, 32, rounding)
    with torch.no_grad():
        exact = linear(x)
        sim.set(*int4_plan.int4_parts(linear.weight.detach(), 32))
        int4_sim, int4_eager = sim(x), Int4GroupLinear.from_float(linear, 32)(x)
        sim.set(int8(linear.weight.detach(), 32), None)
        int8_sim, int8_eager = sim(x), torchao_8da(copy.deepcopy(linear), bits=8)(x)
    for simulated, eager in ((int4_sim, int4_eager), (int8_sim, int8_eager)):
        error = float((eager - exact).abs().max())
        assert error > 1e-3  # quantised ...
        # ... as simulated (int4: to float rounding; int8: 8 % of the error, ties rounded apart)
        assert float((simulated - eager).abs().max()) < 0.15 * error


def test_module_bits_give_every_part_of_a_fused_matmul_its_bits() -> None:
    from omnidraft_deploy.exporters.xnnpack.eager_quant import (
        Int4GroupLinear,
        linear_scheme,
        quantize_eager,
    )

    model = _model()
    plan = {
        name: 8 if name.endswith("qkv_proj") else 4 for name, _ in int4_plan.fused_linears(model)
    }
    bits = int4_plan.module_bits(model, plan)
    assert len(bits) == 7 * SPEC.n_layers  # q, k, v, o, gate, up, down per layer
    assert bits["model.layers.0.self_attn.k_proj"] == 8
    assert bits["model.layers.0.mlp.down_proj"] == 4
    recipe = get_recipe("xnnpack", "8da4w")
    assert linear_scheme(recipe, "model.layers.0.self_attn.k_proj", bits) == "8da8w"
    assert linear_scheme(recipe, "model.layers.0.mlp.down_proj", bits) == "8da4w"
    assert linear_scheme(recipe, "lm_head", bits) == "8da8w"  # the recipe's head
    quantized = quantize_eager(model, recipe, bits)
    layer = quantized.model.layers[0]
    assert isinstance(layer.mlp.down_proj, Int4GroupLinear)
    assert not isinstance(layer.self_attn.k_proj, Int4GroupLinear)
