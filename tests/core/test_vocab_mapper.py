"""VocabMapper on the toy pair and its binary format (round trip, golden bytes, rejection)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnidraft_deploy.testing import TableTokenizer, toy_pair
from omnidraft_deploy.vocab import io
from omnidraft_deploy.vocab.mapper import VocabMapper

GOLDEN = Path(__file__).parents[1] / "golden" / "mapper_v1.bin"


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


def test_round_trip_and_golden_bytes() -> None:
    m = toy_mapper()
    data = io.to_bytes(m)
    assert GOLDEN.read_bytes() == data, "format changed: bump VERSION and regenerate the golden"
    back = io.from_bytes(data)
    assert back.content_hash() == m.content_hash()
    assert back.target_eos == m.target_eos and back.draft_eos == m.draft_eos


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
