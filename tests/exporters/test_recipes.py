"""Recipes as data (issue 27): every recipe's fields, one registered package per backend family,
quantisation maths below the recipes, and a recipe added from a test exported end to end."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest
from omnidraft_deploy.exporters import EXPORTERS

from omnidraft_deploy.catalog.backends import (
    BACKENDS,
    RECIPES,
    Activations,
    Backend,
    QuantRecipe,
    bytes_per_param,
    recipe_names,
)

ROOT = Path(__file__).resolve().parents[2]
EXPORTERS_DIR = ROOT / "exporters"


def test_every_registered_recipe_has_its_bytes_per_parameter() -> None:
    sizes = bytes_per_param()
    assert set(sizes) == {name for _, name in RECIPES}  # qdq-*, int8w, *-emb8 included
    for r in RECIPES.values():
        assert r.bytes_per_param > 0 and sizes[r.name] == r.bytes_per_param  # one value a name
    assert sizes["fp32"] == 4.0 and sizes["int4"] < sizes["int8"] < sizes["fp32"]
    with pytest.raises(ValueError, match="bytes_per_param"):
        QuantRecipe("x", Backend.ONNX, 1.0, 0.5)


def test_recipe_fields_say_what_the_names_used_to() -> None:
    def r(backend: str, name: str) -> QuantRecipe:
        return RECIPES[(Backend(backend), name)]

    assert not r("onnx", "fp32").quantized and r("onnx", "int8").quantized
    assert r("onnx", "w8a8").activations is Activations.ROWS and r("onnx", "w8a8").smooth
    assert r("onnx", "int8-dyn").activations is Activations.DYNAMIC
    assert not r("onnx", "int8-dyn").fused  # traced + ORT's quantize_dynamic only
    invariant = {n for n in recipe_names("onnx") if r("onnx", n).batch_invariant}
    assert invariant == {"int8", "int4", "w8a8", "gguf4"}
    assert r("qnn", "qdq-a16w8").activation_bits == 16 and r("qnn", "qdq-u8").activation_bits == 8
    assert {n: r("onnx", n).weight_bits for n in ("fp32", "int8", "int4")} == {
        "fp32": 32, "int8": 8, "int4": 4,
    }  # fmt: skip


def test_each_backend_package_registers_its_exporter() -> None:
    for info in BACKENDS.values():
        module = importlib.import_module(info.module)
        assert EXPORTERS[info.backend.value].__module__ == module.__name__


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def test_quant_maths_imports_no_recipe_package() -> None:
    """Arrows run downward: recipe packages import ``exporters.quant``, never the reverse (the
    int4 grid maths used to live in the ONNX writer, which imported the int4 plan back)."""
    recipes = tuple(f"omnidraft_deploy.exporters.{p}" for p in ("onnx", "qnn", "xnnpack"))
    bad = [
        f"{path.name} imports {m}"
        for path in sorted((EXPORTERS_DIR / "quant").glob("*.py"))
        for m in sorted(_imports(path))
        if m.startswith(recipes)
    ]
    assert bad == []


def test_exporters_read_recipe_fields_not_names() -> None:
    """No ``recipe.name == "w8a8"``-style test: a new recipe is a row of fields."""
    names = {name for _, name in RECIPES}
    bad = []
    for path in sorted(EXPORTERS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            consts = {
                c.value
                for s in sides
                for c in ast.walk(s)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
            named = any(isinstance(s, ast.Attribute) and s.attr == "name" for s in sides)
            if named and consts & names:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


def test_a_recipe_added_in_a_test_exports_a_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a recipe is a row of the table: an fp32 ONNX twin under a new name exports a
    verified bundle through the normal entry point (and opens: conftest), then leaves."""
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair

    key = (Backend.ONNX, "fp32-twin")
    twin = QuantRecipe("fp32-twin", Backend.ONNX, 1e-3, 1.0, 4.0, fused=True)
    monkeypatch.setitem(RECIPES, key, twin)
    assert "fp32-twin" in recipe_names("onnx")
    cfg = ExportConfig(target="tiny-llama3-8b", drafter="tiny-llama-68m", backend="onnx",
                       quantization="fp32-twin", out_dir=tmp_path / "b", max_seq_len=32,
                       draft_len=3)  # fmt: skip
    bundle = export_pair(cfg)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for role in ("drafter", "target"):
        assert manifest["graphs"][role]["quantization"] == "fp32-twin"
        assert manifest["graphs"][role]["parity"]["max_abs_logit_diff"] < 1e-3
    # read from the fields as fp32 is: a swappable drafter, a fused (not invariant) target
    assert manifest["extras"]["drafter"]["onnx"]["weights_swappable"] is True
    assert manifest["extras"]["target"]["onnx"]["fused"] is True
    monkeypatch.undo()
    assert key not in RECIPES and "fp32-twin" not in recipe_names("onnx")


def test_every_recipe_package_ships_in_the_wheel() -> None:
    import tomllib

    packages = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    for init in sorted(EXPORTERS_DIR.rglob("__init__.py")):
        rel = init.parent.relative_to(EXPORTERS_DIR).parts
        assert ".".join(("omnidraft_deploy", "exporters", *rel)) in packages


def test_gguf_weights_default_to_their_own_blocks_on_xnnpack() -> None:
    from omnidraft_deploy.catalog.backends import default_quantization

    assert default_quantization("xnnpack", True, True) == ("gguf4", "gguf4")
    assert default_quantization("xnnpack", True, False) == ("gguf4", "fp32")
    assert default_quantization("onnx", True, True) == ("fp32", "fp32")  # no GGUF default there
    with pytest.raises(KeyError, match="choose from"):
        default_quantization("tpu", True, True)


def test_the_export_says_which_default_it_chose(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from omnidraft_deploy.cli.main import _default_quantization

    args = argparse.Namespace(backend="xnnpack", model="/m/Qwen2.5-Coder-1.5B-Q4_K_M.gguf",
                              target=None, drafter_model=None, drafter="smollm2-135m")  # fmt: skip
    assert _default_quantization(args) == "gguf4,gguf4"  # SmolLM2's preset is pinned to a GGUF
    assert "--quantization gguf4,gguf4" in capsys.readouterr().err
    args = argparse.Namespace(backend="xnnpack", model=None, target="tiny-llama3-8b",
                              drafter_model=None, drafter=None)  # fmt: skip
    assert _default_quantization(args) == "fp32,fp32"
    assert capsys.readouterr().err == ""


def test_a_gguf_recipe_reads_the_users_own_file_else_the_pinned_one(tmp_path: Path) -> None:
    import dataclasses

    from omnidraft_deploy.exporters.quant.gguf_grid import gguf_file

    from omnidraft_deploy.catalog.presets import get_preset

    tiny = get_preset("tiny-qwen2-7b")
    own = dataclasses.replace(tiny, gguf_path=str(tmp_path / "mine.gguf"))
    assert gguf_file(own) == tmp_path / "mine.gguf"
    with pytest.raises(ValueError, match=r"--model X\.gguf"):
        gguf_file(tiny)
