"""Which listed files of a bundle were hashed already, so a re-open of an unchanged file skips it.

``verify_bundle(root, state=...)`` hashes a listed file once per *file identity* and records the
identity in the bundle's session folder (``state.state_dir``, never the bundle), written
atomically as ``verified_files.json``::

    {"version": 1, "bundle": "<resolved bundle folder>",
     "files": {"<relative path>": {"sha256": "<hex the manifest lists>", "size": <int>,
                                   "mtime_ns": <int>, "ctime_ns": <int>, "inode": <int>,
                                   "device": <int>}}}

A later open skips hashing a file only when its ``fstat`` (taken on the descriptor opened
symlink-free, as every read is) matches the record exactly *and* the record's sha256 is the one
the manifest lists now; anything else (another size, a write that moved mtime / ctime, a replaced
file with a new inode, a re-exported manifest) is hashed again and rejected if it differs. The
record is advisory: a missing, unreadable, foreign (another bundle folder, another version) or
malformed record is ignored and every file hashed, never trusted in part. A file whose mtime is
within ``RACY_NS`` of the moment it was hashed is not recorded: a write in the same clock tick
could leave its mtime unchanged (git's "racy" entries). The record guards against accidents
(a truncated copy, a flipped byte), not against someone who can write the user's own state folder.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.bundle.strict_json import loads_strict

log = logging.getLogger(__name__)
RECORD_FILE = "verified_files.json"
VERSION = 1
RACY_NS = 2_000_000_000  # files changed this recently are hashed again on the next open
MAX_RECORD_BYTES = 4 << 20
_INT_KEYS = ("size", "mtime_ns", "ctime_ns", "inode", "device")

FileId = dict[str, Any]  # {"sha256": str, "size": int, "mtime_ns": int, ...}: one file's entry


def file_id(st: os.stat_result, sha256: str) -> FileId:
    """The identity of a file whose content hashes to ``sha256`` (``st``: its ``fstat``)."""
    return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "inode": st.st_ino, "device": st.st_dev}  # fmt: skip


def settled(st: os.stat_result, hashed_at_ns: int) -> bool:
    """Whether a file hashed at ``hashed_at_ns`` may be recorded: its content last changed (mtime)
    before the racy window, so any later write moves its mtime."""
    return st.st_mtime_ns < hashed_at_ns - RACY_NS


def _entry_ok(entry: object) -> bool:
    return (isinstance(entry, dict) and set(entry) == {"sha256", *_INT_KEYS}
            and isinstance(entry["sha256"], str)
            and all(type(entry[k]) is int for k in _INT_KEYS))  # fmt: skip


def load_record(state: Path, root: Path) -> dict[str, FileId]:
    """The recorded identities for bundle folder ``root``; {} when there is no sound record."""
    path = state / RECORD_FILE
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_RECORD_BYTES:
            return {}
        doc = loads_strict(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # unreadable, not UTF-8 / JSON, dup keys
        log.debug("%s ignored (%s): every file is hashed", path, e)
        return {}
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return {}
    files = doc.get("files")
    if doc.get("bundle") != str(root.resolve()) or not isinstance(files, dict):
        return {}
    if not all(isinstance(k, str) and _entry_ok(v) for k, v in files.items()):
        return {}
    return files


def save_record(state: Path, root: Path, files: dict[str, FileId]) -> None:
    """Write the record atomically; a state folder that refuses the write costs only speed."""
    doc = {"version": VERSION, "bundle": str(root.resolve()), "files": files}
    try:
        write_text_atomic(state / RECORD_FILE, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        log.warning("%s not written (%s): the next open hashes every file again", state, e)
