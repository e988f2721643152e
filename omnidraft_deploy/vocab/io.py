"""Binary format of a ``VocabMapper`` (``vocab_map.bin`` in a bundle); Java reads the same bytes.

Layout, all little-endian, version 1::

    offset  size            field
    0       4               magic b"ODVM"
    4       2               u16 version (= 1)
    6       2               u16 flags (0; reserved)
    8       4               u32 V_d   drafter vocabulary size
    12      4               u32 V_t   target vocabulary size (tokenizer ids)
    16      4               u32 N     length of the CSR id list
    20      2               u16 n_draft_eos
    22      2               u16 n_target_eos
    24      4*n_draft_eos   u32 drafter EOS ids
    ..      4*n_target_eos  u32 target EOS ids
    ..      4*V_d           i32 draft_to_target   (-1 = no direct mapping)
    ..      4*(V_t+1)       u32 target_to_draft_offsets (monotone, last == N)
    ..      4*N             u32 target_to_draft_flat (each < V_d)
    end-4   4               u32 CRC-32 (zlib) of every byte before it

Readers reject a wrong magic (foreign file), a newer version, a size that does not match the
header (truncated or padded), a CRC mismatch and out-of-range ids, naming the file.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from omnidraft_deploy.manifest import write_bytes_atomic
from omnidraft_deploy.vocab.mapper import VocabMapper

MAGIC = b"ODVM"
VERSION = 1
_HEADER = struct.Struct("<4sHHIIIHH")


class VocabMapFormatError(ValueError):
    pass


def to_bytes(mapper: VocabMapper) -> bytes:
    d2t = mapper.draft_to_target.numpy().astype("<i4")
    offsets = mapper.target_to_draft_offsets.numpy().astype("<u4")
    flat = mapper.target_to_draft_flat.numpy().astype("<u4")
    body = b"".join(
        [
            _HEADER.pack(
                MAGIC,
                VERSION,
                0,
                mapper.draft_vocab_size,
                mapper.target_vocab_size,
                flat.size,
                len(mapper.draft_eos),
                len(mapper.target_eos),
            ),
            np.asarray(mapper.draft_eos, dtype="<u4").tobytes(),
            np.asarray(mapper.target_eos, dtype="<u4").tobytes(),
            d2t.tobytes(),
            offsets.tobytes(),
            flat.tobytes(),
        ]
    )
    return body + struct.pack("<I", zlib.crc32(body))


def from_bytes(data: bytes, *, source: str = "<bytes>") -> VocabMapper:
    def fail(problem: str) -> VocabMapFormatError:
        return VocabMapFormatError(f"{source}: {problem}")

    if len(data) < _HEADER.size + 4:
        raise fail(f"truncated: {len(data)} bytes is shorter than the header")
    magic, version, _flags, vd, vt, n, nde, nte = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise fail(f"not a vocabulary map (magic {magic!r}, expected {MAGIC!r})")
    if version > VERSION:
        raise fail(f"format version {version} is newer than this reader ({VERSION})")
    expected = _HEADER.size + 4 * (nde + nte + vd + vt + 1 + n) + 4
    if len(data) != expected:
        raise fail(f"size {len(data)} B does not match header ({expected} B): truncated or padded")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if crc != zlib.crc32(data[:-4]):
        raise fail("CRC-32 mismatch: file is corrupted")
    arr = np.frombuffer(data, dtype="<u4", offset=_HEADER.size, count=nde + nte + vd + vt + 1 + n)
    draft_eos, target_eos = arr[:nde], arr[nde : nde + nte]
    d2t = arr[nde + nte : nde + nte + vd].view("<i4").astype(np.int64)
    offsets = arr[nde + nte + vd : nde + nte + vd + vt + 1].astype(np.int64)
    flat = arr[nde + nte + vd + vt + 1 :].astype(np.int64)
    if d2t.size and (d2t.max() >= vt or d2t.min() < -1):
        raise fail("draft_to_target holds ids outside the target vocabulary")
    if offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise fail("target_to_draft_offsets are not monotone or do not end at N")
    if flat.size and flat.max() >= vd:
        raise fail("target_to_draft_flat holds ids outside the drafter vocabulary")
    return VocabMapper(
        torch.from_numpy(d2t),
        torch.from_numpy(offsets),
        torch.from_numpy(flat),
        draft_eos=tuple(int(x) for x in draft_eos),
        target_eos=tuple(int(x) for x in target_eos),
    )


def save(mapper: VocabMapper, path: str | os.PathLike[str]) -> None:
    write_bytes_atomic(path, to_bytes(mapper))


def load(path: str | os.PathLike[str]) -> VocabMapper:
    p = Path(path)
    if not p.is_file():
        raise VocabMapFormatError(f"{p}: missing")
    return from_bytes(p.read_bytes(), source=str(p))
