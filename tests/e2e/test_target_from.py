"""``omnidraft-export --target-from BUNDLE``: a new drafter (e.g. one distilled for this target) for
a target exported once. The target graph files, their description and ``expected.json`` come from
the bundle unchanged; only the drafter is exported; a bundle of other weights, another recipe or
another context is refused naming what differs, and nothing is published."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_weights import VOCAB_GGUF, tiny_hf_folder

from omnidraft_deploy.cli.main import export_main


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, require_asset: Callable) -> dict[str, Path]:
    """A tiny Qwen2 target, two tiny Llama-2 drafters of other weights, and bundle A of the first."""
    pytest.importorskip("onnxruntime")
    for kind in ("qwen2", "llama2"):
        require_asset(VOCAB_GGUF[kind])
    root = tmp_path_factory.mktemp("target-from")
    out = {"target": tiny_hf_folder(root / "Tiny-Qwen2", "qwen2", seed=1),
           "d1": tiny_hf_folder(root / "Tiny-Llama-A", "llama2", seed=2),
           "d2": tiny_hf_folder(root / "Tiny-Llama-B", "llama2", seed=3)}  # fmt: skip
    out["a"] = root / "a"
    assert export_main([*_args(out, "d1", out["a"]), "--reference-prompts", "2"]) == 0
    return out


def _args(p: dict[str, Path], drafter: str, out: Path) -> list[str]:
    return ["--model", str(p["target"]), "--drafter-model", str(p[drafter]), "--backend", "onnx",
            "--max-seq-len", "64", "--out", str(out)]  # fmt: skip


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def test_the_target_is_reused_and_only_the_drafter_exported(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    b = tmp_path / "b"
    assert export_main([*_args(pair, "d2", b), "--target-from", str(pair["a"])]) == 0
    ma, mb = _manifest(pair["a"]), _manifest(b)
    assert mb["graphs"]["target"] == ma["graphs"]["target"]
    target_files = [rel for rel in ma["files"] if rel.startswith("target") and "/" not in rel]
    assert target_files and all(mb["files"][r] == ma["files"][r] for r in target_files)
    assert mb["files"]["expected.json"] == ma["files"]["expected.json"]
    assert (b / "expected.json").read_bytes() == (pair["a"] / "expected.json").read_bytes()
    assert mb["files"]["drafter.onnx"]["sha256"] != ma["files"]["drafter.onnx"]["sha256"]
    assert mb["extras"]["target_from"] == str(pair["a"])
    assert mb["extras"]["target"] == ma["extras"]["target"]  # the target's export facts
    assert mb["extras"]["drafter_model"] != ma["extras"]["drafter_model"]
    if os.name == "posix":  # hard-linked, not copied, where the file system allows
        assert (b / "target.onnx").stat().st_ino == (pair["a"] / "target.onnx").stat().st_ino


@pytest.mark.parametrize(
    ("change", "problem"),
    [(["--max-seq-len", "96"], "max_seq_len 64 (wanted 96)"),
     (["--quantization", "int8"], "recipe 'fp32' (wanted 'int8')")],
)  # fmt: skip
def test_another_graph_is_refused_naming_what_differs(
    pair: dict[str, Path], tmp_path: Path, change: list[str], problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    b = tmp_path / "b"
    assert export_main([*_args(pair, "d2", b), *change, "--target-from", str(pair["a"])]) != 0
    err = capsys.readouterr().err
    assert "its target graph is not the one asked for" in err and problem in err
    assert not b.exists()


def test_a_folder_that_is_not_a_bundle_is_refused_before_any_work(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = tmp_path / "b"
    assert export_main([*_args(pair, "d2", b), "--target-from", str(tmp_path)]) != 0
    assert "--target-from" in capsys.readouterr().err and not b.exists()


def test_drafter_from_reuses_the_drafter_and_exports_the_target_again(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    """``--drafter-from``: the same pair under another target recipe; the drafter graph and its
    description come from the bundle, the target (and ``expected.json``) are exported anew."""
    b = tmp_path / "b"
    args = [*_args(pair, "d1", b), "--quantization", "int8,fp32", "--reference-prompts", "2"]
    assert export_main([*args, "--drafter-from", str(pair["a"])]) == 0
    ma, mb = _manifest(pair["a"]), _manifest(b)
    assert mb["graphs"]["drafter"] == ma["graphs"]["drafter"]
    assert mb["files"]["drafter.onnx"] == ma["files"]["drafter.onnx"]
    assert mb["graphs"]["target"]["quantization"] == "int8"
    assert mb["files"]["target.onnx"]["sha256"] != ma["files"]["target.onnx"]["sha256"]
    assert mb["extras"]["drafter_from"] == str(pair["a"])


def test_drafter_from_and_target_from_together_are_refused(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = tmp_path / "b"
    a = str(pair["a"])
    assert export_main([*_args(pair, "d1", b), "--drafter-from", a, "--target-from", a]) != 0
    assert "nothing left to export" in capsys.readouterr().err and not b.exists()
