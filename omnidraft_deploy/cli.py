"""Command line: ``omnidraft <verb>`` and ``omnidraft-export``. The single composition root.

Each handler turns its ``Namespace`` into library arguments in one place and lazy-imports the
heavy backends it needs, so ``--help`` starts in well under a second. Every verb runs under
``console.run_verb``: quiet unless ``-v``, errors as one paragraph naming the flag, Ctrl-C exits
130. Results go to stdout; progress bars, notes and statistics to stderr. ``run`` and
``validate`` only read a bundle; their session files go to ``--state`` (``omnidraft_deploy.state``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omnidraft_deploy import __version__
from omnidraft_deploy.backends import backend_names, get_backend, quantization_help
from omnidraft_deploy.cli_local import (
    DEFAULT_PROMPT,
    add_decode_flags,
    cmd_assets,
    cmd_bench,
    cmd_generate,
    cmd_presets,
)
from omnidraft_deploy.console import library_stdout, run_verb
from omnidraft_deploy.presets import DEFAULT_DRAFTER, DEFAULT_TARGET, Role

EXPORT_EXAMPLES = """examples:
  omnidraft-export                        # offline tiny twins: random weights, real tokenizers
  omnidraft-export --target qwen2.5-0.5b --drafter smollm2-135m --backend onnx --quantization int8
  omnidraft-export --target llama3-8b --model ~/models/Meta-Llama-3-8B-Instruct --backend xnnpack
