"""ODNG v1: golden bytes, exact round trips, and rejection of every truncation and corruption."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.eviction import LRUPolicy
from omnidraft_deploy.ngram.format import (
    NGramFormatError,
    NGramHeader,
    from_bytes,
    load,
    save,
    to_bytes,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ngram_v1.bin"
V_D, V_T = 32000, 128256  # Llama-2 drafter, Llama-3 target
GOLDEN_ITEMS = [
    ((29871, 30010, 29879), 596, 1),
    ((100, 200, 300, 400), 127999, 1),
    ((1, 2), 6, 2),
    ((13, 13), 271, 3),
]


def golden_cache() -> NGramCache:
    """The fixed history behind tests/golden/ngram_v1.bin (also read by the Java tests)."""
    cache = NGramCache(max_entries=4, policy="lfu")
    cache.update([285, 433, 446], 83415)
    cache.update([13, 13], 271)
    cache.update([29871, 30010, 29879], 596)
    cache.update([13, 13], 271)
    assert cache.match([5, 13, 13, 7], 1) == (271, 2)
    cache.update([1, 2], 5)
    cache.update([1, 2], 6)  # latest target id wins
    cache.update([100, 200, 300, 400], 127999)  # full: evicts (285, 433, 446), 1 use, oldest
    return cache


def _reseal(data: bytes) -> bytes:
    """Recompute the CRC so that a test reaches the check behind it."""
    return data[:-4] + struct.pack("<I", zlib.crc32(data[:-4]))


def test_golden_bytes_are_frozen() -> None:
    data = to_bytes(golden_cache(), draft_vocab_size=V_D, target_vocab_size=V_T)
    assert data == GOLDEN.read_bytes(), "format v1 changed: bump VERSION instead of editing v1"
    assert data[:24] == b"ODNG" + struct.pack("<HHIIII", 1, 1, V_D, V_T, 4, len(data) - 28)


def test_golden_file_loads_to_the_expected_entries() -> None:
    cache, header = load(GOLDEN, expect_draft_vocab=V_D, expect_target_vocab=V_T)
    assert header == NGramHeader(1, "lfu", V_D, V_T, 4, header.entries_nbytes)
    assert cache.items() == GOLDEN_ITEMS and cache.policy == "lfu"
    assert cache.match([1, 2, 3]) == (6, 2)


def test_every_truncation_and_single_byte_corruption_of_golden_is_rejected() -> None:
    data = GOLDEN.read_bytes()
    for k in range(len(data)):
        with pytest.raises(NGramFormatError):
            from_bytes(data[:k])
    for pos in range(len(data)):
        for xor in range(1, 256):
            bad = bytearray(data)
            bad[pos] ^= xor
            with pytest.raises(NGramFormatError):
                from_bytes(bytes(bad))


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (lambda d: b"PK\x03\x04" + d[4:], "not an n-gram cache"),
        (lambda d: d[:4] + struct.pack("<H", 2) + d[6:], "version 2 is newer"),
        (lambda d: d[:4] + struct.pack("<H", 0) + d[6:], "version 0 is unknown"),
        (lambda d: d + b"\0", "truncated or padded"),
        (lambda d: d[:-1], "truncated or padded"),
        (lambda d: d[:10], "truncated"),
        (lambda d: d[:-4] + bytes(4), "CRC-32 mismatch"),
        (lambda d: _reseal(d[:6] + struct.pack("<H", 2) + d[8:]), "unknown flags"),
        (lambda d: _reseal(d[:6] + struct.pack("<H", 0x11) + d[8:]), "unknown flags"),
        (
            lambda d: _reseal(d[:8] + struct.pack("<I", 400) + d[12:]),
            r"entry 0: draft id 30010 outside the drafter vocabulary \(400\)",
        ),
        (
            lambda d: _reseal(d[:12] + struct.pack("<I", 600) + d[16:]),
            "entry 1: target id 127999 outside",
        ),
        (lambda d: _reseal(d[:16] + struct.pack("<I", 5) + d[20:]), "ends before N entries"),
        (lambda d: _reseal(d[:16] + struct.pack("<I", 3) + d[20:]), "left in the entry section"),
        (lambda d: _reseal(d[:24] + b"\x01" + d[25:]), "n = 1"),
    ],
)
def test_rejections_name_the_problem(patch, message: str) -> None:
    with pytest.raises(NGramFormatError, match=message) as err:
        from_bytes(patch(GOLDEN.read_bytes()), source="bundle/ngram_cache.bin")
    assert str(err.value).startswith("bundle/ngram_cache.bin: ")


def _entry_file(entry: bytes, n_entries: int = 1) -> bytes:
    head = b"ODNG" + struct.pack("<HHIIII", 1, 0, 1000, 1000, n_entries, len(entry))
    return _reseal(head + entry + bytes(4))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (bytes([2, 1, 2, 3, 1]), None),  # valid: (1, 2) -> 3, 1 use
        (bytes([2, 1, 2, 3, 0]), "use count 0"),
        (bytes([2, 0x81, 0x00, 2, 3, 1]), "non-canonical varint"),
        (bytes([2, 1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 3, 1]), "longer than 5 bytes"),
        (bytes([2, 1, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 3, 1]), "does not fit in u32"),
        (bytes([2, 1, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 3, 1]), "draft id 4294967295 outside"),
        (bytes([2, 1, 2, 3]), "1 entries cannot fit in 4 B"),
        (bytes([3, 1, 2, 3, 4]), "runs past the entry section"),
        (bytes([0x80, 1, 2, 3, 4, 5, 6]), "runs past the entry section"),  # n >= 128: slow path
    ],
)
def test_malformed_entries(entry: bytes, message: str | None) -> None:
    if message is None:
        assert from_bytes(_entry_file(entry))[0].items() == [((1, 2), 3, 1)]
    else:
        with pytest.raises(NGramFormatError, match=message):
            from_bytes(_entry_file(entry))


def test_duplicate_ngrams_are_rejected() -> None:
    with pytest.raises(NGramFormatError, match=r"entry 1: duplicate n-gram \(1, 2\)"):
        from_bytes(_entry_file(bytes([2, 1, 2, 3, 1]) * 2, n_entries=2))


def test_vocab_expectations_and_writer_checks(tmp_path: Path) -> None:
    with pytest.raises(
        NGramFormatError, match="drafter vocabulary of 32000 tokens, expected 32001"
    ):
        load(GOLDEN, expect_draft_vocab=32001)
    with pytest.raises(NGramFormatError, match="target vocabulary of 128256 tokens, expected 151"):
        from_bytes(GOLDEN.read_bytes(), expect_target_vocab=151936)
    with pytest.raises(NGramFormatError, match="missing"):
        load(tmp_path / "nope.bin")
    with pytest.raises(ValueError, match="draft id"):
        to_bytes(golden_cache(), draft_vocab_size=1000, target_vocab_size=V_T)
    with pytest.raises(ValueError, match="target id"):
        to_bytes(golden_cache(), draft_vocab_size=V_D, target_vocab_size=1000)

    class MRUPolicy(LRUPolicy):
        name = "mru"

    with pytest.raises(ValueError, match="policy 'mru' has no id"):
        to_bytes(NGramCache(policy=MRUPolicy()), draft_vocab_size=V_D, target_vocab_size=V_T)


def test_save_load_and_capacity_on_load(tmp_path: Path) -> None:
    path = tmp_path / "bundle" / "ngram_cache.bin"
    save(golden_cache(), path, draft_vocab_size=V_D, target_vocab_size=V_T)
    assert path.read_bytes() == GOLDEN.read_bytes()
    assert [p.name for p in path.parent.iterdir()] == ["ngram_cache.bin"]  # no temp file left
    small, _ = load(path, max_entries=2)
    assert small.items() == GOLDEN_ITEMS[2:]  # the next victims are dropped first


_rows = st.lists(
    st.tuples(
        st.lists(st.integers(0, V_D - 1), min_size=2, max_size=6).map(tuple),
        st.integers(0, V_T - 1),
        st.integers(1, 2**32 - 1),
    ),
    max_size=25,
    unique_by=lambda r: r[0],
)


def _cache(rows: list, policy: str) -> NGramCache:
    if policy == "lfu":  # a valid LFU state lists counts in ascending order
        rows = sorted(rows, key=lambda r: r[2])
    return NGramCache.from_items(rows, policy=policy)


@settings(max_examples=100, deadline=None)
@given(rows=_rows, policy=st.sampled_from(["lru", "lfu"]))
def test_round_trip_is_exact(rows: list, policy: str) -> None:
    cache = _cache(rows, policy)
    data = to_bytes(cache, draft_vocab_size=V_D, target_vocab_size=V_T)
    back, header = from_bytes(data)
    assert back.items() == cache.items() and back.policy == policy == header.policy
    assert to_bytes(back, draft_vocab_size=V_D, target_vocab_size=V_T) == data
    assert len(data) <= cache.nbytes  # the accounted size bounds the file (ids, counts < 2**28)
    for c in (cache, back):  # the eviction order survives: same victims afterwards
        c.update([1, 2, 3], 4)
        c.match([rows[0][0][0], 9] if rows else [0])
    assert back.items() == cache.items()


@settings(max_examples=40, deadline=None)
@given(
    rows=_rows,
    policy=st.sampled_from(["lru", "lfu"]),
    pos=st.integers(0, 10**6),
    xor=st.integers(1, 255),
)
def test_random_files_reject_all_truncations_and_a_corruption(
    rows: list, policy: str, pos: int, xor: int
) -> None:
    data = to_bytes(_cache(rows, policy), draft_vocab_size=V_D, target_vocab_size=V_T)
    for k in range(len(data)):
        with pytest.raises(NGramFormatError):
            from_bytes(data[:k])
    bad = bytearray(data)
    bad[pos % len(data)] ^= xor
    with pytest.raises(NGramFormatError):
        from_bytes(bytes(bad))
