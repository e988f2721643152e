"""One bundle, one real drafter, two real targets (slow, issue 30): SmolLM2-135M drafts for
Qwen2.5-Coder-0.5B and -1.5B from one multi-target ONNX bundle, exported with the same code as
``omnidraft-export --target qwen2.5-0.5b,qwen2.5-1.5b``; for each target ``validate`` checks
ONNX Runtime speculative == ONNX Runtime target-only == the eager target, token for token, on the
shipped prompts. Skipped when the optional GGUFs are absent (``omnidraft assets fetch --models``).
Run it alone (``pytest -m slow -k real_multi``): it exports and loads the 1.5B (~15 GB peak)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

TARGETS = ("qwen2.5-0.5b", "qwen2.5-1.5b")


@pytest.mark.slow
def test_two_real_targets_on_one_drafter_are_each_lossless(
    require_asset: Callable[[str], Path], tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    for asset in ("smollm2-135m-gguf", *(f"{t}-gguf" for t in TARGETS)):
        require_asset(asset)
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.multi import MultiExportConfig, export_multi
    from omnidraft_deploy.runtime.validate import validate_bundle

    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.catalog.prompts import load_prompts

    base = ExportConfig(target=TARGETS[0], drafter="smollm2-135m", backend="onnx",
                        quantization="int8", out_dir=tmp_path / "bundle", max_seq_len=128,
                        draft_len=4)  # fmt: skip
    bundle = export_multi(MultiExportConfig(base=base, targets=TARGETS))
    manifest = read_manifest(bundle)
    assert sorted(manifest.targets) == sorted(TARGETS) and set(manifest.graphs) == {"drafter"}
    maps = {t.vocab_map for t in manifest.targets.values()}
    assert len(maps) == 1  # one Qwen2 vocabulary: one map file for both targets
    assert manifest.extras["sharing"]["saved_bytes"] > 0
    for name in TARGETS:
        report = validate_bundle(bundle, max_new_tokens=16, target=name)
        assert report["target"] == name
        assert report["speculative_equal"] == report["prompts"] == len(load_prompts()), report
        assert report["passed"], report
