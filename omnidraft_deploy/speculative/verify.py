"""Rejection-sampling verification (Leviathan et al., 2023; Chen et al., 2023), as pure functions.

For proposal ``x_i ~ q_i`` and target distribution ``p_i``, accept with probability
``min(1, p_i(x_i) / q_i(x_i))``; on the first rejection sample from the residual
``norm(max(0, p_i - q_i))``; if all ``n`` are accepted, sample a bonus token from ``p_n``. The output
is distributed exactly as ``p`` whenever ``q_i`` is the true proposal distribution (the ``exact``
mode). In ``omnidraft`` mode the merged n-gram probability replaces ``q_i(x_i)`` and the residual uses
the DM-mapped row, which is not exactly ``q``: that bias is measured in tests and benchmarks.

With one-hot ``p`` (greedy target) this reduces to "accept while the proposal is the argmax".
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.speculative.sampling import sample


class Rows(Protocol):
    """Row ``i`` of the proposal laws: a (n, V) tensor or ``drafter.ProposalRows`` (lazy)."""

    def __getitem__(self, i: int) -> Tensor: ...


def residual(target_probs: Tensor, proposal_probs: Tensor) -> Tensor:
    """norm(max(0, p - q)); p, q: (V,). Falls back to p when p <= q everywhere (measure zero)."""
    diff = (target_probs - proposal_probs).clamp_min(0.0)
    total = diff.sum()
    return diff / total if total > 0 else target_probs


def verify(
    proposal_ids: list[int],
    proposal_q: Tensor,
    proposal_rows: Rows | None,
    target_probs: Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Accept a prefix of the proposals and pick the next token.

    proposal_ids: n target ids; proposal_q: (n,) probability the proposer gave each of them;
    proposal_rows: (n, V) full proposal distributions for the residual, read only at the first
    rejected position (None: one-hot proposals, e.g. greedy drafts or lookup);
    target_probs: (n+1, V). Returns (n_accepted, next_id).
    """
    n = len(proposal_ids)
    for i, x in enumerate(proposal_ids):
        p, q = float(target_probs[i, x]), float(proposal_q[i])
        if q <= 0.0:
            raise ValueError(f"proposal {i} (id {x}) has proposal probability {q}")
        if p >= q or float(torch.rand((), generator=generator)) < p / q:
            continue
        rows = proposal_rows[i] if proposal_rows is not None else torch.zeros_like(target_probs[i])
        if proposal_rows is None:
            rows[x] = 1.0
        return i, sample(residual(target_probs[i], rows), generator)
    return n, sample(target_probs[n], generator)


def greedy_ids(target_logits: Tensor, limit: int | None = None) -> list[int]:
    """Each row's argmax over ids ``< limit`` (padded vocabulary rows never win): (n, V) -> n ids.

    One numpy pass, no copy (the decode loop's only full-vocabulary pass on the target side in
    greedy mode). Refuses a row whose winner is not finite: numpy's argmax returns the first NaN,
    and +inf or an all -inf row wins with a non-finite value, so this catches every broken row
    an overflow or a broken graph could produce (see ``decoder._limit``)."""
    rows = target_logits.detach().float().numpy().reshape(-1, target_logits.shape[-1])
    if limit is not None and limit < rows.shape[-1]:
        rows = rows[:, :limit]
    best = rows.argmax(-1)
    top = rows[np.arange(best.size), best]
    if not np.isfinite(top).all():
        raise non_finite_rows(np.flatnonzero(~np.isfinite(top)).tolist())
    return [int(b) for b in best]


def non_finite_rows(bad: list[int]) -> FloatingPointError:
    """The error for target logits rows ``bad`` that hold NaN / +inf or nothing but -inf."""
    return FloatingPointError(
        f"the target returned non-finite logits (NaN/inf) in rows {bad[:8]} of this call: "
        "an overflow in the model or a broken graph; refusing to decode from them"
    )


def accept_greedy(proposal_ids: list[int], best: list[int]) -> tuple[int, int]:
    """Accept while each proposal is the target's argmax ``best[i]``: (n_accepted, next id)."""
    for i, x in enumerate(proposal_ids):
        if best[i] != x:
            return i, best[i]
    return len(proposal_ids), best[len(proposal_ids)]
