"""VocabMapper on the toy pair and its binary format (round trip, golden bytes, every reader rule)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
import torch

from omnidraft_deploy.testing import TableTokenizer, toy_pair
from omnidraft_deploy.vocab import io
from omnidraft_deploy.vocab.mapper import VocabMapper
from omnidraft_deploy.vocab.roles import Role

GOLDEN_V1 = Path(__file__).parents[1] / "golden" / "mapper_v1.bin"
GOLDEN = Path(__file__).parents[1] / "golden" / "mapper_v2.bin"


def toy_mapper() -> VocabMapper:
    return VocabMapper.from_tokenizers(*toy_pair())


def test_tables_on_toy_pair() -> None:
    dt, tt = toy_pair()
    m = toy_mapper()
    assert m.draft_to_target.tolist() == [0, 1, 2, 3, 4, 5]  # every drafter piece exists in target
    assert m.target_to_draft(tt.encode("bc")[0]) == [2, 3]
    assert m.target_to_draft(tt.encode("abc")[0]) == [5, 3]  # longest match: 'ab' + 'c'
    assert m.target_to_draft(0) == [0]  # EOS <-> EOS
    text = "ab cab bca"
    assert b"".join(dt.token_bytes(i) for i in m.translate(tt.encode(text))) == text.encode()


def test_map_probs_marginalises_duplicates() -> None:
    # drafter spells b"a" twice (byte fallback and learned piece): both map to target 'a'
    drafter = TableTokenizer("d", [b"</s>", b"a", b"b", b"a"])
    target = TableTokenizer("t", [b"<eos>", b"a", b"b", b"ab"])
    m = VocabMapper.from_tokenizers(drafter, target)
    assert m.draft_to_target.tolist() == [0, 1, 2, 1]
    q = m.map_probs(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    assert torch.allclose(q, torch.tensor([0.1, 0.6, 0.3, 0.0]))
    assert m.target_to_draft(1) == [3]  # the higher id (learned piece) is canonical


def test_missing_byte_is_a_clear_error() -> None:
    drafter = TableTokenizer("d", [b"</s>", b"a"])
    target = TableTokenizer("t", [b"<eos>", b"a", b"z"])
    with pytest.raises(ValueError, match="no drafter token"):
        VocabMapper.from_tokenizers(drafter, target)


def golden_mapper() -> VocabMapper:
    """Roles (drafter BOS, EOS), a placeholder and two target tokens the drafter cannot spell."""
    drafter = TableTokenizer("d", [b"</s>", b"<s>", b"a", b"b", b" ", b"ab", b"?"], bos_id=1)
    target = TableTokenizer("t", [b"<eos>", b"a", b"b", b" ", b"ab", b"\xff", b"a\xff", b"ba"])
    return VocabMapper.from_tokenizers(drafter, target, placeholder=6)


def test_golden_mapper_tables() -> None:
    m = golden_mapper()
    assert m.drafter_bos == 1 and m.role_id(Role.PLACEHOLDER, "drafter") == 6
    assert m.placeholder_counts == {5: 1, 6: 1}
    assert m.target_to_draft(6) == [2, 6] and m.target_to_draft(7) == [3, 2]


def test_round_trip_and_golden_bytes() -> None:
    m = golden_mapper()
    data = io.to_bytes(m)
    assert GOLDEN.read_bytes() == data, "format changed: bump VERSION and add a new golden"
    back = io.from_bytes(data)
    assert back.content_hash() == m.content_hash()
    assert back.target_eos == m.target_eos and back.draft_eos == m.draft_eos
    assert back.roles == m.roles and back.placeholder_counts == m.placeholder_counts
    assert back.drafter_bos == 1


def test_version_1_is_still_read() -> None:
    """The v1 golden (toy pair, written before roles existed) reads with no roles / placeholder."""
    old, now = io.from_bytes(GOLDEN_V1.read_bytes()), toy_mapper()
    for name in ("draft_to_target", "target_to_draft_offsets", "target_to_draft_flat"):
        assert torch.equal(getattr(old, name), getattr(now, name)), name
    assert old.roles == () and old.drafter_bos is None and old.placeholder_counts == {}
    assert (old.draft_eos, old.target_eos) == (now.draft_eos, now.target_eos)


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    """``data`` with one field rewritten and the CRC recomputed (a well-formed lie)."""
    out = bytearray(data[:-4])
    struct.pack_into(fmt, out, offset, value)
    return bytes(out) + struct.pack("<I", zlib.crc32(bytes(out)))


# golden_mapper v2 layout: header 32 B, 1 drafter EOS, 1 target EOS, 3 role rows, 2 placeholder
# rows, 7 draft_to_target, 9 offsets
_EOS_D, _EOS_T, _ROLES, _LOST = 32, 36, 40, 76
_OFFSETS = _LOST + 16 + 4 * 7


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (4, "<H", 0, "version 0 does not exist"),
        (6, "<H", 1, "reserved flags"),
        (26, "<H", 3, "reserved header field"),
        (_EOS_D, "<I", 7, "drafter EOS ids outside"),
        (_EOS_T, "<I", 8, "target EOS ids outside"),
        (_ROLES, "<i", 9, "role codes"),
        (_ROLES + 12, "<i", int(Role.BOS), "role codes"),  # BOS twice
        (_ROLES + 4, "<i", 7, "role rows hold ids outside"),
        (_ROLES + 8, "<i", -2, "role rows hold ids outside"),
        (_ROLES + 24 + 8, "<i", 0, "placeholder role row"),
        (_LOST, "<I", 6, "placeholder rows"),  # 6 then 6: not strictly increasing
        (_LOST + 4, "<I", 0, "placeholder rows"),
        (_LOST + 16, "<i", 8, "draft_to_target holds ids outside"),
        (_OFFSETS, "<I", 1, "do not start at 0"),
        (_OFFSETS + 8, "<I", 0, "not monotone"),
    ],
)
def test_reader_enforces_every_rule(offset: int, fmt: str, value: int, match: str) -> None:
    data = io.to_bytes(golden_mapper())
    io.from_bytes(_patch(data, offset, fmt, struct.unpack_from(fmt, data, offset)[0]))  # control
    with pytest.raises(io.VocabMapFormatError, match=match):
        io.from_bytes(_patch(data, offset, fmt, value), source="vocab_map.bin")


def test_reader_rejects_empty_vocabularies_and_oversized_files(tmp_path: Path) -> None:
    """Issue 10 silent accepts: a drafter vocabulary of size 0; readers now take a size cap."""
    empty = VocabMapper(
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(3, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        draft_eos=(),
        target_eos=(),
    )
    with pytest.raises(io.VocabMapFormatError, match="empty vocabulary"):
        io.from_bytes(io.to_bytes(empty))
    data = io.to_bytes(golden_mapper())
    with pytest.raises(io.VocabMapFormatError, match="size cap"):
        io.from_bytes(data, max_bytes=len(data) - 1)
    path = tmp_path / "vocab_map.bin"
    path.write_bytes(data)
    with pytest.raises(io.VocabMapFormatError, match=f"{path}: .* size cap"):
        io.load(path, max_bytes=64)
    assert io.load(path).content_hash() == golden_mapper().content_hash()


def test_v1_reader_rules_apply_too() -> None:
    v1 = GOLDEN_V1.read_bytes()  # header 24 B, 1 + 1 EOS, 6 draft_to_target, 11 offsets
    with pytest.raises(io.VocabMapFormatError, match="target EOS ids outside"):
        io.from_bytes(_patch(v1, 28, "<I", 10))
    with pytest.raises(io.VocabMapFormatError, match="do not start at 0"):
        io.from_bytes(_patch(v1, 32 + 24, "<I", 1))


@pytest.mark.parametrize("cut", [0, 3, 20, -5, -1])
def test_truncated_is_rejected(cut: int) -> None:
    data = io.to_bytes(toy_mapper())
    with pytest.raises(io.VocabMapFormatError, match="truncated|size"):
        io.from_bytes(data[:cut], source="vocab_map.bin")


def test_corrupted_foreign_and_newer_are_rejected(tmp_path: Path) -> None:
    data = bytearray(io.to_bytes(toy_mapper()))
    flipped = bytearray(data)
    flipped[40] ^= 0xFF
    with pytest.raises(io.VocabMapFormatError, match="CRC"):
        io.from_bytes(bytes(flipped))
    with pytest.raises(io.VocabMapFormatError, match="not a vocabulary map"):
        io.from_bytes(b"ODNG" + bytes(data[4:]))
    newer = bytearray(data)
    newer[4] = 9
    with pytest.raises(io.VocabMapFormatError, match="newer"):
        io.from_bytes(bytes(newer))
    path = tmp_path / "vocab_map.bin"
    io.save(toy_mapper(), path)
    assert io.load(path).content_hash() == toy_mapper().content_hash()
    with pytest.raises(io.VocabMapFormatError, match="missing"):
        io.load(tmp_path / "nope.bin")
