"""Shared test helpers. Asset policy: tokenizer assets are required (CI runs
``omnidraft assets fetch`` before pytest), so a missing one FAILS with the fix; the optional model
assets (SmolLM2-135M, Qwen2.5-0.5B GGUF) SKIP when absent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def require_asset_path(name: str) -> Path:
    """Path of a cached asset: fail (default assets) or skip (optional models) if missing."""
    from omnidraft_deploy.catalog.assets import AssetError, asset_path, get_asset

    try:
        return asset_path(name)
    except AssetError as e:
        if get_asset(name).optional:
            pytest.skip(
                f"optional model asset {name!r} not cached: `omnidraft assets fetch --models`"
            )
        pytest.fail(f"{e}\n(CI must run `omnidraft assets fetch` before pytest)", pytrace=False)


@pytest.fixture(scope="session")
def require_asset() -> Callable[[str], Path]:
    """``require_asset("vocab-llama-spm-gguf") -> Path``; see ``require_asset_path``."""
    return require_asset_path


@pytest.fixture(scope="session")
def cli_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny ONNX bundle exported through ``omnidraft-export`` (no parity run: graph parity
    has its own tests), shared by the CLI, hash-record and layering tests; copy it to change it."""
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.cli.main import export_main

    out = tmp_path_factory.mktemp("cli") / "tiny-onnx"
    args = ["--backend", "onnx", "--out", str(out), "--max-seq-len", "48", "--draft-len", "3"]
    assert export_main([*args, "--no-verify"]) == 0
    return out


MULTI_TARGETS = ("tiny-llama3-8b", "tiny-qwen2-7b", "tiny-vicuna-7b")  # three vocabularies


@pytest.fixture(scope="session")
def multi_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One multi-target tiny ONNX bundle (issue 30: one drafter, ``MULTI_TARGETS``), exported as a
    user types it, shared by the multi-target tests and the Android core's golden-trace replay
    (``omnidraft_deploy.golden.write.MULTI`` records at its settings); copy it to change it."""
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.cli.main import export_main

    out = tmp_path_factory.mktemp("multi") / "three"
    args = ["--target", ",".join(MULTI_TARGETS), "--backend", "onnx", "--out", str(out),
            "--max-seq-len", "48", "--draft-len", "3", "--no-verify"]  # fmt: skip
    assert export_main(args) == 0
    return out


@pytest.fixture(autouse=True)
def _exports_open_before_publishing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: every bundle a test writes through the one export path
    (``exporters.export.export_pair``) is opened with the runtime's opener (``open_bundle``:
    every check, then both graphs' sessions) before it is published, so no test passes on a
    bundle that the runtime would refuse. The CLI passes ``check_bundle`` the same way."""
    from omnidraft_deploy.exporters import export

    real = export.export_bundle

    def export_bundle(cfg: Any, **kw: Any) -> Path:
        given = kw.pop("opener", None)

        def opener(staged: Path) -> None:
            from omnidraft_deploy.runtime.bundle import open_bundle

            if given is not None:
                given(staged)
            open_bundle(staged)

        return real(cfg, opener=opener, **kw)

    monkeypatch.setattr(export, "export_bundle", export_bundle)
