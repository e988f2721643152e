"""``VocabMapper``: the only code that knows both vocabularies (drafter and target).

Everything is derived from the raw bytes each token stands for (``TokenizerLike.token_bytes``), so
SentencePiece ``'▁'`` spaces, ``<0x0A>`` byte-fallback pieces and byte-level BPE ``'Ġ'`` pieces all
compare equal when they spell the same bytes. Tables are dense int64 tensors (EAGLE-style: gathers,
no dicts, export- and Java-friendly):

- ``draft_to_target (V_d,)``: the target id with exactly the same bytes, else -1 ("direct mapping",
  DM). The drafter's EOS maps to the target's first EOS; other drafter specials map to -1.
- ``target_to_draft_offsets (V_t+1,)`` / ``target_to_draft_flat (N,)``: CSR table giving, for every
  target id, its canonical drafter encoding: greedy longest byte match over the drafter's normal
  tokens (where two drafter tokens spell the same bytes, e.g. Llama-2's ``<0x41>`` and ``A``, the
  higher id wins, which is the learned piece rather than the byte fallback). A target token with a
  1-token encoding that maps back to it is DM; a longer encoding is what the n-gram cache merges.
  Target specials (``<|im_start|>``) are spelled out as their literal text; target EOS -> drafter
  EOS; target BOS -> drafter BOS (or nothing when the drafter has none).

Sources: OmniDraft (Ramakrishnan et al., 2025) section 3.1; transformers'
``AssistantToTargetTranslator`` for the same idea over strings.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.protocols import TokenizerLike


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    eos: tuple[int, ...]
    special: frozenset[int]  # control tokens, never matched by bytes (eos/bos included)

    @classmethod
    def of(cls, tok: TokenizerLike) -> SpecialIds:
        return cls(tok.bos_id, tuple(tok.eos_ids), frozenset(tok.special_ids))


def _byte_index(table: list[bytes], special: frozenset[int]) -> dict[bytes, int]:
    index: dict[bytes, int] = {}
    for i, b in enumerate(table):
        if b and i not in special:
            index[b] = i  # later (higher) id wins on duplicates
    return index


def greedy_encode(data: bytes, index: dict[bytes, int], max_len: int) -> list[int]:
    """Greedy longest-match segmentation of ``data`` into ids of ``index`` (bytes -> id)."""
    out: list[int] = []
    i = 0
    while i < len(data):
        for n in range(min(max_len, len(data) - i), 0, -1):
            tid = index.get(data[i : i + n])
            if tid is not None:
                out.append(tid)
                i += n
                break
        else:
            raise ValueError(
                f"byte {data[i]:#04x} of {data!r} has no drafter token (no byte fallback?)"
            )
    return out


class VocabMapper:
    """Dense draft<->target tables; construct with ``from_byte_tables`` or ``vocab.io.load``."""

    def __init__(
        self,
        draft_to_target: Tensor,
        target_to_draft_offsets: Tensor,
        target_to_draft_flat: Tensor,
        *,
        draft_eos: tuple[int, ...],
        target_eos: tuple[int, ...],
    ) -> None:
        if (
            target_to_draft_offsets.numel() < 1
            or int(target_to_draft_offsets[-1]) != target_to_draft_flat.numel()
        ):
            raise ValueError("target_to_draft_offsets does not match target_to_draft_flat")
        self.draft_to_target = draft_to_target.to(torch.int64)
        self.target_to_draft_offsets = target_to_draft_offsets.to(torch.int64)
        self.target_to_draft_flat = target_to_draft_flat.to(torch.int64)
        self.draft_eos, self.target_eos = draft_eos, target_eos
        self.draft_vocab_size = int(draft_to_target.numel())
        self.target_vocab_size = int(target_to_draft_offsets.numel() - 1)
        self.dm_draft_mask = self.draft_to_target >= 0  # (V_d,) bool
        self._dm_draft_ids = torch.nonzero(self.dm_draft_mask).flatten()
        self._dm_target_ids = self.draft_to_target[self._dm_draft_ids]
        self._offsets = self.target_to_draft_offsets.tolist()
        self._flat = self.target_to_draft_flat.tolist()

    @classmethod
    def from_byte_tables(
        cls,
        draft_bytes: list[bytes],
        target_bytes: list[bytes],
        *,
        draft_special: SpecialIds,
        target_special: SpecialIds,
    ) -> VocabMapper:
        """Build both tables from the byte spelling of every id (index = token id)."""
        d_index = _byte_index(draft_bytes, draft_special.special)
        t_index = _byte_index(target_bytes, target_special.special)
        d2t = np.full(len(draft_bytes), -1, dtype=np.int64)
        for b, d in d_index.items():
            d2t[d] = t_index.get(b, -1)
        for i, b in enumerate(draft_bytes):  # duplicates that lost the index still map directly
            if b and i not in draft_special.special and d2t[i] < 0:
                d2t[i] = t_index.get(b, -1)
        if draft_special.eos and target_special.eos:
            d2t[list(draft_special.eos)] = target_special.eos[0]
        max_len = max(map(len, d_index)) if d_index else 1
        offsets, flat = [0], []
        for t, b in enumerate(target_bytes):
            if t in target_special.eos and draft_special.eos:
                flat.append(draft_special.eos[0])
            elif t == target_special.bos:
                flat.extend([] if draft_special.bos is None else [draft_special.bos])
            elif b:
                flat.extend(greedy_encode(b, d_index, max_len))
            offsets.append(len(flat))
        return cls(
            torch.from_numpy(d2t),
            torch.tensor(offsets),
            torch.tensor(flat, dtype=torch.int64),
            draft_eos=draft_special.eos,
            target_eos=target_special.eos,
        )

    @classmethod
    def from_tokenizers(cls, draft_tok: TokenizerLike, target_tok: TokenizerLike) -> VocabMapper:
        """Convenience for the edges (CLI, bundle export)."""
        return cls.from_byte_tables(
            _bytes_table(draft_tok),
            _bytes_table(target_tok),
            draft_special=SpecialIds.of(draft_tok),
            target_special=SpecialIds.of(target_tok),
        )

    def target_to_draft(self, target_id: int) -> list[int]:
        """Canonical drafter encoding of one target token."""
        return self._flat[self._offsets[target_id] : self._offsets[target_id + 1]]

    def translate(self, target_ids: list[int]) -> list[int]:
        """Drafter ids spelling the same bytes as ``target_ids``."""
        out: list[int] = []
        for t in target_ids:
            out.extend(self.target_to_draft(t))
        return out

    def map_probs(self, draft_probs: Tensor) -> Tensor:
        """Marginal of a drafter distribution on target ids over DM tokens.

        draft_probs: (..., V_d) -> (..., V_t); mass on unmapped drafter tokens is dropped, so the
        result sums to the DM mass (renormalise first to get a proper distribution, see TLI).
        """
        out = draft_probs.new_zeros((*draft_probs.shape[:-1], self.target_vocab_size))
        src = draft_probs[..., self._dm_draft_ids]
        idx = self._dm_target_ids.expand_as(src)
        return out.scatter_add_(-1, idx, src)

    def content_hash(self) -> str:
        """sha256 of both tables; goes into artifact metadata as ``mapping_hash``."""
        h = hashlib.sha256()
        for t in (self.draft_to_target, self.target_to_draft_offsets, self.target_to_draft_flat):
            h.update(t.numpy().astype("<i8").tobytes())
        h.update(repr((self.draft_eos, self.target_eos)).encode())
        return h.hexdigest()

    def overlap_report(self) -> dict[str, float]:
        """Overlap figures for a pair: how much of each vocabulary maps directly."""
        lengths = self.target_to_draft_offsets.diff()
        dm_targets = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        dm_targets[self._dm_target_ids] = True
        return {
            "draft_vocab": self.draft_vocab_size,
            "target_vocab": self.target_vocab_size,
            "draft_dm_fraction": float(self.dm_draft_mask.float().mean()),
            "target_dm_fraction": float(dm_targets.float().mean()),
            "target_multi_token_fraction": float((lengths >= 2).float().mean()),
            "mean_draft_tokens_per_target_token": float(lengths.float().mean()),
            "max_draft_tokens_per_target_token": int(lengths.max()),
        }


def _bytes_table(tok: TokenizerLike) -> list[bytes]:
    table = getattr(tok, "token_bytes_table", None)  # optional fast path of real tokenizers
    if callable(table):
        return list(table())
    return [tok.token_bytes(i) for i in range(tok.vocab_size)]