Architecture, tokenizer and special tokens come from the weights (--model, --drafter-model); a
preset supplies the rest and must speak the same vocabulary, or the export is refused before any
work. recipes (--quantization): """
PROVIDER_HELP = "where the graphs run (default: qnn bundles on the QNN HTP, others the CPU)"
STATE_HELP = "folder for session files (grown n-gram cache, reports); default: user state folder"


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults (except unset ones) and keeps the examples' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


def _cmd_export(args: argparse.Namespace) -> int:
    from omnidraft_deploy.inputs import resolve_export  # checks first: no torch import before

    target, drafter = args.target or DEFAULT_TARGET, args.drafter or DEFAULT_DRAFTER
    quant = args.quantization or get_backend(args.backend).default_quantization
    out = Path(args.out or f"bundles/{target}-{args.backend}")
    inputs = resolve_export(
        target=target, drafter=drafter, model=args.model, drafter_model=args.drafter_model,
        out_dir=out, force=args.force, quantization=quant,
        default_target=args.target is None, default_drafter=args.drafter is None,
    )  # fmt: skip
    for note in inputs.notes:
        print(f"note: {note}", file=sys.stderr)
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.checked_export import export_resolved

    cfg = ExportConfig(
        target=target, drafter=drafter, backend=args.backend, quantization=quant, out_dir=out,
        max_seq_len=args.max_seq_len, draft_len=args.draft_len, target_model=args.model,
        drafter_model=args.drafter_model, verify=not args.no_verify,
    )  # fmt: skip
    with library_stdout(getattr(args, "verbose", False)):
        path = export_resolved(cfg, inputs)
    manifest = json.loads((path / "manifest.json").read_text())
    size = sum(f["size"] for f in manifest["files"].values()) / 1e6
    parity = manifest["graphs"]["target"].get("parity", {})
    checked = f", target max |logit diff| {parity['max_abs_logit_diff']:.2g}" if parity else ""
    chat = " --chat" if inputs.target.chat_template else ""
    print(f"exported {path} ({args.backend}/{quant}, {size:.1f} MB{checked})\nnext:\n"
          f"  omnidraft validate {path}\n  omnidraft run {path}{chat} --prompt 'def fib(n):'")  # fmt: skip
    return 0


def _bundle_prompts(bundle: str) -> list[tuple[str, list[int]]]:
    from omnidraft_deploy.manifest import verify_bundle
    from omnidraft_deploy.prompts import load_prompts
    from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer

    tok = load_bundle_tokenizer(Path(bundle), "target", verify_bundle(bundle).files)
    return [(p.task, tok.encode(p.text)) for p in load_prompts()]


def _cmd_validate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from omnidraft_deploy.manifest import write_text_atomic
    from omnidraft_deploy.runtime.validate import validate_bundle
    from omnidraft_deploy.state import VALIDATION_REPORT, state_dir

    ok = True
    for bundle in args.bundles:

        def bar(rows: Any, name: str = bundle) -> Any:
            return tqdm(rows, desc=f"validate {name}", unit="prompt", leave=False)

        report = validate_bundle(
            bundle, max_new_tokens=args.max_new_tokens, provider=args.provider, progress=bar
        )
        path = state_dir(bundle, args.state) / VALIDATION_REPORT
        write_text_atomic(path, json.dumps(report, indent=2) + "\n")
        n = report["prompts"]
        print(f"{bundle}: {report['backend']}/{report['quantization']} on {report['provider']}: "
              f"runtime == reference {report['eager_equal']}/{n}, speculative == runtime "
              f"{report['speculative_equal']}/{n} -> {'PASS' if report['passed'] else 'FAIL'}"
              f"  (report: {path})")  # fmt: skip
        ok &= bool(report["passed"])
    return 0 if ok else 1


def _cmd_run(args: argparse.Namespace) -> int:
    import torch

    from omnidraft_deploy.manifest import verify_bundle
    from omnidraft_deploy.runtime.validate import run_bundle, target_only
    from omnidraft_deploy.speculative.decoder import DecodeConfig
    from omnidraft_deploy.speculative.drafter import Mode
    from omnidraft_deploy.state import state_dir
    from omnidraft_deploy.streaming import TextStreamer
    from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat

    tok = load_bundle_tokenizer(Path(args.bundle), "target", verify_bundle(args.bundle).files)
    text = (
        render_chat(getattr(tok, "chat_template", None), args.prompt) if args.chat else args.prompt
    )
    greedy = Mode(args.mode) is Mode.GREEDY
    cfg = DecodeConfig(mode=Mode(args.mode), temperature=0.0 if greedy else args.temperature,
                       top_p=None if greedy else args.top_p, max_new_tokens=args.max_new_tokens)  # fmt: skip
    stream = TextStreamer(tok, sys.stdout, sys.stderr if args.step_stats else None)
    if not args.chat:
        sys.stdout.write(args.prompt)
    ids = tok.encode(text)
    _, stats = run_bundle(
        args.bundle, ids, provider=args.provider, observer=stream, config=cfg,
        state=state_dir(args.bundle, args.state), generator=torch.Generator().manual_seed(args.seed),
    )  # fmt: skip
    stream.finish()
    if args.stats:
        summary = {k: round(v, 4) for k, v in stats.summary().items()}
        base, base_stats = target_only(args.bundle, ids, cfg, provider=args.provider,
                                       generator=torch.Generator().manual_seed(args.seed))  # fmt: skip
        summary["target_only_wall_s"] = round(base_stats.wall_s, 4)
        summary["speedup_vs_target_only"] = round(base_stats.wall_s / max(stats.wall_s, 1e-9), 3)
        print(json.dumps(summary), file=sys.stderr)
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


def _cmd_profile(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from omnidraft_deploy.runtime.profile import profile_bundle
    from omnidraft_deploy.state import state_dir

    path = profile_bundle(
        Path(args.bundle), state_dir(args.bundle, args.state), k_max=args.k_max, reps=args.reps,
        threads=args.threads, progress=lambda r: tqdm(r, desc="profile", unit="round"),
    )  # fmt: skip
    print(f"{args.bundle}: cost profile written to {path}")
    return 0


def add_export_flags(p: argparse.ArgumentParser) -> None:
    """The export verb's flags (12), shared by ``omnidraft export`` and ``omnidraft-export``."""
    p.add_argument(
        "--target", help=f"target preset, see `omnidraft presets` (default: {DEFAULT_TARGET})"
    )
    p.add_argument("--drafter", help=f"drafter preset (default: {DEFAULT_DRAFTER})")
    p.add_argument("--backend", default="xnnpack", choices=backend_names(), help="graph format")
    p.add_argument("--quantization", help="recipe; default: the backend's first (see below)")
    p.add_argument("--out", help="bundle folder (default: bundles/<target>-<backend>)")
    p.add_argument("--force", action="store_true", help="replace the bundle already at --out")
    p.add_argument("--model", help="target weights: Hugging Face folder or .gguf file")
    p.add_argument("--drafter-model", help="drafter weights: Hugging Face folder or .gguf file")
    p.add_argument("--max-seq-len", type=int, default=512, help="KV-cache slots of both graphs")
    p.add_argument("--draft-len", type=int, default=4, help="drafter proposals per step")
    p.add_argument("--no-verify", action="store_true", help="skip reload + parity with eager")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="library warnings, tracebacks")  # fmt: skip
    p.set_defaults(handler=_cmd_export)


