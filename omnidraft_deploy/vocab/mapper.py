"""``VocabMapper``: the only code that knows both vocabularies (drafter and target).

Everything is derived from the raw bytes each token stands for (``TokenizerLike.token_bytes``), so
SentencePiece ``'▁'`` spaces, ``<0x0A>`` byte-fallback pieces and byte-level BPE ``'Ġ'`` pieces all
compare equal when they spell the same bytes. Tables are dense int64 tensors (EAGLE-style: gathers,
no dicts, export- and Java-friendly):

- ``draft_to_target (V_d,)``: the target id with exactly the same bytes, else -1 ("direct mapping",
  DM). Drafter special tokens map by meaning (``vocab.roles``): its end of turn to the target's end
  of turn, its EOS to the target's EOS, its start of turn to the target's start of turn (an end of
  turn and an end of document stand in for each other when one side lacks one); other drafter
  specials map to -1.
- ``target_to_draft_offsets (V_t+1,)`` / ``target_to_draft_flat (N,)``: CSR table giving, for every
  target id, its canonical drafter encoding: greedy longest byte match over the drafter's normal
  tokens (where two drafter tokens spell the same bytes, e.g. Llama-2's ``<0x41>`` and ``A``, the
  higher id wins, which is the learned piece rather than the byte fallback). A target token with a
  1-token encoding that maps back to it is DM; a longer encoding is what the n-gram cache merges.
  Target specials with a role go to the drafter's token of the same role (BOS to the drafter's BOS
  or nothing); other target specials are spelled out as their literal text. A byte the drafter has
  no token for is spelled with the ``PLACEHOLDER`` drafter token, and ``placeholder_bytes(t)``
  counts how many bytes of ``t`` were replaced (``vocab.build`` chooses the placeholder).
- ``roles``: the role table (``Role``, drafter id, target id; -1 = none), including the drafter's
  BOS, which starts the drafter's context (``drafter_bos``).

Sources: OmniDraft (Ramakrishnan et al., 2025) section 3.1; transformers'
``AssistantToTargetTranslator`` for the same idea over strings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.vocab.roles import Role, counterpart, special_roles

RoleRow = tuple[Role, int, int]  # (role, drafter id or -1, target id or -1)


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    eos: tuple[int, ...]
    special: frozenset[int]  # control tokens, never matched by bytes (eos/bos included)
    roles: Mapping[Role, int] = field(default_factory=dict)  # meaning -> id (``vocab.roles``)

    @classmethod
    def of(cls, tok: TokenizerLike) -> SpecialIds:
        return cls(tok.bos_id, tuple(tok.eos_ids), frozenset(tok.special_ids), special_roles(tok))

    def role_ids(self) -> dict[Role, int]:
        """Roles, with BOS / EOS filled in from ``bos`` / ``eos`` when no role table was given."""
        roles = dict(self.roles)
        if self.bos is not None:
            roles.setdefault(Role.BOS, self.bos)
        if self.eos and Role.EOS not in roles and Role.EOT not in roles:
            roles[Role.EOS] = self.eos[0]
        return roles


def _byte_index(table: list[bytes], special: frozenset[int]) -> dict[bytes, int]:
    index: dict[bytes, int] = {}
    for i, b in enumerate(table):
        if b and i not in special:
            index[b] = i  # later (higher) id wins on duplicates
    return index


def greedy_encode(
    data: bytes, index: dict[bytes, int], max_len: int, placeholder: int | None = None
) -> list[int]:
    """Greedy longest-match segmentation of ``data`` into ids of ``index`` (bytes -> id).

    A byte no id starts with becomes ``placeholder`` (one id per byte) or, without one, raises.
    """
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
            if placeholder is None:
                raise ValueError(
                    f"byte {data[i]:#04x} of {data!r} has no drafter token (no byte fallback?)"
                )
            out.append(placeholder)
            i += 1
    return out


def unspelled_bytes(data: bytes, index: dict[bytes, int]) -> int:
    """How many bytes of ``data`` have no single-byte token in ``index``."""
    return sum(bytes([c]) not in index for c in data)


def role_table(draft: SpecialIds, target: SpecialIds, placeholder: int | None) -> list[RoleRow]:
    """One row per role either side has: (role, drafter id, target id), -1 where it has none."""
    d_roles, t_roles = draft.role_ids(), target.role_ids()
    rows = [
        (r, d_roles.get(r, -1), t_roles.get(r, -1)) for r in Role if r in d_roles or r in t_roles
    ]
    if placeholder is not None:
        rows.append((Role.PLACEHOLDER, placeholder, -1))
    return rows


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
        roles: tuple[RoleRow, ...] = (),
        placeholder_counts: Mapping[int, int] | None = None,
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
        self.roles = tuple((Role(r), int(d), int(t)) for r, d, t in roles)
        self.placeholder_counts = dict(sorted((placeholder_counts or {}).items()))
        self.draft_vocab_size = int(draft_to_target.numel())
        self.target_vocab_size = int(target_to_draft_offsets.numel() - 1)
        self.dm_draft_mask = self.draft_to_target >= 0  # (V_d,) bool
        self._dm_draft_ids = torch.nonzero(self.dm_draft_mask).flatten()
        self._dm_target_ids = self.draft_to_target[self._dm_draft_ids]
        self._offsets = self.target_to_draft_offsets.tolist()
        self._flat = self.target_to_draft_flat.tolist()
        self.draft_to_target_list: list[int] = self.draft_to_target.tolist()  # per-token lookups
        self._spellers: tuple[list[int], list[int]] | None = None  # built on first ``marginal``

    @classmethod
    def from_byte_tables(
        cls,
        draft_bytes: list[bytes],
        target_bytes: list[bytes],
        *,
        draft_special: SpecialIds,
        target_special: SpecialIds,
        placeholder: int | None = None,
    ) -> VocabMapper:
        """Build both tables from the byte spelling of every id (index = token id).

        ``placeholder``: drafter id that spells a byte the drafter has no token for (None: such
        a byte raises ``ValueError``).
        """
        d_index = _byte_index(draft_bytes, draft_special.special)
        t_index = _byte_index(target_bytes, target_special.special)
        d2t = np.full(len(draft_bytes), -1, dtype=np.int64)
        for b, d in d_index.items():
            d2t[d] = t_index.get(b, -1)
        for i, b in enumerate(draft_bytes):  # duplicates that lost the index still map directly
            if b and i not in draft_special.special and d2t[i] < 0:
                d2t[i] = t_index.get(b, -1)
        for d, t in _special_draft_to_target(draft_special, target_special).items():
            d2t[d] = t
        fixed = _special_target_to_draft(draft_special, target_special)
        max_len = max(map(len, d_index)) if d_index else 1
        offsets, flat, lost = [0], [], {}
        for t, b in enumerate(target_bytes):
            if t in fixed:
                flat.extend(fixed[t])
            elif b:
                flat.extend(greedy_encode(b, d_index, max_len, placeholder))
                if placeholder is not None and (n := unspelled_bytes(b, d_index)):
                    lost[t] = n
            offsets.append(len(flat))
        return cls(
            torch.from_numpy(d2t),
            torch.tensor(offsets),
            torch.tensor(flat, dtype=torch.int64),
            draft_eos=draft_special.eos,
            target_eos=target_special.eos,
            roles=tuple(role_table(draft_special, target_special, placeholder)),
            placeholder_counts=lost,
        )

    @classmethod
    def from_tokenizers(
        cls, draft_tok: TokenizerLike, target_tok: TokenizerLike, *, placeholder: int | None = None
    ) -> VocabMapper:
        """Convenience for the edges (tests, toy pairs); real pairs go through ``vocab.build``."""
        return cls.from_byte_tables(
            bytes_table(draft_tok),
            bytes_table(target_tok),
            draft_special=SpecialIds.of(draft_tok),
            target_special=SpecialIds.of(target_tok),
            placeholder=placeholder,
        )

    def role_id(self, role: Role, side: str) -> int | None:
        """The id of ``role`` on ``side`` ("drafter" or "target"), None if that side lacks it."""
        col = {"drafter": 1, "target": 2}[side]
        ids = [row[col] for row in self.roles if row[0] is role and row[col] >= 0]
        return ids[0] if ids else None

    @property
    def drafter_bos(self) -> int | None:
        """The id the drafter's context starts with (stored in the map: every verb agrees)."""
        return self.role_id(Role.BOS, "drafter")

    def placeholder_bytes(self, target_id: int) -> int:
        """Bytes of ``target_id`` its drafter spelling replaces by the placeholder (0: none)."""
        return self.placeholder_counts.get(target_id, 0)

    def target_to_draft(self, target_id: int) -> list[int]:
        """Canonical drafter encoding of one target token."""
        if not 0 <= target_id < self.target_vocab_size:
            raise ValueError(
                f"target id {target_id} is outside the target vocabulary (0..{self.target_vocab_size - 1}"
                "; model rows past it are padding)"
            )
        return self._flat[self._offsets[target_id] : self._offsets[target_id + 1]]

    def translate(self, target_ids: list[int]) -> list[int]:
        """Drafter ids spelling the same bytes as ``target_ids`` (placeholders for the bytes the
        drafter cannot spell, see ``placeholder_bytes``)."""
        out: list[int] = []
        for t in target_ids:
            out.extend(self.target_to_draft(t))
        return out

    def drafter_context(self, target_ids: list[int]) -> list[int]:
        """The drafter's context for a target prompt: ``translate``, starting with the drafter's
        BOS when the map stores one."""
        ids = self.translate(target_ids)
        bos = self.drafter_bos
        return [bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids

    def map_probs(self, draft_probs: Tensor) -> Tensor:
        """Marginal of a drafter distribution on target ids over DM tokens.

        draft_probs: (..., V_d) -> (..., V_t); mass on unmapped drafter tokens is dropped, so the
        result sums to the DM mass (renormalise first to get a proper distribution, see TLI).
        """
        out = draft_probs.new_zeros((*draft_probs.shape[:-1], self.target_vocab_size))
        src = draft_probs[..., self._dm_draft_ids]
        idx = self._dm_target_ids.expand_as(src)
        return out.scatter_add_(-1, idx, src)

    def marginal(self, draft_probs: Tensor, target_id: int) -> float:
        """``map_probs(draft_probs)[target_id]`` without the full row: the mass of every DM
        drafter token that maps to ``target_id``. draft_probs: (V_d,)."""
        if self._spellers is None:  # CSR: target id -> the DM drafter ids mapping to it
            order = torch.argsort(self._dm_target_ids, stable=True)
            ids = self._dm_draft_ids[order].tolist()
            counts = torch.bincount(self._dm_target_ids, minlength=self.target_vocab_size)
            offsets = [0, *torch.cumsum(counts, 0).tolist()]
            self._spellers = (offsets, ids)
        offsets, ids = self._spellers
        spellers = ids[offsets[target_id] : offsets[target_id + 1]]
        return float(draft_probs[spellers].sum()) if spellers else 0.0

    def content_hash(self) -> str:
        """sha256 of both tables; goes into artifact metadata as ``mapping_hash``."""
        h = hashlib.sha256()
        for t in (self.draft_to_target, self.target_to_draft_offsets, self.target_to_draft_flat):
            h.update(t.numpy().astype("<i8").tobytes())
        h.update(repr((self.draft_eos, self.target_eos)).encode())
        if self.roles or self.placeholder_counts:  # v1 maps (neither) keep their hash
            h.update(
                repr(([(int(r), d, t) for r, d, t in self.roles], self.placeholder_counts)).encode()
            )
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


def _special_draft_to_target(draft: SpecialIds, target: SpecialIds) -> dict[int, int]:
    """Drafter special id -> target id of the same meaning (``vocab.roles.counterpart``)."""
    d_roles, t_roles = draft.role_ids(), target.role_ids()
    out: dict[int, int] = {}
    for role, d in d_roles.items():
        t = counterpart(role, t_roles)
        if t is not None:
            out[d] = t
    end = counterpart(Role.EOS, t_roles)
    for d in draft.eos:  # further EOS ids without a role of their own
        if d not in out and end is not None:
            out[d] = end
    return out


def _special_target_to_draft(draft: SpecialIds, target: SpecialIds) -> dict[int, list[int]]:
    """Target special id -> its fixed drafter spelling (the drafter's token of the same meaning;
    nothing for a BOS the drafter lacks). Absent: spelled as literal text."""
    d_roles, t_roles = draft.role_ids(), target.role_ids()
    out: dict[int, list[int]] = {}
    for role, t in t_roles.items():
        d = counterpart(role, d_roles)
        if d is not None:
            out[t] = [d]
        elif role is Role.BOS:
            out[t] = []
    end = counterpart(Role.EOS, d_roles)
    for t in target.eos:
        if t not in out and end is not None:
            out[t] = [end]
    return out


def bytes_table(tok: TokenizerLike) -> list[bytes]:
    """Byte spelling of every id of ``tok`` (index = id)."""
    table = getattr(tok, "token_bytes_table", None)  # optional fast path of real tokenizers
    if callable(table):
        return list(table())
    return [tok.token_bytes(i) for i in range(tok.vocab_size)]
