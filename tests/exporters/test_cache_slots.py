"""A fused graph exported at S_big slots, fed caches of S < S_big slots, computes what the graph
exported at S computes, bit for bit: S enters the graph only through its rotary tables (row p
depends on p alone) and the symbolic slot axis of its cache inputs. ``benchmarks/kv_slots.py``
relies on it (one exported graph, one host cache per S), and so would a cache that grows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from omnidraft_deploy.exporters.exportable import graph_info

from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph, contiguous_positions
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model

ort = pytest.importorskip("onnx") and pytest.importorskip("onnxruntime")

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)  # GQA + qkv bias
SMALL, BIG = 128, 256  # both whole attention-span blocks of 64 (batch-invariant form)


def _export(tmp: Path, slots: int, invariant: bool) -> tuple[Path, GraphInfo]:
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    model = build_model(SPEC, seed=3, max_seq_len=slots)
    path = tmp / f"target-{slots}.onnx"
    info = graph_info(model, SPEC, file=path.name, quantization="int8", seq_len=None)
    export_onnx(model, path, info=info, recipe=get_recipe("onnx", "int8"), fused=True,
                invariant=invariant)  # fmt: skip
    return path, info


def _decode(path: Path, info: GraphInfo, slots: int) -> np.ndarray:
    """Logits of a 70-token prompt in two calls, then 40 greedy 1-token steps (past slot 64),
    then a rollback and a 3-token verification-like call, on caches of ``slots`` slots."""
    from omnidraft_deploy.host.profile import ort_session

    graph = ExplicitCacheGraph(
        ort_session(path, threads=1), dataclasses.replace(info, max_seq_len=slots)
    )
    assert graph.caches[0].shape[2] == slots
    ids = [(i * 37) % 380 + 2 for i in range(70)]
    rows = [graph.run(np.array([ids[:50]]), contiguous_positions(0, 50))]
    rows.append(graph.run(np.array([ids[50:]]), contiguous_positions(50, 20)))
    token, pos = int(rows[-1][-1].argmax()), 70
    for _ in range(40):
        rows.append(graph.run(np.array([[token]]), contiguous_positions(pos, 1)))
        token, pos = int(rows[-1][-1].argmax()), pos + 1
    rows.append(graph.run(np.array([[5, 6, 7]]), contiguous_positions(pos - 10, 3)))
    return np.concatenate(rows)


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "gqa"])
def test_big_graph_on_small_caches_equals_small_graph(tmp_path: Path, invariant: bool) -> None:
    import onnx

    small, small_info = _export(tmp_path, SMALL, invariant)
    big, big_info = _export(tmp_path, BIG, invariant)
    inits = {m: {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer}
             for m, p in (("small", small), ("big", big))}  # fmt: skip
    assert inits["small"].keys() == inits["big"].keys()
    for name, arr in inits["small"].items():
        other = inits["big"][name]
        if name in ("cos_cache", "sin_cache"):  # S rows; the first SMALL rows the same
            assert arr.shape[0] == SMALL and other.shape[0] == BIG
            other = other[:SMALL]
        assert np.array_equal(arr, other), name
    want = _decode(small, small_info, SMALL)
    assert np.array_equal(_decode(big, big_info, SMALL), want)
    # and a cache of S slots is used for nothing but its first positions: a larger one, same rows
    assert np.array_equal(_decode(big, big_info, BIG), want)
