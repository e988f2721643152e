"""Real cross-vocabulary pair (SmolLM2-135M drafter -> Qwen2.5-Coder-0.5B target).

Fast tests cover the byte-safe mapper on table tokenizers; the ``slow`` ones load the real models
(optional assets: skipped when not cached) and check that greedy speculative decoding returns the
target's own greedy output token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.resolve.pair import Pair, build_pair
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import make_policy
from omnidraft_deploy.testing import TableTokenizer
from omnidraft_deploy.vocab.build import build_mapper, unspellable_target_ids
from omnidraft_deploy.vocab.mapper import VocabMapper


def _toy() -> tuple[TableTokenizer, TableTokenizer]:
    drafter = TableTokenizer("t-drafter", [b"</s>", b"a", b"b", b" ", b"ab", b"?"])  # no b"\xff"
    target = TableTokenizer("t-target", [b"<eos>", b"a", b"b", b" ", b"ab", b"\xff", b"a\xff"])
    return drafter, target


def test_plain_mapper_rejects_unspellable_bytes() -> None:
    drafter, target = _toy()
    with pytest.raises(ValueError, match="0xff"):
        VocabMapper.from_tokenizers(drafter, target)


def test_byte_safe_mapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path))
    drafter, target = _toy()
    assert unspellable_target_ids(drafter, target) == [5, 6]
    mapper = build_mapper(drafter, target)
    assert mapper.target_to_draft(5) == [5] and mapper.target_to_draft(6) == [1, 5]  # "?" stands in
    assert mapper.placeholder_counts == {5: 1, 6: 1}
    assert mapper.target_to_draft(4) == [4]  # spellable tokens keep their drafter spelling
    assert [int(t) for t in mapper.draft_to_target] == [0, 1, 2, 3, 4, -1]  # "?": not in target
    assert list((tmp_path / "mappers").glob("t-drafter--t-target-*.bin"))
    again = build_mapper(drafter, target)  # from the cache file
    assert again.target_to_draft(1) == [1] and again.target_to_draft(6) == [1, 5]
    assert again.placeholder_counts == mapper.placeholder_counts


@pytest.fixture(scope="module")
def real_pair(require_asset: Callable[[str], Path]) -> Pair:
    """The pair through the library's one loader (``resolve.pair.build_pair``)."""
    require_asset("smollm2-135m-gguf")
    require_asset("qwen2.5-0.5b-gguf")
    return build_pair(get_preset("qwen2.5-0.5b"), get_preset("smollm2-135m"), max_seq_len=256)


def _config(pair: Pair, max_new_tokens: int) -> DecodeConfig:
    """Greedy, the target's EOS ids, the padded logits rows past the vocabulary masked."""
    return DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=tuple(pair.target_tok.eos_ids),
                        vocab_limit=pair.mapper.target_vocab_size)  # fmt: skip


@pytest.mark.slow
def test_real_mapper_spells_every_spellable_target_token(real_pair: Pair) -> None:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    drafter_tok, target_tok = load_tokenizer("smollm2"), load_tokenizer("qwen2")
    blank = set(unspellable_target_ids(drafter_tok, target_tok))
    assert len(blank) == 21  # tokens holding bytes SmolLM2 has no token for (placeholder)
    d_bytes, t_bytes = drafter_tok.token_bytes_table(), target_tok.token_bytes_table()
    m = real_pair.mapper
    for t in range(0, target_tok.vocab_size, 97):  # a spread sample of the 151665 ids
        if t in blank or t in target_tok.special_ids:
            continue
        assert b"".join(d_bytes[d] for d in m.target_to_draft(t)) == t_bytes[t], t


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["heuristic", "predictor"])
def test_greedy_speculative_equals_target_only(real_pair: Pair, policy: str) -> None:
    from omnidraft_deploy.catalog.prompts import load_prompts
    from omnidraft_deploy.ngram.cache import NGramCache

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    cfg = _config(real_pair, 16)
    dec = SpeculativeDecoder(real_pair.target, real_pair.drafter, real_pair.mapper,
                             make_policy(policy, 3), NGramCache(), config=cfg)  # fmt: skip
    prompts = [p for p in load_prompts({"code", "chat", "math"})][::3]
    for p in prompts:
        ids = real_pair.target_tok.encode(p.text)
        logits = real_pair.target.forward(torch.tensor(ids, dtype=torch.long), 0)
        assert torch.isfinite(logits).all(), "target logits not finite (NaN '!!!' outputs)"
        want, _ = generate_target_only(real_pair.target, ids, cfg)
        assert len(set(want)) > 2, real_pair.target_tok.decode(want)  # not a degenerate repeat
        got, stats = dec.generate(ids)
        assert got == want, (
            p.task,
            real_pair.target_tok.decode(want),
            real_pair.target_tok.decode(got),
        )
        assert stats.proposed > 0 and stats.target_calls <= len(want)


TOOLS = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather '
    'of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
    '"required": ["city"]}}}'
)
# Qwen2.5's chat template rendered with one tool (tokenizer.chat_template of the GGUF) and FIM.
SPECIAL_PROMPTS = {
    "tool_call": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + TOOLS
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": '
        '<function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is the weather like in Paris?<|im_end|>\n<|im_start|>assistant\n"
    ),
    "fim": "<|fim_prefix|>def mean(xs):\n    <|fim_suffix|>\n    return total / len(xs)\n<|fim_middle|>",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SPECIAL_PROMPTS))
def test_tool_call_and_fim_prompts_decode_like_target_only(real_pair: Pair, kind: str) -> None:
    """Issue 15: Qwen2.5's tool-call / FIM ids (151646-151664) crashed the speculative path."""
    from omnidraft_deploy.ngram.cache import NGramCache

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    tok = real_pair.target_tok
    ids = tok.encode(SPECIAL_PROMPTS[kind])
    assert any(151646 <= i < 151665 for i in ids)  # Qwen2.5's added tokens are in the prompt
    cfg = _config(real_pair, 32)
    want, _ = generate_target_only(real_pair.target, ids, cfg)
    dec = SpeculativeDecoder(real_pair.target, real_pair.drafter, real_pair.mapper,
                             make_policy("heuristic", 3), NGramCache(), config=cfg)  # fmt: skip
    got, stats = dec.generate(ids)
    assert got == want, (kind, tok.decode(want), tok.decode(got))
    assert stats.proposed > 0
    if kind == "tool_call":  # the target answers with a call of the tool (not a degenerate text)
        assert '"name": "get_weather"' in tok.decode(want), tok.decode(want)
