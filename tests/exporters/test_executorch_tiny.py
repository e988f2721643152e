"""XNNPACK .pte recipe on a small model: reloaded program vs eager, constant methods, coverage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omnidraft_deploy.exporters.verify import ExportVerificationError, verify_artifact

from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer, build_model

pytest.importorskip("executorch")

SPEC = dataclasses.replace(get_preset("tiny-llama3-8b"), vocab_size=320)  # GQA
PROMPTS = [[5, 9, 100, 3, 44, 17], [7, 8]]


def _export(tmp: Path, quant: str, fast: bool = True) -> tuple[Transformer, Path, dict]:
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    model = build_model(SPEC, seed=2, max_seq_len=32)
    path = tmp / f"{quant}-{fast}.pte"
    cov = export_pte(model, path, recipe=get_recipe("xnnpack", quant), eos_ids=(2, 7),
                     bundle_hash="abc", fast=fast)  # fmt: skip
    return model, path, cov


@pytest.fixture(scope="module")
def fp32(tmp_path_factory: pytest.TempPathFactory) -> tuple[Transformer, Path, dict]:
    return _export(tmp_path_factory.mktemp("pte"), "fp32")


def test_reloaded_pte_matches_eager_incl_rollback(fp32) -> None:
    from omnidraft_deploy.exporters.exportable import graph_info

    model, path, _ = fp32
    info = graph_info(model, SPEC, file=path.name, quantization="fp32", seq_len=None)
    result = verify_artifact(path, info, model, get_recipe("xnnpack", "fp32"), PROMPTS)
    assert result["max_abs_logit_diff"] < 1e-4 and result["top1_agreement"] == 1.0
    assert result["rollback_max_abs_diff"] < 1e-4
    other = build_model(SPEC, seed=3, max_seq_len=32)
    with pytest.raises(ExportVerificationError, match="fp32"):
        verify_artifact(path, info, other, get_recipe("xnnpack", "fp32"), PROMPTS)


def test_fast_lowering_writes_the_same_program(fp32, tmp_path: Path) -> None:
    _, fast, cov = fp32
    _, slow, cov_slow = _export(tmp_path, "fp32", fast=False)
    assert cov["fast_lowering"] and not cov_slow["fast_lowering"]
    assert cov["delegated_subgraphs"] == cov_slow["delegated_subgraphs"]
    assert fast.read_bytes() == slow.read_bytes()


def test_constant_methods_carry_the_metadata(fp32) -> None:
    from omnidraft_deploy.exporters.verify import pte_constants
    from omnidraft_deploy.exporters.xnnpack.lower import CONSTANT_METHODS

    _, path, _ = fp32
    consts = pte_constants(path)
    assert set(CONSTANT_METHODS) <= set(consts)
    assert consts["get_max_seq_len"] == [32] and consts["get_vocab_size"] == [320]
    assert consts["get_n_layers"] == [2] and consts["get_eos_ids"] == [2, 7]
    assert consts["get_format_version"] == [1] and consts["get_bundle_hash"] == ["abc"]


def test_linears_are_delegated_to_xnnpack(fp32) -> None:
    _, _, cov = fp32
    assert cov["delegated_nodes"] > 0 and cov["delegated_subgraphs"] > 0
    assert not any("linear" in op or "mm" in op for op in cov["non_delegated_ops"])


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["8da4w", "8da4w-emb8", "int8w", "8da8w"])
def test_quantized_pte_within_recipe_tolerance(quant: str, tmp_path: Path, fp32) -> None:

    from omnidraft_deploy.exporters import get_exporter

    model = build_model(SPEC, seed=2, max_seq_len=32)
    recipe = get_recipe("xnnpack", quant)  # through the registered recipe: 8da8w is smoothed there
    info, _ = get_exporter("xnnpack")(model, SPEC, tmp_path, role="target", recipe=recipe,
                                      draft_len=4, eos_ids=(2, 7))  # fmt: skip
    path = tmp_path / info.file
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    assert 0 < result["max_abs_logit_diff"] < get_recipe("xnnpack", quant).tolerance
    assert path.stat().st_size < fp32[1].stat().st_size


def test_legalize_in_place_sorts_the_same_graph_without_recompiling(monkeypatch) -> None:
    import torch
    from omnidraft_deploy.exporters.xnnpack.lower import _legalize_in_place

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ((x + 1) * 2).relu()

    gm = torch.fx.symbolic_trace(Chain())
    graph = gm.graph
    add, mul = [n for n in graph.nodes if n.op == "call_function"][:2]
    add.prepend(mul)  # mul before its input: not a valid order
    with pytest.raises(RuntimeError, match="before it has been defined"):
        graph.lint()
    monkeypatch.setattr(type(gm), "recompile", lambda self: pytest.fail("recompiled"))
    assert _legalize_in_place(gm) is gm and gm.graph is graph  # moved, not replaced
    graph.lint()  # topological again
    names = [n.name for n in graph.nodes]
    assert names.index("add") < names.index("mul")
