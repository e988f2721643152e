"""Headline decoding benchmark on ONNX Runtime: Qwen2.5-Coder-0.5B target, cross-vocabulary drafters.

    .venv/bin/python -m benchmarks.real_pair prepare             # export + verify graphs (cached)
    .venv/bin/python -m benchmarks.real_pair run --tasks code    # one timed chunk (quiet machine)
    .venv/bin/python -m benchmarks.real_pair report              # chunks -> reports/real_pair/real_pair.*

``run`` (one chunk per task keeps each under the 15-minute QUIET window): loads the ORT graphs
(``benchmarks.ort_pair``; sessions with explicit intra-op threads, no spinning; the target is
the int8 fused graph with batch-invariant attention by default, ``int8-inv``: its rows are bitwise
the same whatever a call's width, ``benchmarks/batch_invariance.py``, so greedy speculative output
is target-only output by construction; ``--also-target int8`` adds the GroupQueryAttention int8
graph's target-only row, the fastest plain decoding, whose outputs may differ; drafters int8,
whose numerics only move speed), measures the
cost profile (``host.profile.measure``: interleaved repeats, medians) and saves it to
``.bench/real_pair/cost_profile.json``, from where the decoders load it; then times every method on
the task's 6 prompts (``omnidraft_deploy/data/real_pair_prompts.json``) x ``--max-new-tokens``,
greedy, round-robin (``common.timer.run_side_by_side``), and compares every output with our ORT
target-only. HF target-only and HF universal assisted generation (eager transformers) and ONNX
Runtime GenAI target-only (its model builder's int8 build of the same weights, when prepared) run
on the same prompts. Load average is recorded at start and end. ``report`` merges the chunks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import ort_pair as op
from benchmarks.common import peers
from benchmarks.common.pair import pair_vocab, task_prompts
from benchmarks.common.report import run_meta
from benchmarks.common.timer import run_side_by_side, target_run
from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import pair_config

log = logging.getLogger("real_pair")
CHUNKS = op.ROOT / "chunks"
TASKS = ("math", "code", "chat", "summarisation")
GENAI = Path(".bench/runtime_speed/genai/qwen2.5-0.5b-int8")


def _load(a: argparse.Namespace) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    threads, drafters = a.threads, a.drafters.split(",")
    path, info, parity = op.verify_graph(op.TARGET, "target", a.target_quant)
    target = op.ort_graph(path, info, threads)
    lms, facts, target_tok = {}, {"target": parity}, None
    for name in drafters:
        source = op.DRAFTERS[name]
        if not op.early_exit_ready(source):
            log.warning("%s: distilled weights not cached yet; row skipped", name)
            continue
        path, info, parity = op.verify_graph(source, "drafter", a.drafter_quant)
        vocab = pair_vocab(op.TARGET, source.partition(":")[0])
        target_tok = vocab.target_tok
        lms[name], facts[name] = (op.ort_graph(path, info, threads), vocab.mapper), parity
    return target, target_tok, lms, facts


def cmd_run(a: argparse.Namespace) -> None:
    from omnidraft_deploy.host.profile import measure
    from omnidraft_deploy.speculative.cost import CostProfile

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    target, tok, lms, parity = _load(a)
    cfg = pair_config(next(iter(lms.values()))[1], DecodeConfig(max_new_tokens=a.max_new_tokens))
    profiles = measure(target, {n: lm for n, (lm, _) in lms.items()}, k_max=a.k_max, reps=a.reps)
    prof_path = op.ROOT / "cost_profile.json"
    write_text_atomic(prof_path, json.dumps({n: json.loads(p.to_json()) for n, p in
                                             profiles.items()}, indent=1))  # fmt: skip
    loaded = {n: CostProfile.from_json(json.dumps(v)) for n, v in
              json.loads(prof_path.read_text()).items()}  # fmt: skip  # what the decoders use
    methods = {"ours_target": target_run(target, cfg)}
    for quant in filter(None, a.also_target.split(",")):  # absolute-speed reference rows
        path, info, _ = op.verify_graph(op.TARGET, "target", quant)  # faster, maybe not invariant
        methods[f"ours_{quant}_target"] = target_run(op.ort_graph(path, info, a.threads), cfg)
    methods |= op.spec_methods(target, lms, loaded, cfg, k_max=a.k_max,
                               hybrid=tuple(a.hybrid.split(",")) if a.hybrid else (),
                               heuristic=tuple(a.heuristic.split(",")) if a.heuristic else ())  # fmt: skip
    if (GENAI / "genai_config.json").is_file() and not a.no_genai:
        methods["genai_target"] = peers.genai_method(a.threads, a.max_new_tokens, GENAI)
    if not a.no_hf:
        methods |= peers.hf_methods(op.TARGET, op.DRAFTERS["smollm2"], threads=a.threads,
                                    max_new_tokens=a.max_new_tokens, eos_ids=cfg.eos_ids)  # fmt: skip
    load_s = time.perf_counter() - t0
    profs = {n: json.loads(p.to_json()) for n, p in loaded.items()}
    for i, task in enumerate(a.tasks.split(",")):  # one chunk file per task: partial runs count
        res = run_side_by_side(methods, task_prompts(tok, {task}), threads=a.threads,
                               repeats=a.repeats, warmup=i == 0)  # fmt: skip
        meta = {**run_meta(threads=a.threads), **res.meta, "tasks": task, "target_quant": a.target_quant,
                "drafter_quant": a.drafter_quant, "max_new_tokens": a.max_new_tokens,
                "repeats": a.repeats, "load_s": round(load_s, 1), "load_avg_run_start": load0,
                "graph_parity": parity}  # fmt: skip
        out = {"meta": meta, "profiles": profs, "rows": res.rows}
        write_text_atomic(Path(a.chunk_dir) / f"{i}-{task}.json", json.dumps(out, indent=1))
        log.info("task %s done; load %s -> %s", task, meta["load_avg_start"], meta["load_avg_end"])


def cmd_prepare(a: argparse.Namespace) -> None:
    _load(a)
    if a.genai:
        from benchmarks.runtime_speed import build_genai

        log.info("GenAI build: %s", build_genai("qwen2.5-0.5b", "int8"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    for verb in ("prepare", "run"):
        p = sub.add_parser(verb)
        p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads (cores)")
        p.add_argument("--drafters", default="smollm2,ee8_before,ee8_offline,trained45m")
        p.add_argument("--target-quant", default="int8-inv",
                       help="target graph (ort_pair.parse_quant; batch-invariant: int8-inv)")  # fmt: skip
        p.add_argument("--drafter-quant", default="int8")
    sub.choices["prepare"].add_argument("--genai", action="store_true")
    p = sub.choices["run"]
    p.add_argument("--tasks", default="code")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--reps", type=int, default=7, help="profile repeats (interleaved)")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--hybrid", default="smollm2,ee8_offline", help="drafters also run with lookup")
    p.add_argument("--heuristic", default="smollm2", help="drafters also run with +2/-1, k=4")
    p.add_argument("--also-target", default="int8", help="target-only rows on other graphs")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--no-genai", action="store_true")
    p.add_argument("--chunk-dir", default=str(CHUNKS), help="where the chunk's JSON goes")
    p = sub.add_parser("report")
    p.add_argument("--out-dir", default="reports/real_pair")
    p.add_argument("--chunk-dir", default=str(CHUNKS))
    p.add_argument("--name", default="real_pair", help="report file stem")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if a.verb == "report":
        from benchmarks.real_pair_report import write_report

        write_report(Path(a.chunk_dir), Path(a.out_dir), a.name)
    else:
        {"prepare": cmd_prepare, "run": cmd_run}[a.verb](a)


if __name__ == "__main__":
    main()
