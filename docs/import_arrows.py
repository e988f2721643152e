"""The import arrows between the rooms of the house, and whether docs/architecture.md follows them.

    .venv/bin/python docs/import_arrows.py            # the rooms by level, bottom first; exit 1 on
                                                      # a cycle or where the doc drifted
    .venv/bin/python docs/import_arrows.py --modules  # module -> module arrows that cross rooms

A room is a subpackage of ``omnidraft_deploy`` (``runtime/`` and ``exporters/`` install as
``omnidraft_deploy.runtime`` / ``.exporters``); a loose module of the root is its own room. Every
import counts, at module top or inside a function. A room's level is one more than the highest
level of the rooms it imports, so an arrow always points to a lower level; an upward arrow closes a
cycle of rooms and there is no order (``room_levels`` raises ``graphlib.CycleError``).

The doc follows the code when (``doc_drift``): its "Order of rooms" list gives every room at its
level (``N. `room` -> ...``), and the section of each room names each of its modules (a backticked
span holding the module's name). ``tests/core/test_rooms.py`` runs both checks, and plants an
upward import and a drifted doc to see them fail.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
sys.path.insert(0, str(ROOT / "tests" / "core"))
# the layering test owns the module graph (every import, top level or in a function): one walker
from test_layering import installed_modules, module_graph  # type: ignore[import-not-found]  # noqa: E402

Graph = dict[str, set[str]]


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_arrows(graph: Graph) -> Graph:
    """Room -> the other rooms its modules import."""
    deps: Graph = {room(m): set() for m in graph}
    for m, targets in graph.items():
        deps[room(m)] |= {room(t) for t in targets} - {room(m)}
    return deps


def room_levels(graph: Graph) -> dict[str, int]:
    """Room -> its level (1: imports no other room). Raises ``CycleError`` on an upward arrow."""
    deps = room_arrows(graph)
    levels: dict[str, int] = {}
    for r in TopologicalSorter(deps).static_order():
        levels[r] = 1 + max((levels[d] for d in deps[r]), default=0)
    return levels


def doc_levels(text: str) -> dict[str, int]:
    """Room -> level as the doc's numbered "Order of rooms" list states it (``N. `a`, `b` -> ...``:
    the rooms named before the first arrow of each item, or of each line of it)."""
    section = text.split("## Order of rooms", 1)[-1].split("\n## ", 1)[0]
    levels: dict[str, int] = {}
    level = 0
    for line in section.splitlines():
        item = re.match(r"(\d+)\. (.*)", line)
        if item:
            level = int(item.group(1))
            line = item.group(2)
        elif not line.startswith("   `"):
            continue
        for name in re.findall(r"`([\w.]+)`", line.split("->", 1)[0]):
            levels[name] = level
    return levels


def room_sections(text: str) -> dict[str, str]:
    """Room -> the text of the ``### `room/` ...`` section(s) whose heading names it."""
    found: dict[str, str] = defaultdict(str)
    for part in re.split(r"\n(?=### )", text):
        heading = part.split("\n", 1)[0]
        if heading.startswith("### "):
            for name in re.findall(r"`(\w+)/?`", heading):
                found[name] += part
    return found


def doc_drift(graph: Graph, modules: dict[str, Path], text: str) -> list[str]:
    """Where the doc ``text`` disagrees with the code: a room missing from the order or at another
    level than the code's, a module its room's section does not name."""
    code, doc = room_levels(graph), doc_levels(text)
    bad = [f"room {r}: level {doc.get(r, 'missing')} in the doc, {lv} in the code"
           for r, lv in sorted(code.items()) if doc.get(r) != lv]  # fmt: skip
    bad += [f"room {r}: in the doc's order, not in the code" for r in sorted(set(doc) - set(code))]
    sections = room_sections(text)
    for module, path in sorted(modules.items()):
        name = path.parent.name if path.stem == "__init__" else path.stem
        if path.stem == "__init__" and module.count(".") < 2:
            continue  # a room's own package
        if not re.search(rf"`[^`\n]*\b{re.escape(name)}\b[^`\n]*`", sections.get(room(module), "")):
            bad.append(f"module {module}: not named in the section of room {room(module)}")
    return bad


def main(argv: list[str]) -> int:
    graph = module_graph()
    if "--modules" in argv:
        arrows = sorted((m, t) for m, ts in graph.items() for t in ts if room(m) != room(t))
        print("\n".join(f"{m} -> {t}" for m, t in arrows))
        return 0
    try:
        levels = room_levels(graph)
    except CycleError as e:
        print(f"rooms in a cycle (an upward arrow): {e.args[1]}")
        return 1
    deps = room_arrows(graph)
    for r in sorted(levels, key=lambda r: (levels[r], r)):
        print(f"{levels[r]:2}. {r:18} -> {', '.join(sorted(deps[r])) or '(nothing)'}")
    drift = doc_drift(graph, installed_modules(), DOC.read_text("utf-8"))
    print(*(f"docs/architecture.md: {d}" for d in drift), sep="\n")
    return 1 if drift else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
