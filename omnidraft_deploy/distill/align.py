"""Align target-vocabulary supervision to drafter-vocabulary positions (pure functions).

The decoder speaks target ids only; the drafter is trained on its own ids. ``VocabMapper`` is the
only object that knows both vocabularies: each target token ``t_j`` has a canonical drafter
encoding ``target_to_draft(t_j) = [d_{s_j}, ..., d_{e_j - 1}]`` (one token for directly mapped
"DM" tokens, ``n >= 2`` for tokens the n-gram cache merges). Concatenating these encodings gives
the drafter sequence ``D`` and per-target-token spans ``[s_j, e_j)`` into it.

A target token whose encoding is empty (an unmappable special token) gets an empty span and is
skipped by every loss. The drafter logits at position ``i`` predict ``D[i + 1]``, so target token
``j`` is predicted from drafter positions ``s_j - 1 .. e_j - 2``; a span starting at 0 has no
predicting position and is skipped too.

``build_example`` turns one verification step (context + committed target tokens + the target's
top-k at those positions) into a fixed-length :class:`DistillExample` whose tensors feed
``losses.hybrid_loss_rows`` directly, in eager PyTorch and in the exported training graphs alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch
from torch import Tensor

from omnidraft_deploy.distill.losses import map_topk_to_draft


class MapperLike(Protocol):
    """The part of ``omnidraft_deploy.vocab.mapper.VocabMapper`` this module uses."""

    draft_to_target: Tensor  # (V_d,) int64, target id with identical bytes or -1
    target_to_draft_offsets: Tensor  # (V_t + 1,) int64 CSR offsets
    target_to_draft_flat: Tensor  # (N,) int64 CSR values

    @property
    def draft_vocab_size(self) -> int: ...

    @property
    def target_vocab_size(self) -> int: ...


class TokenKind(StrEnum):
    DM = "dm"  # one drafter token with the same bytes: trained by L_DM
    NGRAM = "ngram"  # canonical drafter encoding of >= 1 tokens that is not DM: trained by L_Ngram
    SKIP = "skip"  # empty encoding (unmappable special token)


def target_to_draft_ids(mapper: MapperLike, target_id: int) -> list[int]:
    """Canonical drafter encoding of one target id, read from the CSR tables."""
    if not 0 <= target_id < mapper.target_vocab_size:
        raise ValueError(f"target id {target_id} outside [0, {mapper.target_vocab_size})")
    lo = int(mapper.target_to_draft_offsets[target_id])
    hi = int(mapper.target_to_draft_offsets[target_id + 1])
    return [int(x) for x in mapper.target_to_draft_flat[lo:hi]]


def dm_inverse(draft_to_target: Tensor, target_vocab_size: int) -> Tensor:
    """Inverse DM table: ``(V_t,)`` int64 drafter id with identical bytes, or -1.

    ``draft_to_target: (V_d,)``. Where several drafter ids share one target id, the largest wins
    (deterministic). Distinct target ids always map to distinct drafter ids.
    """
    inverse = torch.full((target_vocab_size,), -1, dtype=torch.long)
    valid = (draft_to_target >= 0).nonzero().flatten()
    inverse[draft_to_target[valid]] = valid
    return inverse


def translate(mapper: MapperLike, target_ids: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Target ids -> (drafter ids ``D``, spans): ``D[s_j:e_j]`` encodes ``target_ids[j]``."""
    draft_ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for t in target_ids:
        start = len(draft_ids)
        draft_ids.extend(target_to_draft_ids(mapper, t))
        spans.append((start, len(draft_ids)))
    return draft_ids, spans


def token_kind(mapper: MapperLike, target_id: int, encoding: list[int]) -> TokenKind:
    """Classify a target token by its drafter encoding."""
    if not encoding:
        return TokenKind.SKIP
    if len(encoding) == 1 and int(mapper.draft_to_target[encoding[0]]) == target_id:
        return TokenKind.DM
    return TokenKind.NGRAM


