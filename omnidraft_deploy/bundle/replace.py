"""What an export may replace at its output folder: the files it can prove are the bundle's.

An export swaps a whole staged folder into its output folder (``folder.atomic_bundle_dir``), so
everything there is gone afterwards. A file there is the bundle's only when the manifest at that
folder lists it *and* the file has the size and sha256 listed (``proven_files``); a name alone
proves nothing (a ``manifest.json`` copied into a folder of the user's own files names them too).
``foreign_entries`` lists everything else, which ``resolve.out_dir.check_out_dir`` refuses before
an export starts and ``refuse_foreign`` again right before the swap (a file saved into the folder
while the export ran is the user's too).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omnidraft_deploy.bundle.manifest import BundleError


def our_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest at ``out`` when it reads as one of our bundles' (even a damaged or newer
    one: only its ``files`` entries are used), else None."""
    from omnidraft_deploy.bundle.manifest import (
        FORMAT_NAME,
        MANIFEST_NAME,
        MAX_JSON_DEPTH,
        MAX_MANIFEST_BYTES,
    )
    from omnidraft_deploy.bundle.strict_json import parse_strict

    path = out / MANIFEST_NAME
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_MANIFEST_BYTES:
        return None
    try:
        manifest = parse_strict(path.read_text(encoding="utf-8"), max_depth=MAX_JSON_DEPTH)
    except (OSError, ValueError):  # unreadable, not UTF-8 / JSON, nested, duplicate keys, NaN
        return None
    ours = isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME
    return manifest if ours else None


def proven_files(out: Path, files: object) -> set[str]:
    """The listed files of ``files`` (a manifest's, as parsed) that are plain files at ``out``
    with the listed size and sha256: what the export may replace as the bundle's own."""
    from omnidraft_deploy.bundle.files import sha256_file
    from omnidraft_deploy.bundle.sections import check_relpath

    proven: set[str] = set()
    for rel, entry in files.items() if isinstance(files, dict) else ():
        try:
            path = out / check_relpath("files", rel)  # never a file outside ``out``
        except ValueError:
            continue
        if not isinstance(entry, dict) or path.is_symlink() or not path.is_file():
            continue
        if entry.get("size") == path.stat().st_size and entry.get("sha256") == sha256_file(path):
            proven.add(str(rel))
    return proven


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


def refuse_foreign(out: Path) -> None:
    """``BundleError`` when ``out`` holds anything but our bundle's proven files (or nothing);
    the last check before an export replaces ``out`` (module docstring)."""
    if not out.is_dir() or out.is_symlink() or not any(out.iterdir()):
        return
    manifest = our_manifest(out)
    foreign = foreign_entries(out, proven_files(out, manifest.get("files") if manifest else None))
    if manifest is None or foreign:
        shown = ", ".join(foreign[:5]) if manifest else "it holds no bundle of ours"
        raise BundleError(out, f"changed while the export ran ({shown}): not replaced; the new "
                          "bundle was not published")  # fmt: skip
