"""`exact` sampling through the real vocabularies reproduces the target's distribution.

Tiny random targets of the real architectures (peaky init so a few hundred samples are enough),
a drafter correlated with the target (``BridgeDrafter``) so both acceptance and rejection happen.
The joint law of the first two generated tokens is computed exactly on its high-mass cells, the
rest pooled, and compared with a chi-square test.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import FixedDraftLen
from omnidraft_deploy.speculative.drafter import Mode
from omnidraft_deploy.speculative.lossless import chi_square, chi_square_z
from omnidraft_deploy.testing import BridgeDrafter
from omnidraft_deploy.vocab.build import build_mapper
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

N_SAMPLES, TOP = 300, 12
OTHER = (-1, -1)


def _joint(model, prompt: list[int], vocab_limit: int) -> dict[tuple[int, int], float]:
    """Exact P(x1, x2) on the TOP x TOP high-mass cells; the remainder as OTHER."""

    def probs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model.forward_train(torch.tensor([ids]), last_only=True)[0, -1]
        return torch.softmax(
            logits.masked_fill(torch.arange(len(logits)) >= vocab_limit, -1e30), -1
        )

    p1 = probs(prompt)
    cells: dict[tuple[int, int], float] = {}
    for x1 in p1.topk(TOP).indices.tolist():
        p2 = probs([*prompt, x1])
        for x2 in p2.topk(TOP).indices.tolist():
            cells[(x1, x2)] = float(p1[x1] * p2[x2])
    cells[OTHER] = max(0.0, 1.0 - sum(cells.values()))
    return cells


@pytest.mark.parametrize("target", ["tiny-llama3-8b", "tiny-qwen2-7b", "tiny-vicuna-7b"])
def test_exact_mode_matches_target_through_real_vocabularies(target: str) -> None:
    spec = get_preset(target)
    t_tok, d_tok = load_tokenizer(spec.tokenizer), load_tokenizer("llama2")
    mapper = build_mapper(d_tok, t_tok)
    model = build_model(spec, seed=7, init_std=0.8, max_seq_len=32)
    with torch.no_grad():  # like natural text, most mass on tokens the drafter spells directly
        direct = torch.zeros(spec.vocab_size, dtype=torch.bool)
        direct[mapper.draft_to_target[mapper.draft_to_target >= 0]] = True
        model.lm_head.weight[~direct] *= 0.5
    drafter = BridgeDrafter(model, t_tok, d_tok, mapper.draft_to_target, seed=1)
    prompt = t_tok.encode("Answer:")
    truth = _joint(model, prompt, mapper.target_vocab_size)
    cfg = DecodeConfig(
        mode=Mode.EXACT, temperature=1.0, max_new_tokens=2, vocab_limit=mapper.target_vocab_size
    )
    dec = SpeculativeDecoder(EagerLM(model), drafter, mapper, FixedDraftLen(3), config=cfg)
    gen = torch.Generator().manual_seed(0)
    counts: Counter[tuple[int, ...]] = Counter()
    accepted = proposed = 0
    for _ in range(N_SAMPLES):
        out, stats = dec.generate(prompt, generator=gen)
        counts[tuple(out) if tuple(out) in truth else OTHER] += 1
        accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
    stat, dof = chi_square(counts, truth)  # type: ignore[arg-type]
    assert chi_square_z(stat, dof) < 4.0, (stat, dof)
    assert 0.1 < accepted / proposed < 0.95  # both paths exercised
