"""Command line: ``omnidraft <verb>`` and ``omnidraft-export``. The single composition root.

Each handler turns its ``Namespace`` into library arguments in one place and lazy-imports the
heavy backends it needs, so ``--help`` starts in well under a second; every flag is declared in
``cli_parser``, which gets the handlers by verb name (``HANDLERS``). Every verb runs under
``console.run_verb``: quiet unless ``-v``, errors as one paragraph naming the flag, Ctrl-C exits
130. Results go to stdout; progress bars, notes and statistics to stderr. ``run`` and
``validate`` only read a bundle; their session files go to ``--state`` (``omnidraft_deploy.bundle.state``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omnidraft_deploy.catalog.backends import get_backend
from omnidraft_deploy.catalog.presets import DEFAULT_TARGET
from omnidraft_deploy.cli.console import library_stdout, run_verb
from omnidraft_deploy.cli.local import cmd_assets, cmd_bench, cmd_generate, cmd_presets
from omnidraft_deploy.cli.parser import (
    VERIFY_HASHES_ENV,
    Handler,
    build_export_parser,
    build_parser,
)


def _cmd_export(args: argparse.Namespace) -> int:
    from omnidraft_deploy.resolve.out_dir import InputError

    for flag, given in (("--target-from", args.target_from), ("--drafter-from", args.drafter_from)):
        if given and not (Path(given) / "manifest.json").is_file():
            raise InputError(flag, f"{given}: not a bundle (no manifest.json)")
    if args.target_from and args.drafter_from:
        raise InputError("--drafter-from", "with --target-from there is nothing left to export")
    if args.target is not None and "," in args.target:
        if args.target_from or args.drafter_from:
            raise InputError("--target-from" if args.target_from else "--drafter-from",
                             "reuses a graph of a one-target bundle; a multi-target export "
                             "exports every target")  # fmt: skip
        return _cmd_export_multi(args)
    from omnidraft_deploy.resolve.context import choose_max_seq_len
    from omnidraft_deploy.resolve.export_inputs import resolve_export  # no torch import before

    quant, _, drafter_quant = (args.quantization or _default_quantization(args)).partition(",")
    from omnidraft_deploy.resolve.weights_spec import own_name

    name = own_name(args.model) if args.target is None and args.model else args.target
    out = Path(args.out or f"bundles/{name or DEFAULT_TARGET}-{args.backend}")
    inputs = resolve_export(
        target=args.target, drafter=args.drafter, model=args.model,
        drafter_model=args.drafter_model, out_dir=out, force=args.force, quantization=quant,
        reuse_target=bool(args.target_from),
    )  # fmt: skip
    max_seq_len, context_note = choose_max_seq_len(inputs, args.max_seq_len)
    for note in (*inputs.notes, context_note, *_left_out(args)):
        print(f"note: {note}", file=sys.stderr)
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair
    from omnidraft_deploy.runtime.bundle import check_bundle

    t, d = inputs.target, inputs.drafter
    cfg = ExportConfig(
        target=t.spec, drafter=d.spec, backend=args.backend, quantization=quant, out_dir=out,
        drafter_quantization=drafter_quant or None, max_seq_len=max_seq_len,
        draft_len=args.draft_len, verify=not args.no_verify,
        reference_prompts=args.reference_prompts, target_model=t.weights if args.model else None,
        drafter_model=d.weights if args.drafter_model else None,
    )  # fmt: skip
    with library_stdout(getattr(args, "verbose", False)):
        target_from = Path(args.target_from) if args.target_from else None  # no target export
        drafter_from = Path(args.drafter_from) if args.drafter_from else None  # no drafter export
        path = export_pair(
            cfg, inputs, opener=check_bundle, target_from=target_from, drafter_from=drafter_from
        )  # never publish what open refuses
    manifest = json.loads((path / "manifest.json").read_text())
    size = sum(f["size"] for f in manifest["files"].values()) / 1e6
    parity = manifest["graphs"]["target"].get("parity", {})
    checked = f", target max |logit diff| {parity['max_abs_logit_diff']:.2g}" if parity else ""
    chat = " --chat" if t.chat_template else ""
    recipes = f"{quant},{drafter_quant}" if drafter_quant else quant
    print(f"exported {path} ({args.backend}/{recipes}, {size:.1f} MB{checked})\nnext:\n"
          f"  omnidraft validate {path}\n  omnidraft run {path}{chat} --prompt 'def fib(n):'")  # fmt: skip
    return 0


def _default_quantization(args: argparse.Namespace) -> str:
    """``TARGET,DRAFTER`` recipes when ``--quantization`` is not given: weights that are a GGUF
    (``--model X.gguf``, or a preset pinned to one) keep their own blocks where the backend has
    such a recipe (``backends.default_quantization``); said on stderr when it applies."""
    from omnidraft_deploy.catalog.backends import default_quantization
    from omnidraft_deploy.catalog.presets import Source, get_preset

    def gguf(weights: str | None, preset: str | None) -> bool:
        if weights:
            return str(weights).endswith(".gguf")
        try:
            return preset is not None and get_preset(preset).source is Source.GGUF
        except KeyError:
            return False  # an unknown preset is refused, listing the valid ones, further on

    target, drafter = default_quantization(args.backend, gguf(args.model, args.target),
                                           gguf(args.drafter_model, args.drafter))  # fmt: skip
    plain = get_backend(args.backend).default_quantization
    if (target, drafter) != (plain, plain):
        print(f"note: --quantization {target},{drafter}: the {args.backend} default for GGUF "
              "weights (their own blocks; `omnidraft-export --help` lists the recipes)",
              file=sys.stderr)  # fmt: skip
    return f"{target},{drafter}"


def _left_out(args: argparse.Namespace) -> list[str]:
    """What an export leaves out on request, said before it starts (``make demo`` sizes its
    export for a demo with ``--reference-prompts``)."""
    from omnidraft_deploy.catalog.prompts import load_prompts

    notes, shipped = [], len(load_prompts())
    if args.reference_prompts is not None and args.reference_prompts < shipped:
        notes.append(f"expected.json records the eager target on {args.reference_prompts} of the "
                     f"{shipped} shipped prompts (--reference-prompts): validate checks those")  # fmt: skip
    if args.no_verify:
        notes.append("the written graphs are not checked against eager PyTorch (--no-verify)")
    return notes


def _cmd_export_multi(args: argparse.Namespace) -> int:
    """``--target A,B,C``: one bundle of one drafter and several targets (``exporters.multi``)."""
    from omnidraft_deploy.resolve.context import choose_max_seq_len
    from omnidraft_deploy.resolve.export_inputs import resolve_export

    targets = tuple(t.strip() for t in args.target.split(","))
    quant, _, drafter_quant = (args.quantization or _default_quantization(args)).partition(",")
    out = Path(args.out or f"bundles/{'+'.join(targets)}-{args.backend}")
    inputs = [resolve_export(target=t, drafter=args.drafter, model=args.model,
                             drafter_model=args.drafter_model, out_dir=out, force=args.force,
                             quantization=quant)
              for t in targets]  # fmt: skip
    drafter = inputs[0].drafter
    max_seq_len = min(choose_max_seq_len(i, args.max_seq_len)[0] for i in inputs)
    for note in (*dict.fromkeys(n for i in inputs for n in i.notes), *_left_out(args)):
        print(f"note: {note}", file=sys.stderr)
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.multi import MultiExportConfig, export_multi
    from omnidraft_deploy.runtime.bundle import check_every_target

    base = ExportConfig(
        target=targets[0], drafter=drafter.spec, backend=args.backend, quantization=quant,
        out_dir=out, drafter_quantization=drafter_quant or None, max_seq_len=max_seq_len,
        draft_len=args.draft_len, target_model=args.model,
        drafter_model=drafter.weights if args.drafter_model else None,
        verify=not args.no_verify,
        reference_prompts=args.reference_prompts,
    )  # fmt: skip
    with library_stdout(getattr(args, "verbose", False)):
        path = export_multi(MultiExportConfig(base, targets), inputs, opener=check_every_target)
    sharing = json.loads((path / "manifest.json").read_text())["extras"]["sharing"]
    print(f"exported {path} ({args.backend}, one drafter, targets {', '.join(targets)}; "
          f"{sharing['bundle_bytes'] / 1e6:.1f} MB against {sharing['separate_bytes'] / 1e6:.1f} "
          f"MB as separate bundles: {sharing['saved_bytes']:,} bytes saved)\nnext:\n"
          f"  omnidraft validate {path}\n  omnidraft run {path} --target {targets[0]} "
          "--prompt 'def fib(n):'")  # fmt: skip
    return 0


def _state(bundle: str, override: str | None, target: str | None = None) -> Path:
    """The session folder (``bundle.state``) of ``target`` of the bundle, once its manifest reads
    as a bundle's: a missing or foreign folder, or a target the bundle lacks (or none picked of
    several), is refused (``BundleError``) before any state folder is made; each target of a
    multi-target bundle has its own (``bundle.targets.target_state``)."""
    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.state import state_dir
    from omnidraft_deploy.bundle.targets import select, target_state

    view = select(read_manifest(bundle), target, source=Path(bundle) / "manifest.json")
    return target_state(state_dir(bundle, override), view)


def _bundle_prompts(bundle: str, target: str | None = None) -> list[tuple[str, list[int]]]:
    """The shipped prompt set in the target ids of the bundle's (selected) target."""
    from omnidraft_deploy.catalog.prompts import load_prompts

    # the tokenizer's bytes are hashed as read; adapt_bundle opens (and checks) the whole bundle
    from omnidraft_deploy.runtime.session import target_tokenizer

    tok = target_tokenizer(Path(bundle), target)
    return [(p.task, tok.encode(p.text)) for p in load_prompts()]


