"""Verbs that need neither exporters nor a runtime: ``presets``, ``assets``, ``generate``, ``bench``.

Handlers for ``omnidraft_deploy.cli.main`` (the composition root; the flags are declared in
``cli_parser``); each turns its ``Namespace`` into library arguments and lazy-imports what it
needs. Results go to stdout, statistics and progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from omnidraft_deploy.catalog.presets import Role, get_preset, list_presets


def cmd_presets(args: argparse.Namespace) -> int:
    for spec in list_presets(Role(args.role) if args.role else None):
        size = f"{spec.n_params() / 1e6:,.1f}M"
        print(
            f"{spec.name:18} {spec.role.value:8} {spec.family.value:6} tokenizer={spec.tokenizer:8}"
            f" vocab={spec.vocab_size:<7} params={size:>10}  {spec.weights_from}"
        )
    return 0


def cmd_assets(args: argparse.Namespace) -> int:
    from omnidraft_deploy.catalog import assets

    if args.action == "list":
        for name, info in assets.list_assets().items():
            print(f"{name:28} {info}")
        return 0
    names = None
    if args.models:  # named presets: the default assets and those presets' models
        names = [a.name for a in assets.ASSETS.values() if not a.optional]
        names += assets.preset_models(args.models)
    plan = assets.download_plan(names, include_models=args.models is not None)
    if plan:
        total = sum(size for _, size in plan) / 1e6
        print(f"downloading {total:,.1f} MB: " + ", ".join(f"{n} ({b / 1e6:,.1f} MB)" for n, b in plan))
    paths = assets.fetch_assets(names, include_models=args.models is not None)
    for name, path in paths.items():
        print(f"{name:28} {path}")
    return 0


def decode_config(args: argparse.Namespace) -> Any:
    """Mode, temperature and token budget from the flags (the pair adds its vocabulary limit and
    EOS ids: ``speculative.factory``)."""
    from omnidraft_deploy.speculative.decoder import DecodeConfig
    from omnidraft_deploy.speculative.drafter import Mode

    mode = Mode(args.mode)
    temperature = 0.0 if mode is Mode.GREEDY else args.temperature
    return DecodeConfig(mode=mode, temperature=temperature, max_new_tokens=args.max_new_tokens)


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from omnidraft_deploy.ngram.cache import NGramCache
    from omnidraft_deploy.resolve.pair import build_pair
    from omnidraft_deploy.speculative.decoder import generate_target_only
    from omnidraft_deploy.speculative.factory import build_decoder, pair_config

    pair = build_pair(get_preset(args.target), get_preset(args.drafter), seed=args.seed)
    cfg = pair_config(pair.mapper, decode_config(args))
    ids = pair.target_tok.encode(args.prompt)
    dec = build_decoder(pair.target, pair.drafter, pair.mapper, policy=args.policy,
                        draft_len=args.draft_len, config=cfg, ngram_cache=NGramCache())  # fmt: skip
    out, stats = dec.generate(ids, generator=torch.Generator().manual_seed(args.seed))
    from omnidraft_deploy.request.streaming import (
        decode_continuation,  # keeps SentencePiece join spaces
    )

    print(args.prompt + decode_continuation(pair.target_tok, ids, out))
    if args.check:
        ref, _ = generate_target_only(
            pair.target, ids, cfg, torch.Generator().manual_seed(args.seed)
        )
        print(f"identical to target-only: {ref == out}", file=sys.stderr)
    print(json.dumps({k: round(v, 4) for k, v in stats.summary().items()}), file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from omnidraft_deploy.bench import BenchPrompt, run_decode_bench, write_report
    from omnidraft_deploy.catalog.prompts import load_prompts
    from omnidraft_deploy.ngram.cache import NGramCache
    from omnidraft_deploy.resolve.pair import build_pair

    if args.lossless:
        from omnidraft_deploy.bench import lossless_report

        print(lossless_report(args.out).read_text())
        return 0
    pair = build_pair(get_preset(args.target), get_preset(args.drafter), seed=args.seed)
    prompts = [BenchPrompt(p.task, pair.target_tok.encode(p.text)) for p in load_prompts()]
    result = run_decode_bench(pair.target, pair.drafter, pair.mapper, prompts, decode_config(args),
                              policy=args.policy, draft_len=args.draft_len,
                              ngram_cache=NGramCache(), seed=args.seed)  # fmt: skip
    meta = {
        "target": args.target,
        "drafter": args.drafter,
        "mode": args.mode,
        "policy": args.policy,
        "draft_len": args.draft_len,
        **pair.mapper.overlap_report(),
    }
    path = write_report(
        result, args.out, title=f"decode-{args.drafter}--{args.target}-{args.mode}", meta=meta
    )
    print(path.read_text())
    return 0
