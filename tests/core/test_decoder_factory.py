"""The one decoder factory (``speculative.factory.build_decoder``): policies by registry name, the
pair's vocabulary limit and EOS ids from the mapper, one cost-policy cap everywhere."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from benchmarks.common import timer
from benchmarks.common.pair import fresh_lookup
from omnidraft_deploy.catalog.policies import NEEDS_PROFILE, PolicyName
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only
from omnidraft_deploy.speculative.draft_len import (
    POLICIES,
    CostAwareDraftLen,
    FixedDraftLen,
    make_policy,
)
from omnidraft_deploy.speculative.factory import build_decoder, pair_config
from omnidraft_deploy.speculative.hybrid import HybridProposer
from omnidraft_deploy.testing import toy_models

ROOT = Path(__file__).resolve().parents[2]
PROFILE = CostProfile(target_ms=(10.0, 11.0, 12.0, 13.0), drafter_ms=(1.0, 1.1, 1.2, 1.3))
FACTORY = "omnidraft_deploy/speculative/factory.py"


def test_the_registry_names_the_policies_the_parser_offers() -> None:
    assert set(POLICIES) == set(PolicyName)
    from omnidraft_deploy.cli.main import HANDLERS
    from omnidraft_deploy.cli.parser import build_parser

    parser = build_parser(HANDLERS)
    assert parser.parse_args(["generate", "--prompt", "x", "--policy", "predictor"]).policy == "predictor"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--prompt", "x", "--policy", "cost"])
    assert {PolicyName.COST} == NEEDS_PROFILE


def test_the_cost_cap_is_twice_the_draft_length_everywhere() -> None:
    policy = make_policy("cost", 4, PROFILE)
    assert isinstance(policy, CostAwareDraftLen) and policy.max_len == 8
    with pytest.raises(ValueError, match="needs a cost profile"):
        make_policy("cost", 4)
    with pytest.raises(ValueError, match="takes no cost profile"):
        make_policy("heuristic", 4, PROFILE)
    with pytest.raises(KeyError, match=r"choose from \['cost', 'fixed', 'heuristic', 'predictor'\]"):
        make_policy("fastest", 4)


def test_the_pair_decides_vocab_limit_and_eos() -> None:
    target, drafter, mapper = toy_models()
    asked = DecodeConfig(max_new_tokens=6, eos_ids=(99,), vocab_limit=3)  # a caller's copy loses
    dec = build_decoder(target, drafter, mapper, policy="fixed", draft_len=2, config=asked)
    assert dec.cfg.vocab_limit == mapper.target_vocab_size
    assert dec.cfg.eos_ids == tuple(mapper.target_eos) and dec.cfg.max_new_tokens == 6
    assert isinstance(dec.policy, FixedDraftLen)
    assert pair_config(mapper, asked, stop_at_eos=False).eos_ids == ()


def test_the_factory_wires_cost_aware_hybrid_decoders() -> None:
    target, drafter, mapper = toy_models()
    cfg = pair_config(mapper, DecodeConfig(max_new_tokens=6))
    prompt = [1, 2, 3]
    want, _ = generate_target_only(target, prompt, cfg)
    dec = build_decoder(target, drafter, mapper, policy="cost", draft_len=2, profile=PROFILE,
                        config=cfg, lookup=fresh_lookup())  # fmt: skip
    assert isinstance(dec.drafter, HybridProposer) and dec.policy.max_len == 4  # type: ignore[attr-defined]
    priced = dataclasses.replace(PROFILE, prefill_ms_per_token=2.0)
    out, wall, st = timer.decoder_run(dec, profile=priced)(prompt)
    assert out == want and wall > 0  # greedy speculative output is target-only output
    extra = getattr(st, "extra", {})
    assert {"predicted_base_ms", "predicted_spec_ms", "model", "lookup", "none"} <= set(extra)
    assert extra["prefill_ms"] == 3 * 2.0  # the prompt's 3 tokens, paid alike by target-only
    fixed = build_decoder(target, drafter, mapper, policy="fixed", draft_len=2, config=cfg)
    assert timer.decoder_run(fixed)(prompt)[0] == want == timer.target_run(target, cfg)(prompt)[0]


def _builds_a_decoder(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "SpeculativeDecoder"
               for n in ast.walk(tree))  # fmt: skip


def test_one_library_function_builds_a_decoder() -> None:
    """Outside the factory no library or benchmark module calls ``SpeculativeDecoder(...)``
    (tests build their own, to test the loop itself)."""
    builders = {path.relative_to(ROOT).as_posix()
                for folder in ("omnidraft_deploy", "runtime", "exporters", "benchmarks")
                for path in sorted((ROOT / folder).rglob("*.py")) if _builds_a_decoder(path)}  # fmt: skip
    assert builders == {FACTORY}
    planted = ast.parse("def f(t, d, m, p):\n    return SpeculativeDecoder(t, d, m, p)\n")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "SpeculativeDecoder"
               for n in ast.walk(planted))  # fmt: skip