def _cmd_validate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from omnidraft_deploy.bundle.atomic import write_text_atomic
    from omnidraft_deploy.bundle.state import VALIDATION_REPORT
    from omnidraft_deploy.runtime.validate import validate_bundle

    ok = True
    for bundle, target in _bundle_targets(args.bundles, args.target):
        name = bundle if target is None else f"{bundle} [{target}]"

        def bar(rows: Any, name: str = name) -> Any:
            return tqdm(rows, desc=f"validate {name}", unit="prompt", leave=False)

        state = _state(bundle, args.state, target)
        report = validate_bundle(bundle, max_new_tokens=args.max_new_tokens, target=target,
                                 provider=args.provider, progress=bar, state=state)  # fmt: skip
        path = state / VALIDATION_REPORT
        write_text_atomic(path, json.dumps(report, indent=2) + "\n")
        n = report["prompts"]
        print(f"{name}: {report['backend']}/{report['quantization']} on {report['provider']}: "
              f"runtime == reference {report['eager_equal']}/{n}, speculative == runtime "
              f"{report['speculative_equal']}/{n} -> {'PASS' if report['passed'] else 'FAIL'}"
              f"  (report: {path})")  # fmt: skip
        ok &= bool(report["passed"])
    return 0 if ok else 1


def _bundle_targets(bundles: list[str], target: str | None) -> list[tuple[str, str | None]]:
    """(bundle, target) pairs ``validate`` checks: every target of a multi-target bundle unless
    ``--target`` names one; None for a single-target bundle (its only target)."""
    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.targets import target_names

    pairs: list[tuple[str, str | None]] = []
    for bundle in bundles:
        manifest = read_manifest(bundle)
        names = target_names(manifest) if manifest.targets and target is None else [target]
        pairs += [(bundle, name) for name in names]
    return pairs


