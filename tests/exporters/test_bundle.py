"""Bundle writer: a real verified bundle, atomicity on failure, config validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omnidraft_deploy.exporters import EXPORTERS
from omnidraft_deploy.exporters.bundle import ExportConfig, export_bundle
from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.verify import ExportVerificationError

from omnidraft_deploy.bundle.folder import read_manifest, verify_bundle
from omnidraft_deploy.bundle.manifest import BundleError

EXTRA = {"vocab_map.bin": (b"\x01map", "vocab_map"), "ngram_cache.bin": (b"\x02ng", "ngram_cache")}


def _cfg(out: Path, backend: str = "onnx", **kw: Any) -> ExportConfig:
    return ExportConfig(
        target="tiny-llama3-8b", drafter="tiny-llama-68m", backend=backend, out_dir=out,
        max_seq_len=32, draft_len=3, **kw,
    )  # fmt: skip


def _check_bundle(out: Path, backend: str, graph_ext: str) -> None:
    manifest = verify_bundle(out)  # every file present with its sha256
    assert manifest.backend == backend and manifest.mapping_hash == "ab" * 32
    for role, vocab in (("drafter", 32000), ("target", 128256)):
        g = manifest.graphs[role]
        assert g.file == f"{role}{graph_ext}" and g.vocab_size == vocab and g.max_seq_len == 32
        assert g.parity["max_abs_logit_diff"] < 1e-3 and g.parity["top1_agreement"] == 1.0
        stages = manifest.extras[role]["stages"]
        assert {"load", "export", "verify"} <= set(stages)
        assert all(s["seconds"] >= 0 and s["peak_rss_mb"] > 50 for s in stages.values())
    assert manifest.files["vocab_map.bin"].role == "vocab_map"
    assert manifest.files["target_tokenizer/tokenizer.json"].role == "target_tokenizer"
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    (d / "tokenizer.json").write_text('{"model": "fake"}')
    return d


def test_onnx_bundle_is_verified_and_complete(tmp_path: Path, tok_dir: Path) -> None:
    pytest.importorskip("onnxruntime")
    out = tmp_path / "b"
    export_bundle(
        _cfg(out), extra_files=EXTRA, tokenizer_dirs={"target": tok_dir}, mapping_hash="ab" * 32,
        eos_ids={"target": (128001,), "drafter": (2,)},
    )  # fmt: skip
    _check_bundle(out, "onnx", ".onnx")
    manifest = read_manifest(out)
    assert manifest.files["target.ort"].role == "ort_mobile_graph"
    assert manifest.extras["target"]["onnx"]["ort_mobile_file"] == "target.ort"


def test_no_ort_writes_no_mobile_copy_and_says_so(tmp_path: Path) -> None:
    """``omnidraft-export --no-ort`` (``make demo``): the .onnx graphs only, each graph's
    extras naming why its .ort is missing."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "b"
    export_bundle(_cfg(out, verify=False, ort_mobile=False), mapping_hash="ab" * 32)
    manifest = verify_bundle(out)
    assert not list(out.glob("*.ort")) and not any(f.endswith(".ort") for f in manifest.files)
    for role in ("drafter", "target"):
        onnx_facts = manifest.extras[role]["onnx"]
        assert onnx_facts["ort_mobile_file"] is None
        assert onnx_facts["ort_mobile_skipped"] == "not asked for (--no-ort)"


