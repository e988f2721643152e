"""``omnidraft-export --target A,B,C``: one bundle, one drafter, several targets (issue 30).

``export_multi(cfg)`` exports each target with the drafter through the one export path
(``export.export_pair``: each target's graph verified against its eager model, its tokenizer,
vocabulary map, seeded n-gram cache and ``expected.json`` recorded, the staged pair opened by the
caller's opener) into a scratch folder inside the staging folder of the final bundle. The drafter
is exported and verified once, with the first target; the later separate bundles link its graph
files (``export_bundle(drafter_from=...)``). These are exactly the separate bundles a user would
otherwise ship. Then it assembles the multi-target
bundle (layout and schema 2: ``bundle.manifest``):

- the drafter's graph files and tokenizer once, from the first separate bundle; every other
  separate bundle must hold the same drafter (graph description and tokenizer bytes) or the
  export is refused;
- per target, its graph files, tokenizer, n-gram cache and ``expected.json`` under
  ``targets/<name>/``; its vocabulary map under ``maps/`` named by the sha256 of its bytes, so
  targets of one vocabulary share one map file;
- ``extras.sharing``: the listed bytes of the separate bundles, of this one, and the difference
  (bytes saved), measured on the very files written, not estimated.

The scratch folder is removed before the staging folder is renamed into place
(``folder.atomic_bundle_dir``): a failure or kill leaves the previous bundle at ``out_dir``. The
drafter's ONNX metadata ``omnidraft.bundle_hash`` names the first target's map (each separate
export stamps its own); no reader acts on it for ONNX graphs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.bundle import ExportConfig, Verify, open_staged
from omnidraft_deploy.exporters.export import export_pair

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.folder import atomic_bundle_dir, read_manifest
from omnidraft_deploy.bundle.manifest import MANIFEST_NAME, MULTI_TARGET_VERSION, Manifest
from omnidraft_deploy.bundle.sections import FileEntry, TargetInfo, check_relpath
from omnidraft_deploy.resolve.export_inputs import ExportInputs

log = logging.getLogger(__name__)
SCRATCH = ".separate"  # the separate bundles, inside the staging folder
SHARED_EXTRAS = ("seed", "max_seq_len", "verified", "runtime_versions", "drafter", "drafter_model")


@dataclass(frozen=True)
class MultiExportConfig:
    """``omnidraft-export --target A,B,C``: ``base`` says everything but the targets (its own
    ``target`` is the first); every target is a preset name, its own name in the bundle."""

    base: ExportConfig
    targets: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.targets) < 2 or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"--target {','.join(self.targets)}: a multi-target bundle needs two "
                             "or more different targets")  # fmt: skip
        if self.base.backend != "onnx":
            raise ValueError(f"--backend {self.base.backend}: multi-target bundles are written "
                             "for the onnx backend only (issue 30)")  # fmt: skip
        if self.base.target_model is not None:
            raise ValueError("--model names one target's weights; with several targets each "
                             "target's preset supplies its weights")  # fmt: skip
        for name in self.targets:
            check_relpath("target", name)  # a folder name of the bundle
            dataclasses.replace(self.base, target=name)  # KeyError listing the valid presets

    def target_config(self, name: str, out_dir: Path) -> ExportConfig:
        return dataclasses.replace(self.base, target=name, out_dir=out_dir)


def export_multi(
    cfg: MultiExportConfig, inputs: Sequence[ExportInputs] | None = None, *,
    verify: Verify | None = None, opener: Callable[[Path], Any] | None = None,
) -> Path:  # fmt: skip
    """Write the multi-target bundle at ``cfg.base.out_dir`` (module docstring); return it.

    ``inputs``: per target, the checked inputs of ``resolve_export`` (None: resolved here).
    ``verify``: as ``export_pair``'s. ``opener(folder)`` raises to refuse a bundle: it opens each
    staged separate bundle and then the staged multi-target bundle (the CLI passes the runtime's
    ``check_every_target``)."""
    out = Path(cfg.base.out_dir)
    with atomic_bundle_dir(out) as tmp:
        separate: dict[str, Path] = {}
        for i, name in enumerate(cfg.targets):
            one = cfg.target_config(name, tmp / SCRATCH / name)
            separate[name] = export_pair(
                one, None if inputs is None else inputs[i], verify=verify, opener=opener,
                drafter_from=next(iter(separate.values()), None),
            )  # fmt: skip
        manifest = assemble(tmp, separate, draft_len=cfg.base.draft_len)
        shutil.rmtree(tmp / SCRATCH)
        write_text_atomic(tmp / MANIFEST_NAME, manifest.to_json())
        if opener is not None:
            open_staged(tmp, [*manifest.files, MANIFEST_NAME], out.name, opener)
    sharing = manifest.extras["sharing"]
    log.info("multi-target bundle written to %s (%d bytes saved)", out, sharing["saved_bytes"])
    return out


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # the scratch folder is removed: the link keeps the bytes, no copy
    except OSError:
        shutil.copyfile(src, dst)


def _place(rel: str, entry: FileEntry, name: str) -> str | None:
    """Where a separate bundle's file goes in the multi-target bundle (None: the vocabulary
    map, placed by content; the drafter's files keep their names)."""
    if rel.startswith("drafter"):
        return rel
    if entry.role == "vocab_map":
        return None
    if rel.startswith("target") or rel in ("ngram_cache.bin", "expected.json"):
        return f"targets/{name}/{rel}"
    raise ValueError(f"{rel}: a file this assembler does not know where to put (role "
                     f"{entry.role!r})")  # fmt: skip