def _cmd_run(args: argparse.Namespace) -> int:
    from omnidraft_deploy.cli.client import run_remote, socket_path

    request = _run_request(args)
    state = _state(args.bundle, args.state, args.target)
    trust_record = os.environ.get(VERIFY_HASHES_ENV, "") in ("", "0")
    if trust_record and not args.no_server:  # a resident ``omnidraft serve`` answers first
        status = run_remote(socket_path(state), request, sys.stdout, sys.stderr)
        if status is not None:
            return status
    if args.chat:  # the template's sandboxed renderer starts while the bundle opens
        from omnidraft_deploy.vocab.chat_sandbox import prestart

        prestart()
    from omnidraft_deploy.runtime.session import generate, open_session

    session = open_session(args.bundle, provider=args.provider, state=state, target=args.target,
                           trust_record=trust_record)  # fmt: skip
    generate(session, request, sys.stdout, sys.stderr)
    return 0


def _run_request(args: argparse.Namespace) -> Any:
    """``run``'s flags as a ``request.protocol.RunRequest`` (the prompt file read)."""
    from omnidraft_deploy.request.protocol import RunRequest
    from omnidraft_deploy.resolve.out_dir import InputError

    if args.mode != "greedy" and args.temperature <= 0:
        raise InputError("--temperature", f"--mode {args.mode} samples: it needs a temperature "
                         "> 0 (--mode greedy for argmax decoding)")  # fmt: skip
    return RunRequest(
        bundle=str(Path(args.bundle).resolve()), target=args.target, provider=args.provider,
        prompt=_prompt_text(args.prompt, args.prompt_file), chat=args.chat, mode=args.mode,
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        seed=args.seed, stats=args.stats,
    )  # fmt: skip


