"""``logits_from`` (``graph_contract.LOGITS_FROM``): fused graphs score only the rows a caller reads.

How ONNX Runtime exposes an overridable initializer (checked here, not assumed), the fused graph's
call for its last rows against its full call (bitwise, every path and recipe), ``forward_tail`` on
it, and export verification refusing a graph whose tail rows differ.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.verify import ExportVerificationError, verify_artifact

from omnidraft_deploy.bundle import graph_contract as gc
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)  # GQA + qkv bias
MAX_SEQ = 64  # a whole attention-span block: the invariant path can be written
PROMPT = [5, 9, 100, 3, 44, 17, 250, 31, 8]


def _sliced_rows_graph() -> bytes:
    """``y = x[:, logits_from:, :]`` with ``logits_from`` an overridable initializer ([0])."""
    from onnx import TensorProto, helper, numpy_helper

    ends = numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), "ends")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    first = numpy_helper.from_array(np.array([0], np.int64), gc.LOGITS_FROM)
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", gc.LOGITS_FROM, "ends", "axes"], ["y"])], "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", 3]),
         helper.make_tensor_value_info(gc.LOGITS_FROM, TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "rows", 3])],
        initializer=[first, ends, axes],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model.SerializeToString()


def test_onnx_runtime_lists_and_binds_an_overridable_initializer_as_the_contract_says() -> None:
    """Not in ``get_inputs()`` but in ``get_overridable_initializers()``; unfed: its value [0];
    ``bind_cpu_input`` refuses it, an OrtValue binds, and a bound OrtValue over a numpy array
    reads the array's value at each run (``ExplicitCacheGraph`` binds it once)."""
    sess = ort.InferenceSession(_sliced_rows_graph(), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert [i.name for i in sess.get_overridable_initializers()] == [gc.LOGITS_FROM]
    assert gc.takes_logits_from(sess)
    x = np.arange(12, dtype=np.float32).reshape(1, 4, 3)
    assert sess.run(None, {"x": x})[0].shape == (1, 4, 3)
    assert sess.run(None, {"x": x, gc.LOGITS_FROM: np.array([3])})[0].shape == (1, 1, 3)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    with pytest.raises(RuntimeError, match=gc.LOGITS_FROM):
        binding.bind_cpu_input(gc.LOGITS_FROM, np.array([3], np.int64))
    first = np.zeros(1, np.int64)
    binding.bind_ortvalue_input(gc.LOGITS_FROM, ort.OrtValue.ortvalue_from_numpy(first))
    for value, rows in ((3, 1), (0, 4), (2, 2)):
        first[0] = value
        binding.bind_output("y", "cpu")
        sess.run_with_iobinding(binding)
        assert binding.get_outputs()[0].numpy().shape == (1, rows, 3)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy()[0], x[0, 2:])


def _graph(quant: str, invariant: bool) -> tuple[gc.ExplicitCacheGraph, bytes]:
    from omnidraft_deploy.exporters.onnx.fused import build_graph

    from omnidraft_deploy.host.onnx_host import cpu_session

    model = build_model(SPEC, seed=5, max_seq_len=MAX_SEQ)
    with torch.no_grad():
        proto = build_graph(model, get_recipe("onnx", quant), invariant=invariant)
    data = proto.SerializeToString()
    info = graph_info(model, SPEC, file="target.onnx", quantization=quant, seq_len=None)
    return gc.ExplicitCacheGraph(cpu_session(data, threads=2), info), data


@pytest.mark.parametrize("invariant", [False, True], ids=["gqa", "invariant"])
@pytest.mark.parametrize("quant", ["fp32", "int8", "w8a8"])
def test_tail_calls_are_the_full_calls_rows_bit_for_bit(quant: str, invariant: bool) -> None:
    graph, _ = _graph(quant, invariant)
    assert graph.tail_alone
    ids, pos = np.array([PROMPT]), gc.contiguous_positions(0, len(PROMPT))
    full = graph.run(ids, pos)  # logits_from not fed by the host: 0, every row
    assert full.shape == (len(PROMPT), SPEC.vocab_size)
    for rows in (1, 4, len(PROMPT)):
        graph.reset()
        alone = graph.run(ids, pos, rows=rows)
        assert alone.shape == (rows, SPEC.vocab_size)
        assert np.array_equal(alone, full[-rows:]), np.abs(alone - full[-rows:]).max()
    again = graph.run(ids[:, :4], pos[:4])  # the bound logits_from is back to 0: all rows
    np.testing.assert_array_equal(again, full[:4])
    nxt = np.array([[7]]), gc.contiguous_positions(len(PROMPT), 1)
    graph.run(ids, pos, rows=1)
    step = graph.run(*nxt)  # reads the cache the last-only call wrote
    graph.reset()
    graph.run(ids, pos)
    np.testing.assert_array_equal(step, graph.run(*nxt))
    with pytest.raises(ValueError, match="rows 0"):
        graph.run(ids, pos, rows=0)


