"""Every flag of ``omnidraft <verb>`` and ``omnidraft-export``: the one parser module.

``omnidraft_deploy.cli.main`` (the composition root) passes its handlers in by verb name; this module
imports no backend, so ``--help`` starts in well under a second. Help shows defaults (except
unset ones) and the export recipes.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from omnidraft_deploy import __version__
from omnidraft_deploy.catalog.backends import backend_names, quantization_help
from omnidraft_deploy.catalog.policies import NEEDS_PROFILE, PolicyName
from omnidraft_deploy.catalog.presets import DEFAULT_DRAFTER, DEFAULT_TARGET, Role

Handler = Callable[[argparse.Namespace], int]
DEFAULT_PROMPT = (
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:"
)
DESCRIPTION = (
    "Command line: ``omnidraft <verb>`` and ``omnidraft-export``. The single composition root."
)
EXPORT_EXAMPLES = """examples:
  omnidraft-export                        # offline tiny twins: random weights, real tokenizers
  omnidraft-export --model Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf --drafter smollm2-135m \\
      --backend onnx --quantization w8a8,int8   # your own weights: a .gguf or an HF folder
  omnidraft-export --target qwen2.5-0.5b --drafter smollm2-135m --backend onnx --quantization int8
  omnidraft-export --target qwen2.5-0.5b --drafter smollm2-135m --backend onnx --quantization w8a8,int8
  omnidraft-export --model ~/models/Meta-Llama-3-8B-Instruct --backend xnnpack
  omnidraft-export --target tiny-llama3-8b,tiny-qwen2-7b,tiny-vicuna-7b --backend onnx  # one drafter
Architecture, size, context, tokenizer, special tokens and chat template come from the weights
(--model, --drafter-model); a preset is a shortcut naming pinned weights, and with weights it must
speak the same vocabulary, or the export is refused before any work. recipes (--quantization): """
EXPORT_DESCRIPTION = ("Export a verified drafter + target bundle (graphs, tokenizers, vocabulary "
                      "map, n-gram cache, manifest).")  # fmt: skip
PROVIDER_HELP = "where the graphs run (default: qnn bundles on the QNN HTP, others the CPU)"
STATE_HELP = "folder for session files (grown n-gram cache, reports); default: user state folder"
VERBOSE_HELP = "library warnings, tracebacks"
VERIFY_HASHES_ENV = "OMNIDRAFT_VERIFY_HASHES"
SOCKET_HELP = (
    "the Unix socket (default: serve.sock in the --state folder, where `omnidraft "
    "run` looks for a server)"
)
SERVE_HELP = "keep a bundle open for `omnidraft run` (a Unix socket; one request at a time)"
RUN_EPILOG = f"""hashes: each bundle file is hashed once per file identity (size, mtime, inode)
and recorded in the --state folder; a changed file is hashed again and refused if it differs.
{VERIFY_HASHES_ENV}=1 hashes every file on every run ('omnidraft validate' always does).
server: when 'omnidraft serve' holds this bundle (and --state, --target), run sends it the request
and prints its reply (no bundle opened here); --no-server (or {VERIFY_HASHES_ENV}=1) decodes in
this process."""


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults (except unset ones) and keeps the examples' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


def utf8_text(text: str) -> str:
    """A text argument that is valid UTF-8 (Python keeps undecodable argv bytes as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 (undecodable byte at character {e.start}); pass UTF-8 text"
        ) from None
    return text


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes
MAX_TOKENS_FLAG = (1 << 31) - 1


def finite_float(lo: float, hi: float) -> Callable[[str], float]:
    """A ``type=`` for a number in ``[lo, hi]``: NaN and infinity refused at parse time, so the
    error names the flag (argparse prefixes ``argument --flag:``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not a number") from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not a finite number in [{lo:g}, "
                                             f"{hi:g}]")  # fmt: skip
        return value

    return parse


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """A ``type=`` for an integer in ``[lo, hi]`` (argparse names the flag in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo}, {hi}]")
        return value

    return parse


