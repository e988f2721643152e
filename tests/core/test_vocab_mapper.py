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


# --- issue 15 reproducers and the drafter-context invariant ----------------------------------


def _faithful(
    mapper: VocabMapper, d_table: list[bytes], data: bytes, drafter_ids: list[int]
) -> bool:
    """The invariant: the drafter ids spell ``data`` with each byte no drafter token holds
    replaced by the placeholder token's bytes."""
    singles = {b for b in d_table if len(b) == 1}
    ph = mapper.role_id(Role.PLACEHOLDER, "drafter")
    ph_bytes = b"" if ph is None else d_table[ph]
    want = b"".join(bytes([c]) if bytes([c]) in singles else ph_bytes for c in data)
    return b"".join(d_table[i] for i in drafter_ids) == want


def test_drafter_context_stays_byte_faithful_and_counts_the_loss() -> None:
    from omnidraft_deploy.speculative.draft_len import FixedDraftLen
    from omnidraft_deploy.speculative.drafter import CrossVocabDrafter, Mode, Proposal

    m = golden_mapper()
    d_table = [b"</s>", b"<s>", b"a", b"b", b" ", b"ab", b"?"]
    t_table = [b"<eos>", b"a", b"b", b" ", b"ab", b"\xff", b"a\xff", b"ba"]

    class NoLM:  # the drafter's model is never called by reset/commit
        vocab_size, max_seq_len = 7, 64

        def forward(self, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
            raise AssertionError("not called")

    drafter = CrossVocabDrafter(NoLM(), m, FixedDraftLen(2), mode=Mode.GREEDY, target_vocab=8)
    prompt = [1, 6, 3, 5]  # a, a\xff, " ", \xff
    drafter.reset(prompt)
    assert drafter.draft_ids[0] == 1  # the drafter BOS stored in the map
    assert _faithful(m, d_table, b"".join(t_table[t] for t in prompt), drafter.draft_ids[1:])
    assert drafter.placeholder_bytes == 2
    empty = Proposal([], torch.zeros(0), None, [], [], 0)
    committed = list(prompt)
    for nxt in (7, 5, 4):
        drafter._drafts, drafter._fed_len = [], drafter.kv_len
        drafter.commit(empty, 0, nxt)
        committed.append(nxt)
        spelled = b"".join(t_table[t] for t in committed)
        assert _faithful(m, d_table, spelled, drafter.draft_ids[1:]), committed
    assert drafter.placeholder_bytes == 3


@pytest.fixture(scope="module")
def smol_qwen(require_asset):  # type: ignore[no-untyped-def]
    require_asset("smollm2-135m-gguf")
    from omnidraft_deploy.vocab.build import build_mapper
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    d_tok, t_tok = load_tokenizer("smollm2"), load_tokenizer("qwen2")
    return d_tok, t_tok, build_mapper(d_tok, t_tok)


def test_reproducer_qwen25_added_tokens_translate(smol_qwen) -> None:  # type: ignore[no-untyped-def]
    """Issue 15: ``build_mapper(smollm2, qwen2).translate([151659])`` raised IndexError."""
    d_tok, t_tok, m = smol_qwen
    assert m.target_vocab_size == 151665
    assert d_tok.decode(m.translate([151659])) == "<|fim_prefix|>"
    for t in range(151646, 151665):  # tool-call, FIM, repo markers, vision: literal text
        assert b"".join(d_tok.token_bytes(i) for i in m.target_to_draft(t)) == t_tok.token_bytes(t)
    with pytest.raises(ValueError, match="outside the target vocabulary .* padding"):
        m.translate([151665])  # a [PAD] row of the model: never a token


def test_reproducer_special_tokens_map_by_meaning(smol_qwen) -> None:  # type: ignore[no-untyped-def]
    """Issue 15: SmolLM2's <|im_end|> mapped to Qwen's <|endoftext|>; Qwen's <|im_start|> was
    spelled to the drafter as text."""
    _, t_tok, m = smol_qwen
    assert m.draft_to_target[[0, 1, 2]].tolist() == [151643, 151644, 151645]
    assert [m.target_to_draft(t) for t in (151643, 151644, 151645)] == [[0], [1], [2]]
    chat = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = m.translate(t_tok.encode(chat))
    assert ids.count(1) == 2 and ids.count(2) == 1  # SmolLM2's own turn tokens


def test_reproducer_unspellable_bytes_get_a_counted_placeholder(smol_qwen) -> None:  # type: ignore[no-untyped-def]
    """Issue 15: 21 Qwen tokens need bytes SmolLM2 has no token for; they got an empty drafter
    spelling with no signal."""
    from omnidraft_deploy.vocab.build import unspellable_bytes, unspellable_target_ids

    d_tok, t_tok, m = smol_qwen
    missing = set(unspellable_bytes(d_tok))
    assert {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2} <= missing
    blank = unspellable_target_ids(d_tok, t_tok)
    assert len(blank) == 21 and sorted(m.placeholder_counts) == blank
    d_table = d_tok.token_bytes_table()
    assert d_table[m.role_id(Role.PLACEHOLDER, "drafter")] == "\ufffd".encode()
    for t in blank:
        assert m.target_to_draft(t), t  # never empty again
        assert _faithful(m, d_table, t_tok.token_bytes(t), m.target_to_draft(t)), t
    text = "tab\x04 and \x13 then ok"
    ids = t_tok.encode(text)
    assert _faithful(m, d_table, text.encode(), m.translate(ids))
    assert sum(m.placeholder_bytes(t) for t in ids) == 2