def utf8_text(text: str) -> str:
    """A text argument that is valid UTF-8 (Python keeps undecodable argv bytes as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 (undecodable byte at character {e.start}); pass UTF-8 text"
        ) from None
    return text


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, type=utf8_text)
    p.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mode", default="greedy", choices=["greedy", "exact", "omnidraft"])
    p.add_argument("--temperature", type=float, default=0.7, help="exact/omnidraft modes")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling (exact/omnidraft)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    p.add_argument("--state", help=STATE_HELP)
    p.add_argument("--stats", action="store_true", help="stats + speedup vs target-only (stderr)")
    p.add_argument("--step-stats", action="store_true", help="per-step stats on stderr")


def _verb(sub: Any, name: str, help: str, handler: Any, common: argparse.ArgumentParser) -> Any:
    p = sub.add_parser(name, help=help, description=help, parents=[common], formatter_class=_Help)
    p.set_defaults(handler=handler)
    return p


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)  # -v after the verb too, never reset
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="library warnings, tracebacks")  # fmt: skip
    parser = argparse.ArgumentParser(prog="omnidraft", description=__doc__.splitlines()[0],
                                     formatter_class=_Help)  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="library warnings, tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = _verb(sub, "presets", "list model presets", cmd_presets, common)
    p.add_argument("--role", choices=[r.value for r in Role])
    p = _verb(sub, "assets", "fetch / list pinned offline assets", cmd_assets, common)
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("--models", action="store_true", help="also the real SmolLM2/Qwen2.5 GGUFs")
    p = _verb(sub, "generate", "speculative generation with eager models", cmd_generate, common)
    add_decode_flags(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, type=utf8_text)
    p.add_argument("--check", action="store_true", help="also run target-only and compare")
    p = _verb(sub, "bench", "target-only vs speculative on the prompt set", cmd_bench, common)
    add_decode_flags(p)
    p.add_argument("--out", default="reports")
    p.add_argument("--lossless", action="store_true", help="measure sampling bias instead")
    p = sub.add_parser("export", help="export a verified bundle (same as omnidraft-export)",
                       epilog=EXPORT_EXAMPLES + quantization_help(), formatter_class=_Help)  # fmt: skip
    add_export_flags(p)
    p = _verb(sub, "validate", "check bundles against their recorded reference", _cmd_validate,
              common)  # fmt: skip
    p.add_argument("bundles", nargs="+")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    p.add_argument("--state", help=STATE_HELP)
    p = _verb(sub, "run", "generate from a bundle (streams text)", _cmd_run, common)
    _add_run_flags(p)
    p = _verb(sub, "profile", "measure per-call latency of a bundle's graphs (cost model)",
              _cmd_profile, common)  # fmt: skip
    p.add_argument("bundle")
    p.add_argument("--k-max", type=int, default=8, help="longest draft: verify widths 1..k+1")
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds (medians kept)")
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: physical cores)")
    p.add_argument("--state", help=STATE_HELP)
    p = _verb(sub, "adapt", "adapt a bundle's drafter online, then publish it", _cmd_adapt, common)
    p.add_argument("bundle")
    p.add_argument("--rounds", type=int, default=2, help="passes over the shipped prompt set")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, help="learning rate (default: AdaptConfig's, 1e-3)")
    p.add_argument("--steps-per-update", type=int, help="optimiser steps after each prompt (4)")
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = "omnidraft-export" if args.verb == "export" else f"omnidraft {args.verb}"
    return run_verb(prog, lambda: int(args.handler(args)), verbose=args.verbose)


def export_main(argv: Sequence[str] | None = None) -> int:
    """``omnidraft-export``: its own parser, so help and errors say ``omnidraft-export``."""
    parser = argparse.ArgumentParser(
        prog="omnidraft-export", formatter_class=_Help, epilog=EXPORT_EXAMPLES + quantization_help(),
        description="Export a verified drafter + target bundle (graphs, tokenizers, vocabulary "
        "map, n-gram cache, manifest).",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_export_flags(parser)
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    return run_verb("omnidraft-export", lambda: _cmd_export(args), verbose=verbose)


if __name__ == "__main__":
    raise SystemExit(main())
