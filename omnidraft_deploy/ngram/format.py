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

Readers reject, naming the file: a wrong magic (foreign file), an unknown or newer version,
reserved flag bits or an unknown policy id, a size that does not match ``24 + B + 4`` (truncated
or padded), a CRC mismatch, a malformed entry (n < 2, bad varint, use count 0, duplicate n-gram,
entries not filling B exactly), ids outside the vocabularies, and vocabulary sizes that differ
from what the caller expects.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omnidraft_deploy.manifest import write_bytes_atomic
from omnidraft_deploy.ngram.cache import DEFAULT_MAX_ENTRIES, FILE_OVERHEAD_NBYTES, NGramCache
from omnidraft_deploy.ngram.eviction import Key

MAGIC = b"ODNG"
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
    rows = _read_entries(data, header, source)
    cache = NGramCache.from_items(
        rows,
        max_entries=max_entries or max(DEFAULT_MAX_ENTRIES, header.n_entries),
        max_bytes=max_bytes,
        policy=header.policy,
    )
    return cache, header


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
) -> tuple[NGramCache, NGramHeader]:
    p = Path(path)
    if not p.is_file():
        raise NGramFormatError(p, "missing")
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