def text_file(path: str) -> str:
    """A ``type=`` for a file to read (``--prompt-file``): it exists and is not a folder."""
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path!r:.200} is a folder, not a file")
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{path!r:.200}: no such file")
    return path


def folder_path(path: str) -> str:
    """A ``type=`` for a folder that may not exist yet (``--state``): not an existing file."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path!r:.200} exists and is not a folder")
    return path


TEMPERATURE = finite_float(0.0, 1e6)
TOP_P = finite_float(0.0, 1.0)
SEED = int_in(*SEED_RANGE)
NEW_TOKENS = int_in(1, MAX_TOKENS_FLAG)
DRAFT_LEN = int_in(1, 32)


def add_export_flags(p: argparse.ArgumentParser, handler: Handler) -> None:
    """The export verb's flags (12), shared by ``omnidraft export`` and ``omnidraft-export``."""
    p.add_argument("--target", help="target preset, see `omnidraft presets` (default: the "
                   f"--model weights as they are, else {DEFAULT_TARGET}); A,B,C: one bundle of "
                   "one drafter and these targets (onnx)")  # fmt: skip
    p.add_argument("--drafter", help="drafter preset (default: the --drafter-model weights as "
                   f"they are, else {DEFAULT_DRAFTER})")  # fmt: skip
    p.add_argument("--backend", default="xnnpack", choices=backend_names(), help="graph format")
    p.add_argument("--quantization", help="recipe, or TARGET,DRAFTER recipes (e.g. w8a8,int8); "
                   "default: the backend's first (see below)")  # fmt: skip
    p.add_argument("--out", help="bundle folder (default: bundles/<target or model>-<backend>)")
    p.add_argument("--force", action="store_true",
                   help="replace the bundle at --out (refused if it holds unlisted files)")  # fmt: skip
    p.add_argument("--model", help="target weights: Hugging Face folder or .gguf file")
    p.add_argument("--drafter-model", help="drafter weights: Hugging Face folder or .gguf file")
    p.add_argument("--max-seq-len", type=int, help="KV-cache slots of both graphs (default: the "
                   "models' own context, capped by a KV budget; the export prints it)")  # fmt: skip
    p.add_argument("--draft-len", type=int, default=4, help="drafter proposals per step")
    p.add_argument("--no-verify", action="store_true", help="skip reload + parity with eager")
    p.add_argument("--target-from", metavar="BUNDLE", help="reuse this bundle's verified target "
                   "graph (same weights, backend, recipe, context): only the drafter is exported, "
                   "e.g. a drafter distilled for that target")  # fmt: skip
    p.add_argument("--drafter-from", metavar="BUNDLE", help="reuse this bundle's verified drafter "
                   "graph (same weights, backend, recipe, context): only the target is exported, "
                   "e.g. the same pair under another target recipe")  # fmt: skip
    p.add_argument("--reference-prompts", type=int, metavar="N", help="record the eager target's "
                   "output (expected.json, what validate checks) on N of the shipped prompts, "
                   "spread over the tasks (default: all 12)")  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help=VERBOSE_HELP)  # fmt: skip
    p.set_defaults(handler=handler)


def add_decode_flags(p: argparse.ArgumentParser) -> None:
    """Flags of the eager verbs (``generate``, ``bench``): a preset pair and a decoding setup."""
    p.add_argument(
        "--target", default=DEFAULT_TARGET, help="target preset (see `omnidraft presets`)"
    )
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help="drafter preset")
    p.add_argument("--mode", default="greedy", choices=["greedy", "exact", "omnidraft"])
    p.add_argument("--temperature", type=TEMPERATURE, default=1.0, help="for exact/omnidraft modes")
    p.add_argument("--max-new-tokens", type=NEW_TOKENS, default=48)
    p.add_argument("--draft-len", type=DRAFT_LEN, default=4)
    p.add_argument("--policy", default="heuristic",  # the draft_len.POLICIES that need no profile
                   choices=[n.value for n in PolicyName if n not in NEEDS_PROFILE])  # fmt: skip
    p.add_argument("--seed", type=SEED, default=0)


