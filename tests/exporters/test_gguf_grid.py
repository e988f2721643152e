"""GGUF blocks kept on their own grid (``exporters.quant.gguf_grid``): the codes and scales read
from raw blocks dequantise to exactly what the ``gguf`` package's own dequantizer gives, and the
MatMulNBits graph of ``exporters.onnx.gguf_grid`` computes ``x @ w.T`` on that grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omnidraft_deploy.exporters.quant.gguf_grid import READERS, Grid, rounded8

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

# K-quant block widths in bytes and where their fp16 super-block scales sit
K_QUANTS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def synthetic_blocks(kind: str, rows: int, supers: int, seed: int) -> np.ndarray:
    """Random K-quant rows ``(rows, supers * width)``: every code and 6/8-bit scale random, the
    fp16 scales finite and small (the ``gguf`` package cannot quantise K-quants itself)."""
    width, halves = K_QUANTS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * supers, width), dtype=np.uint8)
    for off in halves:
        d = rng.uniform(-0.05, 0.05, (rows * supers, 1)).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_blocks_dequantise_bit_for_bit(kind: str) -> None:
    raw = synthetic_blocks(kind, rows=5, supers=3, seed=1)
    grid = READERS[kind](raw)
    ref = dequantize(raw, T[kind])
    assert grid.dequantize().shape == ref.shape == (5, 768)
    np.testing.assert_array_equal(grid.dequantize(), ref)
    assert (grid.bits, grid.block) == ((4, 32) if kind == "Q4_K" else (8, 16))
    assert grid.codes.max() <= (15 if kind == "Q4_K" else 159)  # Q6_K: q - 32 + 128


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_legacy_blocks_dequantise_bit_for_bit(kind: str) -> None:
    w = np.random.default_rng(2).standard_normal((6, 256)).astype(np.float32)
    raw = quantize(w, T[kind])
    np.testing.assert_array_equal(READERS[kind](raw).dequantize(), dequantize(raw, T[kind]))


def test_q4_k_scales_and_minimums_are_the_sub_blocks() -> None:
    """Each sub-block of 32 is ``scale * q - minimum`` with one float scale and minimum, codes
    0..15 (what MatMulNBits' 4-bit blocks of 32 hold), and ``packed`` puts two codes a byte."""
    grid = READERS["Q4_K"](synthetic_blocks("Q4_K", rows=2, supers=1, seed=3))
    assert grid.scales().shape == grid.minimums().shape == (2, 8) and grid.per == 8
    packed = grid.packed()
    assert packed.shape == (2, 8, 16)
    unpacked = np.stack([packed & 15, packed >> 4], -1).reshape(2, -1)
    np.testing.assert_array_equal(unpacked, grid.codes)
    # 144 bytes a super-block in the GGUF; the grid stores the same bits (codes, fp16 d / dmin,
    # one byte per 6-bit scale and minimum)
    assert grid.nbytes() == 2 * (128 + 4 + 16)


def test_rounded8_is_within_half_a_step() -> None:
    w = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    grid = rounded8(w, "Q5_0")
    step = np.repeat(grid.scales(), 32, axis=1)
    assert np.all(np.abs(grid.dequantize() - w) <= step / 2 + 1e-7)


def test_a_bad_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="whole blocks"):
        Grid(4, 32, np.zeros((2, 48), np.uint8), np.zeros((2, 1)), np.zeros((2, 1), np.uint8))


