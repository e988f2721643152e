"""Crash-safe writes: files and whole folders replaced so that a kill at any instant loses nothing.

Names of our own making, beside the thing they replace (``<name>`` is the final file or folder)::

    .<name>.XXXXXXXX.tmp       a file being written by ``write_bytes_atomic``
    .<name>.XXXXXXXX.partial   a folder being staged by ``staged_dir`` (or, after an exchange, the
                               previous version being deleted)
    .<name>.old                the previous folder during a two-rename swap (fallback only)

``XXXXXXXX`` is ``tempfile``'s 8 random characters ``[a-z0-9_]``; nothing else is ever matched.
Every writer holds an exclusive ``flock`` on its temp file / staging folder while it works, and
the kernel drops that lock when the process dies, so ``clean_stale`` removes only leftovers of
dead writers, never the work of a live one.

Folder swap (``publish_dir``): on Linux the staged folder and the live one are exchanged in one
``renameat2(RENAME_EXCHANGE)`` call, so ``final`` is never missing, not even for an instant. Where
the kernel or file system lacks it, ``final`` is renamed to ``.<name>.old`` and the staged folder
into place; a kill between the two renames leaves only ``.<name>.old``, which ``recover_dir``
(run by the next export and by every bundle open) renames back.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

_RANDOM = re.compile(r"[a-z0-9_]{8}")  # tempfile._RandomNameSequence's alphabet and length
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_libc = ctypes.CDLL(None, use_errno=True)


def old_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def _ours(candidate: Path, final: Path, suffix: str) -> bool:
    prefix = f".{final.name}."
    name = candidate.name
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return False
    return _RANDOM.fullmatch(name[len(prefix) : len(name) - len(suffix)]) is not None


def _unlocked(path: Path) -> bool:
    """True when no live process holds the writer's lock on ``path`` (a file or a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the probe lock


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clean_stale_files(path: str | os.PathLike[str]) -> list[Path]:
    """Delete ``.<name>.XXXXXXXX.tmp`` files beside ``path`` left by dead writers; return them."""
    path = Path(path)
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for p in path.parent.iterdir():
            if _ours(p, path, ".tmp") and not p.is_symlink() and p.is_file() and _unlocked(p):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    removed.append(p)
    return removed


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a locked temp file in the same folder, fsync, rename over ``path``, fsync the folder.

    Temp files of earlier writers of ``path`` that were killed are deleted first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_files(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until close: clean_stale_files leaves it alone
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; artifacts are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def recover_dir(final: str | os.PathLike[str], *, marker: str) -> bool:
    """Put ``.<name>.old`` back at ``final`` when a swap was killed between its two renames.

    ``marker``: a file every complete folder holds (``manifest.json``). Returns True on a restore.
    """
    final = Path(final)
    old = old_path(final)
    if os.path.lexists(final) or not (old.is_dir() and not old.is_symlink()):
        return False
    if not (old / marker).is_file():
        return False
    with contextlib.suppress(FileNotFoundError, FileExistsError, OSError):
        os.rename(old, final)  # fails harmlessly if a writer just published a new ``final``
        return True
    return False


def clean_stale_dirs(final: str | os.PathLike[str], *, marker: str) -> list[Path]:
    """Recover ``final`` if needed, then delete our leftovers beside it; return what was deleted.

    Deleted: ``.<name>.XXXXXXXX.partial`` folders no live writer holds, and ``.<name>.old`` once a
    complete ``final`` (one holding ``marker``) is in place.
    """
    final = Path(final)
    recover_dir(final, marker=marker)
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for p in final.parent.iterdir():
            if _ours(p, final, ".partial") and p.is_dir() and not p.is_symlink() and _unlocked(p):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    old = old_path(final)
    if old.is_dir() and not old.is_symlink() and (final / marker).is_file():
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _retire(folder: Path, marker: str = "manifest.json") -> None:
    """Delete a replaced folder, its marker first: a kill midway leaves no complete copy."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder / marker)
    shutil.rmtree(folder, ignore_errors=True)


def is_ours(folder: Path) -> bool:
    """True for a folder named like our staging / previous-version folders (never a bundle)."""
    name = folder.name
    if name.startswith(".") and name.endswith(".old") and len(name) > 5:
        return True
    parts = name.rsplit(".", 2)
    return (
        name.startswith(".")
        and len(parts) == 3
        and parts[2] == "partial"
        and _RANDOM.fullmatch(parts[1]) is not None
    )


def publish_dir(staged: Path, final: Path, *, exchange: bool = True) -> None:
    """Make the complete folder ``staged`` appear at ``final`` (see the module docstring).

    ``exchange`` False forces the two-rename fallback (tests of ``recover_dir``).
    """
    if not os.path.lexists(final):
        os.rename(staged, final)
    elif exchange and _exchange(staged, final):
        _retire(staged)  # now the previous version
    else:
        old = old_path(final)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(staged, final)  # a kill before this line: recover_dir restores ``old``
        _retire(old)
    _fsync_dir(final.parent)


@contextlib.contextmanager
def staged_dir(
    final_dir: str | os.PathLike[str], *, marker: str, exchange: bool = True,
    before_publish: Callable[[], None] | None = None,
) -> Iterator[Path]:  # fmt: skip
    """Yield a locked staging folder beside ``final_dir``; on success it replaces ``final_dir``.

    Before staging: ``clean_stale_dirs`` (recovery + leftovers of killed writers). The body must
    write ``marker`` last; a body that raises, or ends without ``marker``, publishes nothing, and
    so does a ``before_publish`` that raises (its last look at ``final_dir``).
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_dirs(final, marker=marker)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    lock = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield tmp
        tmp.chmod(0o755)
        if not (tmp / marker).is_file():
            raise FileNotFoundError(f"{tmp}: staging finished without writing {marker}")
        if before_publish is not None:
            before_publish()
        publish_dir(tmp, final, exchange=exchange)
    finally:
        os.close(lock)
        shutil.rmtree(tmp, ignore_errors=True)
