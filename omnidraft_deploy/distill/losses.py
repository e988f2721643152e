"""Hybrid online-distillation loss of OmniDraft (pure functions over tensors).

OmniDraft (Ramakrishnan et al., 2025, "OmniDraft: A Cross-vocabulary, Online Adaptive Drafter for
On-device Speculative Decoding", Sec. 3.3) trains the drafter online with

    L = L_DM + lambda * L_Ngram

- ``L_DM``: for committed target tokens that are *directly mapped* (a drafter token with identical
  bytes exists), the KL divergence from the target's next-token distribution, restricted to the
  directly mapped part of the vocabulary and renormalised there, to the drafter's:

      L_DM = mean_{j in DM} sum_{d} p~_T(d | x_<j) * (log p~_T(d | x_<j) - log p_D(d | D_<s_j))

  with ``p~_T(d) = p_T(t) / sum_{t' in topk & DM} p_T(t')`` for ``d = DM^-1(t)``. Only the target's
  top-k is available (k = 8 by default), so the sum runs over the DM members of the top-k.
  ``p_D`` is the drafter's full softmax (not renormalised), so mass the drafter puts on unmapped
  tokens is penalised.

- ``L_Ngram``: for committed target tokens that the drafter can only produce as a *sequence*
  ``d_{s_j} .. d_{e_j-1}`` (tokens merged by the n-gram cache), the teacher-forced negative
  log-likelihood of that sequence, i.e. of the n-gram seen as one token, weighted by the target's
  probability of the merged token:

      L_Ngram = mean_{j in NG} p_T(t_j | x_<j) * ( - sum_{i=s_j}^{e_j-1} log p_D(d_i | D_<i) )

  The paper treats the n-gram as a single token whose drafter probability is the product of the
  per-token conditionals and weights its log-likelihood by the target's probability; this is the
  same quantity: a one-sample estimate of the cross-entropy from ``p_T`` restricted to the committed
  n-gram token (the remaining top-k n-gram alternatives are not teacher-forceable without extra
  drafter passes, so they are dropped). ``p_T(t_j) = 0`` when ``t_j`` is outside the top-k.

Row form (what the exported training graphs compute): every drafter position ``i`` carries
``dm_weight[i]`` and ``ngram_weight[i]`` already divided by the batch's DM-row / n-gram-span
counts (``align.stack_examples``), so each loss is a plain weighted sum over rows. Padding rows
have weight 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_TINY = 1e-30  # log(0) guard: rows with p = 0 contribute p * log(TINY) = 0


def map_topk_to_draft(
    topk_target_ids: Tensor, topk_probs: Tensor, dm_inverse: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Scatter the target's top-k into the drafter vocabulary through the DM table.

    ``topk_target_ids, topk_probs: (..., k)``; ``dm_inverse: (V_t,)`` drafter id or -1.
    Returns ``(topk_draft_ids (..., k)`` with unmapped entries set to 0, ``probs (..., k)``
    renormalised over the DM mass (0 where unmapped; all 0 where the DM mass is 0), ``dm_mass
    (...)`` = sum of the mapped target probabilities).
    """
    mapped = dm_inverse[topk_target_ids]  # (..., k)
    probs = torch.where(mapped >= 0, topk_probs.float(), torch.zeros((), dtype=torch.float32))
    mass = probs.sum(-1)  # (...)
    probs = probs / mass.clamp_min(_TINY).unsqueeze(-1)
    return mapped.clamp(min=0), probs, mass


def dm_kl_rows(drafter_logits: Tensor, topk_draft_ids: Tensor, topk_probs: Tensor) -> Tensor:
    """Per-row ``KL(p~_T || p_D)`` over the mapped top-k.

    ``drafter_logits: (..., V_d)``; ``topk_draft_ids: (..., k)`` drafter ids;
    ``topk_probs: (..., k)`` renormalised target probabilities (rows summing to 1 or all 0).
    Returns ``(...)``: ``sum_i p_i * (log p_i - log_softmax(z)[d_i])``; 0 for all-zero rows.
    """
    log_pd = F.log_softmax(drafter_logits.float(), dim=-1).gather(-1, topk_draft_ids)  # (..., k)
    p = topk_probs.float()
    return (p * (torch.log(p.clamp_min(_TINY)) - log_pd)).sum(-1)


def ngram_nll_rows(drafter_logits: Tensor, next_draft_ids: Tensor) -> Tensor:
    """Per-row teacher-forced NLL ``-log p_D(next_draft_ids[i] | D_<=i)``.

    ``drafter_logits: (..., V_d)``; ``next_draft_ids: (...)`` int64. Returns ``(...)``.
    """
    log_pd = F.log_softmax(drafter_logits.float(), dim=-1)
    return -log_pd.gather(-1, next_draft_ids.unsqueeze(-1)).squeeze(-1)


def dm_loss(
    drafter_logits: Tensor, topk_draft_ids: Tensor, topk_probs: Tensor, dm_weight: Tensor
) -> Tensor:
    """``L_DM = sum_rows dm_weight * KL_row``; shapes as in ``dm_kl_rows``, ``dm_weight: (...)``."""
    return (dm_weight * dm_kl_rows(drafter_logits, topk_draft_ids, topk_probs)).sum()


def ngram_loss(drafter_logits: Tensor, next_draft_ids: Tensor, ngram_weight: Tensor) -> Tensor:
    """``L_Ngram = sum_rows ngram_weight * NLL_row``; ``ngram_weight: (...)`` = p_T / #spans."""
    return (ngram_weight * ngram_nll_rows(drafter_logits, next_draft_ids)).sum()


def hybrid_loss_rows(  # noqa: PLR0913
    drafter_logits: Tensor,
    topk_draft_ids: Tensor,
    topk_probs: Tensor,
    dm_weight: Tensor,
    next_draft_ids: Tensor,
    ngram_weight: Tensor,
    lam: float | Tensor,
) -> Tensor:
    """``L = L_DM + lam * L_Ngram`` (scalar); all inputs in row form ``(B, T, ...)``.

    One ``log_softmax`` is shared by both terms. ``lam = 0`` gives the L_DM-only ablation.
    """
    log_pd = F.log_softmax(drafter_logits.float(), dim=-1)  # (B, T, V_d)
    p = topk_probs.float()
    kl = (p * (torch.log(p.clamp_min(_TINY)) - log_pd.gather(-1, topk_draft_ids))).sum(-1)
    nll = -log_pd.gather(-1, next_draft_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return (dm_weight * kl).sum() + lam * (ngram_weight * nll).sum()
