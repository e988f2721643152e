"""Dependency rules (STYLE.md): exporters and runtime never import each other; the core imports
neither, except the composition roots ``cli`` and ``commands`` (inside their verb handlers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSITION_ROOTS = frozenset({"cli.py", "commands.py"})


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _violations(
    folder: str, forbidden: tuple[str, ...], skip: frozenset[str] = frozenset()
) -> list[str]:
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path.name in skip:
            continue
        out += [
            f"{path.relative_to(ROOT)} imports {m}"
            for m in sorted(_imports(path))
            if m.startswith(forbidden)
        ]
    return out


@pytest.mark.parametrize(
    ("folder", "forbidden", "skip"),
    [
        ("exporters", ("omnidraft_deploy.runtime",), frozenset()),
        ("runtime", ("omnidraft_deploy.exporters",), frozenset()),
        (
            "omnidraft_deploy",
            ("omnidraft_deploy.exporters", "omnidraft_deploy.runtime"),
            COMPOSITION_ROOTS,
        ),
    ],
)
def test_layering(folder: str, forbidden: tuple[str, ...], skip: frozenset[str]) -> None:
    assert _violations(folder, forbidden, skip) == []


def test_the_check_sees_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from omnidraft_deploy.runtime.bundle import open_bundle\n")
    assert _imports(f) == {"omnidraft_deploy.runtime.bundle"}
