"""Decoding benchmark on exported bundles: one target, cross-vocabulary and family drafters, peers.

    .venv/bin/python benchmarks/real_pair_bundle.py run --bundle bundles/q15 \
        --family-bundle bundles/q15-family --gguf <Qwen2.5-Coder-1.5B GGUF> \
        --genai .bench/runtime_speed/genai/qwen2.5-1.5b-int8 --name real_pair_1p5b
    .venv/bin/python benchmarks/real_pair_bundle.py report --name real_pair_1p5b

What a user runs is what is timed: the bundle is opened by the runtime's opener (``open_bundle``),
its cost profile measured as ``run`` measures it (``runtime.profile.measure_bundle``: call
latencies + the host overhead of a real decode), and every decoder is built from the bundle's own
graphs, map and n-gram cache, with ``host_threads = 1`` as ``run`` sets it. Rows (greedy):

- ``ours_target``: the bundle's target alone;
- ``ours_smollm2``: the bundle's drafter, direct map + n-gram cache, cost-aware, no lookup;
- ``ours_hybrid_smollm2``: the same plus lookup drafts, chosen per step by the cost model;
- ``ours_lookup``: lookup drafts alone (no drafter model);
- ``ours_family``: the family bundle's drafter (same vocabulary as the target; ``--family-bundle``);
- ``genai_target``: ONNX Runtime GenAI target-only on its builder's graph of the same weights;
- ``llamacpp_target``: llama.cpp's plain decode of the same GGUF (``llama-cpp-python``, built from
  its sdist: ``pip install llama-cpp-python==0.3.36``; the ``bench`` extra does not pull it).

``--modes exact`` adds ``*_t07`` rows: ``exact`` sampling at temperature 0.7 (seeded), compared by
tokens/s, since sampled outputs differ between runs. Every prompt runs every method round-robin
(``real_pair.run_side_by_side``), the load average is recorded at start and end; ``report`` writes
``reports/<name>/<name>.{json,md}`` and a plot per task (``real_pair_report``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import OpenBundle, open_bundle
from omnidraft_deploy.runtime.profile import cpu_model, measure_bundle
from ort_pair import _traced  # type: ignore[import-not-found]  # benchmarks/, beside this script
from real_pair import genai_method  # type: ignore[import-not-found]

from omnidraft_deploy import real_pair as rp
from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen, FixedDraftLen
from omnidraft_deploy.speculative.drafter import Mode
from omnidraft_deploy.speculative.lookup import LookupConfig, LookupProposer
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat

log = logging.getLogger("real_pair_bundle")
HERE = Path(__file__).parent
TASKS = ("math", "code", "chat", "summarisation", "code_edit")


def load_prompts(tok: Any, tasks: list[str], per_task: int) -> list[tuple[str, list[int]]]:
    """The real-pair prompt set plus the code-editing prompts, chat-formatted (instruct models)."""
    from importlib import resources

    raw = json.loads(resources.files("omnidraft_deploy").joinpath(
        "data/real_pair_prompts.json").read_text("utf-8"))  # fmt: skip
    raw += json.loads((HERE / "code_edit_prompts.json").read_text("utf-8"))
    out: list[tuple[str, list[int]]] = []
    for task in tasks:
        texts = [p["text"] for p in raw if p["task"] == task][:per_task]
        template = getattr(tok, "chat_template", None)
        out += [(task, tok.encode(render_chat(template, t))) for t in texts]
    return out


def _decoder(bundle: OpenBundle, prof: CostProfile, cfg: DecodeConfig, *, model: bool,
             lookup: bool, drafter: OpenBundle | None = None) -> SpeculativeDecoder:  # fmt: skip
    """A decoder as ``run`` builds it (cost-aware, the bundle's n-gram cache, host threads 1)."""
    src = drafter or bundle
    look = LookupProposer(LookupConfig(keep_history=False)) if lookup else None
    cache = copy.deepcopy(src.ngram_cache) if model else None  # each decoder grows its own
    return SpeculativeDecoder(bundle.target, src.drafter if model else None, src.mapper,
                              CostAwareDraftLen(prof, 2 * bundle.manifest.draft_len), cache,
                              config=cfg, lookup=look, profile=prof)  # fmt: skip


def _sampled(dec: SpeculativeDecoder | None, target: Any, cfg: DecodeConfig, seed: int) -> Any:
    """A run over a fresh seeded generator (sampled rows: one draw per call)."""

    def run(ids: list[int]) -> tuple[list[int], float, Any]:
        gen = torch.Generator().manual_seed(seed)
        if dec is None:
            out, st = rp.generate_target_only(target, ids, cfg, gen)
        else:
            out, st = dec.generate(ids, generator=gen)
        return out, st.wall_s, st

    return run


def _profiles(bundle: OpenBundle, family: OpenBundle | None, reps: int) -> dict[str, CostProfile]:
    """The bundle's profiles as ``run`` measures them (its drafter as ``smollm2``, ``""`` for
    lookup), plus the family drafter timed against the same target calls."""
    others = {"family": family.drafter} if family else {}
    profs = measure_bundle(bundle, k_max=2 * bundle.manifest.draft_len, reps=reps, others=others)
    profs["smollm2"] = profs.pop("drafter")
    return profs


def methods(a: argparse.Namespace, bundle: OpenBundle, family: OpenBundle | None,
            profs: dict[str, CostProfile]) -> dict[str, Any]:  # fmt: skip
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    base = DecodeConfig(max_new_tokens=a.max_new_tokens, eos_ids=tuple(tok.eos_ids),
                        vocab_limit=bundle.mapper.target_vocab_size, host_threads=1)  # fmt: skip
    m: dict[str, Any] = {}
    if "greedy" in a.modes:

        def ours_target(ids: list[int]) -> tuple[list[int], float, Any]:
            out, st = rp.generate_target_only(bundle.target, ids, base)
            return out, st.wall_s, st

        m["ours_target"] = ours_target
        m["ours_smollm2"] = _traced(_decoder(bundle, profs["smollm2"], base, model=True,
                                             lookup=False), profs["smollm2"])  # fmt: skip
        m["ours_hybrid_smollm2"] = _traced(_decoder(bundle, profs["smollm2"], base, model=True,
                                                    lookup=True), profs["smollm2"])  # fmt: skip
        m["ours_lookup"] = _traced(_decoder(bundle, profs[""], base, model=False, lookup=True),
                                   profs[""])  # fmt: skip
        if family is not None:
            m["ours_family"] = _traced(_decoder(bundle, profs["family"], base, model=True,
                                                lookup=False, drafter=family), profs["family"])  # fmt: skip
        if a.genai:
            m["genai_target"] = genai_method(a.threads, a.max_new_tokens, Path(a.genai))
        if a.gguf:
            m["llamacpp_target"] = _llamacpp(Path(a.gguf), a.threads, a.max_new_tokens)
    if "exact" in a.modes:
        cfg = dataclasses.replace(base, mode=Mode.EXACT, temperature=0.7)
        m["ours_target_t07"] = _sampled(None, bundle.target, cfg, a.seed)
        for name, look in (("smollm2", False), ("hybrid_smollm2", True)):
            dec = _decoder(bundle, profs["smollm2"], cfg, model=True, lookup=look)
            m[f"ours_{name}_t07"] = _sampled(dec, bundle.target, cfg, a.seed)
    return m


def _llamacpp(gguf: Path, threads: int, max_new: int) -> Any:
    """llama.cpp's plain greedy decode of the GGUF (its own sampler at temperature 0)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)  # fmt: skip

    def run(ids: list[int]) -> tuple[list[int], float, None]:
        llm.reset()
        t0 = time.perf_counter()
        out: list[int] = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            if tok == llm.token_eos() or len(out) >= max_new:
                break
            out.append(int(tok))
        return out, time.perf_counter() - t0, None

    return run


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
    family = open_bundle(a.family_bundle, threads=a.threads) if a.family_bundle else None
    if a.ort_spinning != "in-call":  # the runtime's sessions are opened so
        _spinning_sessions(bundle, a.threads, a.ort_spinning)
    profs = _profiles(bundle, family, a.reps)
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    prompts = load_prompts(tok, a.tasks.split(","), a.per_task)
    meths = methods(a, bundle, family, profs)
    if a.methods:
        keep = a.methods.split(",")
        unknown = sorted(set(keep) - set(meths))
        if unknown:
            raise SystemExit(f"unknown methods {unknown}; choose from {sorted(meths)}")
        meths = {n: f for n, f in meths.items() if n in keep}
    start = os.getloadavg()
    res = rp.run_side_by_side(meths, prompts, repeats=a.repeats, warmup=True)
    target = bundle.manifest.graphs["target"]
    meta = {"tasks": a.tasks, "threads": a.threads, "ort_spinning": a.ort_spinning, "target_quant": target.quantization,
            "target": target.preset, "bundle": str(a.bundle), "family_bundle": a.family_bundle,
            "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "modes": a.modes,
            "load_s": round(time.perf_counter() - t0, 1), "load_avg_run_start": load0,
            "load_avg_start": start, "load_avg_end": os.getloadavg(),
            "utc_end": time.strftime("%H:%M:%S", time.gmtime()), "command": " ".join(sys.argv),
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count()}, "revision": _revision()}  # fmt: skip
    out = {"meta": meta, "profiles": {n: json.loads(p.to_json()) for n, p in profs.items()},
           "rows": res.rows}  # fmt: skip
    chunks = Path(a.chunk_dir) / a.name
    chunks.mkdir(parents=True, exist_ok=True)
    write_text_atomic(chunks / f"{a.chunk}.json", json.dumps(out, indent=1, default=str))
    log.info("done; load %s -> %s", start, meta["load_avg_end"])


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

    bundle = open_bundle(a.bundle, threads=a.threads)
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    cfg = DecodeConfig(mode=Mode.EXACT, temperature=0.7, max_new_tokens=2, eos_ids=(),
                       vocab_limit=bundle.mapper.target_vocab_size, host_threads=1)  # fmt: skip
    report = []
    for task, ids in load_prompts(tok, a.tasks.split(","), 1):
        law = two_token_law(bundle, ids, cfg)
        # a fixed draft length: every step proposes, so acceptance and rejection both run
        dec = SpeculativeDecoder(bundle.target, bundle.drafter, bundle.mapper,
                                 FixedDraftLen(3), None, config=cfg)  # fmt: skip
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
    out = Path(a.out_dir) / a.name / f"{a.name}_lossless.json"
    meta = {"command": " ".join(sys.argv), "revision": _revision(), "load_avg": os.getloadavg()}
    write_text_atomic(out, json.dumps({"meta": meta, "prompts": report}, indent=1) + "\n")


def _revision() -> str:
    import subprocess

    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)  # fmt: skip
    return proc.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("run")
    p.add_argument("--bundle", required=True)
    p.add_argument("--family-bundle", default=None, help="a bundle whose drafter shares the "
                   "target's vocabulary (its target graph is not used)")  # fmt: skip
    p.add_argument("--gguf", default=None, help="the target's GGUF: adds llama.cpp's plain decode")
    p.add_argument("--genai", default=None, help="ORT GenAI folder of the same weights")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--per-task", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--reps", type=int, default=5, help="profile repeats (interleaved)")
    p.add_argument("--modes", default="greedy", help="greedy,exact")
    p.add_argument("--methods", default="", help="only these rows (comma-separated names)")
    p.add_argument(
        "--ort-spinning",
        choices=("in-call", "off", "on", "default"),
        default="in-call",
        help="ONNX Runtime pools spin: in-call (the runtime's sessions), off, on, ORT's default",
    )
    p.add_argument("--seed", type=int, default=0)
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
    p.add_argument("--out-dir", default="reports")
    p = sub.add_parser("report")
    p.add_argument("--name", default="real_pair_1p5b")
    p.add_argument("--chunk-dir", default=".bench/real_pair_bundle")
    p.add_argument("--out-dir", default="reports")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if a.verb == "report":
        from real_pair_report import write_report  # type: ignore[import-not-found]

        write_report(Path(a.chunk_dir) / a.name, Path(a.out_dir) / a.name, a.name)
    elif a.verb == "lossless":
        cmd_lossless(a)
    else:
        cmd_run(a)


if __name__ == "__main__":
    main()
