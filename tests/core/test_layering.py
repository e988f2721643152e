"""Architecture rules (STYLE.md) as a test, over the library folders (tests are free):

- exporters and runtime never import each other; the core imports neither, except the one
  composition root ``cli/main.py`` (inside its verb handlers);
- one model loader: only ``resolve/load.py`` calls the weight sources (random init, HF / GGUF
  weights, the pretraining cache); the sources themselves are the other allowed files;
- one graph-call contract: graph input / output names are spelled only in
  ``omnidraft_deploy/bundle/graph_contract.py``;
- one backend list: no literal collection of backend names outside ``omnidraft_deploy/catalog/backends.py``;
- one vocabulary assembly: tokenizers + mapper of a pair are built by ``vocab/pair.py`` only;
- no benchmark code in the library: no library module imports ``benchmarks``, and none that no
  entry point reaches serves a benchmark (such a module belongs in ``benchmarks/``).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("omnidraft_deploy", "exporters", "runtime", "benchmarks")
COMPOSITION_ROOTS = frozenset({"omnidraft_deploy/cli/main.py"})
# name -> the modules that may import it: the loader and the weight sources themselves
# (pretraining builds its compact model; ``testing`` builds the fakes' toy models)
LOADER_SOURCES = {
    "build_model": {
        "omnidraft_deploy/resolve/load.py",
        "omnidraft_deploy/distill/pretrain.py",
        "omnidraft_deploy/testing.py",
    },
    "load_preset_weights": {"omnidraft_deploy/resolve/load.py"},
    "load_pretrained": {"omnidraft_deploy/resolve/load.py"},
    "load_hf_folder": {"omnidraft_deploy/resolve/load.py"},
}  # hf_adapter.gguf_to_hf_folder is not listed: it converts files for transformers / GenAI
HF_LOAD = ("omnidraft_deploy.reference.hf_adapter", "load_model")
MAPPER_BUILDERS = {"omnidraft_deploy/vocab/pair.py"}  # build_mapper's callers: the one assembly
CONTRACT = "omnidraft_deploy/bundle/graph_contract.py"
BACKENDS = "omnidraft_deploy/catalog/backends.py"
INSTALLED = {  # folder -> the package it installs as (pyproject's package-dir)
    "omnidraft_deploy": "omnidraft_deploy",
    "runtime": "omnidraft_deploy.runtime",
    "exporters": "omnidraft_deploy.exporters",
}
INSTALLED_FOLDERS = tuple(INSTALLED)
# each cycle from its least module; the exporters' three (quantize <-> onnx_fused <-> int4_plan)
# went with issue 27: the int4 grid maths lives in exporters/quant/, which the ONNX writer imports
KNOWN_CYCLES: dict[str, tuple[str, ...]] = {}
ENTRY_POINTS = ("omnidraft_deploy.cli.main", "omnidraft_deploy.golden",
                "omnidraft_deploy.runtime", "omnidraft_deploy.exporters")  # fmt: skip
BENCHMARKS = "benchmarks"


def _files(folders: tuple[str, ...] = LIBRARY) -> Iterator[tuple[str, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            yield rel, ast.parse(path.read_text(), rel)


def _imports(tree: ast.Module) -> set[tuple[str, str]]:
    """(module, name) of every import (name "" for ``import module``)."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.update((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update((a.name, "") for a in node.names)
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("exporters", ("omnidraft_deploy.runtime",)),
        ("runtime", ("omnidraft_deploy.exporters",)),
        ("omnidraft_deploy", ("omnidraft_deploy.exporters", "omnidraft_deploy.runtime")),
    ],
)
def test_layering(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = [
        f"{rel} imports {module}"
        for rel, tree in _files((folder,))
        if rel not in COMPOSITION_ROOTS
        for module, _ in sorted(_imports(tree))
        if module.startswith(forbidden)
    ]
    assert bad == []


def _loader_violations(rel: str, tree: ast.Module) -> list[str]:
    bad = []
    for module, name in _imports(tree):
        allowed = LOADER_SOURCES.get(name)
        if allowed is not None and rel not in allowed:
            bad.append(f"{rel} imports {name} from {module}: load through resolve.load")
        if (module, name) == HF_LOAD and rel != "omnidraft_deploy/resolve/load.py":
            bad.append(f"{rel} imports hf_adapter.load_model: load through resolve.load")
    return bad


def test_one_model_loader() -> None:
    assert [v for rel, tree in _files() for v in _loader_violations(rel, tree)] == []


def _literal_io_names(tree: ast.Module) -> list[tuple[int, str]]:
    from omnidraft_deploy.bundle import graph_contract as gc

    names = {gc.TOKEN_IDS, gc.INPUT_POS, gc.LOGITS}
    prefixes = tuple(f(0)[:-1] for f in (gc.cache_in, gc.cache_chunk_out, gc.cache_present))
    numbered = re.compile("(" + "|".join(map(re.escape, prefixes)) + r")\d+")  # cache_3, ...
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in names or numbered.fullmatch(node.value):
                hits.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value) in prefixes:
                hits.append((node.lineno, f"{head.value!s}{{...}}"))
    return hits


