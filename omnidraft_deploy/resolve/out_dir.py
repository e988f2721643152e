"""``omnidraft-export --out DIR``: never delete what is not the bundle's.

An export publishes its bundle by swapping a whole staged folder into ``DIR``
(``bundle.folder.atomic_bundle_dir``), so whatever ``DIR`` holds is gone afterwards. So
``check_out_dir`` accepts only a new or empty folder, or, with ``--force``, a folder holding one
of our bundles and nothing else: every file in it must be ``manifest.json`` or listed in that
manifest's ``files``. Anything else (a user's notes, a file copied into a bundle, a folder with a
copied ``manifest.json``) is refused, naming those files, and nothing in ``DIR`` is touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """A flag's value cannot be used; ``str()`` is one paragraph naming the flag."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")


def _our_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest at ``out`` when it reads as one of our bundles' (even a damaged or newer
    one), else None."""
    from omnidraft_deploy.bundle.manifest import FORMAT_NAME, MANIFEST_NAME

    path = out / MANIFEST_NAME
    if path.is_symlink():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ours = isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME
    return manifest if ours else None


def foreign_entries(out: Path, listed: set[str]) -> list[str]:
    """Paths under ``out`` (relative, ``/``-separated; folders end in ``/``) that are neither
    ``manifest.json`` nor a file ``listed``: links, other files and folders that hold no listed
    file."""
    from omnidraft_deploy.bundle.manifest import MANIFEST_NAME

    keep = listed | {MANIFEST_NAME}
    parents = {p for rel in keep for p in _parents(rel)}
    foreign = []
    for top, dirs, files in os.walk(out):
        base = Path(top).relative_to(out).as_posix()
        for d in sorted(dirs):
            rel = d if base == "." else f"{base}/{d}"
            if rel not in parents or (Path(top) / d).is_symlink():
                foreign.append(rel + "/")
        dirs[:] = [d for d in dirs if (d if base == "." else f"{base}/{d}") in parents]
        for f in sorted(files):
            rel = f if base == "." else f"{base}/{f}"
            if rel not in keep or (Path(top) / f).is_symlink():
                foreign.append(rel)
    return sorted(foreign)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def check_out_dir(out: Path, *, force: bool) -> bool:
    """Refuse a non-empty ``out`` that is not only our bundle, or a bundle without ``force``
    (module docstring). Returns True when ``out`` holds a bundle that the export will replace.
    Never modifies ``out``."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError("--out", f"{out} exists and is not a folder; choose a new folder.")
    if not out.exists() or not any(out.iterdir()):
        return False
    manifest = _our_manifest(out)
    if manifest is None:
        names = sorted(p.name for p in out.iterdir())
        raise InputError(
            "--out",
            f"{out} is not empty ({len(names)} entries: {_shown(names)}) and is not an omnidraft "
            "bundle; nothing in it was touched. Choose a new or empty folder for --out.",
        )
    files = manifest.get("files")
    foreign = foreign_entries(out, set(files) if isinstance(files, dict) else set())
    if foreign:
        raise InputError(
            "--out",
            f"{out} holds a bundle and also {len(foreign)} entries its manifest does not list "
            f"({_shown(foreign)}); an export replaces the whole folder, so nothing in it was "
            "touched. Move those files out, or choose another --out.",
        )
    if not force:
        raise InputError(
            "--out",
            f"{out} already holds a {manifest.get('backend')} bundle; pass --force to replace it "
            "(the old one stays in place until the new one is complete), or choose another --out.",
        )
    return True
