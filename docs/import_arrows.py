"""Print the import arrows between the rooms of the house (docs/architecture.md is derived from it).

    .venv/bin/python docs/import_arrows.py            # room -> rooms it imports, bottom room first
    .venv/bin/python docs/import_arrows.py --modules  # module -> module arrows that cross rooms

A room is a subpackage of ``omnidraft_deploy`` (``runtime/`` and ``exporters/`` install as
``omnidraft_deploy.runtime`` / ``.exporters``); a loose module of the root is its own room. Every
import counts, at module top or inside a function. Arrows inside a room are not printed.
"""

from __future__ import annotations

import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "core"))
# the layering test owns the module graph (every import, top level or in a function): one walker
from test_layering import module_graph  # type: ignore[import-not-found]  # noqa: E402


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def main(argv: list[str]) -> int:
    graph = module_graph()
    arrows = {(m, t) for m, targets in graph.items() for t in targets if room(m) != room(t)}
    if "--modules" in argv:
        print("\n".join(f"{m} -> {t}" for m, t in sorted(arrows)))
        return 0
    deps: dict[str, set[str]] = {room(m): set() for m in graph}
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
