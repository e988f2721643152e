"""A real cross-vocabulary bundle through ONNX Runtime (slow): SmolLM2-135M drafter ->
Qwen2.5-Coder-0.5B target, exported with the same code as ``omnidraft-export`` and validated with
``omnidraft validate``: eager PyTorch == ONNX Runtime target-only == ONNX Runtime speculative,
token for token, on the shipped prompts (math, code, chat, summarisation)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.mark.slow
def test_real_onnx_bundle_is_lossless_through_ort(
    require_asset: Callable[[str], Path], tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    require_asset("smollm2-135m-gguf")
    require_asset("qwen2.5-0.5b-gguf")
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair
    from omnidraft_deploy.runtime.validate import validate_bundle

    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.catalog.prompts import load_prompts

    cfg = ExportConfig(
        target="qwen2.5-0.5b",
        drafter="smollm2-135m",
        backend="onnx",
        quantization="fp32",
        out_dir=tmp_path / "bundle",
        max_seq_len=128,
        draft_len=4,
    )
    bundle = export_pair(cfg)
    manifest = read_manifest(bundle)
    assert {g.preset for g in manifest.graphs.values()} == {"qwen2.5-0.5b", "smollm2-135m"}
    report = validate_bundle(bundle, max_new_tokens=16)  # expected.json's prompts
    assert report["speculative_equal"] == report["prompts"] == len(load_prompts())
    assert report["eager_equal"] == report["prompts"]
    assert report["passed"]


@pytest.mark.slow
def test_real_int8_bundle_target_is_batch_invariant_and_lossless(
    require_asset: Callable[[str], Path], tmp_path: Path
) -> None:
    """The int8 target is exported with batch-invariant attention (``exporters.onnx.invariant``):
    ONNX Runtime speculative == ONNX Runtime target-only on every shipped prompt, by construction
    rather than by the absence of near-ties (the GroupQueryAttention int8 graph flipped some)."""
    pytest.importorskip("onnxruntime")
    require_asset("smollm2-135m-gguf")
    require_asset("qwen2.5-0.5b-gguf")
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair
    from omnidraft_deploy.runtime.validate import validate_bundle

    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.catalog.prompts import load_prompts

    cfg = ExportConfig(target="qwen2.5-0.5b", drafter="smollm2-135m", backend="onnx",
                       quantization="int8", out_dir=tmp_path / "bundle", max_seq_len=128,
                       draft_len=4)  # fmt: skip
    bundle = export_pair(cfg)
    manifest = read_manifest(bundle)
    assert manifest.extras["target"]["onnx"]["batch_invariant"] is True
    assert manifest.extras["drafter"]["onnx"]["batch_invariant"] is False
    report = validate_bundle(bundle, max_new_tokens=24)  # expected.json's prompts
    assert report["speculative_equal"] == report["prompts"] == len(load_prompts())
