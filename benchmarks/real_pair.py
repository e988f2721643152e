"""Headline decoding benchmark on ONNX Runtime: Qwen2.5-Coder-0.5B target, cross-vocabulary drafters.

    .venv/bin/python benchmarks/real_pair.py prepare                 # export + verify graphs (cached)
    .venv/bin/python benchmarks/real_pair.py run --tasks code        # one timed chunk (quiet machine)
    .venv/bin/python benchmarks/real_pair.py report                  # chunks -> reports/real_pair/real_pair.*

``run`` (one chunk per task keeps each under the 15-minute QUIET window): loads the ORT graphs
(``benchmarks/ort_pair.py``; sessions with explicit intra-op threads, no spinning; the target is
the int8 fused graph with batch-invariant attention by default, ``int8-inv``: its rows are bitwise
the same whatever a call's width, ``benchmarks/batch_invariance.py``, so greedy speculative output
is target-only output by construction; ``--also-target int8`` adds the GroupQueryAttention int8
graph's target-only row, the fastest plain decoding, whose outputs may differ; drafters int8,
whose numerics only move speed), measures the
cost profile (``omnidraft_deploy.profile.measure``: interleaved repeats, medians) and saves it to
``.bench/real_pair/cost_profile.json``, from where the decoders load it; then times every method on
the task's 6 prompts (``omnidraft_deploy/data/real_pair_prompts.json``) x ``--max-new-tokens``,
greedy, round-robin (``real_pair.run_side_by_side``), and compares every output with our ORT
target-only. HF target-only and HF universal assisted generation (eager transformers) and ONNX
Runtime GenAI target-only (its model builder's int8 build of the same weights, when prepared) run
on the same prompts. Load average is recorded at start and end. ``report`` merges the chunks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import ort_pair as op  # type: ignore[import-not-found]  # benchmarks/, beside this script

from omnidraft_deploy import real_pair as rp
from omnidraft_deploy.bundle.atomic import write_text_atomic

log = logging.getLogger("real_pair")
CHUNKS = op.ROOT / "chunks"
TASKS = ("math", "code", "chat", "summarisation")
GENAI = Path(".bench/runtime_speed/genai/qwen2.5-0.5b-int8")


def _prompts(tok: Any, tasks: set[str]) -> list[tuple[str, list[int]]]:
    from importlib import resources

    raw = json.loads(resources.files("omnidraft_deploy").joinpath(
        "data/real_pair_prompts.json").read_text("utf-8"))  # fmt: skip
    return [(p["task"], tok.encode(p["text"])) for p in raw if p["task"] in tasks]


def _load(a: argparse.Namespace) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    threads, drafters = a.threads, a.drafters.split(",")
    target_tok = load_tokenizer("qwen2")
    path, info, parity = op.verify_graph(op.TARGET, "target", a.target_quant)
    target = op.ort_graph(path, info, threads)
    lms, facts = {}, {"target": parity}
    for name in drafters:
        source, tok = op.DRAFTERS[name]
        if not op.early_exit_ready(source):
            log.warning("%s: distilled weights not cached yet; row skipped", name)
            continue
        path, info, parity = op.verify_graph(source, "drafter", a.drafter_quant)
        mapper, _ = op.mapper_for(tok, target_tok)
        lms[name], facts[name] = (op.ort_graph(path, info, threads), mapper), parity
    return target, target_tok, lms, facts


def genai_method(threads: int, max_new: int, folder: Path = GENAI) -> Any:
    """ONNX Runtime GenAI's greedy decode of its builder's graph in ``folder`` (a method row)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from runtime_speed import GenAI  # type: ignore[import-not-found]

    engine = GenAI(folder, threads)

    def run(ids: list[int]) -> tuple[list[int], float, None]:
        t0 = time.perf_counter()
        gen = engine._gen(ids)
        out: list[int] = []
        while len(out) < max_new and not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out, time.perf_counter() - t0, None

    return run


