"""Binary format of a ``VocabMapper`` (``vocab_map.bin`` in a bundle); Java reads the same bytes.

Layout, all little-endian. Version 2 (written)::

    offset  size            field
    0       4               magic b"ODVM"
    4       2               u16 version (= 2)
    6       2               u16 flags (must be 0; reserved)
    8       4               u32 V_d   drafter vocabulary size (>= 1)
    12      4               u32 V_t   target vocabulary size (tokenizer ids, >= 1)
    16      4               u32 N     length of the CSR id list
    20      2               u16 n_draft_eos
    22      2               u16 n_target_eos
    24      2               u16 n_roles
    26      2               u16 reserved (must be 0)
    28      4               u32 n_placeholder
    32      4*n_draft_eos   u32 drafter EOS ids (each < V_d)
    ..      4*n_target_eos  u32 target EOS ids (each < V_t)
    ..      12*n_roles      role rows (i32 role, i32 drafter id, i32 target id): role codes
                            1 BOS, 2 EOS, 3 end of turn, 4 start of turn, 5 placeholder
                            (``vocab.roles.Role``), each code at most once; an id is -1 (that side
                            has no such token) or inside its vocabulary; a placeholder row has a
                            drafter id and target id -1. The drafter BOS row (if any) is the id the
                            drafter's context starts with.
    ..      8*n_placeholder (u32 target id, u32 n_bytes): target ids strictly increasing and
                            < V_t, n_bytes >= 1 = bytes of that token spelled with the placeholder
                            drafter token; n_placeholder > 0 requires a placeholder role row.
    ..      4*V_d           i32 draft_to_target   (-1 = no direct mapping, else < V_t)
    ..      4*(V_t+1)       u32 target_to_draft_offsets (offsets[0] == 0, monotone, last == N)
    ..      4*N             u32 target_to_draft_flat (each < V_d)
    end-4   4               u32 CRC-32 (zlib) of every byte before it

Version 1 (still read) is the same without the bytes at offsets 24-31, the role rows and the
placeholder rows (its maps have no roles: no drafter BOS, no placeholder).

Readers reject, naming the file: a file over the size cap (checked before reading), a wrong magic
(foreign file), version 0 or newer than this reader, non-zero flags or reserved field, V_d or V_t of
0, a size that does not match the header (truncated or padded), a CRC mismatch and every rule above
(out-of-range ids, unknown or repeated role codes, offsets not starting at 0 or not monotone).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.vocab.mapper import VocabMapper
from omnidraft_deploy.vocab.roles import Role

MAGIC = b"ODVM"
VERSION = 2
DEFAULT_MAX_BYTES = 256 << 20  # far above any real map (Llama-3 <- Llama-2: ~2 MB)
_HEADER_V1 = struct.Struct("<4sHHIIIHH")
_HEADER_V2 = struct.Struct("<4sHHIIIHHHHI")


class VocabMapFormatError(ValueError):
    pass


def to_bytes(mapper: VocabMapper) -> bytes:
    """The version-2 bytes of ``mapper``."""
    roles = np.asarray([[int(r), d, t] for r, d, t in mapper.roles], dtype="<i4").reshape(-1, 3)
    lost = np.asarray(list(mapper.placeholder_counts.items()), dtype="<u4").reshape(-1, 2)
    flat = mapper.target_to_draft_flat.numpy().astype("<u4")
    header = _HEADER_V2.pack(
        MAGIC,
        VERSION,
        0,
        mapper.draft_vocab_size,
        mapper.target_vocab_size,
        flat.size,
        len(mapper.draft_eos),
        len(mapper.target_eos),
        len(roles),
        0,
        len(lost),
    )
    body = b"".join(
        [
            header,
            np.asarray(mapper.draft_eos, dtype="<u4").tobytes(),
            np.asarray(mapper.target_eos, dtype="<u4").tobytes(),
            roles.tobytes(),
            lost.tobytes(),
            mapper.draft_to_target.numpy().astype("<i4").tobytes(),
            mapper.target_to_draft_offsets.numpy().astype("<u4").tobytes(),
            flat.tobytes(),
        ]
    )
    return body + struct.pack("<I", zlib.crc32(body))


def from_bytes(
    data: bytes, *, source: str = "<bytes>", max_bytes: int | None = DEFAULT_MAX_BYTES
) -> VocabMapper:
    """Parse and check (every rule of the module docstring) one ``vocab_map.bin``."""

    def fail(problem: str) -> VocabMapFormatError:
        return VocabMapFormatError(f"{source}: {problem}")

    if max_bytes is not None and len(data) > max_bytes:
        raise fail(f"{len(data)} B is over the size cap of {max_bytes} B")
    if len(data) < _HEADER_V1.size + 4:
        raise fail(f"truncated: {len(data)} bytes is shorter than the header")
    magic, version, flags, vd, vt, n, nde, nte = _HEADER_V1.unpack_from(data)
    if magic != MAGIC:
        raise fail(f"not a vocabulary map (magic {magic!r}, expected {MAGIC!r})")
    if version > VERSION:
        raise fail(f"format version {version} is newer than this reader ({VERSION})")
    if version < 1:
        raise fail(f"format version {version} does not exist (1..{VERSION})")
    if flags:
        raise fail(f"reserved flags are {flags:#06x}, must be 0")
    if vd == 0 or vt == 0:
        raise fail(f"empty vocabulary (drafter {vd}, target {vt} ids)")
    n_roles = n_lost = reserved = 0
    head = _HEADER_V1.size
    if version >= 2:
        if len(data) < _HEADER_V2.size + 4:
            raise fail(f"truncated: {len(data)} bytes is shorter than the v2 header")
        *_, n_roles, reserved, n_lost = _HEADER_V2.unpack_from(data)
        head = _HEADER_V2.size
    if reserved:
        raise fail(f"reserved header field is {reserved}, must be 0")
    words = nde + nte + 3 * n_roles + 2 * n_lost + vd + vt + 1 + n
    if len(data) != head + 4 * words + 4:
        raise fail(f"size {len(data)} B does not match header ({head + 4 * words + 4} B): "
                   "truncated or padded")  # fmt: skip
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if crc != zlib.crc32(data[:-4]):
        raise fail("CRC-32 mismatch: file is corrupted")
    arr = np.frombuffer(data, dtype="<u4", offset=head, count=words)
    parts = np.split(arr, np.cumsum([nde, nte, 3 * n_roles, 2 * n_lost, vd, vt + 1]))
    draft_eos, target_eos, role_words, lost_words, d2t_u, offsets_u, flat_u = parts
    rows = role_words.view("<i4").astype(np.int64).reshape(-1, 3)
    lost = lost_words.astype(np.int64).reshape(-1, 2)
    d2t = d2t_u.view("<i4").astype(np.int64)
    offsets, flat = offsets_u.astype(np.int64), flat_u.astype(np.int64)
    problem = _check(vd, vt, n, draft_eos, target_eos, rows, lost, d2t, offsets, flat)
    if problem:
        raise fail(problem)
    return VocabMapper(
        torch.from_numpy(d2t),
        torch.from_numpy(offsets),
        torch.from_numpy(flat),
        draft_eos=tuple(int(x) for x in draft_eos),
        target_eos=tuple(int(x) for x in target_eos),
        roles=tuple((Role(int(r)), int(d), int(t)) for r, d, t in rows),
        placeholder_counts={int(t): int(c) for t, c in lost},
    )


def _check(
    vd: int,
    vt: int,
    n: int,
    draft_eos: np.ndarray,
    target_eos: np.ndarray,
    rows: np.ndarray,
    lost: np.ndarray,
    d2t: np.ndarray,
    offsets: np.ndarray,
    flat: np.ndarray,
) -> str | None:
    """The first broken rule of the module docstring, or None."""
    if draft_eos.size and draft_eos.max() >= vd:
        return "drafter EOS ids outside the drafter vocabulary"
    if target_eos.size and target_eos.max() >= vt:
        return "target EOS ids outside the target vocabulary"
    codes = rows[:, 0].tolist()
    if any(c not in Role._value2member_map_ for c in codes) or len(set(codes)) != len(codes):
        return f"role codes {codes} are unknown or repeated (known: {[int(r) for r in Role]})"
    if rows.size and (
        (rows[:, 1] < -1).any() or (rows[:, 1] >= vd).any()
        or (rows[:, 2] < -1).any() or (rows[:, 2] >= vt).any()
    ):  # fmt: skip
        return "role rows hold ids outside their vocabulary"
    placeholder = [(d, t) for r, d, t in rows.tolist() if r == Role.PLACEHOLDER]
    if placeholder and (placeholder[0][0] < 0 or placeholder[0][1] != -1):
        return "the placeholder role row needs a drafter id and target id -1"
    if lost.size and (
        not placeholder or (np.diff(lost[:, 0]) <= 0).any() or lost[-1, 0] >= vt
        or (lost[:, 1] < 1).any()
    ):  # fmt: skip
        return "placeholder rows are unsorted, out of range, empty or lack a placeholder role"
    if d2t.size and (d2t.max() >= vt or d2t.min() < -1):
        return "draft_to_target holds ids outside the target vocabulary"
    if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        return "target_to_draft_offsets do not start at 0, are not monotone or do not end at N"
    if flat.size and flat.max() >= vd:
        return "target_to_draft_flat holds ids outside the drafter vocabulary"
    return None


def save(mapper: VocabMapper, path: str | os.PathLike[str]) -> None:
    write_bytes_atomic(path, to_bytes(mapper))


def load(path: str | os.PathLike[str], *, max_bytes: int | None = DEFAULT_MAX_BYTES) -> VocabMapper:
    """Read ``path`` (size cap checked before reading; see ``from_bytes``)."""
    p = Path(path)
    if not p.is_file():
        raise VocabMapFormatError(f"{p}: missing")
    size = p.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise VocabMapFormatError(f"{p}: {size} B is over the size cap of {max_bytes} B")
    return from_bytes(p.read_bytes(), source=str(p), max_bytes=max_bytes)
