"""Choosing the target of a bundle: one drafter, one or several targets (issue 30).

A single-target bundle (schema 1) has one target, named by its preset; a multi-target bundle
(schema 2, ``manifest.TargetInfo``) lists its targets by name. ``select(manifest, name)`` gives the
manifest the runtime decodes with: a single-target manifest is returned as it is (``name`` None or
its preset); a multi-target one becomes a one-target view (``graphs.target`` = that target's
graph, ``mapping_hash`` = its map's, ``targets`` = it alone). ``parts(manifest)`` names the files
of the selected target (vocabulary map, n-gram cache, tokenizer folder, ``expected.json``) for
either kind, so no reader spells a file name of its own. With several targets and no name, or an
unknown name, ``select`` raises a ``BundleError`` that lists the targets.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from omnidraft_deploy.bundle.manifest import MANIFEST_NAME, BundleError, Manifest
from omnidraft_deploy.bundle.sections import TargetInfo

# the files of the one target of a single-target bundle (schema 1)
SINGLE = {"vocab_map": "vocab_map.bin", "ngram_cache": "ngram_cache.bin",
          "tokenizer": "target_tokenizer", "expected": "expected.json"}  # fmt: skip
TARGET_FLAG = "--target"


def is_multi(manifest: Manifest) -> bool:
    """Whether ``manifest`` is a multi-target bundle's (or a view of one target of it)."""
    return bool(manifest.targets)


def target_names(manifest: Manifest) -> list[str]:
    """The targets a user can pick: the listed names, or the one target's preset."""
    return sorted(manifest.targets) if manifest.targets else [manifest.graphs["target"].preset]


def select(
    manifest: Manifest, name: str | None, *, source: str | os.PathLike[str] = MANIFEST_NAME
) -> Manifest:
    """The manifest of target ``name`` (module docstring); ``source`` names the manifest file in
    errors. None picks the only target, and is refused with a list where there are several."""
    names = target_names(manifest)
    if name is None and len(names) > 1:
        raise BundleError(source, f"a bundle of {len(names)} targets ({', '.join(names)}): "
                          f"choose one with {TARGET_FLAG} NAME")  # fmt: skip
    if name is not None and name not in names:
        raise BundleError(source, f"no target {name!r} in this bundle; its targets: "
                          f"{', '.join(names)}")  # fmt: skip
    if not manifest.targets or "target" in manifest.graphs:
        return manifest
    picked = name or names[0]
    info = manifest.targets[picked]
    return dataclasses.replace(
        manifest, graphs={**manifest.graphs, "target": info.graph},
        mapping_hash=info.mapping_hash, targets={picked: info},
    )  # fmt: skip


def selected(manifest: Manifest) -> str:
    """The name of the target a selected (or single-target) manifest decodes."""
    if manifest.targets and "target" not in manifest.graphs:
        raise ValueError("a multi-target manifest: select a target first")
    return next(iter(manifest.targets)) if manifest.targets else manifest.graphs["target"].preset


def parts(manifest: Manifest) -> TargetInfo:
    """The selected target's graph and files (``select`` first on a multi-target manifest)."""
    if manifest.targets:
        if "target" not in manifest.graphs:
            raise ValueError("a multi-target manifest: select a target first")
        return next(iter(manifest.targets.values()))
    return TargetInfo(graph=manifest.graphs["target"], mapping_hash=manifest.mapping_hash,
                      **SINGLE)  # fmt: skip


def target_state(state: Path, manifest: Manifest) -> Path:
    """The session folder of the selected target: the bundle's own for a single-target bundle,
    ``<state>/targets/<name>`` for a target of a multi-target bundle (each target grows its own
    n-gram cache and measures its own cost profile)."""
    if not manifest.targets:
        return state
    folder = state / "targets" / selected(manifest)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
