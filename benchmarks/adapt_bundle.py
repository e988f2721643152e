"""Online adaptation on a real bundle: does the drafter learn the target's traffic (issue 26)?

The bundle's target graph verifies (ONNX Runtime, as ``run`` opens it); the drafter runs eagerly
from its preset's weights, as ``omnidraft adapt`` runs it (``runtime.adapt``), because its weights
change after every prompt. Held-out corpus prompts (``distill.data``: never used to build any
shipped drafter), cycled over the tasks, are split into an adaptation stream and an evaluation
set. The evaluation set is decoded greedily before and after adaptation with a fixed draft length
(every step proposes, so acceptance compares like with like), and each output is checked against
the target-only output. Acceptance only: the eager drafter's speed is not the product's.

    python -m benchmarks.adapt_bundle --bundle bundles/q15-w8a8 --n-adapt 16 --n-eval 8

Writes ``reports/adapt_bundle/<name>.{json,md}`` (command, git revision, CPU, load average).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import OpenBundle, open_bundle

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, adapt_stream, make_distiller
from omnidraft_deploy.distill.data import TASKS, DataConfig, build_corpus, split
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.resolve.load import load_model
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import FixedDraftLen, HeuristicDraftLen
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer

log = logging.getLogger("adapt_bundle")


def held_out_prompts(bundle: OpenBundle, n: int, prompt_tokens: int) -> list[list[int]]:
    """``n`` held-out corpus prompts (target ids), the tasks taken in turn."""
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    _, held = split(build_corpus(DataConfig()), DataConfig().heldout_frac)
    per_task = {t: [tok.encode(d)[:prompt_tokens] for d in held[t][: n + 4]] for t in TASKS}
    out = [per_task[t][i] for i in range(n + 4) for t in TASKS if i < len(per_task[t])]
    return [p for p in out if len(p) >= 8][:n]


def evaluate(bundle: OpenBundle, drafter: Any, prompts: list[list[int]], cfg: DecodeConfig,
             refs: list[list[int]], draft_len: int) -> dict[str, float]:  # fmt: skip
    """Greedy speculative decode of ``prompts``: acceptance, tokens per target call, identical."""
    dec = SpeculativeDecoder(bundle.target, EagerLM(drafter), bundle.mapper,
                             FixedDraftLen(draft_len), config=cfg)  # fmt: skip
    acc = prop = calls = gen = same = 0
    for p, ref in zip(prompts, refs, strict=True):
        out, st = dec.generate(p)
        acc, prop, calls = acc + st.accepted, prop + st.proposed, calls + st.target_calls
        gen, same = gen + st.n_generated, same + int(out == ref)
    return {"acceptance": acc / max(prop, 1), "tokens_per_target_call": gen / max(calls, 1),
            "identical": same, "prompts": len(prompts)}  # fmt: skip


def run(a: argparse.Namespace) -> dict[str, Any]:
    load0 = os.getloadavg()
    torch.set_num_threads(a.threads)
    bundle = open_bundle(a.bundle, threads=a.threads)
    info = bundle.manifest.graphs["drafter"]
    drafter = load_model(get_preset(info.preset), max_seq_len=info.max_seq_len)
    prompts = held_out_prompts(bundle, a.n_adapt + a.n_eval, a.prompt_tokens)
    adapt_p, eval_p = prompts[: a.n_adapt], prompts[a.n_adapt :]
    cfg = DecodeConfig(max_new_tokens=a.max_new_tokens, vocab_limit=bundle.mapper.target_vocab_size,
                       eos_ids=bundle.mapper.target_eos, host_threads=a.threads)  # fmt: skip
    refs = [generate_target_only(bundle.target, p, cfg)[0] for p in eval_p]
    before = evaluate(bundle, drafter, eval_p, cfg, refs, a.draft_len)
    log.info("before: %s", before)
    acfg = AdaptConfig(lr=a.lr, steps_per_update=a.steps_per_update, batch_size=a.batch_size)
    distiller = make_distiller(drafter, bundle.mapper, acfg)
    dec = SpeculativeDecoder(bundle.target, EagerLM(drafter), bundle.mapper,
                             HeuristicDraftLen(a.draft_len), config=cfg)  # fmt: skip
    t0 = time.perf_counter()
    report = adapt_stream(dec, distiller, adapt_p)
    adapt_s = time.perf_counter() - t0
    after = evaluate(bundle, drafter, eval_p, cfg, refs, a.draft_len)
    log.info("after: %s", after)
    meta = {**run_meta(threads=a.threads, load_avg_start=load0), "bundle": str(a.bundle), "target": bundle.manifest.graphs["target"].preset,
            "drafter": info.preset, "adapt": dataclasses.asdict(acfg) | {"n_prompts": len(adapt_p)},
            "n_eval": len(eval_p), "max_new_tokens": a.max_new_tokens, "draft_len": a.draft_len,
            "adapt_s": round(adapt_s, 1)}  # fmt: skip
    return {"meta": meta, "before": before, "after": after,
            "adapt_trace": report.acceptance, "optimizer_steps": report.optimizer_steps,
            "rolled_back": report.rolled_back}  # fmt: skip


def write(res: dict[str, Any], name: str) -> None:
    m, out = res["meta"], Path("reports/adapt_bundle")
    out.mkdir(parents=True, exist_ok=True)
    rows = [f"# Online adaptation of {m['drafter']} to {m['target']} ({m['bundle']})\n",
            *meta_lines(m), "Adaptation: "
            f"{m['adapt']['n_prompts']} held-out prompts, {m['adapt']['steps_per_update']} "
            f"{m['adapt']['optimizer']} steps of {m['adapt']['batch_size']} (lr "
            f"{m['adapt']['lr']:g}, guard {m['adapt']['guard']}) after each, "
            f"{res['optimizer_steps']} steps kept, {m['adapt_s']:.0f} s. Evaluation: "
            f"{m['n_eval']} other held-out prompts x {m['max_new_tokens']} tokens, greedy, "
            f"draft length fixed at {m['draft_len']}.\n",
            "| drafter | acceptance | target tokens / call | identical to target-only |",
            "|---|---|---|---|"]  # fmt: skip
    for k in ("before", "after"):
        r = res[k]
        rows.append(f"| {k} | {r['acceptance']:.3f} | {r['tokens_per_target_call']:.2f} | "
                    f"{r['identical']}/{r['prompts']} |")  # fmt: skip
    trace = ", ".join(f"{x:.2f}" for x in res["adapt_trace"])
    rows += ["", f"Acceptance per adaptation prompt (heuristic draft length): {trace}"]
    write_report(out / name, res, markdown=lambda _: "\n".join(rows) + "\n")
    print("\n".join(rows))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--n-adapt", type=int, default=16)
    p.add_argument("--n-eval", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--draft-len", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--steps-per-update", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="adapt_1p5b")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    write(run(a), a.name)


if __name__ == "__main__":
    main()
