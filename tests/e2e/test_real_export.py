"""The real SmolLM2-135M exports to every backend and reloads within its recipe's tolerance (slow).

One graph per backend through the registered exporter (the same code ``omnidraft-export`` runs),
then ``exporters.verify.verify_artifact``: reload through the reference runtime, compare logits with
eager PyTorch on real prompts (prefill, single steps, a KV rollback), raise outside tolerance.
Figures (size, time, peak RSS) for the same exports: ``benchmarks/export_report.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer

PRESET = "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2(require_asset: Callable[[str], Path]) -> Transformer:
    require_asset("smollm2-135m-gguf")
    from omnidraft_deploy.resolve.load import load_model

    return load_model(get_preset(PRESET), max_seq_len=128)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "quant", "suffix"),
    [
        ("onnx", "fp32", ".onnx"),
        ("qnn", "qdq-a16w8", ".onnx"),
        ("onnx", "int4", ".onnx"),
        ("xnnpack", "fp32", ".pte"),
    ],
)
def test_smollm2_exports_and_reloads_within_tolerance(
    smollm2: Transformer, tmp_path: Path, backend: str, quant: str, suffix: str
) -> None:
    from omnidraft_deploy.exporters import get_exporter
    from omnidraft_deploy.exporters.verify import prompt_ids, verify_artifact

    from omnidraft_deploy.catalog.backends import get_recipe

    pytest.importorskip(
        {"onnx": "onnxruntime", "qnn": "onnxruntime_qnn"}.get(backend, "executorch")
    )
    spec, recipe = get_preset(PRESET), get_recipe(backend, quant)
    info, facts = get_exporter(backend)(
        smollm2, spec, tmp_path, role="target", recipe=recipe, draft_len=4, eos_ids=(2,)
    )
    assert info.file.endswith(suffix) and info.vocab_size == spec.vocab_size
    prompts = prompt_ids(spec.tokenizer, spec.vocab_size, n=2, limit=16)
    parity = verify_artifact(tmp_path / info.file, info, smollm2, recipe, prompts)
    assert parity["rows"] > 0 and parity["top1_agreement"] >= recipe.min_top1
    if backend == "qnn":
        assert facts["htp_validated"] and facts["htp_context_bytes"] > 0
