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

import torch
from torch import Tensor

from omnidraft_deploy.speculative.sampling import sample


def residual(target_probs: Tensor, proposal_probs: Tensor) -> Tensor:
    """norm(max(0, p - q)); p, q: (V,). Falls back to p when p <= q everywhere (measure zero)."""
    diff = (target_probs - proposal_probs).clamp_min(0.0)
    total = diff.sum()
    return diff / total if total > 0 else target_probs


def verify(
    proposal_ids: list[int],
    proposal_q: Tensor,
    proposal_rows: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Accept a prefix of the proposals and pick the next token.

    proposal_ids: n target ids; proposal_q: (n,) probability the proposer gave each of them;
    proposal_rows: (n, V) full proposal distributions for the residual (None: greedy target);
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


def verify_greedy(proposal_ids: list[int], target_logits: Tensor) -> tuple[int, int]:
    """Greedy verification: target_logits (n+1, V). Deterministic, no randomness consumed."""
    best = target_logits.argmax(-1).tolist()
    for i, x in enumerate(proposal_ids):
        if best[i] != x:
            return i, best[i]
    return len(proposal_ids), best[len(proposal_ids)]