def _linear_session(grid: Grid, outliers: np.ndarray | None = None) -> Any:
    """An ONNX Runtime session of ``grid_linear`` alone: ``x (1, T, K)`` -> ``(1, T, N)``."""
    pytest.importorskip("onnxruntime")
    import onnx
    import onnxruntime as ort
    from omnidraft_deploy.exporters.onnx.fused import MS, GraphWriter
    from omnidraft_deploy.exporters.onnx.gguf_grid import grid_linear
    from onnx import TensorProto, helper

    n, k = grid.codes.shape
    g = GraphWriter(4, 32, grids={"w": [grid]})
    out = grid_linear(g, "w", "x", [grid], outliers)
    graph = g.model.graph
    graph.node.extend(g.nodes)
    graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", k]))
    graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, "T", n]))
    g.model.ir_version = onnx.IR_VERSION
    g.model.opset_import.extend([helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    return ort.InferenceSession(g.model.SerializeToString(), providers=["CPUExecutionProvider"])


def _rows_are_invariant(sess: Any, x: np.ndarray, got: np.ndarray) -> None:
    for t in (1, 2):  # a decode call's rows are a verification call's rows, bit for bit
        part = sess.run(None, {"x": x[:, :t]})[0]
        np.testing.assert_array_equal(part[0], got[0, :t])


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_matmul_nbits_graph_computes_the_grid(kind: str) -> None:
    """The graph of ``onnx.gguf_grid`` (folded scales, 4-bit minimums as block sums) against
    ``x @ w.T`` in float64 on the dequantised grid; int8 activations per block (accuracy level
    4) bound the difference, and a 1-row call gives the 3-row call's row bit for bit (the 4-bit
    matmuls' padding row, ``ROW_PAD``: unpadded, ONNX Runtime 1.32's 1-row sums differ)."""
    grid = READERS[kind](synthetic_blocks(kind, rows=24, supers=2, seed=5))
    sess = _linear_session(grid)
    x = np.random.default_rng(6).standard_normal((1, 3, grid.codes.shape[1])).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    ref = x.astype(np.float64) @ grid.dequantize().astype(np.float64).T
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()  # int8 activations: ~0.5 %
    _rows_are_invariant(sess, x, got)


def test_outlier_channels_leave_the_int8_blocks() -> None:
    """Three channels 300x the others (an attention-sink row) make MatMulNBits' int8 block of
    32 round their neighbours to a few levels; split out (``gguf_grid._split``: zeroed in the
    grid matmul, exact fp32 columns beside it) the error falls to the plain row's, the rows stay
    batch-invariant, and the graph's extra weights are those columns alone."""
    grid = READERS["Q4_K"](synthetic_blocks("Q4_K", rows=24, supers=2, seed=8))
    k = grid.codes.shape[1]
    idx = np.array([5, 40, 300])
    x = np.random.default_rng(9).standard_normal((1, 3, k)).astype(np.float32)
    x[..., idx] *= 300.0
    w = grid.dequantize().astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    inliers = x.astype(np.float64).copy()
    inliers[..., idx] = 0.0
    scale = np.abs(inliers @ w.T).max()  # the size of what the int8 blocks carry

    def error(sess: Any) -> float:
        return float(np.abs(sess.run(None, {"x": x})[0] - ref).max() / scale)

    whole, split = _linear_session(grid), _linear_session(grid, idx)
    assert error(split) <= 0.02 < error(whole)
    _rows_are_invariant(split, x, split.run(None, {"x": x})[0])


def test_outlier_names_map_the_eager_gate_to_the_fused_gate_up() -> None:
    from omnidraft_deploy.exporters.onnx.gguf_grid import outlier_names

    got = outlier_names({"model.layers.3.mlp.gate_proj": [7, 1], "model.layers.3.mlp.up_proj": [7, 1],
                         "model.layers.0.self_attn.q_proj": [2]})  # fmt: skip
    assert list(got) == ["layers.3.gate_up"] and got["layers.3.gate_up"].tolist() == [7, 1]


def test_a_tiny_model_exports_to_onnx_gguf4_with_its_outliers_split(tmp_path: Path) -> None:
    """The fused batch-invariant graph of a tiny model's written GGUF, gate|up split on 3 input
    channels a layer (``quant.outliers`` on the eager model): the graph holds each layer's side
    columns and verifies against the eager model the GGUF dequantises to."""
    pytest.importorskip("onnxruntime")
    import onnx
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx
    from omnidraft_deploy.exporters.quant.outliers import outlier_channels
    from omnidraft_deploy.exporters.verify import verify_artifact
    from tiny_gguf import PROMPTS, SPEC, write_tiny_gguf

    from omnidraft_deploy.catalog.backends import get_recipe

    model = write_tiny_gguf(tmp_path / "tiny.gguf", max_seq_len=64)
    recipe = get_recipe("onnx", "gguf4")
    outliers = outlier_channels(model, PROMPTS, k=3, kinds=("gate_proj",))
    info = graph_info(model, SPEC, file="target.onnx", quantization="gguf4", seq_len=None)
    path = export_onnx(model, tmp_path / "target.onnx", info=info, recipe=recipe, fused=True,
                       invariant=True, gguf=tmp_path / "tiny.gguf", outliers=outliers)  # fmt: skip
    graph = onnx.load(str(path)).graph
    columns = {t.name: tuple(t.dims) for t in graph.initializer if "outlier_columns" in t.name}
    assert columns == {f"layers.{i}.gate_up.outlier_columns": (3, 2 * SPEC.intermediate_size)
                       for i in range(SPEC.n_layers)}  # fmt: skip
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    assert result["max_abs_logit_diff"] < 0.5 * recipe.tolerance
    assert result["top1_agreement"] >= 0.9


def test_embedding_graph_gathers_the_grid_rows_exactly() -> None:
    """``grid_embedding``: packed Q4_K rows gathered and dequantised per token, bit for bit."""
    pytest.importorskip("onnxruntime")
    import onnx
    import onnxruntime as ort
    from omnidraft_deploy.exporters.onnx.fused import MS, GraphWriter
    from omnidraft_deploy.exporters.onnx.gguf_grid import grid_embedding
    from onnx import TensorProto, helper

    grid = READERS["Q4_K"](synthetic_blocks("Q4_K", rows=40, supers=2, seed=7))
    g = GraphWriter(4, 32)
    grid_embedding(g, "ids", grid, "embeds")
    g.model.graph.node.extend(g.nodes)
    g.model.graph.input.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "T"]))
    g.model.graph.output.append(helper.make_tensor_value_info("embeds", TensorProto.FLOAT, None))
    g.model.ir_version = onnx.IR_VERSION
    g.model.opset_import.extend([helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    sess = ort.InferenceSession(g.model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[3, 39, 0, 3]], np.int64)
    got = sess.run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(got[0], grid.dequantize()[ids[0]])


def test_llama_rows_undo_the_gguf_q_k_permutation() -> None:
    """llama.cpp's converter permutes q/k rows (``permute`` in convert_hf_to_gguf.py); the grid
    rows taken in ``llama_rows`` order are the Hugging Face rows again."""
    from omnidraft_deploy.exporters.quant.gguf_grid import llama_rows

    heads, rows = 3, 24
    hf = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    stored = hf.reshape(heads, 2, rows // heads // 2, 4).swapaxes(1, 2).reshape(hf.shape)
    np.testing.assert_array_equal(stored[llama_rows(rows, heads)], hf)
    grid = READERS["Q4_K"](synthetic_blocks("Q4_K", rows=rows, supers=1, seed=8))
    index = llama_rows(rows, heads)
    np.testing.assert_array_equal(grid.rows(index).dequantize(), grid.dequantize()[index])


def _gguf_with(path: Path, name: str, raw: np.ndarray, kind: str) -> Any:
    """``path``: a GGUF holding one tensor; returns that tensor as ``GGUFReader`` reads it."""
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tensor(name, raw, raw_dtype=T[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(str(path)).tensors[0]


def test_a_re_rounded_tensor_passes_the_check_against_its_own_weight(tmp_path: Path) -> None:
    """Qwen2.5-Coder-0.5B's GGUF stores attention weights as Q5_0, which the ``gguf*`` recipes
    re-round to 8 bits; the check against the loaded model compares the re-rounded grid within
    half its step (it refused the file before), and still refuses a different weight by name."""
    from omnidraft_deploy.exporters.quant.gguf_grid import checked_grid

    w = np.random.default_rng(7).standard_normal((96, 64)).astype(np.float32) * 0.05
    tensor = _gguf_with(tmp_path / "q5.gguf", "blk.0.attn_q.weight", quantize(w, T.Q5_0), "Q5_0")
    weight = dequantize(np.asarray(tensor.data), T.Q5_0)  # the eager model loaded from the file
    grid = checked_grid(tensor, weight, tmp_path / "q5.gguf")
    assert grid.bits == 8 and grid.source == "Q5_0->8"
    other = weight.copy()
    other[40, 3] += 0.01  # far more than half an 8-bit step of this block
    with pytest.raises(ValueError, match=r"q5\.gguf: tensor blk\.0\.attn_q\.weight \(Q5_0->8"):
        checked_grid(tensor, other, tmp_path / "q5.gguf")
