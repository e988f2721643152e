"""``bundle.onnx_meta``: the metadata and external-data files the bundle checks read from an ONNX
file without parsing its weights equal what ``onnx.load`` gives, and a file cut anywhere or
foreign bytes are refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from omnidraft_deploy.bundle.onnx_meta import read_onnx_meta

onnx = pytest.importorskip("onnx")


def _model(path: Path) -> Path:
    import numpy as np
    from onnx import helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.arange(300, dtype=np.float32) * i, f"w{i}") for i in range(3)
    ]
    ext = inits[1]  # weights in another file
    ext.ClearField("raw_data")
    ext.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "target.onnx.data"), ("offset", "4096"), ("length", "1200")):
        ext.external_data.add(key=key, value=value)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [300])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [300])
    nodes = [helper.make_node("Add", ["x", f"w{i}"], [f"a{i}"]) for i in range(3)]
    nodes += [helper.make_node("Sum", ["a0", "a1", "a2"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits))
    for key, value in (("omnidraft.format_version", "1"), ("note", "é ☃"), ("note", "last")):
        model.metadata_props.add(key=key, value=value)
    path.write_bytes(model.SerializeToString())
    return path


def test_reads_what_onnx_load_reads(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.onnx")
    meta = read_onnx_meta(path)
    ref = onnx.load(str(path), load_external_data=False)
    assert meta.metadata == {p.key: p.value for p in ref.metadata_props}
    assert meta.metadata["note"] == "last"  # a repeated key: the last, as a dict of the list
    assert meta.external == {"w1": "target.onnx.data"}
    with open(path, "rb") as f:  # from an open descriptor (the bundle opener's), left open
        assert read_onnx_meta(f.fileno()) == meta
        assert not f.closed


def test_cut_or_foreign_files_are_refused(tmp_path: Path) -> None:
    data = _model(tmp_path / "m.onnx").read_bytes()
    bad = tmp_path / "bad.onnx"
    for cut in (1, 7, len(data) // 3, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="past its message|wire type|field number 0"):
            read_onnx_meta(bad)
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_onnx_meta(bad)
    rng = random.Random(0)
    for _ in range(50):  # noise either breaks the wire format or names no omnidraft metadata
        bad.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
        try:
            meta = read_onnx_meta(bad)
        except ValueError:
            continue
        assert "omnidraft.format_version" not in meta.metadata
