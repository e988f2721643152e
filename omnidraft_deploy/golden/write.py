"""Writes the Android core's golden files: decoding traces and tokenizer vectors (one command).

    .venv/bin/python -m omnidraft_deploy.golden            # traces + vectors (about 8 min, 1 thread)
    .venv/bin/python -m omnidraft_deploy.golden --vectors  # tokenizer vectors only (~1 min)
    .venv/bin/python -m omnidraft_deploy.golden --traces --only tiny-llama3-greedy-cost  # one trace

``tests/golden/traces/<name>.json.gz``: ``trace.record_pair`` over the tiny preset pairs that the
bundle tests export (random weights, real tokenizers) and, when the optional model assets are cached
(``omnidraft assets fetch --models``), the real SmolLM2-135M -> Qwen2.5-0.5B pair, whose drafts get
accepted and merged (random tiny models never agree). The ``*-cost`` traces decode as ``omnidraft
run`` does with a cost profile (cost-aware draft length, lookup proposals), priced by the fixed
``PROFILES`` below instead of a measurement. Tiny pairs' vocabulary maps are rebuilt by
the test from the default assets; the real pair's map is stored next to its traces
(``<pair>.vocab_map.bin.gz``) because its drafter tokenizer is an optional asset.

One trace, ``tiny-multi-greedy-heuristic``, is a multi-target trace (issue 30): two targets of two
vocabularies (``MULTI``) decoded with ONE drafter object, at the settings of the tests' multi-target
bundle (``tests/conftest.py`` ``multi_bundle``: the same presets and seeds, ``max_seq_len``,
``draft_len``). It is the trace format extended: ``{"format", "name", "drafter", "bundle": {...},
"targets": [<one trace per target, as record_pair writes it>]}``. The Android test opens that
bundle, selects each target by name and replays its trace with the map and tokenizer it ships.

``tests/golden/tokenizer_vectors/<tokenizer>.json.gz``: ``{"tokenizer", "strings", "ids"}`` for a
fixed, seeded set of strings (unicode, whitespace runs, code, emoji, special-token text, the
llama.cpp golden inputs and the shipped prompts).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import random
from pathlib import Path
from typing import Any

from omnidraft_deploy.speculative.cost import CostProfile

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "golden" / "traces"
VECTORS = ROOT / "tests" / "golden" / "tokenizer_vectors"
VECTOR_TOKENIZERS = ("llama2", "llama3", "qwen2", "gpt2", "smollm2")
REAL_PAIR = ("qwen2.5-0.5b", "smollm2-135m")
# the multi-target trace: two targets of two vocabularies on one drafter, at the settings of the
# tests' multi-target bundle (tests/conftest.py multi_bundle: --max-seq-len 48 --draft-len 3)
MULTI = ("tiny-llama3-8b", "tiny-qwen2-7b")
MULTI_DRAFTER = "tiny-llama-68m"
MULTI_NAME = "tiny-multi-greedy-heuristic"
MULTI_BUNDLE = {"max_seq_len": 48, "draft_len": 3, "seed": 0}
log = logging.getLogger(__name__)
# Fixed costs (ms) of the cost traces: the profile `omnidraft profile` measured for the int8 ONNX
# SmolLM2-135M -> Qwen2.5-Coder-0.5B bundle (reports/real_pair, 2 threads; target calls of 1..9
# tokens, SmolLM2 14.1 ms a call: drafting rarely pays, lookups do), and the same target with
# that report's 8-layer early-exit drafter (5.75 ms a call), where model drafts pay.
_TARGET_MS = (31.554, 34.575, 33.705, 35.753, 38.904, 40.626, 41.740, 43.171, 45.893)
PROFILES = {
    "measured": CostProfile(target_ms=_TARGET_MS, drafter_ms=(14.067, 14.733, 15.519),
                            lookup_ms=0.001, overhead_ms=2.868),
    "cheap-drafter": CostProfile(target_ms=_TARGET_MS, drafter_ms=(5.751, 5.823, 6.144),
                                 lookup_ms=0.001, overhead_ms=2.868),
}  # fmt: skip

_PROMPTS_TINY = ("def fibonacci(n: int) -> int:\n    return", "Héllo wörld, 東京 ☕ 🚀 — ok?")
_PROMPT_REPEAT = (
    "for i in range(3):\n    print(i)\nfor j in range(3):\n    print(j)\nfor k in range("
)
_PROMPTS_REAL = (
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    "<|im_start|>user\nSay hello in French, one word.<|im_end|>\n<|im_start|>assistant\n",
    "User: Explique la différence entre « café » et « thé ». ☕\nAssistant:",
)


def _trace_plan() -> list[tuple[tuple[str, str], dict[str, Any]]]:
    from omnidraft_deploy.speculative.drafter import Mode

    tiny3, tinyq, small = (
        ("tiny-llama3-8b", "tiny-llama-68m"),
        ("tiny-qwen2-7b", "tiny-llama-68m"),
        REAL_PAIR,
    )
    g, e = Mode.GREEDY, Mode.EXACT
    cheap, measured = PROFILES["cheap-drafter"], PROFILES["measured"]
    return [
        (tiny3, dict(name="tiny-llama3-greedy-fixed", mode=g, policy="fixed", prompts=_PROMPTS_TINY)),
        (tiny3, dict(name="tiny-llama3-exact-heuristic", mode=e, temperature=1.0,
                     policy="heuristic", cache_policy="lfu", prompts=_PROMPTS_TINY)),
        (tinyq, dict(name="tiny-qwen2-greedy-heuristic", mode=g, policy="heuristic",
                     cache_policy="lfu", prompts=_PROMPTS_TINY)),
        (small, dict(name="smollm2-qwen2.5-greedy-heuristic", mode=g, policy="heuristic",
                     max_new_tokens=32, cache_max_entries=12, prompts=_PROMPTS_REAL)),
        (small, dict(name="smollm2-qwen2.5-greedy-fixed", mode=g, policy="fixed",
                     max_new_tokens=32, cache_policy="lfu", cache_max_entries=12,
                     prompts=_PROMPTS_REAL)),
        (small, dict(name="smollm2-qwen2.5-exact-heuristic", mode=e, temperature=0.7,
                     policy="heuristic", max_new_tokens=32, prompts=_PROMPTS_REAL[::2])),
        (tiny3, dict(name="tiny-llama3-greedy-cost", mode=g, policy="cost", profile=cheap,
                     max_new_tokens=32, prompts=(*_PROMPTS_TINY, _PROMPT_REPEAT))),
        (tinyq, dict(name="tiny-qwen2-exact-cost", mode=e, temperature=1.0, policy="cost",
                     profile=cheap, cache_policy="lfu", max_new_tokens=32,
                     prompts=(*_PROMPTS_TINY, _PROMPT_REPEAT))),
        (small, dict(name="smollm2-qwen2.5-greedy-cost", mode=g, policy="cost", profile=cheap,
                     max_new_tokens=48, cache_max_entries=12, prompts=_PROMPTS_REAL)),
        (small, dict(name="smollm2-qwen2.5-greedy-cost-measured", mode=g, policy="cost",
                     profile=measured, max_new_tokens=48, prompts=_PROMPTS_REAL)),
        (small, dict(name="smollm2-qwen2.5-exact-cost", mode=e, temperature=0.7, policy="cost",
                     profile=cheap, max_new_tokens=32, prompts=_PROMPTS_REAL[::2])),
    ]  # fmt: skip


def _cached(asset: str) -> bool:
    from omnidraft_deploy.catalog import assets

    try:
        assets.asset_path(asset)
    except assets.AssetError:
        return False
    return True


def _write_gz(path: Path, data: bytes) -> None:
    from omnidraft_deploy.bundle.atomic import write_bytes_atomic

    write_bytes_atomic(path, gzip.compress(data, compresslevel=9, mtime=0))


def write_traces(out: Path, *, include_real: bool = True, only: tuple[str, ...] = ()) -> list[Path]:
    """Record every trace of the plan (those named ``only``, when given) whose models are
    available; returns the files written."""
    import torch

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.golden.trace import TraceConfig, record_pair
    from omnidraft_deploy.resolve.pair import build_pair
    from omnidraft_deploy.vocab import io as vocab_io

    torch.set_num_threads(1)
    written: list[Path] = []
    pairs: dict[tuple[str, str], Any] = {}
    plan = [(pair, kw) for pair, kw in _trace_plan() if not only or kw["name"] in only]
    if only and len(plan) != len(set(only)):
        known = sorted(kw["name"] for _, kw in _trace_plan())
        raise KeyError(f"unknown trace in {sorted(only)}; choose from {known}")
    for (target, drafter), kwargs in plan:
        if (target, drafter) == REAL_PAIR and not (
            include_real and all(_cached(get_preset(n).gguf_asset or "") for n in REAL_PAIR)
        ):
            log.warning("skipping %s: model assets not cached (omnidraft assets fetch --models)",
                        kwargs["name"])  # fmt: skip
            continue
        if (target, drafter) not in pairs:
            log.info("loading %s <- %s", target, drafter)
            pairs[(target, drafter)] = build_pair(
                get_preset(target), get_preset(drafter), seed=0, max_seq_len=256
            )
        pair = pairs[(target, drafter)]
        cfg = TraceConfig(**kwargs)
        meta = {"name": cfg.name, "target": target, "drafter": drafter,
                "target_tokenizer": pair.target_tok.name,
                "drafter_tokenizer": pair.drafter_tok.name,
                "vocab_map": f"{drafter}--{target}.vocab_map.bin.gz"
                if (target, drafter) == REAL_PAIR else None}  # fmt: skip
        log.info("recording %s", cfg.name)
        trace = record_pair(cfg, target=pair.target, drafter=pair.drafter,
                            target_tok=pair.target_tok, drafter_tok=pair.drafter_tok,
                            mapper=pair.mapper, meta=meta)  # fmt: skip
        path = out / f"{cfg.name}.json.gz"
        _write_gz(path, json.dumps(trace, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        written.append(path)
        if meta["vocab_map"]:
            _write_gz(out / meta["vocab_map"], vocab_io.to_bytes(pair.mapper))
    return written


def write_multi_trace(out: Path) -> Path:
    """The multi-target trace (module docstring): each target of ``MULTI`` with the first pair's
    drafter object, heuristic draft length from the bundle's ``draft_len``, greedy."""
    import torch

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.golden.trace import TRACE_FORMAT, TraceConfig, record_pair
    from omnidraft_deploy.resolve.pair import build_pair
    from omnidraft_deploy.speculative.drafter import Mode

    torch.set_num_threads(1)
    seq, seed = MULTI_BUNDLE["max_seq_len"], MULTI_BUNDLE["seed"]
    traces: list[dict[str, Any]] = []
    drafter = None
    for target in MULTI:  # the export's seeds: target seed, drafter seed + 1 (build_pair's too)
        pair = build_pair(get_preset(target), get_preset(MULTI_DRAFTER), seed=seed, max_seq_len=seq)
        drafter = drafter or pair.drafter  # one drafter object serves every target
        cfg = TraceConfig(name=f"{MULTI_NAME}/{target}", mode=Mode.GREEDY, policy="heuristic",
                          draft_len=MULTI_BUNDLE["draft_len"], cache_policy="lfu",
                          prompts=_PROMPTS_TINY)  # fmt: skip
        meta = {"name": cfg.name, "target": target, "drafter": MULTI_DRAFTER,
                "target_tokenizer": pair.target_tok.name,
                "drafter_tokenizer": pair.drafter_tok.name, "vocab_map": None}  # fmt: skip
        log.info("recording %s", cfg.name)
        traces.append(record_pair(cfg, target=pair.target, drafter=drafter,
                                  target_tok=pair.target_tok, drafter_tok=pair.drafter_tok,
                                  mapper=pair.mapper, meta=meta))  # fmt: skip
    doc = {"format": TRACE_FORMAT, "name": MULTI_NAME, "drafter": MULTI_DRAFTER,
           "bundle": {**MULTI_BUNDLE, "targets": list(MULTI)}, "targets": traces}  # fmt: skip
    path = out / f"{MULTI_NAME}.json.gz"
    _write_gz(path, json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8"))
    return path


def vector_strings(seed: int = 0, n_random: int = 2000) -> list[str]:
    """The fixed string set of the tokenizer vectors (deterministic for a given ``seed``)."""
    from omnidraft_deploy.catalog.prompts import load_prompts
    from omnidraft_deploy.vocab.tokenizers import read_golden

    pools = {
        "ascii": "the quick brown fox jumps over lazy dogs I'm you'll we'd they've it's DON'T",
        "code": "def f(x): return x**2 + 1; if (a && b) { y += 3; } // ok\tfor i in range(10):",
        "digits": "0 7 12 123 1234 12345 3.14159 1e-9 2024-01-02 0xFF 1,000,000 ½ ² ٣ ४",
        "latin": "café naïve façade Ærø straße ÉCOLE Ångström ñandú œuvre ĳ ǅ",
        "cjk": "東京都 你好世界 こんにちは カタカナ 한국어 漢字テスト 中文，标点。",
        "scripts": "Привет мир Ελληνικά עברית العربية हिन्दी ไทย ქართული Ⴀ",
        "combining": "e\u0301 a\u0308 n\u0303 \u1e9b\u0323 A\u030a \u0915\u094d\u0937",
        "emoji": "😀 🚀 👩‍💻 👍🏽 🇫🇷 ❤️ ☕ 🧑‍🤝‍🧑 🏳️‍🌈 ✅ 🐍",
        "space": " \t\n\r\n  \u00a0\u3000\u2009\u200b\u2028",
        "special": "<|im_start|> <|im_end|> <|endoftext|> <s> </s> <|begin_of_text|> <unk>",
    }
    pieces = [w for text in pools.values() for w in text.split(" ") if w] + list(pools["space"])
    rng = random.Random(seed)
    out: list[str] = ["", " ", "  ", "\n", "\n\n\n", "\t", " \n ", "a", " a", "  a", "a  "]
    for stem in ("llama-spm", "llama-bpe", "qwen2", "gpt2"):
        if _cached(f"golden-{stem}-inp"):
            out += [text for text, _ in read_golden(stem)]
    out += [p.text for p in load_prompts()]
    for _ in range(n_random):
        k = rng.randint(1, 12)
        seps = [" ", "", "  ", "\n", "\t", " \n"]
        parts = [rng.choice(pieces) + rng.choice(seps) for _ in range(k)]
        if rng.random() < 0.2:
            parts.insert(0, " " * rng.randint(1, 5))
        out.append("".join(parts))
    return list(dict.fromkeys(out))  # unique, first occurrence order


def write_vectors(out: Path) -> list[Path]:
    from omnidraft_deploy.catalog import assets
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    strings = vector_strings()
    written = []
    for name in VECTOR_TOKENIZERS:
        try:
            tok = load_tokenizer(name)
        except assets.AssetError as e:
            log.warning("skipping tokenizer %s: %s", name, e)
            continue
        doc = {"tokenizer": name, "strings": strings, "ids": [tok.encode(s) for s in strings]}
        path = out / f"{name}.json.gz"
        _write_gz(path, json.dumps(doc, ensure_ascii=False).encode("utf-8"))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omnidraft_deploy.golden", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--vectors", action="store_true", help="tokenizer vectors only")
    parser.add_argument("--traces", action="store_true", help="traces only")
    parser.add_argument("--no-real", action="store_true", help="skip the real-model traces")
    parser.add_argument("--multi", action="store_true", help="the multi-target trace only")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="with --traces: record only this trace of the plan (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for d in (TRACES, VECTORS):
        d.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    if not (args.traces or args.multi):
        files += write_vectors(VECTORS)
    if not (args.vectors or args.multi):
        files += write_traces(TRACES, include_real=not args.no_real, only=tuple(args.only))
    if not (args.vectors or args.only):
        files.append(write_multi_trace(TRACES))
    for f in files:
        print(f"{f.relative_to(ROOT)}  {f.stat().st_size} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