def cmd_run(a: argparse.Namespace) -> None:
    from omnidraft_deploy.host.profile import measure
    from omnidraft_deploy.speculative.cost import CostProfile

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    target, tok, lms, parity = _load(a)
    cfg = rp.DecodeConfig(max_new_tokens=a.max_new_tokens, eos_ids=tuple(tok.eos_ids),
                          vocab_limit=next(iter(lms.values()))[1].target_vocab_size)  # fmt: skip
    profiles = measure(target, {n: lm for n, (lm, _) in lms.items()}, k_max=a.k_max, reps=a.reps)
    prof_path = op.ROOT / "cost_profile.json"
    write_text_atomic(prof_path, json.dumps({n: json.loads(p.to_json()) for n, p in
                                             profiles.items()}, indent=1))  # fmt: skip
    loaded = {n: CostProfile.from_json(json.dumps(v)) for n, v in
              json.loads(prof_path.read_text()).items()}  # fmt: skip  # what the decoders use

    def ours_target(ids: list[int]) -> tuple[list[int], float, Any]:
        out, st = rp.generate_target_only(target, ids, cfg)
        return out, st.wall_s, st

    methods: dict[str, Any] = {"ours_target": ours_target}
    for quant in filter(None, a.also_target.split(",")):  # absolute-speed reference rows
        methods[f"ours_{quant}_target"] = _target_only(quant, a.threads, cfg)
    methods |= op.spec_methods(target, lms, loaded, cfg, k_max=a.k_max,
                               hybrid=tuple(a.hybrid.split(",")) if a.hybrid else (),
                               heuristic=tuple(a.heuristic.split(",")) if a.heuristic else ())  # fmt: skip
    if (GENAI / "genai_config.json").is_file() and not a.no_genai:
        methods["genai_target"] = genai_method(a.threads, a.max_new_tokens)
    if not a.no_hf:
        methods |= _hf_methods(cfg, a.threads)
    load_s = time.perf_counter() - t0
    profs = {n: json.loads(p.to_json()) for n, p in loaded.items()}
    for i, task in enumerate(a.tasks.split(",")):  # one chunk file per task: partial runs count
        start, utc0 = os.getloadavg(), time.strftime("%H:%M:%S", time.gmtime())
        res = rp.run_side_by_side(methods, _prompts(tok, {task}), repeats=a.repeats, warmup=i == 0)
        meta = {"tasks": task, "threads": a.threads, "target_quant": a.target_quant,
                "drafter_quant": a.drafter_quant, "max_new_tokens": a.max_new_tokens,
                "repeats": a.repeats, "load_s": round(load_s, 1), "load_avg_start": start,
                "load_avg_run_start": load0, "utc_start": utc0, "load_avg_end": os.getloadavg(),
                "utc_end": time.strftime("%H:%M:%S", time.gmtime()),
                "command": " ".join(sys.argv), "graph_parity": parity}  # fmt: skip
        chunks = Path(a.chunk_dir)
        chunks.mkdir(parents=True, exist_ok=True)
        out = {"meta": meta, "profiles": profs, "rows": res.rows}
        write_text_atomic(chunks / f"{i}-{task}.json", json.dumps(out, indent=1))
        log.info("task %s done; load %s -> %s", task, start, meta["load_avg_end"])


def _target_only(quant: str, threads: int, cfg: Any) -> Any:
    """Target-only decoding on another target graph (e.g. int8: faster, not batch-invariant)."""
    path, info, _ = op.verify_graph(op.TARGET, "target", quant)
    graph = op.ort_graph(path, info, threads)

    def run(ids: list[int]) -> tuple[list[int], float, Any]:
        out, st = rp.generate_target_only(graph, ids, cfg)
        return out, st.wall_s, st

    return run


def _hf_methods(cfg: Any, threads: int) -> dict[str, Any]:
    import torch

    from omnidraft_deploy import hf_baseline as hb

    torch.set_num_threads(threads)
    t, d = hb.load_hf_model(rp.TARGET_PRESET), hb.load_hf_model(rp.DRAFTER_PRESET)
    ttok, dtok = hb.load_hf_tokenizer(rp.TARGET_PRESET), hb.load_hf_tokenizer(rp.DRAFTER_PRESET)

    def hf(assisted: bool) -> Any:
        extra = {"drafter": d, "target_tok": ttok, "drafter_tok": dtok} if assisted else {}

        def run(ids: list[int]) -> tuple[list[int], float, None]:
            r = hb.hf_generate(t, ids, max_new_tokens=cfg.max_new_tokens, eos_ids=cfg.eos_ids,
                               **extra)  # fmt: skip
            return r.new_ids, r.wall_s, None

        return run

    return {"hf_target": hf(False), "hf_assisted": hf(True)}


def cmd_prepare(a: argparse.Namespace) -> None:
    _load(a)
    if a.genai:
        sys.path.insert(0, str(Path(__file__).parent))
        from runtime_speed import build_genai

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
        from real_pair_report import write_report  # type: ignore[import-not-found]

        write_report(Path(a.chunk_dir), Path(a.out_dir), a.name)
    else:
        {"prepare": cmd_prepare, "run": cmd_run}[a.verb](a)


if __name__ == "__main__":
    main()