TARGET_HELP = "which target of a multi-target bundle (the error without it lists them)"


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, type=utf8_text)
    p.add_argument("--prompt-file", type=text_file,
                   help="read the prompt from this UTF-8 file instead")  # fmt: skip
    p.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=NEW_TOKENS, default=48)
    p.add_argument("--mode", default="greedy", choices=["greedy", "exact", "omnidraft"])
    p.add_argument("--temperature", type=TEMPERATURE, default=0.7, help="exact/omnidraft modes")
    p.add_argument("--top-p", type=TOP_P, default=None, help="nucleus sampling (exact/omnidraft)")
    p.add_argument("--seed", type=SEED, default=0, help="sampling seed")
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    p.add_argument("--state", type=folder_path, help=STATE_HELP)
    p.add_argument("--stats", nargs="?", const="summary", choices=["summary", "steps"],
                   help="also run target-only: speedup, acceptance, identical? (stderr); "
                        "'--stats steps': and every step's proposals")  # fmt: skip
    p.add_argument("--no-server", action="store_true",
                   help="decode in this process even when `omnidraft serve` holds the bundle")  # fmt: skip


def _add_bundle_verbs(sub: Any, handlers: Mapping[str, Handler], common: Any) -> None:
    """``validate``, ``run``, ``profile``, ``serve``, ``adapt``: verbs over an exported bundle."""
    p = _verb(sub, "validate", "check bundles against their recorded reference", handlers, common)
    p.add_argument("bundles", nargs="+")
    p.add_argument("--target", help="check this target only (default: every target)")
    p.add_argument("--max-new-tokens", type=NEW_TOKENS, default=16)
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    p.add_argument("--state", type=folder_path, help=STATE_HELP)
    p = _verb(sub, "run", "generate from a bundle (streams text)", handlers, common)
    p.epilog = RUN_EPILOG
    _add_run_flags(p)
    p = _verb(sub, "profile", "measure per-call latency of a bundle's graphs (cost model)",
              handlers, common)  # fmt: skip
    p.add_argument("bundle")
    p.add_argument("--k-max", type=int, default=8, help="longest draft: verify widths 1..k+1")
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds (medians kept)")
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: physical cores)")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument("--state", type=folder_path, help=STATE_HELP)
    p = _verb(sub, "serve", SERVE_HELP, handlers, common)
    p.add_argument("bundle")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument("--state", type=folder_path, help=STATE_HELP)
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: physical cores)")
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    p.add_argument("--socket", help=SOCKET_HELP)
    p = _verb(sub, "adapt", "adapt a bundle's drafter online, then publish it", handlers, common)
    p.add_argument("bundle")
    p.add_argument("--rounds", type=int, default=2, help="passes over the shipped prompt set")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, help="learning rate (default: AdaptConfig's, 1e-3)")
    p.add_argument("--steps-per-update", type=int, help="optimiser steps after each prompt (4)")
    p.add_argument("--provider", choices=["cpu", "qnn"], help=PROVIDER_HELP)
    p.add_argument(
        "--target",
        help="multi-target bundle: adapt the drafter of this target on its "
        "traffic; the weights go to its state folder, the bundle is not written",
    )
    p.add_argument("--state", type=folder_path, help=STATE_HELP)


DISTILL_HELP = "teach the drafter the bundle's target: its replies to your requests, then train"
DISTILL_EPILOG = """The target answers each request greedily through the bundle (speculative
decoding: its own output; in its chat template when it has one). Each reply is appended to
distill.replies.jsonl in the target's state folder as it finishes, so a stopped run resumes.
10% of the replies are held out; the new drafter is published (as `omnidraft adapt` publishes)
only when its held-out agreement with the target rises. Loss: L_DM + L_Ngram (+ --seqkd times the
hard-label term); 4 replies a step, 256 drafter ids a row.
--prompts: a text file (one request a line), a .jsonl file ({"text": ...} a line) or a folder
(one request a file); default: the shipped sets (math, code, chat, summaries, code edits)."""