def test_each_role_gets_its_own_recipe(tmp_path: Path) -> None:
    """``--quantization w8a8,int8``: a batch-invariant w8a8 target (cheap
    verification) beside an int8 drafter, each verified under its own recipe."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "b"
    cfg = ExportConfig(target="tiny-qwen2-7b", drafter="tiny-llama-68m", backend="onnx",
                       quantization="w8a8", drafter_quantization="int8", out_dir=out,
                       max_seq_len=64, draft_len=3)  # fmt: skip
    assert (cfg.recipe_name("target"), cfg.recipe_name("drafter")) == ("w8a8", "int8")
    export_bundle(cfg, mapping_hash="ab" * 32)
    manifest = verify_bundle(out)
    assert manifest.graphs["target"].quantization == "w8a8"
    assert manifest.graphs["drafter"].quantization == "int8"
    assert manifest.extras["target"]["onnx"]["batch_invariant"] is True
    assert manifest.graphs["target"].parity["top1_agreement"] >= 0.9


@pytest.mark.slow
def test_xnnpack_bundle_is_verified_and_complete(tmp_path: Path, tok_dir: Path) -> None:
    pytest.importorskip("executorch")
    out = tmp_path / "b"
    export_bundle(
        _cfg(out, "xnnpack"), extra_files=EXTRA, tokenizer_dirs={"target": tok_dir},
        mapping_hash="ab" * 32, eos_ids={"target": (128001,), "drafter": (2,)},
    )  # fmt: skip
    _check_bundle(out, "xnnpack", ".pte")
    assert read_manifest(out).extras["target"]["xnnpack"]["op_coverage"]["delegated_nodes"] > 0


def _previous_bundle(out: Path) -> bytes:
    out.mkdir()
    (out / "manifest.json").write_text('{"format": "omnidraft-bundle", "old": true}')
    return (out / "manifest.json").read_bytes()


def test_crash_mid_export_leaves_nothing_and_keeps_the_old_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def crashing(model, spec, out_dir: Path, *, role: str, **kw: Any):
        calls.append(role)
        (out_dir / f"{role}.onnx").write_bytes(b"half a graph")  # partial write, then a crash
        raise RuntimeError("simulated crash during lowering")

    monkeypatch.setitem(EXPORTERS, "onnx", crashing)
    out = tmp_path / "bundle"
    old = _previous_bundle(out)
    with pytest.raises(RuntimeError, match="simulated crash"):
        export_bundle(_cfg(out, verify=False), extra_files=EXTRA)
    assert calls == ["drafter"]
    assert (out / "manifest.json").read_bytes() == old and sorted(
        p.name for p in out.iterdir()
    ) == ["manifest.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no partial folder left
    with pytest.raises(BundleError, match="missing"):
        verify_bundle(tmp_path / "never-written")


def test_failed_verification_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def quick(model, spec, out_dir: Path, *, role: str, recipe, **kw: Any):
        info = graph_info(model, spec, file=f"{role}.onnx", quantization=recipe.name, seq_len=None)
        (out_dir / info.file).write_bytes(b"graph")
        return info, {}

    def bad_verify(path: Path, info, eager) -> dict[str, float]:
        raise ExportVerificationError(f"{path.name}: parity off")

    monkeypatch.setitem(EXPORTERS, "onnx", quick)
    out = tmp_path / "bundle"
    with pytest.raises(ExportVerificationError, match="drafter.onnx: parity off"):
        export_bundle(_cfg(out), extra_files=EXTRA, verify=bad_verify, mapping_hash="ab" * 32)
    assert list(tmp_path.iterdir()) == []
    export_bundle(
        _cfg(out, verify=False), extra_files=EXTRA, verify=bad_verify, mapping_hash="ab" * 32
    )  # verify off
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extras"]["verified"] is False and manifest["graphs"]["target"]["parity"] == {}


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"target": "llama5"}, "unknown preset"),
        ({"backend": "tflite"}, "unknown backend 'tflite'"),
        ({"quantization": "int3"}, "unknown quantization 'int3'"),
        ({"drafter_quantization": "w3"}, "unknown quantization 'w3'"),
        ({"max_seq_len": 4}, "max_seq_len 4"),
        ({"draft_len": 0}, "draft_len 0"),
        ({"backend": "xnnpack", "ort_mobile": False}, "--no-ort: the xnnpack backend"),
    ],
)
def test_config_validation(kw: dict[str, Any], match: str, tmp_path: Path) -> None:
    base: dict[str, Any] = {"target": "tiny-llama3-8b", "out_dir": tmp_path, "backend": "onnx"}
    with pytest.raises((KeyError, ValueError), match=match):
        ExportConfig(**(base | kw))
