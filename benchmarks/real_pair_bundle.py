"""Decoding benchmark on exported bundles: one target, cross-vocabulary and family drafters, peers.

    .venv/bin/python -m benchmarks.real_pair_bundle run --bundle bundles/q15 \
        --family-bundle bundles/q15-family --gguf <Qwen2.5-Coder-1.5B GGUF> \
        --genai .bench/runtime_speed/genai/qwen2.5-1.5b-int8 --name real_pair_1p5b
    .venv/bin/python -m benchmarks.real_pair_bundle report --name real_pair_1p5b

What a user runs is what is timed: the bundle is opened by the runtime's opener (``open_bundle``),
its cost profile measured as ``run`` measures it (``runtime.profile.measure_bundle``: call
latencies + the host overhead of a real decode), and every decoder is built from the bundle's own
graphs, map and n-gram cache, with ``host_threads = 1`` as ``run`` sets it. Rows (greedy):

- ``ours_target``: the bundle's target alone;
- ``ours_smollm2``: the bundle's drafter, direct map + n-gram cache, cost-aware, no lookup;
- ``ours_hybrid_smollm2``: the same plus lookup drafts, chosen per step by the cost model;
- ``ours_lookup``: lookup drafts alone (no drafter model);
- ``ours_family``: the family bundle's drafter (same vocabulary as the target; ``--family-bundle``);
  ``ours_family_fixed``: the same drafter at its bundle's draft length on every step, without the
  cost policy (which may keep a costly drafter off: the control's other reading);
- ``ours_smollm2_kd`` / ``ours_hybrid_smollm2_kd``: the drafter of ``--kd-bundle`` (the same
  drafter distilled for this target, ``benchmarks/kd_drafter.py``, exported with
  ``--target-from``) in place of the bundle's, without / with lookup: base and distilled drafter
  timed in one run, against the same target calls; ``ours_hybrid_smollm2_kd_learn``: the
  latter pricing its drafts with the latencies its loop pays (``DecodeConfig.learn_costs``,
  ``speculative/cost_learning.py``; one learner per row, kept across the run's prompts; not
  ``run``'s default: it has not measured faster, docs/results/decoding.md);
- ``genai_target``: ONNX Runtime GenAI target-only on its builder's graph of the same weights;
- ``llamacpp_target``: llama.cpp's plain decode of the same GGUF (``llama-cpp-python``, built from
  its sdist: ``pip install llama-cpp-python==0.3.36``; the ``bench`` extra does not pull it).

``--modes exact`` adds ``*_t07`` rows: ``exact`` sampling at temperature 0.7 (seeded), compared by
tokens/s, since sampled outputs differ between runs. Every prompt runs every method round-robin
(``common.timer.run_side_by_side``), the load average is recorded at start and end; ``report``
writes ``reports/local/<name>/<name>.{json,md}`` and a plot per task (``real_pair_report``); a run a
page cites becomes a row of the benchmark's index, ``reports/real_pair_1p5b/runs.json``
(``python -m benchmarks.run_spread add reports/local/<name>/<name>.json``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import OpenBundle, open_bundle
from omnidraft_deploy.runtime.profile import measure_bundle

from benchmarks.common import peers
from benchmarks.common.pair import fresh_lookup, prompt_texts
from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.common.timer import RunFn, decoder_run, run_side_by_side, target_run
from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.drafter import Mode
from omnidraft_deploy.speculative.factory import build_decoder, pair_config
from omnidraft_deploy.vocab.bundle_tokenizer import (
    chat_prefix_ids,
    load_bundle_tokenizer,
    render_chat,
)

log = logging.getLogger("real_pair_bundle")
TASKS = ("math", "code", "chat", "summarisation", "code_edit")


def load_prompts(tok: Any, tasks: list[str], per_task: int) -> list[tuple[str, list[int]]]:
    """The real-pair prompt set plus the code-editing prompts, chat-formatted (instruct models)."""
    raw = prompt_texts(code_edit=True)
    out: list[tuple[str, list[int]]] = []
    for task in tasks:
        texts = [p["text"] for p in raw if p["task"] == task][:per_task]
        template = getattr(tok, "chat_template", None)
        out += [(task, tok.encode(render_chat(template, t))) for t in texts]
    return out


def _decoder(bundle: OpenBundle, prof: CostProfile, cfg: DecodeConfig, *, model: bool,
             lookup: bool, drafter: OpenBundle | None = None,
             fixed: bool = False) -> SpeculativeDecoder:  # fmt: skip
    """A decoder as ``run`` builds it (cost-aware, the bundle's n-gram cache, host threads 1);
    ``fixed``: the drafter's bundle's own draft length at every step instead (no cost policy)."""
    src = drafter or bundle
    cache = copy.deepcopy(src.ngram_cache) if model else None  # each decoder grows its own
    if fixed:
        return build_decoder(bundle.target, src.drafter, src.mapper, policy="fixed", config=cfg,
                             draft_len=src.manifest.draft_len, ngram_cache=cache)  # fmt: skip
    return build_decoder(bundle.target, src.drafter if model else None, src.mapper, config=cfg,
                         policy="cost", draft_len=bundle.manifest.draft_len, profile=prof,
                         ngram_cache=cache, lookup=fresh_lookup() if lookup else None)  # fmt: skip


def _profiles(
    bundle: OpenBundle, others: dict[str, OpenBundle], reps: int, stat: str = "median"
) -> dict[str, CostProfile]:
    """The bundle's profiles as ``run`` measures them (its drafter as ``smollm2``, ``""`` for
    lookup), plus the other bundles' drafters (``family``, ``smollm2_kd``) timed against the
    same target calls; ``stat`` "mean": each call's repetitions averaged instead (a run's sum of
    calls on a machine that alternates between speeds, ``benchmarks/state_trace.py``)."""
    others = {name: b.drafter for name, b in others.items()}
    profs = measure_bundle(bundle, k_max=2 * bundle.manifest.draft_len, reps=reps, others=others,
                           stat=statistics.fmean if stat == "mean" else statistics.median)  # fmt: skip
    profs["smollm2"] = profs.pop("drafter")
    return profs


def methods(a: argparse.Namespace, bundle: OpenBundle, others: dict[str, OpenBundle],
            profs: dict[str, CostProfile]) -> dict[str, RunFn]:  # fmt: skip
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    base = pair_config(bundle.mapper, DecodeConfig(max_new_tokens=a.max_new_tokens, host_threads=1))
    m: dict[str, RunFn] = {}
    warm = chat_prefix_ids(tok) if a.prompt_cache == "system" else []  # every row alike
    if "greedy" in a.modes:
        m["ours_target"] = target_run(bundle.target, base, warm=warm)
        rows = [
            ("ours_smollm2", "smollm2", True, False),  # (row, profile, model, lookup)
            ("ours_hybrid_smollm2", "smollm2", True, True),
            ("ours_lookup", "", False, True),
        ]
        if "family" in others:
            rows.append(("ours_family", "family", True, False))
        if "smollm2_kd" in others:
            rows += [
                ("ours_smollm2_kd", "smollm2_kd", True, False),
                ("ours_hybrid_smollm2_kd", "smollm2_kd", True, True),
                ("ours_hybrid_smollm2_kd_learn", "smollm2_kd", True, True),
            ]
        for name, prof, model, look in rows:
            cfg = dataclasses.replace(base, learn_costs=name.endswith("_learn"))
            dec = _decoder(bundle, profs[prof], cfg, model=model, lookup=look,
                           drafter=others.get(prof))  # fmt: skip
            m[name] = decoder_run(dec, profile=profs[prof], warm=warm)
        if "family" in others:  # the family drafter without the policy's say
            fixed = _decoder(bundle, profs["family"], base, model=True, lookup=False,
                             drafter=others["family"], fixed=True)  # fmt: skip
            m["ours_family_fixed"] = decoder_run(fixed, profile=profs["family"], warm=warm)
        if a.genai:
            m["genai_target"] = peers.genai_method(a.threads, a.max_new_tokens, Path(a.genai))
        if a.gguf:
            m["llamacpp_target"] = peers.llamacpp_method(Path(a.gguf), a.threads,
                                                         a.max_new_tokens, keep=len(warm))  # fmt: skip
    if "exact" in a.modes:
        cfg = dataclasses.replace(base, mode=Mode.EXACT, temperature=0.7)
        m["ours_target_t07"] = target_run(bundle.target, cfg, seed=a.seed, warm=warm)
        for name, look in (("smollm2", False), ("hybrid_smollm2", True)):
            dec = _decoder(bundle, profs["smollm2"], cfg, model=True, lookup=look)
            m[f"ours_{name}_t07"] = decoder_run(dec, seed=a.seed, warm=warm)
    return m


def _spinning_sessions(bundle: OpenBundle, threads: int, spinning: str) -> None:
    """Reopen both graphs with another thread-pool wait (``onnx_host.Spin``; "default": ORT's
    defaults, what the runtime did before issue 26) to measure its cost inside the decode loop."""
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    from omnidraft_deploy.host.onnx_host import Spin

    spin = None if spinning == "default" else Spin(spinning)
    for role in ("target", "drafter"):
        info = bundle.manifest.graphs[role]
        decode = None if info.decode_file is None else bundle.root / info.decode_file
        model = OrtModel(bundle.root / info.file, info, decode=decode, threads=threads,
                         spinning=spin)  # fmt: skip
        setattr(bundle, role, model)


def cmd_run(a: argparse.Namespace) -> None:
    load0, t0 = os.getloadavg(), time.perf_counter()
    bundle = open_bundle(a.bundle, threads=a.threads)
    others = {name: open_bundle(path, threads=a.threads)
              for name, path in (("family", a.family_bundle), ("smollm2_kd", a.kd_bundle)) if path}  # fmt: skip
    if a.ort_spinning != "in-call":  # the runtime's sessions are opened so
        _spinning_sessions(bundle, a.threads, a.ort_spinning)
    profs = _profiles(bundle, others, a.reps, a.profile_stat)
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    prompts = load_prompts(tok, a.tasks.split(","), a.per_task)
    meths = methods(a, bundle, others, profs)
    if a.methods:
        keep = a.methods.split(",")
        unknown = sorted(set(keep) - set(meths))
        if unknown:
            raise SystemExit(f"unknown methods {unknown}; choose from {sorted(meths)}")
        meths = {n: f for n, f in meths.items() if n in keep}
    load_s = round(time.perf_counter() - t0, 1)
    res = run_side_by_side(meths, prompts, threads=a.threads, repeats=a.repeats, warmup=True)
    target = bundle.manifest.graphs["target"]
    meta = {**run_meta(threads=a.threads), **res.meta, "tasks": a.tasks,
            "ort_spinning": a.ort_spinning, "target_quant": target.quantization,
            "target_backend": bundle.manifest.backend,
            "target": target.preset, "bundle": str(a.bundle), "family_bundle": a.family_bundle, "kd_bundle": a.kd_bundle,
            "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "modes": a.modes,
            "load_s": load_s, "load_avg_run_start": load0,
            "prompt_cache": a.prompt_cache}  # fmt: skip
    out = {"meta": meta, "profiles": {n: json.loads(p.to_json()) for n, p in profs.items()},
           "rows": res.rows}  # fmt: skip
    chunk = Path(a.chunk_dir) / a.name / f"{a.chunk}.json"
    write_text_atomic(chunk, json.dumps(out, indent=1, default=str))
    log.info("done; load %s -> %s", meta["load_avg_start"], meta["load_avg_end"])


def two_token_law(bundle: OpenBundle, ids: list[int], cfg: DecodeConfig,
                  mass: float = 0.995) -> dict[tuple[int, ...], float]:  # fmt: skip
    """The target's own law of its next two tokens at ``cfg``'s temperature, exactly: P(x1) from
    one call, P(x2 | x1) for the most likely x1 up to ``mass``; the rest is the cell ``(-1,)``."""
    from omnidraft_deploy.speculative.sampling import logits_to_probs

    def row(seq: list[int]) -> torch.Tensor:
        logits = bundle.target.forward(torch.tensor(seq), 0)[-1][: cfg.vocab_limit]
        return logits_to_probs(logits, cfg.temperature).double()

    law: dict[tuple[int, ...], float] = {}
    p1 = row(ids)
    order = torch.argsort(p1, descending=True).tolist()
    covered = 0.0
    for x1 in order:
        if covered >= mass:
            break
        covered += float(p1[x1])
        p2 = row([*ids, x1])
        for x2 in torch.nonzero(p2 > 1e-4).flatten().tolist():
            law[(x1, x2)] = float(p1[x1] * p2[x2])
    law[(-1,)] = max(0.0, 1.0 - sum(law.values()))
    return law


def cmd_lossless(a: argparse.Namespace) -> None:
    """``exact`` sampling at T = 0.7 with the bundle's drafter proposing 3 tokens every step: the
    law of the first two tokens against the target's own (chi-square, small cells pooled; z < 4
    passes)."""
    from collections import Counter

    from omnidraft_deploy.speculative.lossless import deviation_report

    load0 = os.getloadavg()
    bundle = open_bundle(a.bundle, threads=a.threads)
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    cfg = pair_config(bundle.mapper, DecodeConfig(mode=Mode.EXACT, temperature=0.7, max_new_tokens=2,
                                                  host_threads=1), stop_at_eos=False)  # fmt: skip
    report = []
    for task, ids in load_prompts(tok, a.tasks.split(","), 1):
        law = two_token_law(bundle, ids, cfg)
        # a fixed draft length: every step proposes, so acceptance and rejection both run
        dec = build_decoder(bundle.target, bundle.drafter, bundle.mapper, policy="fixed",
                            draft_len=3, config=cfg, stop_at_eos=False)  # fmt: skip
        gen = torch.Generator().manual_seed(a.seed)
        counts: Counter[tuple[int, ...]] = Counter()
        proposed = accepted = 0
        for _ in range(a.samples):
            out, st = dec.generate(ids, generator=gen)
            key = tuple(out) if tuple(out) in law else (-1,)
            counts[key] += 1
            proposed, accepted = proposed + st.proposed, accepted + st.accepted
        rep = {"task": task, **deviation_report(counts, law), "proposed": proposed,
               "accepted": accepted, "cells": len(law)}  # fmt: skip
        rep["passed"] = rep["chi2_z"] < 4.0
        log.info("%s", rep)
        report.append(rep)
    meta = {**run_meta(threads=a.threads, load_avg_start=load0), "bundle": str(a.bundle),
            "samples": a.samples, "seed": a.seed}  # fmt: skip
    stem = Path(a.out_dir) / a.name / f"{a.name}_lossless"
    write_report(stem, {"meta": meta, "prompts": report}, markdown=lossless_md)


def lossless_md(d: dict[str, Any]) -> str:
    lines = ["# exact sampling (T = 0.7) vs the target's own two-token law", "",
             *meta_lines(d["meta"]), "| task | samples | cells | chi2 | dof | z (< 4 passes) | "
             "passed | proposed | accepted |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["prompts"]:
        lines.append(f"| {r['task']} | {r['samples']:.0f} | {r['cells']} | {r['chi2']:.1f} | "
                     f"{r['dof']:.0f} | {r['chi2_z']:.2f} | {r['passed']} | {r['proposed']} | "
                     f"{r['accepted']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("run")
    p.add_argument("--bundle", required=True)
    p.add_argument("--family-bundle", default=None, help="a bundle whose drafter shares the "
                   "target's vocabulary (its target graph is not used)")  # fmt: skip
    p.add_argument("--kd-bundle", default=None, help="a bundle of the same drafter distilled for "
                   "this target (its target graph is not used): the _kd rows")  # fmt: skip
    p.add_argument("--gguf", default=None, help="the target's GGUF: adds llama.cpp's plain decode")
    p.add_argument("--genai", default=None, help="ORT GenAI folder of the same weights")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--per-task", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--reps", type=int, default=5, help="profile repeats (interleaved)")
    p.add_argument("--profile-stat", choices=["median", "mean"], default="median",
                   help="how the profile summarises each call's repeats")  # fmt: skip
    p.add_argument("--modes", default="greedy", help="greedy,exact")
    p.add_argument("--methods", default="", help="only these rows (comma-separated names)")
    p.add_argument(
        "--ort-spinning",
        choices=("in-call", "off", "on", "default"),
        default="in-call",
        help="ONNX Runtime pools spin: in-call (the runtime's sessions), off, on, ORT's default",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-cache", choices=["none", "system"], default="none",
                   help="none: every prompt prefilled whole; system: every row (llama.cpp's too; "
                   "not GenAI's) finds the chat template's system turn in its caches, as in a "
                   "served session (speculative.kv_reuse)")  # fmt: skip
    p.add_argument("--chunk", default="0")
    p.add_argument("--chunk-dir", default=".bench/real_pair_bundle")
    p.add_argument("--name", default="real_pair_1p5b")
    p = sub.add_parser("lossless")
    p.add_argument("--bundle", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tasks", default="code,chat")
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="real_pair_1p5b")
    p.add_argument("--out-dir", default="reports/local")
    p = sub.add_parser("report")
    p.add_argument("--name", default="real_pair_1p5b")
    p.add_argument("--chunk-dir", default=".bench/real_pair_bundle")
    p.add_argument("--out-dir", default="reports/local")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if a.verb == "report":
        from benchmarks.real_pair_report import write_report as write_pair_report

        write_pair_report(Path(a.chunk_dir) / a.name, Path(a.out_dir) / a.name, a.name)
    elif a.verb == "lossless":
        cmd_lossless(a)
    else:
        cmd_run(a)


if __name__ == "__main__":
    main()
