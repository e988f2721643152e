"""Graph-level bundle checks on one toy ONNX graph: each bad file is refused naming itself."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from runtime_helpers import cached_onnx

from omnidraft_deploy.bundle.manifest import BundleError
from omnidraft_deploy.bundle.sections import GraphInfo

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GraphInfo]:
    return cached_onnx(tmp_path_factory.getbasetemp(), 64, 3, 4, 3)  # shared with ORT tests


def _edit_metadata(src: Path, dst: Path, key: str, value: str | None) -> Path:
    import onnx

    proto = onnx.load(str(src))
    kept = [(p.key, p.value) for p in proto.metadata_props if p.key != key]
    del proto.metadata_props[:]
    for k, v in kept + ([(key, value)] if value is not None else []):
        proto.metadata_props.add(key=k, value=v)
    onnx.save(proto, str(dst))
    return dst


def test_valid_graph_passes(graph: tuple[Path, GraphInfo]) -> None:
    from omnidraft_deploy.runtime.bundle import check_onnx_metadata

    check_onnx_metadata(*graph)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated", "not a readable ONNX model"),
        ("foreign", "no omnidraft.graph_info metadata"),
        ("newer_format", "format_version '2'"),
        ("vocab", "vocab_size=64 but manifest says 32"),
        ("seq_len", "seq_len=3 but manifest says None"),
    ],
)
def test_bad_graph_is_refused_naming_it(
    graph: tuple[Path, GraphInfo], tmp_path: Path, how: str, message: str
) -> None:
    from omnidraft_deploy.runtime.bundle import check_onnx_metadata

    src, info = graph
    bad = tmp_path / "target.onnx"
    if how == "truncated":
        bad.write_bytes(src.read_bytes()[: src.stat().st_size // 3])
    elif how == "foreign":
        _edit_metadata(src, bad, "omnidraft.graph_info", None)
    elif how == "newer_format":
        _edit_metadata(src, bad, "omnidraft.format_version", "2")
    else:
        shutil.copy(src, bad)
        info = dataclasses.replace(
            info, **{"vocab": {"vocab_size": 32}, "seq_len": {"seq_len": None}}[how]
        )
    with pytest.raises(BundleError, match=message) as err:
        check_onnx_metadata(bad, info)
    assert str(bad) in str(err.value)
