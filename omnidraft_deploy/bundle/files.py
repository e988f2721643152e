"""Reading files of a bundle as a closed world: no symlinks, nothing outside the folder.

Every path is opened component by component relative to the bundle folder with ``O_NOFOLLOW``
(``openat``), so a symlink anywhere on the way is refused rather than followed, and only regular
files are read (no FIFO, device or folder). ``read_listed`` reads a file that ``manifest.json``
lists and checks the bytes it read against the listed size and sha256, so the bytes parsed are
the bytes verified (no window between check and use). ``sha256_file`` / ``file_entry`` hash a
file for the manifest an exporter writes.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from omnidraft_deploy.bundle.manifest import MANIFEST_NAME, BundleError
from omnidraft_deploy.bundle.sections import FileEntry

_CHUNK = 1 << 20


def _error(path: Path, problem: str) -> Exception:
    return BundleError(path, problem)


def open_plain(root: Path, rel: str) -> int:
    """File descriptor of the regular file ``root/rel``; symlinks and non-files refused."""
    path = root / rel
    parts = rel.split("/")
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise _error(root, f"cannot open the bundle folder ({e.strerror})") from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, flags_dir, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        raise _error(path, "missing") from None
    except OSError as e:  # ELOOP: a symlink; ENOTDIR: a file where a folder should be
        raise _error(path, f"refused: a symlink or not a plain file ({e.strerror})") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise _error(path, "refused: not a regular file")
    return leaf


def read_plain(root: Path, rel: str, *, max_bytes: int) -> bytes:
    """The bytes of ``root/rel`` (see ``open_plain``), refusing files over ``max_bytes``."""
    fd = open_plain(root, rel)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise _error(root / rel, f"{size} B is over this reader's cap of {max_bytes} B")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _error(root / rel, f"grew past this reader's cap of {max_bytes} B while read")
    return data


def _check(path: Path, entry: FileEntry, size: int, digest: str) -> None:
    if size != entry.size:
        raise _error(path, f"size {size} B != {entry.size} B in manifest (truncated?)")
    if digest != entry.sha256:
        raise _error(path, "sha256 mismatch with manifest (corrupted or replaced)")


def verify_listed(root: Path, rel: str, entry: FileEntry) -> os.stat_result:
    """Size and sha256 of a listed file, streamed (graphs can be GBs); its ``fstat`` when sound."""
    fd = open_plain(root, rel)
    h, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry.size:
            _check(root / rel, entry, os.fstat(f.fileno()).st_size, "")
        while block := f.read(_CHUNK):
            h.update(block)
            size += len(block)
        st = os.fstat(f.fileno())
    _check(root / rel, entry, size, h.hexdigest())
    return st


def stat_listed(root: Path, rel: str) -> os.stat_result:
    """``fstat`` of ``root/rel`` opened as every read is (``open_plain``: no symlink, a plain file)."""
    fd = open_plain(root, rel)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def read_listed(
    root: Path, rel: str, files: dict[str, FileEntry], *, role: str, max_bytes: int
) -> bytes:
    """Bytes of ``rel``, which ``files`` (the manifest's) must list with ``role``; size + sha256
    checked on the bytes returned."""
    entry = files.get(rel)
    if entry is None or entry.role != role:
        raise _error(root / MANIFEST_NAME, f"{rel!r} is not listed in files with role {role!r}")
    if entry.size > max_bytes:
        raise _error(root / rel, f"{entry.size} B is over this reader's cap of {max_bytes} B")
    data = read_plain(root, rel, max_bytes=max_bytes)
    _check(root / rel, entry, len(data), hashlib.sha256(data).hexdigest())
    return data


def refuse_symlinks(root: Path) -> None:
    """Refuse a bundle folder holding a symlink anywhere (they are never written by exporters)."""
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in (*dirs, *names):
            p = Path(folder) / name
            if p.is_symlink():
                raise _error(p, "refused: a symlink inside a bundle (bundles hold plain files)")


def sha256_file(path: str | os.PathLike[str], chunk: int = _CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(bundle_dir: Path, rel: str, role: str) -> FileEntry:
    p = bundle_dir / rel
    return FileEntry(sha256=sha256_file(p), size=p.stat().st_size, role=role)
