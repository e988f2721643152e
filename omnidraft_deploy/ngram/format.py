"""Binary format of an ``NGramCache`` (``ngram_cache.bin`` in a bundle); Java reads the same bytes.

Layout, all little-endian, version 1::

    offset  size  field
    0       4     magic b"ODNG"
    4       2     u16 version (= 1)
    6       2     u16 flags: bits 0-3 eviction policy id (0 = LRU, 1 = LFU); bits 4-15 are
                  reserved and must be 0
    8       4     u32 draft_vocab_size   V_d (>= 1): every draft id is < V_d
    12      4     u32 target_vocab_size  V_t (>= 1): every target id is < V_t
    16      4     u32 N   number of entries
    20      4     u32 B   byte length of the entry section
    24      B     N entries, back to back:
                      u8      n           (2 <= n <= 255)
                      n x varint          draft ids
                      varint              target id
                      varint              use count (>= 1)
    24+B    4     u32 CRC-32 (IEEE, as zlib.crc32 and java.util.zip.CRC32) of bytes [0, 24+B)

``varint`` is unsigned LEB128: 7 value bits per byte, least significant group first, high bit set
on every byte but the last; at most 5 bytes, value <= 2**32 - 1, and canonical (a multi-byte
varint never ends with a 0x00 byte), so every cache has exactly one encoding. Llama-2 drafter ids
take 2-3 bytes, so a trigram entry is about 10 bytes instead of 21 with fixed u32 fields.

Entry order is eviction order: the first entry is the next victim, the last the most protected.
LRU: least recently used first. LFU: ascending use count, least recently used first within one
count. A reader rebuilds the cache by re-adding the entries in file order with their use counts
(``NGramCache.from_items``), which restores the same order for both policies: a warm cache keeps
its eviction order across sessions. Not stored: hit/miss statistics and the capacities, which are
runtime configuration (``load(max_entries=..., max_bytes=...)``).

Canonical order: an LFU file lists its entries in non-decreasing use count (the order ``items()``
gives), so one cache has exactly one encoding; LRU files may hold any counts in any order.

Readers reject, naming the file: a file over the caller's size cap (``max_file_bytes``, checked
before reading), a wrong magic (foreign file), an unknown or newer version, reserved flag bits or
an unknown policy id, a size that does not match ``24 + B + 4`` (truncated or padded), a CRC
mismatch, more entries than B can hold (N > B / 5), a malformed entry (n < 2, bad or
non-canonical varint, use count 0, duplicate n-gram, entries not filling B exactly), LFU use
counts out of order, ids outside the vocabularies, and vocabulary sizes that differ from what the
caller expects.

Loading is linear in the entries with a small constant: the varints of the whole entry section are
decoded at once with NumPy (``_fast_rows``); a file it does not accept is read again entry by
entry (``_read_entries``), which names the first bad entry or, for the rare n >= 128 (an n byte
that is not a one-byte varint), reads it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.ngram.cache import DEFAULT_MAX_ENTRIES, FILE_OVERHEAD_NBYTES, NGramCache
from omnidraft_deploy.ngram.eviction import Key

MAGIC = b"ODNG"
MAX_FILE_BYTES = 64 << 20  # default cap of ``load``: about 6M entries
MIN_ENTRY_NBYTES = 5  # u8 n + 2 one-byte draft ids + one-byte target id + one-byte use count
VERSION = 1
POLICY_IDS: dict[str, int] = {"lru": 0, "lfu": 1}
_POLICY_MASK = 0x000F
_HEADER = struct.Struct("<4sHHIIII")  # magic, version, flags, V_d, V_t, N, B
_CRC = struct.Struct("<I")
assert _HEADER.size + _CRC.size == FILE_OVERHEAD_NBYTES  # the cache's byte accounting relies on it


class NGramFormatError(ValueError):
    """An n-gram cache file is foreign, newer, truncated, corrupted or for other vocabularies."""

    def __init__(self, source: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = str(source)
        self.problem = problem


@dataclass(frozen=True)
class NGramHeader:
    version: int
    policy: str  # "lru" | "lfu"
    draft_vocab_size: int
    target_vocab_size: int
    n_entries: int
    entries_nbytes: int  # B: bytes of the entry section


def to_bytes(cache: NGramCache, *, draft_vocab_size: int, target_vocab_size: int) -> bytes:
    """Encode ``cache`` (entries in eviction order); ids must fit the two vocabularies."""
    for name, size in (("draft", draft_vocab_size), ("target", target_vocab_size)):
        if not 1 <= size <= 0xFFFF_FFFF:
            raise ValueError(f"{name}_vocab_size must be in [1, 2**32 - 1], got {size}")
    if cache.policy not in POLICY_IDS:
        raise ValueError(f"eviction policy {cache.policy!r} has no id in format v1 ({POLICY_IDS})")
    body = bytearray()
    for key, target_id, uses in cache.items():
        if max(key) >= draft_vocab_size:
            raise ValueError(f"n-gram {key} has a draft id >= draft_vocab_size {draft_vocab_size}")
        if target_id >= target_vocab_size:
            raise ValueError(f"target id {target_id} >= target_vocab_size {target_vocab_size}")
        body.append(len(key))
        for value in (*key, target_id, uses):
            _put_varint(body, value)
    head = _HEADER.pack(
        MAGIC,
        VERSION,
        POLICY_IDS[cache.policy],
        draft_vocab_size,
        target_vocab_size,
        len(cache),
        len(body),
    )
    data = head + bytes(body)
    return data + _CRC.pack(zlib.crc32(data))


def from_bytes(
    data: bytes,
    *,
    source: str | os.PathLike[str] = "<bytes>",
    expect_draft_vocab: int | None = None,
    expect_target_vocab: int | None = None,
    max_entries: int | None = None,
    max_bytes: int | None = None,
) -> tuple[NGramCache, NGramHeader]:
    """Decode and check a file; capacities default to ``max(8192, N)`` entries, no byte bound.

    A file larger than the given capacities loses its first entries (the next victims).
    """
    header = _read_header(data, source)
    for what, expected, got in (
        ("drafter", expect_draft_vocab, header.draft_vocab_size),
        ("target", expect_target_vocab, header.target_vocab_size),
    ):
        if expected is not None and expected != got:
            raise NGramFormatError(
                source,
                f"built for a {what} vocabulary of {got} tokens, "
                f"expected {expected}: the cache belongs to another model pair",
            )
    caps = {
        "max_entries": max_entries or max(DEFAULT_MAX_ENTRIES, header.n_entries),
        "max_bytes": max_bytes,
        "policy": header.policy,
    }
    with _no_gc():  # millions of new tuples would trigger full collections again and again
        rows = _fast_rows(data, header)
        if rows is not None:
            try:
                return NGramCache.from_checked_rows(*rows, **caps), header  # type: ignore[arg-type]
            except ValueError:  # a duplicate n-gram: the entry-by-entry reader names it
                pass
        slow = _read_entries(data, header, source)  # names the problem, or reads n >= 128
        rows = [r[0] for r in slow], [r[1] for r in slow], [r[2] for r in slow]
        return NGramCache.from_checked_rows(*rows, **caps), header  # type: ignore[arg-type]


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of acyclic objects are made, then move
    every live object to the permanent generation (``gc.freeze``) before resuming it, so the first
    collection after the load does not traverse them all (they are freed by reference counting)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


def save(
    cache: NGramCache,
    path: str | os.PathLike[str],
    *,
    draft_vocab_size: int,
    target_vocab_size: int,
) -> None:
    """Write atomically (temp file + rename): an interrupted save keeps the previous file."""
    data = to_bytes(cache, draft_vocab_size=draft_vocab_size, target_vocab_size=target_vocab_size)
    write_bytes_atomic(path, data)


def load(
    path: str | os.PathLike[str],
    *,
    expect_draft_vocab: int | None = None,
    expect_target_vocab: int | None = None,
    max_entries: int | None = None,
    max_bytes: int | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> tuple[NGramCache, NGramHeader]:
    """``from_bytes`` of a file; refused unread when larger than ``max_file_bytes``."""
    p = Path(path)
    if not p.is_file():
        raise NGramFormatError(p, "missing")
    size = p.stat().st_size
    if size > max_file_bytes:
        raise NGramFormatError(p, f"{size} B is over this reader's cap of {max_file_bytes} B")
    return from_bytes(
        p.read_bytes(),
        source=p,
        expect_draft_vocab=expect_draft_vocab,
        expect_target_vocab=expect_target_vocab,
        max_entries=max_entries,
        max_bytes=max_bytes,
    )


def _read_header(data: bytes, source: str | os.PathLike[str]) -> NGramHeader:
    if data[:4] != MAGIC:
        raise NGramFormatError(
            source, f"not an n-gram cache (magic {data[:4]!r}, expected {MAGIC!r})"
        )
    if len(data) < FILE_OVERHEAD_NBYTES:
        raise NGramFormatError(source, f"truncated: {len(data)} B is shorter than header + CRC")
    _, version, flags, vd, vt, n, b = _HEADER.unpack_from(data)
    if version != VERSION:
        newer = "newer than this reader" if version > VERSION else "unknown to this reader"
        raise NGramFormatError(
            source,
            f"format version {version} is {newer} ({VERSION}); "
            "upgrade omnidraft-deploy or re-export the cache",
        )
    expected = FILE_OVERHEAD_NBYTES + b
    if len(data) != expected:
        raise NGramFormatError(
            source,
            f"size {len(data)} B does not match the header ({expected} B): truncated or padded",
        )
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc != zlib.crc32(data[: -_CRC.size]):
        raise NGramFormatError(source, "CRC-32 mismatch: the file is corrupted")
    names = {v: k for k, v in POLICY_IDS.items()}
    if flags & ~_POLICY_MASK or (flags & _POLICY_MASK) not in names:
        raise NGramFormatError(source, f"unknown flags 0x{flags:04x} (policy id or reserved bits)")
    if vd == 0 or vt == 0:
        raise NGramFormatError(source, f"vocabulary sizes must be >= 1, got {vd} and {vt}")
    if n * MIN_ENTRY_NBYTES > b:
        raise NGramFormatError(source, f"{n} entries cannot fit in {b} B (>= 5 B each)")
    return NGramHeader(version, names[flags & _POLICY_MASK], vd, vt, n, b)


def _read_entries(
    data: bytes, header: NGramHeader, source: str | os.PathLike[str]
) -> list[tuple[Key, int, int]]:
    rows: list[tuple[Key, int, int]] = []

    def fail(problem: str) -> NGramFormatError:
        return NGramFormatError(source, f"entry {len(rows)}: {problem}")

    seen: set[Key] = set()
    pos, end = _HEADER.size, _HEADER.size + header.entries_nbytes
    for _ in range(header.n_entries):
        if pos >= end:
            raise fail(f"the entry section ({header.entries_nbytes} B) ends before N entries")
        n, pos = data[pos], pos + 1
        if n < 2:
            raise fail(f"n = {n}, an n-gram needs n >= 2")
        values: list[int] = []
        for _ in range(n + 2):
            value, pos = _get_varint(data, pos, end, fail)
            values.append(value)
        key, target_id, uses = tuple(values[:n]), values[n], values[n + 1]
        if max(key) >= header.draft_vocab_size:
            raise fail(
                f"draft id {max(key)} outside the drafter vocabulary ({header.draft_vocab_size})"
            )
        if target_id >= header.target_vocab_size:
            raise fail(
                f"target id {target_id} outside the target vocabulary ({header.target_vocab_size})"
            )
        if uses == 0:
            raise fail("use count 0 (counts start at 1)")
        if key in seen:
            raise fail(f"duplicate n-gram {key}")
        if header.policy == "lfu" and rows and uses < rows[-1][2]:
            raise fail(f"LFU use count {uses} after {rows[-1][2]}: not the canonical order")
        seen.add(key)
        rows.append((key, target_id, uses))
    if pos != end:
        raise NGramFormatError(source, f"{end - pos} B left in the entry section after N entries")
    return rows


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(
    data: bytes, pos: int, end: int, fail: Callable[[str], NGramFormatError]
) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise fail("varint runs past the entry section")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift >= 35:
            raise fail("varint longer than 5 bytes")
    if shift and byte == 0:
        raise fail("non-canonical varint (ends with a 0x00 byte)")
    if value > 0xFFFF_FFFF:
        raise fail(f"varint {value} does not fit in u32")
    return value, pos


def _varints(sec: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """All varints of ``sec`` (uint8) as (values int64, byte lengths); None if any is malformed."""
    ends = np.flatnonzero(sec < 0x80)
    if ends.size == 0 or ends[-1] != sec.size - 1:
        return None
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if int(lengths.max()) > 5 or bool(((lengths > 1) & (sec[ends] == 0)).any()):
        return None  # too long, or non-canonical (multi-byte ending in 0x00)
    values = np.zeros(ends.size, np.int64)
    for j in range(int(lengths.max())):
        has = np.flatnonzero(lengths > j)
        values[has] |= (sec[starts[has] + j].astype(np.int64) & 0x7F) << (7 * j)
    if bool((values > 0xFFFF_FFFF).any()):
        return None
    return values, lengths


def _fast_rows(data: bytes, h: NGramHeader) -> tuple[list[Key], list[int], list[int]] | None:
    """Rows (keys, target ids, uses) when every per-entry check passes and every n < 128, else
    None. Duplicates are left to ``NGramCache.from_checked_rows`` (it raises ValueError)."""
    if h.n_entries == 0:
        return ([], [], []) if h.entries_nbytes == 0 else None
    sec = np.frombuffer(data, np.uint8, count=h.entries_nbytes, offset=_HEADER.size)
    decoded = _varints(sec)
    if decoded is None:
        return None
    values, lengths = decoded
    firsts_list, k, total, mv = [], 0, values.size, values.data
    for _ in range(h.n_entries):  # an entry is n + 3 varints when its n byte is < 0x80
        if k >= total:
            return None
        firsts_list.append(k)
        k += mv[k] + 3
    firsts = np.asarray(firsts_list, np.int64)
    ns = values[firsts]
    if k != total or bool((lengths[firsts] != 1).any() or (ns < 2).any()):
        return None
    role = np.zeros(total, np.int8)  # 0 draft id, 1 n, 2 target id, 3 use count
    role[firsts], role[firsts + ns + 1], role[firsts + ns + 2] = 1, 2, 3
    targets, uses = values[role == 2], values[role == 3]
    if int(values[role == 0].max()) >= h.draft_vocab_size:
        return None
    if int(targets.max()) >= h.target_vocab_size or bool((uses == 0).any()):
        return None
    if h.policy == "lfu" and bool((np.diff(uses) < 0).any()):
        return None
    ids = values[role == 0].tolist()  # draft ids of every entry, back to back
    ends = np.cumsum(ns).tolist()
    keys = [tuple(ids[e - n : e]) for e, n in zip(ends, ns.tolist(), strict=True)]
    return keys, targets.tolist(), uses.tolist()