def _same_drafter(first: Manifest, other: Manifest, name: str) -> None:
    """The drafter of every separate bundle is the one shipped (the export's own check)."""
    a, b = first.graphs["drafter"], other.graphs["drafter"]
    if dataclasses.replace(a, parity={}) != dataclasses.replace(b, parity={}):
        raise ValueError(f"target {name}: its export's drafter graph differs from the first's")
    tok = {r: e.sha256 for r, e in first.files.items() if r.startswith("drafter_tokenizer/")}
    if tok != {r: e.sha256 for r, e in other.files.items() if r.startswith("drafter_tokenizer/")}:
        raise ValueError(f"target {name}: its export's drafter tokenizer differs from the first's")


def assemble(tmp: Path, separate: dict[str, Path], *, draft_len: int) -> Manifest:
    """Link the separate bundles' files into ``tmp`` (module docstring); the manifest to write."""
    manifests = {name: read_manifest(path) for name, path in separate.items()}
    first_name = next(iter(manifests))
    first = manifests[first_name]
    roles: dict[str, str] = {}
    targets: dict[str, TargetInfo] = {}
    for name, m in manifests.items():
        _same_drafter(first, m, name)
        vocab_map = ""
        for rel, entry in m.files.items():
            dst = _place(rel, entry, name)
            if dst is None:
                vocab_map = dst = f"maps/{entry.sha256[:16]}.bin"
            if dst.startswith("drafter") and name != first_name:
                continue
            if not (tmp / dst).exists():  # a shared map: the first target's copy
                _copy(separate[name] / rel, tmp / dst)
            roles[dst] = entry.role
        g = m.graphs["target"]
        targets[name] = TargetInfo(
            graph=dataclasses.replace(g, file=f"targets/{name}/{g.file}"),
            mapping_hash=m.mapping_hash, vocab_map=vocab_map,
            ngram_cache=f"targets/{name}/ngram_cache.bin",
            tokenizer=f"targets/{name}/target_tokenizer",
            expected=f"targets/{name}/expected.json",
        )  # fmt: skip
    files = {rel: file_entry(tmp, rel, role) for rel, role in sorted(roles.items())}
    return Manifest(
        backend=first.backend, draft_len=draft_len, mapping_hash=combined_hash(targets),
        graphs={"drafter": first.graphs["drafter"]}, files=files, targets=targets,
        extras=_extras(manifests, files), schema_version=MULTI_TARGET_VERSION,
    )  # fmt: skip


def combined_hash(targets: dict[str, TargetInfo]) -> str:
    """A multi-target bundle's ``mapping_hash``: over its targets' names and map hashes."""
    lines = "".join(f"{n}:{t.mapping_hash}\n" for n, t in sorted(targets.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def _extras(manifests: dict[str, Manifest], files: dict[str, FileEntry]) -> dict[str, Any]:
    """The first export's shared facts, each target's own, and what sharing saved."""
    first = next(iter(manifests.values()))
    separate = {n: sum(e.size for e in m.files.values()) for n, m in manifests.items()}
    listed = sum(e.size for e in files.values())
    sharing = {
        "separate_bytes": sum(separate.values()), "bundle_bytes": listed,
        "saved_bytes": sum(separate.values()) - listed, "separate_bundle_bytes": separate,
        "vocab_maps": len({r for r, e in files.items() if e.role == "vocab_map"}),
        "what": "listed file bytes (manifests excluded) of the separate single-target bundles "
                "this export verified, minus this bundle's",
    }  # fmt: skip
    return {
        **{k: first.extras[k] for k in SHARED_EXTRAS if k in first.extras},
        "targets": {n: {"target": m.extras.get("target"), "target_model": m.extras.get(
            "target_model")} for n, m in manifests.items()},
        "sharing": sharing,
    }  # fmt: skip
