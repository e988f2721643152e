"""The one mapper builder: ``build_mapper(drafter_tok, target_tok) -> VocabMapper`` (cached).

An edge module (it sees tokenizers). It decides the two things ``VocabMapper.from_byte_tables``
leaves open:

- **Special tokens by meaning**: each tokenizer's role table (``vocab.roles.special_roles``: BOS,
  EOS, end of turn, start of turn, from its config and chat template) is matched across the pair.
- **Bytes the drafter cannot spell**: SmolLM2's byte-level BPE has no token for 0x04, 0x06, 0x13,
  0x14, 0x16, 0x1D, 0xF1, 0xF2 (valid UTF-8 bytes its training never kept) nor for bytes that
  never occur in valid UTF-8 (0xC0, 0xC1, 0xF5-0xFF), while Qwen2's has all 256; Llama-2's byte
  fallback covers all 256, so its pairs have none. Each such byte is spelled with one explicit
  ``PLACEHOLDER`` drafter token (``placeholder_id``: the drafter's token for U+FFFD, else its
  ``?``), so the drafter's context stays byte-aligned with the target's text: its bytes equal the
  committed bytes with every unspellable byte replaced by the placeholder's bytes. The map counts
  the replaced bytes per target id (``VocabMapper.placeholder_bytes``); the drafter reports them
  as ``placeholder_bytes`` (a loss of drafter context, never of output: verification keeps the
  output the target's own).

Built maps are cached under ``<cache>/mappers``, keyed by both byte tables, both role tables and
``BUILD_VERSION``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.vocab.mapper import SpecialIds, VocabMapper, bytes_table

log = logging.getLogger(__name__)

BUILD_VERSION = 2  # bump when the same tokenizers would build a different map
PLACEHOLDER_TEXTS = ("\ufffd", "?")  # first one the drafter has a single token for


def unspellable_target_ids(drafter_tok: TokenizerLike, target_tok: TokenizerLike) -> list[int]:
    """Target ids (not special) holding a byte the drafter has no single-byte token for."""
    return _unspellable(drafter_tok, bytes_table(drafter_tok), target_tok, bytes_table(target_tok))


def unspellable_bytes(drafter_tok: TokenizerLike) -> list[int]:
    """The byte values (0-255) the drafter has no single-byte (non-special) token for."""
    singles = _singles(drafter_tok, bytes_table(drafter_tok))
    return [c for c in range(256) if bytes([c]) not in singles]


def _singles(tok: TokenizerLike, table: list[bytes]) -> set[bytes]:
    special = tok.special_ids
    return {b for i, b in enumerate(table) if len(b) == 1 and i not in special}


def _unspellable(
    drafter_tok: TokenizerLike,
    d_table: list[bytes],
    target_tok: TokenizerLike,
    t_table: list[bytes],
) -> list[int]:
    singles, t_special = _singles(drafter_tok, d_table), target_tok.special_ids
    return [t for t, b in enumerate(t_table)
            if t not in t_special and any(bytes([c]) not in singles for c in b)]  # fmt: skip


def placeholder_id(drafter_tok: TokenizerLike) -> int:
    """The drafter token standing in for an unspellable byte (see the module docstring)."""
    table, special = bytes_table(drafter_tok), drafter_tok.special_ids
    for text in PLACEHOLDER_TEXTS:
        want = text.encode("utf-8")
        ids = [i for i, b in enumerate(table) if b == want and i not in special]
        if ids:
            return ids[-1]
    raise ValueError(
        f"tokenizer {drafter_tok.name} has no single token for any of {PLACEHOLDER_TEXTS!r}"
    )


def cache_key(drafter_tok: TokenizerLike, target_tok: TokenizerLike) -> str:
    """sha256 over both byte tables, special ids, role tables and ``BUILD_VERSION``."""
    h = hashlib.sha256(f"odvm-build-{BUILD_VERSION}".encode())
    for tok in (drafter_tok, target_tok):
        for b in bytes_table(tok):
            h.update(len(b).to_bytes(2, "little") + b)
        sp = SpecialIds.of(tok)
        roles = sorted((int(r), i) for r, i in sp.roles.items())
        h.update(repr((tok.bos_id, tok.eos_ids, sorted(tok.special_ids), roles)).encode())
    return h.hexdigest()


def build_mapper(drafter_tok: TokenizerLike, target_tok: TokenizerLike) -> VocabMapper:
    """Build (or load from the cache) the mapper of a tokenizer pair (see the module docstring)."""
    from omnidraft_deploy.catalog.assets import cache_root
    from omnidraft_deploy.vocab import io

    key = cache_key(drafter_tok, target_tok)
    path = Path(cache_root()) / "mappers" / f"{drafter_tok.name}--{target_tok.name}-{key[:16]}.bin"
    if path.is_file():
        try:
            return io.load(path)
        except io.VocabMapFormatError as e:
            log.warning("rebuilding mapper: %s", e)
    d_table, t_table = bytes_table(drafter_tok), bytes_table(target_tok)
    blank = _unspellable(drafter_tok, d_table, target_tok, t_table)
    placeholder = placeholder_id(drafter_tok) if blank else None
    if blank:
        log.warning(
            "%d %s tokens hold bytes %s cannot spell; the drafter sees placeholder %d for them",
            len(blank),
            target_tok.name,
            drafter_tok.name,
            placeholder,
        )
    t0 = time.perf_counter()
    mapper = VocabMapper.from_byte_tables(
        d_table,
        t_table,
        draft_special=SpecialIds.of(drafter_tok),
        target_special=SpecialIds.of(target_tok),
        placeholder=placeholder,
    )
    log.info(
        "built mapper %s -> %s in %.1f s",
        drafter_tok.name,
        target_tok.name,
        time.perf_counter() - t0,
    )
    io.save(mapper, path)
    return mapper
