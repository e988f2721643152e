"""A bundle folder on disk: read its manifest, verify the files it lists, stage a new one.

``read_manifest`` parses ``manifest.json`` (schema: ``manifest``) through ``files`` (no symlink,
size-capped); ``verify_bundle`` checks every listed file's size and sha256 (once per file
identity when given the bundle's session folder: ``hash_record``); ``atomic_bundle_dir``
stages an export beside the final folder and swaps it into place last (``atomic``): a kill at any
instant leaves the previous bundle or the new one at the final path, never neither and never a
partial one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omnidraft_deploy.bundle.atomic import is_ours, recover_dir, staged_dir
from omnidraft_deploy.bundle.files import read_plain, refuse_symlinks, stat_listed, verify_listed
from omnidraft_deploy.bundle.hash_record import FileId, file_id, load_record, save_record, settled
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


def verify_bundle(
    bundle_dir: str | os.PathLike[str], *, state: Path | None = None, trust_record: bool = True
) -> Manifest:
    """Read the manifest, refuse symlinks anywhere in the folder, check every listed file's size
    and sha256 (``files``).

    ``state`` (the bundle's session folder, ``state.state_dir``): identities of the files hashed
    are recorded there (``hash_record``), and with ``trust_record`` a file whose identity is
    unchanged since it was recorded, and whose size and sha256 the manifest states as recorded,
    is not hashed again; ``trust_record=False`` hashes every file (``omnidraft validate``) and
    refreshes the record. Either way every claim of the manifest is checked on every open.
    """
    root = Path(bundle_dir)
    manifest = read_manifest(root)
    refuse_symlinks(root)
    known = load_record(state, root) if state is not None and trust_record else {}
    recorded: dict[str, FileId] = {}
    for rel, entry in manifest.files.items():
        # the record vouches for the bytes hashed, never for the manifest's claims: a size the
        # manifest states differently from the recorded file's is checked (and refused) below
        trusted = rel in known and known[rel]["size"] == entry.size
        if trusted and file_id(stat_listed(root, rel), entry.sha256) == known[rel]:
            recorded[rel] = known[rel]
            continue
        hashed_at = time.time_ns()
        st = verify_listed(root, rel, entry)
        if settled(st, hashed_at):
            recorded[rel] = file_id(st, entry.sha256)
    if state is not None and recorded != known:
        save_record(state, root, recorded)
    return manifest


@contextmanager
def atomic_bundle_dir(
    final_dir: str | os.PathLike[str], *, exchange: bool = True
) -> Iterator[Path]:
    """Yield a staging folder beside ``final_dir``; once the body has written ``manifest.json``
    it replaces ``final_dir`` whole (``atomic.staged_dir``: leftovers of killed exports are
    deleted first, the swap never leaves ``final_dir`` missing), unless ``final_dir`` then holds
    anything but its old bundle's own files (``replace.refuse_foreign``: kept, nothing published)."""
    from omnidraft_deploy.bundle.replace import refuse_foreign

    def last_look() -> None:  # nothing of the user's appeared there while the export ran
        refuse_foreign(Path(final_dir))

    try:
        with staged_dir(final_dir, marker=MANIFEST_NAME, exchange=exchange,
                        before_publish=last_look) as tmp:  # fmt: skip
            yield tmp
    except FileNotFoundError as e:
        if MANIFEST_NAME in str(e):
            raise BundleError(
                final_dir, f"export finished without writing {MANIFEST_NAME}"
            ) from None
        raise