def _cmd_serve(args: argparse.Namespace) -> int:
    import time

    from omnidraft_deploy.cli.client import socket_path
    from omnidraft_deploy.cli.console import error_line
    from omnidraft_deploy.cli.serve import Served, bind, check_free, serve
    from omnidraft_deploy.runtime.session import changed, generate, open_session, prepare, warm

    t0 = time.perf_counter()
    state = _state(args.bundle, args.state, args.target)
    path = socket_path(state, args.socket)
    check_free(path)  # before the open: a second server would only find out after it
    session = open_session(args.bundle, provider=args.provider, state=state, target=args.target,
                           threads=args.threads, served=True)  # fmt: skip
    t1 = time.perf_counter()
    warm(session)  # the cost profile is measured here the first time (~1 min on a 1.5B target)
    listener = bind(path)
    served = Served(str(Path(args.bundle).resolve()), args.target, session.bundle.provider)
    t2 = time.perf_counter()
    print(f"serving {args.bundle} on {path} (opened in {t1 - t0:.1f} s, warmed in {t2 - t1:.1f} "
          "s)", flush=True)  # fmt: skip

    def refusal() -> str | None:
        files = changed(session)
        return f"its bundle changed since it opened it ({', '.join(files[:3])})" if files else None

    stopped = serve(listener, path, served, lambda r, o, e: generate(session, r, o, e),
                    refusal=refusal, after=lambda: prepare(session),
                    error_line=lambda e: error_line("omnidraft run", e, verbose=False))  # fmt: skip
    print(f"omnidraft serve: stopped ({stopped})", file=sys.stderr)
    return 0


def _prompt_text(prompt: str, prompt_file: str | None) -> str:
    """``--prompt``, or the text of ``--prompt-file`` (UTF-8; any failure names the flag)."""
    if prompt_file is None:
        return prompt
    try:
        return Path(prompt_file).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompt-file {prompt_file}: not UTF-8 text ({e.reason} at byte "
                         f"{e.start})") from None  # fmt: skip
    except OSError as e:  # gone since the parse, a folder, no permission
        raise ValueError(f"--prompt-file {prompt_file}: cannot be read ({e.strerror})") from None


def _cmd_adapt(args: argparse.Namespace) -> int:
    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.targets import select
    from omnidraft_deploy.distill.adapt import AdaptConfig
    from omnidraft_deploy.runtime.adapt import adapt_bundle

    root = Path(args.bundle)
    view = select(read_manifest(root), args.target, source=root / "manifest.json")
    state = _state(args.bundle, args.state, args.target)
    shipped = [ids for _, ids in _bundle_prompts(args.bundle, args.target)]
    capacity = view.graphs["target"].max_seq_len  # a prompt needs room for one new token
    prompts = [ids for ids in shipped if len(ids) < capacity]
    if len(prompts) < len(shipped):
        print(f"adapt: {len(shipped) - len(prompts)} of {len(shipped)} shipped prompts skipped: "
              f"not shorter than the target's capacity of {capacity} tokens", file=sys.stderr)  # fmt: skip
    base = AdaptConfig()
    cfg = AdaptConfig(
        lr=args.lr or base.lr, steps_per_update=args.steps_per_update or base.steps_per_update
    )
    written: list[Path] = []

    def publish(drafter: Any) -> None:  # multi-target: the target's state folder, not the bundle
        written.append(publish_for(root, view, state, drafter))

    result = adapt_bundle(
        args.bundle, prompts, cfg, rounds=args.rounds, max_new_tokens=args.max_new_tokens,
        provider=args.provider, publish=publish, target=args.target, state=state,
    )  # fmt: skip
    trace, n = result.report.acceptance, len(prompts)
    first, last = sum(trace[:n]) / n, sum(trace[-n:]) / n
    print(f"{args.bundle}: {result.rounds} x {n} prompts, {result.report.optimizer_steps} "
          f"optimiser steps ({result.report.rolled_back} rolled back by the guard) in "
          f"{result.report.seconds:.0f} s; acceptance first round {first:.3f} -> last round "
          f"{last:.3f}; adapted drafter written to {written[0]}")  # fmt: skip
    return 0


