"""A bundle folder on disk: read its manifest, verify the files it lists, stage a new one.

``read_manifest`` parses ``manifest.json`` (schema: ``manifest``) through ``files`` (no symlink,
size-capped); ``verify_bundle`` checks every listed file's size and sha256; ``atomic_bundle_dir``
stages an export beside the final folder and swaps it into place last (``atomic``): a kill at any
instant leaves the previous bundle or the new one at the final path, never neither and never a
partial one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omnidraft_deploy.bundle.atomic import is_ours, recover_dir, staged_dir
from omnidraft_deploy.bundle.files import read_plain, refuse_symlinks, verify_listed
from omnidraft_deploy.bundle.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    BundleError,
    Manifest,
)


def read_manifest(bundle_dir: str | os.PathLike[str]) -> Manifest:
    """Parse and validate ``manifest.json`` (no symlink, at most ``MAX_MANIFEST_BYTES``).

    A bundle whose swap was killed between its two renames is restored first (``recover_dir``).
    """
    root = Path(bundle_dir)
    if is_ours(root):
        raise BundleError(root, "a staging or replaced folder of an export, never a bundle")
    recover_dir(root, marker=MANIFEST_NAME)
    path = root / MANIFEST_NAME
    if not os.path.lexists(path):
        raise BundleError(path, "missing: not an exported bundle (or the export did not finish)")
    data = read_plain(root, MANIFEST_NAME, max_bytes=MAX_MANIFEST_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(path, f"not UTF-8 ({e.reason} at byte {e.start})") from None
    return Manifest.from_json(text, source=path)


def verify_bundle(bundle_dir: str | os.PathLike[str]) -> Manifest:
    """Read the manifest, refuse symlinks anywhere in the folder, check every listed file's size
    and sha256 (``files``)."""
    root = Path(bundle_dir)
    manifest = read_manifest(root)
    refuse_symlinks(root)
    for rel, entry in manifest.files.items():
        verify_listed(root, rel, entry)
    return manifest


@contextmanager
def atomic_bundle_dir(
    final_dir: str | os.PathLike[str], *, exchange: bool = True
) -> Iterator[Path]:
    """Yield a staging folder beside ``final_dir``; once the body has written ``manifest.json``
    it replaces ``final_dir`` whole (``atomic.staged_dir``: leftovers of killed exports are
    deleted first, the swap never leaves ``final_dir`` missing)."""
    try:
        with staged_dir(final_dir, marker=MANIFEST_NAME, exchange=exchange) as tmp:
            yield tmp
    except FileNotFoundError as e:
        if MANIFEST_NAME in str(e):
            raise BundleError(
                final_dir, f"export finished without writing {MANIFEST_NAME}"
            ) from None
        raise
