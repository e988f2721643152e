"""The rooms point down, and docs/architecture.md follows them (``docs/import_arrows.py``).

The room order is computed from the code (every import, top level or in a function); an upward
arrow closes a cycle of rooms and leaves no order. The doc states each room's level and names each
module in its room's section. Both checks are shown to fail: on a planted upward import and on a
drifted copy of the doc.
"""

from __future__ import annotations

import ast
import importlib.util
from graphlib import CycleError
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _arrows() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_arrows", ROOT / "docs" / "import_arrows.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ia = _arrows()


def test_the_rooms_point_down_and_the_doc_follows_them() -> None:
    graph = ia.module_graph()
    levels = ia.room_levels(graph)  # raises CycleError on an upward arrow
    for r, deps in ia.room_arrows(graph).items():
        assert all(levels[d] < levels[r] for d in deps), r
    assert ia.doc_drift(graph, ia.installed_modules(), ia.DOC.read_text("utf-8")) == []
    assert ia.main([]) == 0


def test_a_planted_upward_import_leaves_no_order() -> None:
    """A lazy import of the CLI from the bundle format, walked as any module is walked."""
    graph = ia.module_graph()
    planted = "def check():\n    from omnidraft_deploy.cli.main import main\n    return main\n"
    from test_layering import _targets  # type: ignore[import-not-found]

    graph["omnidraft_deploy.bundle.planted"] = _targets(ast.parse(planted), set(graph))
    assert graph["omnidraft_deploy.bundle.planted"] == {"omnidraft_deploy.cli.main"}
    with pytest.raises(CycleError):
        ia.room_levels(graph)


def test_a_drifted_doc_is_named() -> None:
    graph, modules = ia.module_graph(), ia.installed_modules()
    text = ia.DOC.read_text("utf-8")
    assert "2. `bundle` -> " in text and "`onnx_meta.py`" in text
    drifted = text.replace("2. `bundle` -> ", "3. `bundle` -> ").replace("`onnx_meta.py`", "`x.py`")
    bad = ia.doc_drift(graph, modules, drifted)
    assert "room bundle: level 3 in the doc, 2 in the code" in bad
    assert "module omnidraft_deploy.bundle.onnx_meta: not named in the section of room bundle" in bad


def test_the_doc_levels_read_every_line_of_an_item() -> None:
    text = "## Order of rooms\n\n1. `a`, `b` -> nothing.\n   `c` -> nothing (`x`).\n2. `d` -> a.\n"
    assert ia.doc_levels(text) == {"a": 1, "b": 1, "c": 1, "d": 2}
