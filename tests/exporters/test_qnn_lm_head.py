"""``qnn_lm_head.split_lm_head``: the lm_head as constant vocabulary chunks is the same function."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

K, V = 6, 10


def _head_graph(*, transposed: bool, tied: bool) -> object:
    """``logits = h @ W.T`` (traced layout: Transpose of a (V, K) table) or ``h @ W`` (K, V)."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((V, K)).astype(np.float32)
    nodes, outputs = [], [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2, V])]
    if transposed:
        nodes.append(helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]))
        nodes.append(helper.make_node("MatMul", ["h", "table_t"], ["logits"], name="head"))
        init = numpy_helper.from_array(table, "table")
    else:
        nodes.append(helper.make_node("MatMul", ["h", "table"], ["logits"], name="head"))
        init = numpy_helper.from_array(np.ascontiguousarray(table.T), "table")
    inputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 2, K])]
    if tied:  # the embedding Gather reads the same table
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2]))
        nodes.append(helper.make_node("Gather", ["table", "ids"], ["emb"]))
        outputs.append(helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 2, K]))
    graph = helper.make_graph(nodes, "head", inputs, outputs, [init])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(proto: object, tmp: Path, name: str) -> list[np.ndarray]:
    from omnidraft_deploy.host.onnx_host import cpu_session

    onnx.save(proto, tmp / name)
    feeds = {"h": np.linspace(-1, 1, 2 * K, dtype=np.float32).reshape(1, 2, K)}
    session = cpu_session(tmp / name)
    if any(i.name == "ids" for i in session.get_inputs()):
        feeds["ids"] = np.array([[1, 7]], np.int64)
    return list(session.run(None, feeds))


@pytest.mark.parametrize(("transposed", "tied"), [(True, True), (True, False), (False, False)])
def test_split_head_is_identical_and_constant(tmp_path: Path, transposed: bool, tied: bool) -> None:
    from omnidraft_deploy.exporters.qnn.lm_head import split_lm_head

    proto = _head_graph(transposed=transposed, tied=tied)
    before = _run(proto, tmp_path, "a.onnx")
    assert split_lm_head(proto, max_cols=4) == 3  # 10 columns -> 4 + 4 + 2
    ops = [n.op_type for n in proto.graph.node]
    assert "Transpose" not in ops and ops.count("MatMul") == 3 and ops[-1] == "Concat"
    inits = {t.name: list(t.dims) for t in proto.graph.initializer}
    assert inits["lm_head.chunk0"] == [K, 4] and inits["lm_head.chunk2"] == [K, 2]
    assert ("table" in inits) == tied  # the table stays only where the embedding reads it
    after = _run(proto, tmp_path, "b.onnx")
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x, y)


def test_split_head_refuses_graphs_without_a_logits_matmul() -> None:
    from omnidraft_deploy.exporters.qnn.lm_head import split_lm_head
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["logits"])], "g", [x], [y])
    with pytest.raises(ValueError, match="no MatMul producing 'logits'"):
        split_lm_head(helper.make_model(graph))
    with pytest.raises(ValueError, match="max_cols must be >= 1"):
        split_lm_head(helper.make_model(graph), max_cols=0)