def test_graph_io_names_live_in_the_contract_module() -> None:
    bad = [
        f"{rel}:{line} spells the graph name {name!r}: use omnidraft_deploy.bundle.graph_contract"
        for rel, tree in _files()
        if rel != CONTRACT
        for line, name in _literal_io_names(tree)
    ]
    assert bad == []


def test_one_backend_list() -> None:
    from omnidraft_deploy.catalog.backends import backend_names

    names, bad = set(backend_names()), []
    for rel, tree in _files():
        for node in ast.walk(tree):
            if rel != BACKENDS and isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                found = {str(e.value) for e in elts if isinstance(e, ast.Constant)} & names
                if len(found) >= 2:
                    bad.append(f"{rel}:{node.lineno} lists backends {sorted(found)}")
    assert bad == []


def test_one_vocabulary_assembly() -> None:
    bad = [
        f"{rel} imports build_mapper: use vocab.pair (PairVocab / load_pair_vocab)"
        for rel, tree in _files()
        if rel not in MAPPER_BUILDERS
        for module, name in _imports(tree)
        if name == "build_mapper" and module == "omnidraft_deploy.vocab.build"
    ]
    assert bad == []


def test_the_checks_see_violations(tmp_path: Path) -> None:
    src = (
        "def g():\n    from omnidraft_deploy.runtime.bundle import open_bundle\n"
        "    from omnidraft_deploy.reference.model import build_model\n"
        "    return {'logits': 1, 'x': f'cache_{g}', 'y': 'present_3', 'z': 'cache_len'}\n"
    )
    tree = ast.parse(src)
    assert ("omnidraft_deploy.runtime.bundle", "open_bundle") in _imports(tree)
    assert len(_loader_violations("exporters/x.py", tree)) == 1
    assert _loader_violations("omnidraft_deploy/resolve/load.py", tree) == []
    assert sorted(v for _, v in _literal_io_names(tree)) == ["cache_{...}", "logits", "present_3"]


def installed_modules() -> dict[str, Path]:
    """Installed module name -> its file."""
    found = {}
    for folder, package in INSTALLED.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def module_graph() -> dict[str, set[str]]:
    """Installed module -> the installed modules it imports anywhere (top level or in a function)."""
    trees = {
        name: ast.parse(path.read_text(), str(path)) for name, path in installed_modules().items()
    }
    return {name: _targets(tree, trees) - {name} for name, tree in trees.items()}


def _targets(tree: ast.Module, known: Collection[str]) -> set[str]:
    """The modules of ``known`` that ``tree`` imports (``from pkg import mod`` names ``pkg.mod``)."""
    found = {f"{m}.{n}" if f"{m}.{n}" in known else m for m, n in _imports(tree)}
    return found & set(known)


def _cycles_through(graph: dict[str, set[str]], start: str) -> Iterator[tuple[str, ...]]:
    """Simple cycles whose least module is ``start`` (each found once)."""
    stack = [(start, (start,))]
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                yield path
            elif nxt > start and nxt not in path:
                stack.append((nxt, (*path, nxt)))


def import_cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    return {c for start in sorted(graph) for c in _cycles_through(graph, start)}


def test_no_import_cycles_but_the_known_ones() -> None:
    known = set(KNOWN_CYCLES.values())
    print("known cycles (owner: recipes):", *(f"  {n}: {' -> '.join(c)}"
                                             for n, c in KNOWN_CYCLES.items()), sep="\n")  # fmt: skip
    cycles = import_cycles(module_graph())
    assert sorted(cycles - known) == [], "new import cycle(s): make the arrows run one way"
    assert sorted(known - cycles) == [], "a known cycle is gone: drop it from KNOWN_CYCLES"


def test_the_cycle_check_sees_lazy_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_cycles(graph) == {("a", "b", "c")}
    tree = ast.parse("def f():\n    from omnidraft_deploy.bundle import files\n")
    assert ("omnidraft_deploy.bundle", "files") in _imports(tree)


