"""Composition helpers shared by the CLI and benchmarks: a resolved preset pair -> models (through
``reference.load``), tokenizers and the mapper.

This is an edge module: it may touch tokenizers (lazily) because it sits between user text and the
target-id-only decoding core.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from omnidraft_deploy.presets import ModelSpec
from omnidraft_deploy.protocols import CausalLM, TokenizerLike
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)


@dataclass
class Pair:
    target: CausalLM
    drafter: CausalLM
    target_tok: TokenizerLike
    drafter_tok: TokenizerLike
    mapper: VocabMapper


def cache_dir() -> Path:
    from omnidraft_deploy.assets import cache_root

    return Path(cache_root())


def unspellable_target_ids(drafter_tok: TokenizerLike, target_tok: TokenizerLike) -> list[int]:
    """Target ids holding a byte the drafter has no single-byte token for.

    SmolLM2's byte-level BPE has no token for bytes that never occur in valid UTF-8 (0xC0, 0xC1,
    0xF5-0xFF) while Qwen2's has; Llama-2's byte fallback covers all 256, so its pairs have none.
    """
    return _unspellable(
        drafter_tok, _bytes_table(drafter_tok), target_tok, _bytes_table(target_tok)
    )


def _unspellable(
    drafter_tok: TokenizerLike,
    d_table: list[bytes],
    target_tok: TokenizerLike,
    t_table: list[bytes],
) -> list[int]:
    d_special, t_special = drafter_tok.special_ids, target_tok.special_ids
    singles = {b for i, b in enumerate(d_table) if len(b) == 1 and i not in d_special}
    return [t for t, b in enumerate(t_table)
            if t not in t_special and any(bytes([c]) not in singles for c in b)]  # fmt: skip


def build_mapper(drafter_tok: TokenizerLike, target_tok: TokenizerLike) -> VocabMapper:
    """Build (or load from the cache) the mapper of a tokenizer pair; keyed by both byte tables.

    Target tokens the drafter cannot spell (``unspellable_target_ids``) get an empty drafter
    spelling, with a warning: if the target emits one, the drafter's context misses those bytes
    (drafts may get worse), but verification still makes the output the target's own. The key
    covers both tables and special ids, which fix that set, so it is computed on a cache miss only.
    """
    from omnidraft_deploy.vocab import io
    from omnidraft_deploy.vocab.mapper import SpecialIds

    d_table, t_table = _bytes_table(drafter_tok), _bytes_table(target_tok)
    h = hashlib.sha256()
    for tok, table in ((drafter_tok, d_table), (target_tok, t_table)):
        for b in table:
            h.update(len(b).to_bytes(2, "little") + b)
        h.update(repr((tok.bos_id, tok.eos_ids, sorted(tok.special_ids))).encode())
    path = (
        cache_dir() / "mappers" / f"{drafter_tok.name}--{target_tok.name}-{h.hexdigest()[:16]}.bin"
    )
    if path.is_file():
        try:
            return io.load(path)
        except io.VocabMapFormatError as e:
            log.warning("rebuilding mapper: %s", e)
    blank = set(_unspellable(drafter_tok, d_table, target_tok, t_table))
    if blank:
        log.warning(
            "%d %s tokens hold bytes %s cannot spell; they get an empty drafter spelling",
            len(blank),
            target_tok.name,
            drafter_tok.name,
        )
        t_table = [b"" if t in blank else b for t, b in enumerate(t_table)]
    t0 = time.perf_counter()
    mapper = VocabMapper.from_byte_tables(
        d_table,
        t_table,
        draft_special=SpecialIds.of(drafter_tok),
        target_special=SpecialIds.of(target_tok),
    )
    log.info(
        "built mapper %s -> %s in %.1f s",
        drafter_tok.name,
        target_tok.name,
        time.perf_counter() - t0,
    )
    io.save(mapper, path)
    return mapper


def _bytes_table(tok: TokenizerLike) -> list[bytes]:
    table = getattr(tok, "token_bytes_table", None)
    return list(table()) if callable(table) else [tok.token_bytes(i) for i in range(tok.vocab_size)]


def build_pair(
    target: ModelSpec,
    drafter: ModelSpec,
    *,
    seed: int = 0,
    max_seq_len: int | None = None,
    target_weights: str | None = None,
    drafter_weights: str | None = None,
) -> Pair:
    """Both eager models (``reference.load``, the one loader), both tokenizers and the mapper."""
    from omnidraft_deploy.reference.load import load_lm
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    target_tok, drafter_tok = load_tokenizer(target.tokenizer), load_tokenizer(drafter.tokenizer)
    return Pair(
        target=load_lm(target, seed=seed, max_seq_len=max_seq_len, weights=target_weights),
        drafter=load_lm(drafter, seed=seed + 1, max_seq_len=max_seq_len, weights=drafter_weights),
        target_tok=target_tok,
        drafter_tok=drafter_tok,
        mapper=build_mapper(drafter_tok, target_tok),
    )
