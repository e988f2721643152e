"""Where a session's own files go, so that bundles stay read-only and travel.

``run`` grows the n-gram cache, ``validate`` writes a report, an open records which files it hashed
(``hash_record``); none of it goes into the bundle (a bundle is what was exported, byte for byte:
it can sit on a read-only disk, be copied to another machine, or be shared by users). They go to
a per-bundle folder of the user's state::

    --state DIR                                    when given
    $OMNIDRAFT_STATE/bundles/<bundle id>           else, when set
    $XDG_STATE_HOME/omnidraft-deploy/bundles/<id>  else (default ~/.local/state)

``<bundle id>`` is the first 16 hex digits of the sha256 of the bundle's ``manifest.json``, which
lists the sha256 of every file: copies of one bundle share their state wherever they are, and a
re-exported bundle starts fresh.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from omnidraft_deploy.bundle.manifest import MANIFEST_NAME

VALIDATION_REPORT = "validation.json"


def state_root() -> Path:
    if env := os.environ.get("OMNIDRAFT_STATE"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "omnidraft-deploy"


def bundle_id(bundle_dir: str | os.PathLike[str]) -> str:
    """Content id of a bundle: sha256 of its manifest (which hashes every file), 16 hex digits."""
    return hashlib.sha256((Path(bundle_dir) / MANIFEST_NAME).read_bytes()).hexdigest()[:16]


def state_dir(bundle_dir: str | os.PathLike[str], override: str | os.PathLike[str] | None) -> Path:
    """The session folder of a bundle (module docstring); created on demand, never inside it."""
    folder = Path(override) if override else state_root() / "bundles" / bundle_id(bundle_dir)
    if folder.resolve().is_relative_to(Path(bundle_dir).resolve()):
        raise ValueError(f"--state {folder}: inside the bundle; bundles stay read-only")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in the way (FileExistsError), a read-only disk, no permission
        what = "--state" if override else "the session folder (set --state or $OMNIDRAFT_STATE)"
        raise ValueError(f"{what} {folder}: cannot be used as a folder ({e.strerror})") from None
    return folder
