"""Greedy speculative == target-only on every real pair (drafter Llama-2 -> Llama-3, Qwen2, Vicuna).

Tiny random models of the real architectures with the real tokenizers. Random drafters are almost
never accepted, so each pair also runs with ``OracleDrafter`` (knows the target's continuation,
wrong 20% of the time) to exercise acceptance, rollback and n-gram merging through real vocabularies.
"""

from __future__ import annotations

import copy

import pytest
import torch

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.catalog.prompts import load_prompts
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.resolve.pair import build_pair
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import HeuristicDraftLen
from omnidraft_deploy.testing import OracleDrafter

TARGETS = ["tiny-llama3-8b", "tiny-qwen2-7b", "tiny-vicuna-7b"]
EXTRA = ["1234567890 + 0.5 = ?", "   indented\n\tTabbed", "naïve café ünïcödé — “quotes”", "x" * 40]


@pytest.fixture(scope="module", params=TARGETS)
def pair(request):
    return build_pair(
        get_preset(request.param), get_preset("tiny-llama-68m"), seed=3, max_seq_len=256
    )


def _cfg(pair, n: int) -> DecodeConfig:
    return DecodeConfig(
        max_new_tokens=n, eos_ids=pair.target_tok.eos_ids, vocab_limit=pair.mapper.target_vocab_size
    )


def test_random_drafter_greedy_equality(pair) -> None:
    cfg = _cfg(pair, 12)
    texts = [p.text for p in load_prompts()][::3] + EXTRA[:2]
    dec = SpeculativeDecoder(
        pair.target,
        pair.drafter,
        pair.mapper,
        HeuristicDraftLen(3),
        NGramCache(),
        config=cfg,
    )
    for text in texts:
        ids = pair.target_tok.encode(text)
        assert dec.generate(ids)[0] == generate_target_only(pair.target, ids, cfg)[0], text


def test_oracle_drafter_accepts_and_the_ngram_cache_learns(pair) -> None:
    """Each prompt twice: cold n-gram cache, then warm. Outputs always equal target-only; the warm
    pass accepts more, through merged n-grams on cross-vocabulary pairs."""
    cfg = _cfg(pair, 20)
    cache = NGramCache()
    totals = {"cold": [0, 0, 0], "warm": [0, 0, 0]}  # accepted, proposed, merged accepted
    for k, text in enumerate([p.text for p in load_prompts()][::2] + EXTRA[2:]):
        ids = pair.target_tok.encode(text)
        ref, _ = generate_target_only(pair.target, ids, cfg)
        pieces = [
            b"" if i in pair.target_tok.special_ids else pair.target_tok.token_bytes(i)
            for i in [*ids, *ref]
        ]
        oracle = OracleDrafter(pair.drafter_tok, pieces, seed=k)
        dec = SpeculativeDecoder(
            pair.target,
            oracle,
            pair.mapper,
            HeuristicDraftLen(4),
            cache,
            config=cfg,
        )
        for phase in ("cold", "warm"):
            out, stats = dec.generate(ids, generator=torch.Generator().manual_seed(k))
            assert out == ref, (phase, text)
            for j, v in enumerate((stats.accepted, stats.proposed, stats.merged_accepted)):
                totals[phase][j] += v
    cold, warm = (totals[p][0] / totals[p][1] for p in ("cold", "warm"))
    if pair.target_tok.name == "vicuna":  # same vocabulary: everything maps directly
        assert cold > 0.45 and totals["warm"][2] == 0
    else:
        assert warm > cold + 0.1, totals
        assert totals["warm"][2] > totals["cold"][2], totals


def test_the_shipped_seed_merges_on_a_first_request(pair) -> None:
    """``initial_ngram_cache``: the lowest-id merged target tokens, keyed by their drafter
    spelling, lowest id most protected; a first request on it merges where an empty cache cannot,
    and output still equals target-only."""
    from omnidraft_deploy.exporters.export import SEED_ENTRIES, initial_ngram_cache

    seed = initial_ngram_cache(pair.mapper)
    spelled = [t for t in range(pair.mapper.target_vocab_size)
               if len(pair.mapper.target_to_draft(t)) >= 2 and not pair.mapper.placeholder_bytes(t)]  # fmt: skip
    items = seed.items()
    assert [t for _, t, _ in items][::-1] == spelled[: len(items)]
    assert len(items) == min(len(spelled), SEED_ENTRIES)
    assert all(list(k) == pair.mapper.target_to_draft(t) for k, t, _ in items)
    if pair.target_tok.name == "vicuna":  # same vocabulary: nothing to merge (<unk> aside)
        assert len(items) <= 1
        return
    cfg = _cfg(pair, 20)
    merged = {"empty": 0, "seed": 0}
    for k, text in enumerate([p.text for p in load_prompts()][::4] + EXTRA[2:3]):
        ids = pair.target_tok.encode(text)
        ref, _ = generate_target_only(pair.target, ids, cfg)
        pieces = [b"" if i in pair.target_tok.special_ids else pair.target_tok.token_bytes(i)
                  for i in [*ids, *ref]]  # fmt: skip
        for name, cache in (("empty", NGramCache()), ("seed", copy.deepcopy(seed))):
            oracle = OracleDrafter(pair.drafter_tok, pieces, seed=k)
            dec = SpeculativeDecoder(pair.target, oracle, pair.mapper, HeuristicDraftLen(4),
                                     cache, config=cfg)  # fmt: skip
            out, stats = dec.generate(ids, generator=torch.Generator().manual_seed(k))
            assert out == ref, (name, text)
            merged[name] += stats.merged_accepted
    assert merged["seed"] > merged["empty"], merged


def test_eos_just_past_the_budget_is_not_emitted(pair) -> None:
    """An EOS that the last verified step accepts one token past ``max_new_tokens`` is cut like
    any other token: speculative output == target-only (regression: it was kept, 33 vs 32)."""
    text = load_prompts()[0].text
    ids = pair.target_tok.encode(text)
    ref, _ = generate_target_only(pair.target, ids, _cfg(pair, 24))
    pieces = [
        b"" if i in pair.target_tok.special_ids else pair.target_tok.token_bytes(i)
        for i in [*ids, *ref]
    ]
    budgets = [n for n in range(2, len(ref)) if ref[n] not in ref[:n]]
    assert budgets, ref
    for n in budgets:
        cfg = DecodeConfig(
            max_new_tokens=n, eos_ids=(ref[n],), vocab_limit=pair.mapper.target_vocab_size
        )
        base, _ = generate_target_only(pair.target, ids, cfg)
        assert base == ref[:n]
        oracle = OracleDrafter(pair.drafter_tok, pieces, error_rate=0.0)
        dec = SpeculativeDecoder(
            pair.target, oracle, pair.mapper, HeuristicDraftLen(6), NGramCache(), config=cfg
        )
        assert dec.generate(ids)[0] == base, n