def _reachable(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    seen: set[str] = set()
    while roots:
        node = roots.pop()
        if node not in seen:
            seen.add(node)
            roots.extend(graph[node])
    return seen


def benchmark_code_in_library(graph: dict[str, set[str]], library: dict[str, set[str]],
                              benchmarks: dict[str, set[str]]) -> list[str]:  # fmt: skip
    """``graph``: the installed modules' imports; ``library``: library file -> the modules it
    imports; ``benchmarks``: benchmark file -> the library modules it imports."""
    bad = [f"{rel} imports {m}: the library never imports the benchmarks"
           for rel, mods in sorted(library.items()) for m in sorted(mods)
           if m == BENCHMARKS or m.startswith(f"{BENCHMARKS}.")]  # fmt: skip
    reached = _reachable(graph, [m for m in graph if m.startswith(ENTRY_POINTS)])
    reached |= {m.rsplit(".", i)[0] for m in reached for i in range(1, m.count(".") + 1)}
    for module in sorted(set(graph) - reached):  # no command, exporter or runtime path needs it
        users = sorted(rel for rel, mods in benchmarks.items() if module in mods)
        if users:
            bad.append(f"{module} serves only {', '.join(users)}: it belongs in benchmarks/")
    return bad


def test_no_benchmark_code_in_the_library() -> None:
    graph = module_graph()
    library = {rel: {m for m, _ in _imports(tree)} for rel, tree in _files(INSTALLED_FOLDERS)}
    benchmarks = {rel: _targets(tree, graph) for rel, tree in _files((BENCHMARKS,))}
    assert benchmark_code_in_library(graph, library, benchmarks) == []


def test_the_benchmark_check_sees_violations() -> None:
    graph = {"omnidraft_deploy.cli.main": {"omnidraft_deploy.a"}, "omnidraft_deploy.a": set(),
             "omnidraft_deploy.b": set(), "omnidraft_deploy.c": {"omnidraft_deploy.b"}}  # fmt: skip
    library = {"omnidraft_deploy/a.py": {"benchmarks.common.timer", "torch"},
               "omnidraft_deploy/b.py": {"benchmarks_of_another_kind"}}  # fmt: skip
    bench = {"benchmarks/x.py": {"omnidraft_deploy.a", "omnidraft_deploy.c"},
             "benchmarks/y.py": {"omnidraft_deploy.c"}}  # fmt: skip
    assert benchmark_code_in_library(graph, library, bench) == [
        "omnidraft_deploy/a.py imports benchmarks.common.timer: the library never imports the "
        "benchmarks",
        "omnidraft_deploy.c serves only benchmarks/x.py, benchmarks/y.py: it belongs in benchmarks/",
    ]  # b: unreached too, but no benchmark imports it (c does, inside the library)
    tree = ast.parse("def f():\n    from omnidraft_deploy.distill import evaluate\n")
    assert _targets(tree, {"omnidraft_deploy.distill.evaluate"}) == {
        "omnidraft_deploy.distill.evaluate"
    }


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> Counter[str]:
    """Calls of ``module.name``, by their second argument (the file) or as ``"calls"``."""
    calls: Counter[str] = Counter()
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[str(args[1]) if len(args) > 1 else "calls"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("stats", [False, True], ids=["run", "run --stats"])
def test_the_cli_opens_a_bundle_once_per_command(
    cli_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats: bool
) -> None:
    from omnidraft_deploy.runtime import bundle

    from omnidraft_deploy.bundle import folder
    from omnidraft_deploy.cli.main import main

    monkeypatch.delenv("OMNIDRAFT_VERIFY_HASHES", raising=False)
    opened = _counting(monkeypatch, bundle, "open_bundle")
    verified = _counting(monkeypatch, bundle, "verify_bundle")
    hashed = _counting(monkeypatch, folder, "verify_listed")
    args = ["run", str(cli_bundle), "--max-new-tokens", "3", "--state", str(tmp_path)]
    assert main([*args, "--stats"] if stats else args) == 0
    assert opened == {"calls": 1} and verified == {"calls": 1}
    assert set(hashed.values()) == {1}, hashed  # every listed file hashed, once
    hashed.clear()
    monkeypatch.setenv("OMNIDRAFT_VERIFY_HASHES", "1")
    assert main(args) == 0
    assert sum(hashed.values()) == len(hashed) == len(folder.read_manifest(cli_bundle).files)