def _add_distill(sub: Any, handlers: Mapping[str, Handler], common: Any) -> None:
    p = _verb(sub, "distill", DISTILL_HELP, handlers, common)
    p.epilog = DISTILL_EPILOG
    p.add_argument("bundle")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument("--state", type=folder_path, help=STATE_HELP)
    p.add_argument("--prompts", metavar="PATH", help="your requests: file or folder (below)")
    p.add_argument("--replies", type=int_in(2, 1 << 20), default=200,
                   help="replies to collect in all (earlier runs' count)")  # fmt: skip
    p.add_argument("--minutes", type=finite_float(0.1, 1e5), help="wall budget of the run: "
                   "70%% teaching, the rest training")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int_in(1, 4096), default=96, help="tokens a reply")
    p.add_argument("--threads", type=int_in(1, 256), default=os.cpu_count() or 1,
                   help="torch and ONNX Runtime threads")  # fmt: skip
    p.add_argument("--epochs", type=finite_float(0.01, 1000), default=2.0, help="passes")
    p.add_argument("--lr", type=finite_float(1e-9, 1.0), default=5e-5, help="AdamW step size")
    p.add_argument("--seqkd", type=finite_float(0.0, 100.0), default=0.0,
                   help="weight of the hard-label term (sequence-level KD) added to the loss")  # fmt: skip
    p.add_argument("--train-layers", type=int_in(0, 1024), default=0,
                   help="train only the last N blocks and the final norm (0: every parameter)")  # fmt: skip
    p.add_argument("--teach-only", action="store_true", help="collect replies, do not train")


def _verb(sub: Any, name: str, help: str, handlers: Mapping[str, Handler], common: Any) -> Any:
    p = sub.add_parser(name, help=help, description=help, parents=[common], formatter_class=_Help)
    p.set_defaults(handler=handlers[name])
    return p


def build_parser(handlers: Mapping[str, Handler]) -> argparse.ArgumentParser:
    """``omnidraft``'s parser; ``handlers`` maps each verb name to its handler."""
    common = argparse.ArgumentParser(add_help=False)  # -v after the verb too, never reset
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help=VERBOSE_HELP)  # fmt: skip
    parser = argparse.ArgumentParser(prog="omnidraft", description=DESCRIPTION,
                                     formatter_class=_Help)  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = _verb(sub, "presets", "list model presets", handlers, common)
    p.add_argument("--role", choices=[r.value for r in Role])
    p = _verb(sub, "assets", "fetch / list pinned offline assets", handlers, common)
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("--models", nargs="*", metavar="PRESET", default=None,
                   help="also the real GGUFs: every one, or only the named presets' (e.g. "
                   "--models qwen2.5-0.5b smollm2-135m)")  # fmt: skip
    p = _verb(sub, "generate", "speculative generation with eager models", handlers, common)
    add_decode_flags(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, type=utf8_text)
    p.add_argument("--check", action="store_true", help="also run target-only and compare")
    p = _verb(sub, "bench", "target-only vs speculative on the prompt set", handlers, common)
    add_decode_flags(p)
    p.add_argument("--out", default="reports/local",
                   help="report folder (default: git-ignored; reports/decode/ holds the committed)")  # fmt: skip
    p.add_argument("--lossless", action="store_true", help="measure sampling bias instead")
    p = sub.add_parser("export", help="export a verified bundle (same as omnidraft-export)",
                       epilog=EXPORT_EXAMPLES + quantization_help(), formatter_class=_Help)  # fmt: skip
    add_export_flags(p, handlers["export"])
    _add_bundle_verbs(sub, handlers, common)
    _add_distill(sub, handlers, common)
    return parser


def build_export_parser(handler: Handler) -> argparse.ArgumentParser:
    """``omnidraft-export``: its own parser, so help and errors say ``omnidraft-export``."""
    parser = argparse.ArgumentParser(
        prog="omnidraft-export", formatter_class=_Help, description=EXPORT_DESCRIPTION,
        epilog=EXPORT_EXAMPLES + quantization_help(),
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_export_flags(parser, handler)
    return parser