def test_a_session_not_feeding_logits_from_gets_every_row() -> None:
    """Old callers (a plain ``session.run`` without the input) keep getting (1, T, V)."""
    graph, data = _graph("int8", False)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert gc.LOGITS_FROM not in [i.name for i in sess.get_inputs()]
    feeds = graph.feeds(np.array([PROMPT]), gc.contiguous_positions(0, len(PROMPT)))
    logits = sess.run([gc.LOGITS], feeds)[0]
    assert logits.shape == (1, len(PROMPT), SPEC.vocab_size)


def test_forward_tail_on_a_fused_graph_is_forwards_tail(tmp_path: Path) -> None:
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    graph, data = _graph("w8a8", True)
    path = tmp_path / "target.onnx"
    path.write_bytes(data)
    model = OrtModel(path, graph.info, threads=2, huge_pages=False)
    ids = torch.tensor(PROMPT)
    tail = model.forward_tail(ids, 0, 2)
    assert tail.shape == (2, SPEC.vocab_size) and model.n_calls == 1
    assert torch.equal(tail, model.forward(ids, 0)[-2:])
    with pytest.raises(ValueError, match="outside"):
        model.forward_tail(ids, MAX_SEQ - 2, 1)


def test_export_verification_refuses_a_graph_whose_tail_rows_differ(tmp_path: Path) -> None:
    """A graph edited to add ``logits_from`` to its logits: full calls (logits_from 0) still
    match eager, a last-row call is off by T - 1, and verification says so."""
    from onnx import helper

    _, data = _graph("fp32", False)
    proto = onnx.load_from_string(data)
    writer = next(n for n in proto.graph.node if gc.LOGITS in n.output)
    writer.output[list(writer.output).index(gc.LOGITS)] = "logits/raw"
    proto.graph.node.extend([
        helper.make_node("Cast", [gc.LOGITS_FROM], ["logits/from_f"], to=1),
        helper.make_node("Add", ["logits/raw", "logits/from_f"], [gc.LOGITS]),
    ])  # fmt: skip
    path = tmp_path / "target.onnx"
    onnx.save(proto, str(path))
    model = build_model(SPEC, seed=5, max_seq_len=MAX_SEQ)
    info = graph_info(model, SPEC, file=path.name, quantization="fp32", seq_len=None)
    with pytest.raises(ExportVerificationError, match="last 1 row"):
        verify_artifact(path, info, model, get_recipe("onnx", "fp32"), [PROMPT])


def test_greedy_speculative_equals_target_only_on_fused_graphs(tmp_path: Path) -> None:
    """Both graphs take ``logits_from``: target-only decoding and every drafter call ask for the
    last row alone, the speculative prefill for its proposals' rows, verification for every row;
    the w8a8 invariant target keeps greedy speculative output equal to target-only output."""
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    from omnidraft_deploy.speculative.decoder import (
        DecodeConfig,
        SpeculativeDecoder,
        generate_target_only,
    )
    from omnidraft_deploy.speculative.draft_len import FixedDraftLen
    from omnidraft_deploy.testing import TableTokenizer
    from omnidraft_deploy.vocab.mapper import VocabMapper

    models = []
    for name, (quant, invariant) in {"target": ("w8a8", True), "drafter": ("int8", False)}.items():
        graph, data = _graph(quant, invariant)
        (path := tmp_path / f"{name}.onnx").write_bytes(data)
        models.append(OrtModel(path, graph.info, threads=2, huge_pages=False))
    target, drafter = models
    assert target.graph.tail_alone and drafter.graph.tail_alone
    pieces = [b"</s>", *(bytes([i]) for i in range(1, 256)), *(bytes([65, i]) for i in range(128))]
    tok = TableTokenizer("bytes", pieces)  # 384 ids: one vocabulary for both graphs
    mapper = VocabMapper.from_tokenizers(tok, tok)
    cfg = DecodeConfig(max_new_tokens=24)
    for prompt in (PROMPT, [7, 8]):
        want, _ = generate_target_only(target, prompt, cfg)
        dec = SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(3), config=cfg)
        got, stats = dec.generate(prompt)
        assert got == want and stats.drafter_calls > 0, prompt
