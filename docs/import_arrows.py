"""Print the import arrows between the rooms of the house (docs/architecture.md is derived from it).

    .venv/bin/python docs/import_arrows.py            # room -> rooms it imports, bottom room first
    .venv/bin/python docs/import_arrows.py --modules  # module -> module arrows that cross rooms

A room is a subpackage of ``omnidraft_deploy`` (``runtime/`` and ``exporters/`` install as
``omnidraft_deploy.runtime`` / ``.exporters``); a loose module of the root is its own room. Every
import counts, at module top or inside a function. Arrows inside a room are not printed.
"""

from __future__ import annotations

import ast
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = {"omnidraft_deploy": "omnidraft_deploy", "runtime": "omnidraft_deploy.runtime",
             "exporters": "omnidraft_deploy.exporters"}  # fmt: skip


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in INSTALLED.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                    else node.module for a in node.names}  # fmt: skip
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in known}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def main(argv: list[str]) -> int:
    known = modules()
    arrows = {(m, t) for m, p in known.items() for t in imports(p, known) if room(m) != room(t)}
    if "--modules" in argv:
        print("\n".join(f"{m} -> {t}" for m, t in sorted(arrows)))
        return 0
    deps: dict[str, set[str]] = {room(m): set() for m in known}
    for m, t in arrows:
        deps[room(m)].add(room(t))
    try:
        order = list(TopologicalSorter(deps).static_order())
    except CycleError as e:
        print(f"rooms in a cycle: {e.args[1]}")
        return 1
    for r in order:
        print(f"{r:18} -> {', '.join(sorted(deps[r])) or '(nothing)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
