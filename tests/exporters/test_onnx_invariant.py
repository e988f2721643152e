"""Batch-invariant fused graphs (``exporters.onnx.invariant``): eager parity, and a row's logits
bitwise the same whether a call feeds it alone or among T tokens (what makes greedy speculative
output equal target-only output on an int8 target)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.verify import verify_artifact

from omnidraft_deploy.bundle.graph_contract import CacheIO, ExplicitCacheGraph, contiguous_positions
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model

ort = pytest.importorskip("onnxruntime")

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)  # GQA + qkv bias
MAX_SEQ = 128  # two attention-span blocks of 64
PROMPTS = [[5, 9, 100, 3, 44, 17], [7, 8]]


def _export(tmp: Path, quant: str, invariant: bool) -> tuple[Path, GraphInfo]:
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    model = build_model(SPEC, seed=5, max_seq_len=MAX_SEQ)
    path = tmp / "target.onnx"
    info = graph_info(model, SPEC, file=path.name, quantization=quant, seq_len=None)
    recipe = get_recipe("onnx", quant)
    export_onnx(model, path, info=info, recipe=recipe, fused=True, invariant=invariant)
    return path, info


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, GraphInfo]]:
    return {
        q: _export(tmp_path_factory.mktemp(f"inv_{q}"), q, True)
        for q in ("fp32", "int8", "int4", "w8a8")
    }


def _graph(path: Path, info: GraphInfo) -> ExplicitCacheGraph:
    from omnidraft_deploy.host.profile import ort_session

    return ExplicitCacheGraph(ort_session(path, threads=2), info)


@pytest.mark.parametrize("quant", ["fp32", "int8", "int4", "w8a8"])
def test_invariant_graph_matches_eager_incl_rollback(graphs, quant: str) -> None:
    path, info = graphs[quant]
    model = build_model(SPEC, seed=5, max_seq_len=MAX_SEQ)
    recipe = get_recipe("onnx", quant)
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    bound = 1e-4 if quant == "fp32" else recipe.tolerance
    assert result["max_abs_logit_diff"] < bound and result["rollback_max_abs_diff"] < bound


def test_invariant_graph_outputs_chunk_caches_and_no_gqa(graphs) -> None:
    import onnx

    from omnidraft_deploy.bundle.graph_contract import cache_io_of

    path, _ = graphs["int8"]
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "GroupQueryAttention" not in ops and ops.count("RotaryEmbedding") == 2 * 2
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert cache_io_of([o.name for o in sess.get_outputs()]) is CacheIO.CHUNK


def _rows_one_by_one(
    graph: ExplicitCacheGraph, ids: list[int], n: int
) -> tuple[list[int], np.ndarray]:
    """Greedy target-only decode: the prompt in one call, then 1-token calls; every chosen row."""
    graph.reset()
    rows, out, feed, pos = [], [], list(ids), 0
    for _ in range(n):
        row = graph.run(np.array([feed]), contiguous_positions(pos, len(feed)))[-1].copy()
        pos += len(feed)
        rows.append(row)
        out.append(int(row.argmax()))
        feed = [out[-1]]
    return out, np.stack(rows)


def _rows_in_calls_of(
    graph: ExplicitCacheGraph, full: list[int], base: int, n: int, width: int
) -> np.ndarray:
    """The same rows re-scored in ``width``-token calls (a verification call's shape)."""
    graph.reset()
    graph.run(np.array([full[:base]]), contiguous_positions(0, base))
    rows = []
    for i in range(0, n, width):
        feed = full[base + i : base + min(i + width, n)]
        rows.append(graph.run(np.array([feed]), contiguous_positions(base + i, len(feed))))
    return np.concatenate(rows)


@pytest.mark.parametrize("quant", ["int8", "int4", "w8a8"])
def test_rows_are_bitwise_equal_whatever_the_call_width(graphs, quant: str) -> None:
    """60 tokens from position 10 to 70 cross the 64-slot span boundary inside calls of 3, 5, 9."""
    graph = _graph(*graphs[quant])
    prompt = [5, 9, 100, 3, 44, 17, 250, 31, 8, 12, 77]
    n = 60
    out, one_by_one = _rows_one_by_one(graph, prompt, n)
    full, base = prompt + out, len(prompt) - 1
    for width in (2, 3, 5, 9):
        wide = _rows_in_calls_of(graph, full, base, n, width)
        assert np.array_equal(wide, one_by_one), (quant, width, np.abs(wide - one_by_one).max())


def test_target_exports_invariant_by_default_drafter_and_fp32_do_not(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters import get_exporter

    model = build_model(SPEC, seed=5, max_seq_len=MAX_SEQ)
    export = get_exporter("onnx")
    cases = {("target", "int8"): True, ("drafter", "int8"): False, ("target", "fp32"): False}
    for (role, quant), want in cases.items():
        out = tmp_path / f"{role}-{quant}"
        out.mkdir()
        _, extras = export(model, SPEC, out, role=role, recipe=get_recipe("onnx", quant),
                           draft_len=4, eos_ids=())  # fmt: skip
        assert extras["batch_invariant"] is want, (role, quant)


def test_invariant_needs_whole_span_blocks(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.onnx.graph import can_be_invariant, export_onnx

    model = build_model(SPEC, seed=5, max_seq_len=96)
    int8, fp32 = get_recipe("onnx", "int8"), get_recipe("onnx", "fp32")  # read by their fields
    assert not can_be_invariant(model.args, int8) and not can_be_invariant(model.args, fp32)
    whole = build_model(SPEC, seed=5, max_seq_len=128).args
    assert can_be_invariant(whole, int8) and not can_be_invariant(whole, fp32)
    info = graph_info(model, SPEC, file="t.onnx", quantization="int8", seq_len=None)
    with pytest.raises(ValueError, match="multiple of 64"):
        export_onnx(model, tmp_path / "t.onnx", info=info, recipe=get_recipe("onnx", "int8"),
                    fused=True, invariant=True)  # fmt: skip


def test_control_gqa_graph_is_not_batch_invariant(tmp_path: Path) -> None:
    """The check above can fail: the GroupQueryAttention int8 graph of the same model differs
    between call widths (ONNX Runtime 1.32's CPU kernel; why the target is written invariant)."""
    graph = _graph(*_export(tmp_path, "int8", False))
    prompt = [5, 9, 100, 3, 44, 17, 250, 31, 8, 12, 77]
    out, one_by_one = _rows_one_by_one(graph, prompt, 60)
    wide = _rows_in_calls_of(graph, prompt + out, len(prompt) - 1, 60, 5)
    assert not np.array_equal(wide, one_by_one)


def test_w8a8_graph_is_matmulinteger_with_per_row_scales(graphs) -> None:
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(graphs["w8a8"][0]))
    ops = [n.op_type for n in proto.graph.node]
    assert "MatMulNBits" not in ops and ops.count("MatMulInteger") == 2 * 4 + 1  # 4 a layer + head
    inits = {i.name: i for i in proto.graph.initializer}
    for node in (n for n in proto.graph.node if n.op_type == "MatMulInteger"):
        assert len(node.input) == 3  # no weight zero point (0): see linear_rows
        weight, a_zero = (numpy_helper.to_array(inits[i]) for i in node.input[1:3])
        assert weight.dtype == np.int8 and a_zero.dtype == np.uint8 and (a_zero == 128).all()


def test_w8a8_without_the_fused_graph_is_refused(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.onnx.file_quant import quantize_onnx_file

    with pytest.raises(ValueError, match="fused exporter only"):
        quantize_onnx_file(tmp_path / "fp32.onnx", tmp_path / "q.onnx", get_recipe("onnx", "w8a8"))