@dataclass(frozen=True)
class DistillExample:
    """One fixed-length training row set; ``T = seq_len``, ``k`` = top-k width.

    ``draft_ids (T,)`` drafter input ids (right-padded with ``pad_id``); row ``i`` of the drafter
    logits is supervised by: ``topk_draft_ids (T, k)`` / ``topk_probs (T, k)`` the target's top-k
    mapped through the DM table and renormalised over the DM mass (id 0, prob 0 where unused),
    ``dm_weight (T,)`` 1 on DM rows, ``next_draft_ids (T,)`` the teacher-forced next drafter id,
    ``ngram_weight (T,)`` the target's probability of the n-gram token on rows inside its span.
    Weights are unnormalised here; ``stack_examples`` divides them by the batch's DM row count and
    n-gram span count so that ``losses.hybrid_loss_rows`` is a plain weighted sum.
    """

    draft_ids: Tensor
    topk_draft_ids: Tensor
    topk_probs: Tensor
    dm_weight: Tensor
    next_draft_ids: Tensor
    ngram_weight: Tensor
    ngram_spans: int  # number of n-gram target tokens represented

    @property
    def dm_rows(self) -> int:
        return int((self.dm_weight > 0).sum())


def build_example(  # noqa: PLR0913
    mapper: MapperLike,
    context_ids: list[int],
    new_ids: list[int],
    topk_ids: Tensor,
    topk_probs: Tensor,
    *,
    seq_len: int,
    inverse: Tensor | None = None,
    pad_id: int = 0,
) -> DistillExample:
    """Build the supervision for the ``n = len(new_ids)`` committed tokens of one step.

    ``topk_ids / topk_probs: (n, k)`` target ids / probabilities at each committed position.
    The drafter sequence is left-truncated to ``seq_len`` tokens ending at the last committed token,
    then right-padded. ``inverse`` is ``dm_inverse(...)`` (computed when omitted).
    """
    n, k = topk_ids.shape
    if n != len(new_ids):
        raise ValueError(f"topk rows {n} != {len(new_ids)} new tokens")
    inverse = (
        dm_inverse(mapper.draft_to_target, mapper.target_vocab_size) if inverse is None else inverse
    )
    draft_all, spans = translate(mapper, list(context_ids) + list(new_ids))
    cut = max(0, len(draft_all) - seq_len)
    draft = draft_all[cut:]
    ids = torch.full((seq_len,), pad_id, dtype=torch.long)
    ids[: len(draft)] = torch.tensor(draft, dtype=torch.long)
    out_topk = torch.zeros(seq_len, k, dtype=torch.long)
    out_probs = torch.zeros(seq_len, k)
    dm_w, ng_w = torch.zeros(seq_len), torch.zeros(seq_len)
    next_ids = torch.zeros(seq_len, dtype=torch.long)
    next_ids[: len(draft) - 1] = ids[1 : len(draft)]
    n_spans = 0
    for j, t in enumerate(new_ids):
        s, e = spans[len(context_ids) + j]
        s, e = s - cut, e - cut
        kind = token_kind(mapper, t, draft[s:e] if s >= 0 else [])
        if kind is TokenKind.SKIP or s < 1:
            continue
        if kind is TokenKind.DM:
            out_topk[s - 1], out_probs[s - 1], mass = map_topk_to_draft(
                topk_ids[j], topk_probs[j], inverse
            )
            dm_w[s - 1] = 1.0 if mass > 0 else 0.0
            continue
        hit = (topk_ids[j] == t).nonzero().flatten()
        q = float(topk_probs[j, hit[0]]) if len(hit) else 0.0
        ng_w[s - 1 : e - 1] = q
        n_spans += int(q > 0)
    return DistillExample(ids, out_topk, out_probs, dm_w, next_ids, ng_w, n_spans)


BATCH_FIELDS = (
    "draft_ids",
    "topk_draft_ids",
    "topk_probs",
    "dm_weight",
    "next_draft_ids",
    "ngram_weight",
)


def stack_examples(examples: list[DistillExample]) -> dict[str, Tensor]:
    """Stack examples into ``(B, T, ...)`` tensors named as in ``BATCH_FIELDS``.

    Normalises the weights over the whole batch: ``dm_weight /= #DM rows`` and
    ``ngram_weight /= #n-gram spans``, so L_DM is a mean over DM tokens and L_Ngram a mean over
    n-gram tokens of their (probability-weighted) joint negative log-likelihood.
    """
    if not examples:
        raise ValueError("no examples to stack")
    batch = {f: torch.stack([getattr(ex, f) for ex in examples]) for f in BATCH_FIELDS}
    n_dm = sum(ex.dm_rows for ex in examples)
    n_spans = sum(ex.ngram_spans for ex in examples)
    batch["dm_weight"] = batch["dm_weight"] / max(n_dm, 1)
    batch["ngram_weight"] = batch["ngram_weight"] / max(n_spans, 1)
    return batch
