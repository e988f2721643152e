"""Statistical tools to check that a sampler reproduces the target's distribution.

Pure functions over count tables: exact sequence distributions by enumeration, Pearson's
chi-square goodness of fit with small cells pooled, and total-variation distance.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import torch

from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.speculative.sampling import logits_to_probs


def exact_sequence_probs(
    target: CausalLM, prompt_ids: list[int], length: int, temperature: float = 1.0
) -> dict[tuple[int, ...], float]:
    """P(x_1..x_length | prompt) for every sequence, by enumeration (small vocabularies only)."""
    vocab = target.vocab_size
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(vocab), repeat=length - 1):
        ids = torch.tensor([*prompt_ids, *seq], dtype=torch.long)
        probs = logits_to_probs(target.forward(ids, 0)[len(prompt_ids) - 1 :], temperature)
        prefix = math.prod(float(probs[i, t]) for i, t in enumerate(seq))
        for last in range(vocab):
            out[(*seq, last)] = prefix * float(probs[length - 1, last])
    return out


def chi_square(
    counts: Counter[tuple[int, ...]], probs: dict[tuple[int, ...], float], min_expected: float = 5.0
) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom; cells expecting < min_expected are pooled."""
    n = sum(counts.values())
    stat, dof, pool_obs, pool_exp = 0.0, -1, 0.0, 0.0
    for cell, p in probs.items():
        exp, obs = n * p, counts.get(cell, 0)
        if exp < min_expected:
            pool_obs, pool_exp = pool_obs + obs, pool_exp + exp
            continue
        stat += (obs - exp) ** 2 / exp
        dof += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        dof += 1
    return stat, max(dof, 1)


def chi_square_z(stat: float, dof: int) -> float:
    """Wilson-Hilferty normal approximation of a chi-square statistic (z > 4 ~ p < 3e-5)."""
    k = float(dof)
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def total_variation(counts: Counter[tuple[int, ...]], probs: dict[tuple[int, ...], float]) -> float:
    n = sum(counts.values())
    cells = set(probs) | set(counts)
    return 0.5 * sum(abs(counts.get(c, 0) / n - probs.get(c, 0.0)) for c in cells)


def sample_sequences(
    decoder: object, prompt_ids: list[int], n_samples: int, seed: int = 0
) -> Counter[tuple[int, ...]]:
    """Counts of the sequences ``decoder.generate`` returns over ``n_samples`` seeded runs."""
    gen = torch.Generator().manual_seed(seed)
    return Counter(
        tuple(decoder.generate(prompt_ids, generator=gen)[0])  # type: ignore[attr-defined]
        for _ in range(n_samples)
    )


def deviation_report(
    counts: Counter[tuple[int, ...]], truth: dict[tuple[int, ...], float]
) -> dict[str, float]:
    """Total variation and chi-square figures of an empirical law against the exact one."""
    stat, dof = chi_square(counts, truth)
    return {
        "samples": float(sum(counts.values())),
        "total_variation": total_variation(counts, truth),
        "chi2": stat,
        "dof": float(dof),
        "chi2_z": chi_square_z(stat, dof),
    }
