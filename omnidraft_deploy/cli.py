"""Command line: ``omnidraft <verb>`` and ``omnidraft-export``. The single composition root.

Each handler turns its ``Namespace`` into library arguments in one place and lazy-imports the
heavy backends it needs, so ``omnidraft --help`` starts in well under a second.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from omnidraft_deploy.backends import Backend, backend_names, get_backend, quantization_help
from omnidraft_deploy.presets import (
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    Role,
    get_preset,
    list_presets,
)

Handler = Callable[[argparse.Namespace], int]
DEFAULT_PROMPT = (
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:"
)


def _cmd_presets(args: argparse.Namespace) -> int:
    for spec in list_presets(Role(args.role) if args.role else None):
        size = f"{spec.n_params() / 1e6:,.1f}M"
        print(
            f"{spec.name:18} {spec.role.value:8} {spec.family.value:6} tokenizer={spec.tokenizer:8}"
            f" vocab={spec.vocab_size:<7} params={size:>10}  {spec.weights_from}"
        )
    return 0


def _cmd_assets(args: argparse.Namespace) -> int:
    from omnidraft_deploy import assets

    if args.action == "list":
        for name, info in assets.list_assets().items():
            print(f"{name:28} {info}")
        return 0
    paths = assets.fetch_assets(include_models=args.models)
    for name, path in paths.items():
        print(f"{name:28} {path}")
    return 0


def _decode_config(args: argparse.Namespace, eos: tuple[int, ...], vocab_limit: int):
    from omnidraft_deploy.speculative.decoder import DecodeConfig
    from omnidraft_deploy.speculative.drafter import Mode

    mode = Mode(args.mode)
    temperature = 0.0 if mode is Mode.GREEDY else args.temperature
    return DecodeConfig(
        mode=mode,
        temperature=temperature,
        max_new_tokens=args.max_new_tokens,
        eos_ids=eos,
        vocab_limit=vocab_limit,
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from omnidraft_deploy.ngram.cache import NGramCache
    from omnidraft_deploy.pipeline import build_pair
    from omnidraft_deploy.speculative.decoder import SpeculativeDecoder, generate_target_only
    from omnidraft_deploy.speculative.draft_len import make_policy

    pair = build_pair(get_preset(args.target), get_preset(args.drafter), seed=args.seed)
    cfg = _decode_config(args, pair.target_tok.eos_ids, pair.mapper.target_vocab_size)
    ids = pair.target_tok.encode(args.prompt)
    dec = SpeculativeDecoder(
        pair.target,
        pair.drafter,
        pair.mapper,
        make_policy(args.policy, args.draft_len),
        NGramCache(),
        config=cfg,
    )
    out, stats = dec.generate(ids, generator=torch.Generator().manual_seed(args.seed))
    print(args.prompt + pair.target_tok.decode(out))
    if args.check:
        ref, _ = generate_target_only(
            pair.target, ids, cfg, torch.Generator().manual_seed(args.seed)
        )
        print(f"# identical to target-only: {ref == out}")
    print("# " + json.dumps({k: round(v, 4) for k, v in stats.summary().items()}))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from omnidraft_deploy.bench import BenchPrompt, run_decode_bench, write_report
    from omnidraft_deploy.ngram.cache import NGramCache
    from omnidraft_deploy.pipeline import build_pair
    from omnidraft_deploy.prompts import load_prompts
    from omnidraft_deploy.speculative.draft_len import make_policy

    if args.lossless:
        from omnidraft_deploy.bench import lossless_report

        print(lossless_report(args.out).read_text())
        return 0
    pair = build_pair(get_preset(args.target), get_preset(args.drafter), seed=args.seed)
    cfg = _decode_config(args, pair.target_tok.eos_ids, pair.mapper.target_vocab_size)
    prompts = [BenchPrompt(p.task, pair.target_tok.encode(p.text)) for p in load_prompts()]
    result = run_decode_bench(
        pair.target,
        pair.drafter,
        pair.mapper,
        make_policy(args.policy, args.draft_len),
        prompts,
        cfg,
        ngram_cache=NGramCache(),
        seed=args.seed,
    )
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


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from omnidraft_deploy.exporters.bundle import ExportConfig, export_pair

    cfg = ExportConfig(
        target=args.target,
        drafter=args.drafter,
        backend=args.backend,
        quantization=args.quantization or get_backend(args.backend).default_quantization,
        out_dir=Path(args.out or f"bundles/{args.target}-{args.backend}"),
        max_seq_len=args.max_seq_len,
        draft_len=args.draft_len,
        target_model=args.model,
        drafter_model=args.drafter_model,
        seed=args.seed,
        verify=not args.no_verify,
    )
    path = export_pair(cfg)
    print((path / "manifest.json").read_text())
    return 0


def _bundle_prompts(bundle: str) -> list[tuple[str, list[int]]]:
    from omnidraft_deploy.manifest import read_manifest
    from omnidraft_deploy.prompts import load_prompts
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    tok = load_tokenizer(read_manifest(bundle).graphs["target"].tokenizer)
    return [(p.task, tok.encode(p.text)) for p in load_prompts()]


def _cmd_validate(args: argparse.Namespace) -> int:
    from omnidraft_deploy.manifest import write_text_atomic
    from omnidraft_deploy.runtime.validate import validate_bundle

    ok = True
    for bundle in args.bundles:
        report = validate_bundle(
            bundle,
            _bundle_prompts(bundle),
            max_new_tokens=args.max_new_tokens,
            provider=args.provider,
        )
        write_text_atomic(Path(bundle) / "validation.json", json.dumps(report, indent=2) + "\n")
        print(
            f"{bundle}: backend={report['backend']} provider={report['provider']} "
            f"quant={report['quantization']} eager==runtime {report['eager_equal']}/"
            f"{report['prompts']} speculative==runtime {report['speculative_equal']}/"
            f"{report['prompts']} -> {'PASS' if report['passed'] else 'FAIL'}"
        )
        ok &= bool(report["passed"])
    return 0 if ok else 1


def _cmd_run(args: argparse.Namespace) -> int:
    from omnidraft_deploy.manifest import read_manifest
    from omnidraft_deploy.runtime.validate import run_bundle
    from omnidraft_deploy.streaming import TextStreamer
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    graphs = read_manifest(args.bundle).graphs
    t_tok = load_tokenizer(graphs["target"].tokenizer)  # the drafter's BOS is in the map
    stream = TextStreamer(t_tok, sys.stdout, sys.stderr if args.step_stats else None)
    sys.stdout.write(args.prompt)
    _, stats = run_bundle(
        args.bundle,
        t_tok.encode(args.prompt),
        max_new_tokens=args.max_new_tokens,
        provider=args.provider,
        observer=stream,
    )
    stream.finish()
    print("# " + json.dumps({k: round(v, 4) for k, v in stats.summary().items()}))
    return 0


def _cmd_adapt(args: argparse.Namespace) -> int:
    from omnidraft_deploy.distill.adapt import AdaptConfig
    from omnidraft_deploy.exporters.publish import publish_drafter
    from omnidraft_deploy.runtime.adapt import adapt_bundle

    prompts = [ids for _, ids in _bundle_prompts(args.bundle)]
    base = AdaptConfig()
    cfg = AdaptConfig(
        lr=args.lr or base.lr, steps_per_update=args.steps_per_update or base.steps_per_update
    )
    result = adapt_bundle(
        args.bundle, prompts, cfg, rounds=args.rounds, max_new_tokens=args.max_new_tokens,
        provider=args.provider, publish=lambda drafter: publish_drafter(args.bundle, drafter),
    )  # fmt: skip
    trace, n = result.report.acceptance, len(prompts)
    first, last = sum(trace[:n]) / n, sum(trace[-n:]) / n
    print(f"{args.bundle}: {result.rounds} x {n} prompts, {result.report.optimizer_steps} "
          f"optimiser steps in {result.report.seconds:.0f} s; acceptance first round "
          f"{first:.3f} -> last round {last:.3f}")  # fmt: skip
    return 0


def _add_decode_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=DEFAULT_TARGET, help="target preset (see `omnidraft presets`)"
    )
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help="drafter preset")
    p.add_argument("--mode", default="greedy", choices=["greedy", "exact", "omnidraft"])
    p.add_argument("--temperature", type=float, default=1.0, help="for exact/omnidraft modes")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--draft-len", type=int, default=4)
    p.add_argument("--policy", default="heuristic", choices=["fixed", "heuristic", "predictor"])
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnidraft", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("presets", help="list model presets")
    p.add_argument("--role", choices=[r.value for r in Role])
    p.set_defaults(handler=_cmd_presets)
    p = sub.add_parser("assets", help="fetch / list pinned offline assets (tokenizers, models)")
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("--models", action="store_true", help="also the real SmolLM2/Qwen2.5 GGUFs")
    p.set_defaults(handler=_cmd_assets)
    p = sub.add_parser("generate", help="speculative generation with eager models")
    _add_decode_flags(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--check", action="store_true", help="also run target-only and compare")
    p.set_defaults(handler=_cmd_generate)
    p = sub.add_parser(
        "bench", help="target-only vs speculative on the prompt set; writes a report"
    )
    _add_decode_flags(p)
    p.add_argument("--out", default="reports")
    p.add_argument(
        "--lossless",
        action="store_true",
        help="instead: measure exact/omnidraft sampling bias against the exact law",
    )
    p.set_defaults(handler=_cmd_bench)
    p = sub.add_parser("export", help="export a verified bundle (same as omnidraft-export)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="target preset")
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help="drafter preset")
    p.add_argument("--backend", default=Backend.XNNPACK.value, choices=backend_names())
    p.add_argument("--quantization", help=quantization_help())
    p.add_argument("--out", help="bundle folder (default bundles/<target>-<backend>)")
    p.add_argument("--model", help="target weights: HF folder or GGUF file (default: preset)")
    p.add_argument("--drafter-model", help="drafter weights: HF folder or GGUF file")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--draft-len", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-verify", action="store_true", help="skip reload + parity check")
    p.set_defaults(handler=_cmd_export)
    p = sub.add_parser("validate", help="validate bundles: eager vs runtime vs speculative")
    p.add_argument("bundles", nargs="+")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument(
        "--provider", choices=["cpu", "qnn"], help="default: qnn bundles on the QNN HTP, others CPU"
    )
    p.set_defaults(handler=_cmd_validate)
    p = sub.add_parser("run", help="generate from a bundle with the reference runtime")
    p.add_argument("bundle")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument(
        "--provider", choices=["cpu", "qnn"], help="default: qnn bundles on the QNN HTP, others CPU"
    )
    p.add_argument("--step-stats", action="store_true", help="per-step stats on stderr")
    p.set_defaults(handler=_cmd_run)
    p = sub.add_parser("adapt", help="adapt a bundle's drafter online to prompts, then publish it")
    p.add_argument("bundle")
    p.add_argument("--rounds", type=int, default=2, help="passes over the shipped prompt set")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, help="learning rate (default: AdaptConfig's, 1e-3)")
    p.add_argument("--steps-per-update", type=int, help="optimiser steps after each prompt (4)")
    p.add_argument(
        "--provider", choices=["cpu", "qnn"], help="default: qnn bundles on the QNN HTP, others CPU"
    )
    p.set_defaults(handler=_cmd_adapt)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args))
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"omnidraft {args.verb}: error: {e}", file=sys.stderr)
        return 2


def export_main(argv: Sequence[str] | None = None) -> int:
    """``omnidraft-export ...`` is ``omnidraft export ...``."""
    return main(["export", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