def publish_for(root: Path, view: Any, state: Path, drafter: Any) -> Path:
    """Publish a trained drafter (``adapt``, ``distill``): a single-target bundle's drafter graph
    is re-exported from it and verified (``exporters.publish``); a target of a multi-target bundle
    gets it swapped into the shared graph, checked, in its state folder (``runtime.adapted``)."""
    from omnidraft_deploy.exporters.publish import publish_drafter
    from omnidraft_deploy.runtime.adapted import publish_target_weights

    if view.targets:
        return publish_target_weights(root, view, state, drafter)
    return publish_drafter(root, drafter)


def _cmd_distill(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.targets import select
    from omnidraft_deploy.distill.adapt import AdaptConfig
    from omnidraft_deploy.distill.requests import requests_for
    from omnidraft_deploy.runtime.distill import DistillRun, distill_bundle

    requests = requests_for(args.prompts, args.replies)
    cfg = AdaptConfig(lr=args.lr, lam=1.0, seqkd=args.seqkd, batch_size=4, steps_per_update=1,
                      seq_len=256, train_layers=args.train_layers)  # fmt: skip
    state = _state(args.bundle, args.state, args.target)
    run = DistillRun(Path(args.bundle), args.target, state, requests, cfg, replies=args.replies,
                     minutes=args.minutes, max_new_tokens=args.max_new_tokens,
                     threads=args.threads, epochs=args.epochs, teach_only=args.teach_only)  # fmt: skip
    root = Path(args.bundle)
    view = select(read_manifest(root), args.target, source=root / "manifest.json")

    def publish(drafter: Any) -> Path:
        with library_stdout(getattr(args, "verbose", False)):  # torch.onnx's chatter
            return publish_for(root, view, state, drafter)

    line = distill_bundle(run, publish=publish, err=sys.stderr,
                          restate=lambda: _state(args.bundle, args.state, args.target),
                          bar=lambda desc, unit: lambda r: tqdm(r, desc=desc, unit=unit,
                                                                file=sys.stderr))  # fmt: skip
    print(line)
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from omnidraft_deploy.runtime.profile import profile_bundle

    path = profile_bundle(
        Path(args.bundle), _state(args.bundle, args.state, args.target), k_max=args.k_max,
        reps=args.reps, threads=args.threads, target=args.target,
        progress=lambda r: tqdm(r, desc="profile", unit="round"),
    )  # fmt: skip
    print(f"{args.bundle}: cost profile written to {path}")
    return 0


HANDLERS: dict[str, Handler] = {
    "presets": cmd_presets, "assets": cmd_assets, "generate": cmd_generate, "bench": cmd_bench,
    "export": _cmd_export, "validate": _cmd_validate, "run": _cmd_run, "profile": _cmd_profile,
    "adapt": _cmd_adapt, "serve": _cmd_serve, "distill": _cmd_distill,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(HANDLERS).parse_args(argv)
    prog = "omnidraft-export" if args.verb == "export" else f"omnidraft {args.verb}"
    return run_verb(prog, lambda: int(args.handler(args)), verbose=args.verbose)


def export_main(argv: Sequence[str] | None = None) -> int:
    """``omnidraft-export``: its own parser, so help and errors say ``omnidraft-export``."""
    args = build_export_parser(_cmd_export).parse_args(argv)
    verbose = getattr(args, "verbose", False)
    return run_verb("omnidraft-export", lambda: _cmd_export(args), verbose=verbose)


if __name__ == "__main__":
    raise SystemExit(main())
