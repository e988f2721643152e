"""``omnidraft adapt``: the library loop over a real (tiny) bundle, then the publish into it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair

    cfg = ExportConfig(
        target="tiny-llama3-8b",
        drafter="tiny-llama-68m",
        backend="onnx",
        out_dir=tmp_path_factory.mktemp("adapt") / "bundle",
        max_seq_len=64,
        draft_len=3,
    )
    return export_pair(cfg)


def test_adapt_trains_and_publishes_the_drafter(bundle: Path) -> None:
    from omnidraft_deploy.exporters.publish import publish_drafter
    from omnidraft_deploy.runtime.adapt import adapt_bundle
    from omnidraft_deploy.runtime.bundle import load_model

    from omnidraft_deploy.bundle.folder import read_manifest, verify_bundle
    from omnidraft_deploy.distill.adapt import AdaptConfig

    before = read_manifest(bundle)
    published = []
    result = adapt_bundle(
        bundle,
        [[1, 5, 9, 14, 30], [2, 7, 11, 40]],
        AdaptConfig(lr=1e-2, batch_size=2, steps_per_update=2, seq_len=32),
        rounds=2,
        max_new_tokens=6,
        publish=lambda d: published.append(publish_drafter(bundle, d)),
    )
    assert len(result.report.acceptance) == 4 and result.report.optimizer_steps > 0
    after = verify_bundle(published[0])  # every listed file's sha256 holds
    assert after.extras["drafter"]["adapted"] == 1
    d_file = before.graphs["drafter"].file
    assert after.files[d_file].sha256 != before.files[d_file].sha256
    assert after.files["target.onnx"] == before.files["target.onnx"]
    ids = torch.tensor([1, 5, 9, 14])
    runtime = load_model(bundle, "drafter").forward(ids, 0)
    with torch.no_grad():
        eager = result.drafter.forward_train(ids[None])[0]
    torch.testing.assert_close(runtime, eager, atol=1e-4, rtol=1e-4)


def test_adapt_refuses_an_empty_stream(bundle: Path) -> None:
    from omnidraft_deploy.runtime.adapt import adapt_bundle

    from omnidraft_deploy.distill.adapt import AdaptConfig

    with pytest.raises(ValueError, match="at least one prompt"):
        adapt_bundle(bundle, [], AdaptConfig())
    with pytest.raises(ValueError, match="optimizer"):
        AdaptConfig(optimizer="lion")
