"""Online adaptation on a real bundle: does the drafter learn the target's traffic (issue 26)?
With ``--adapt-target A``: what does adapting on another target's traffic do to this bundle's
target, the cost of sharing one drafter between targets (issue 30)?

The bundle's target graph verifies (ONNX Runtime, as ``run`` opens it); the drafter runs eagerly
from its preset's weights, as ``omnidraft adapt`` runs it (``runtime.adapt``), because its weights
change after every prompt. Held-out corpus prompts (``distill.data``: never used to build any
shipped drafter), cycled over the tasks, are split into an adaptation stream and an evaluation
set. The evaluation set is decoded greedily before and after adaptation with a fixed draft length
(every step proposes, so acceptance compares like with like), and each output is checked against
the target-only output. Acceptance only: the eager drafter's speed is not the product's.

``--adapt-target A`` (a preset): the adaptation stream is target A's traffic instead (A's eager
model, its own tokenizer and vocabulary map with the bundle's drafter), and the evaluation set
is decoded on both targets before and after, with the same documents as prompts: the bundle's
target B shows the cost (or gain) of sharing, A shows what the adaptation bought.

    python -m benchmarks.adapt_bundle --bundle bundles/q15-w8a8 --n-adapt 16 --n-eval 8
    python -m benchmarks.adapt_bundle --bundle bundles/q15-w8a8 --adapt-target qwen2.5-0.5b

Writes ``reports/adapt_bundle/<name>.{json,md}`` (command, git revision, CPU, load average).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import OpenBundle, open_bundle

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, adapt_stream, make_distiller
from omnidraft_deploy.distill.data import TASKS, DataConfig, build_corpus, split
from omnidraft_deploy.protocols import CausalLM, TokenizerLike
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.resolve.load import load_lm, load_model
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    generate_target_only,
)
from omnidraft_deploy.speculative.factory import build_decoder, pair_config
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer
from omnidraft_deploy.vocab.mapper import VocabMapper
from omnidraft_deploy.vocab.pair import load_pair_vocab

log = logging.getLogger("adapt_bundle")


def held_out_prompts(tok: TokenizerLike, n: int, prompt_tokens: int) -> list[list[int]]:
    """``n`` held-out corpus prompts (ids of ``tok``), the tasks taken in turn; the same
    documents, in the same order, for every tokenizer."""
    _, held = split(build_corpus(DataConfig()), DataConfig().heldout_frac)
    per_task = {t: [tok.encode(d)[:prompt_tokens] for d in held[t][: n + 4]] for t in TASKS}
    out = [per_task[t][i] for i in range(n + 4) for t in TASKS if i < len(per_task[t])]
    return [p for p in out if len(p) >= 8][:n]


@dataclass(frozen=True)
class Side:
    """One target the drafter serves: its model, map, decode settings, evaluation prompts and
    their target-only outputs."""

    name: str
    target: CausalLM
    mapper: VocabMapper
    cfg: DecodeConfig
    prompts: list[list[int]]
    refs: list[list[int]]


def side(name: str, target: CausalLM, mapper: VocabMapper, prompts: list[list[int]],
         a: argparse.Namespace) -> Side:  # fmt: skip
    cfg = pair_config(mapper, DecodeConfig(max_new_tokens=a.max_new_tokens, host_threads=a.threads))
    refs = [generate_target_only(target, p, cfg)[0] for p in prompts]
    return Side(name, target, mapper, cfg, prompts, refs)


def evaluate(s: Side, drafter: Any, draft_len: int) -> dict[str, float]:
    """Greedy speculative decode of ``s.prompts``: acceptance, tokens per target call, identical."""
    dec = build_decoder(s.target, EagerLM(drafter), s.mapper, policy="fixed", draft_len=draft_len,
                        config=s.cfg)  # fmt: skip
    acc = prop = calls = gen = same = 0
    for p, ref in zip(s.prompts, s.refs, strict=True):
        out, st = dec.generate(p)
        acc, prop, calls = acc + st.accepted, prop + st.proposed, calls + st.target_calls
        gen, same = gen + st.n_generated, same + int(out == ref)
    return {"acceptance": acc / max(prop, 1), "tokens_per_target_call": gen / max(calls, 1),
            "identical": same, "prompts": len(s.prompts)}  # fmt: skip


def other_target(a: argparse.Namespace, bundle: OpenBundle, drafter_preset: str
                 ) -> tuple[CausalLM, VocabMapper, list[list[int]]]:  # fmt: skip
    """``--adapt-target``'s eager model, its vocabulary map with the bundle's drafter, and the
    held-out prompts in its own ids (the first ``n_adapt``: its traffic)."""
    spec = get_preset(a.adapt_target)
    vocab = load_pair_vocab(spec, get_preset(drafter_preset))
    target = load_lm(spec, max_seq_len=bundle.manifest.graphs["target"].max_seq_len)
    return target, vocab.mapper, held_out_prompts(vocab.target_tok, a.n_adapt + a.n_eval,
                                                  a.prompt_tokens)  # fmt: skip


def run(a: argparse.Namespace) -> dict[str, Any]:
    load0 = os.getloadavg()
    torch.set_num_threads(a.threads)
    bundle = open_bundle(a.bundle, threads=a.threads)
    info = bundle.manifest.graphs["drafter"]
    drafter = load_model(get_preset(info.preset), max_seq_len=info.max_seq_len)
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files)
    prompts = held_out_prompts(tok, a.n_adapt + a.n_eval, a.prompt_tokens)
    sides = [side(bundle.manifest.graphs["target"].preset, bundle.target, bundle.mapper,
                  prompts[a.n_adapt :], a)]  # fmt: skip
    if a.adapt_target is not None:  # A is evaluated on the same documents, in its own ids
        target, mapper, prompts = other_target(a, bundle, info.preset)
        sides.append(side(a.adapt_target, target, mapper, prompts[a.n_adapt :], a))
    src = sides[-1]  # the target whose traffic adapts the drafter
    before = [evaluate(s, drafter, a.draft_len) for s in sides]
    log.info("before: %s", before)
    acfg = AdaptConfig(lr=a.lr, steps_per_update=a.steps_per_update, batch_size=a.batch_size)
    distiller = make_distiller(drafter, src.mapper, acfg)
    dec = build_decoder(src.target, EagerLM(drafter), src.mapper, policy="heuristic",
                        draft_len=a.draft_len, config=src.cfg)  # fmt: skip
    t0 = time.perf_counter()
    report = adapt_stream(dec, distiller, prompts[: a.n_adapt])
    adapt_s = time.perf_counter() - t0
    after = [evaluate(s, drafter, a.draft_len) for s in sides]
    log.info("after: %s", after)
    meta = {**run_meta(threads=a.threads, load_avg_start=load0), "bundle": str(a.bundle),
            "target": sides[0].name, "adapt_target": src.name, "drafter": info.preset,
            "adapt": dataclasses.asdict(acfg) | {"n_prompts": a.n_adapt},
            "n_eval": len(sides[0].prompts), "max_new_tokens": a.max_new_tokens,
            "draft_len": a.draft_len, "adapt_s": round(adapt_s, 1)}  # fmt: skip
    res = {"meta": meta, "before": before[0], "after": after[0],
           "adapt_trace": report.acceptance, "optimizer_steps": report.optimizer_steps,
           "rolled_back": report.rolled_back}  # fmt: skip
    if len(sides) > 1:  # the adapting target's own figures, on the same documents
        res["adapt_target_eval"] = {"before": before[1], "after": after[1]}
    return res


def write(res: dict[str, Any], name: str) -> None:
    m, out = res["meta"], Path("reports/adapt_bundle")
    out.mkdir(parents=True, exist_ok=True)
    src = m.get("adapt_target", m["target"])
    rows = [f"# Online adaptation of {m['drafter']} on {src}'s traffic, evaluated on "
            f"{m['target']} ({m['bundle']})\n", *meta_lines(m), "Adaptation: "
            f"{m['adapt']['n_prompts']} held-out prompts of {src}, {m['adapt']['steps_per_update']} "
            f"{m['adapt']['optimizer']} steps of {m['adapt']['batch_size']} (lr "
            f"{m['adapt']['lr']:g}, guard {m['adapt']['guard']}) after each, "
            f"{res['optimizer_steps']} steps kept, {m['adapt_s']:.0f} s. Evaluation: "
            f"{m['n_eval']} other held-out prompts x {m['max_new_tokens']} tokens, greedy, "
            f"draft length fixed at {m['draft_len']}.\n",
            "| target | drafter | acceptance | target tokens / call | identical to target-only |",
            "|---|---|---|---|---|"]  # fmt: skip
    evals = [(m["target"], res)]
    if "adapt_target_eval" in res:
        evals.append((src, res["adapt_target_eval"]))
    for target, figures in evals:
        for k in ("before", "after"):
            r = figures[k]
            rows.append(
                f"| {target} | {k} | {r['acceptance']:.3f} | "
                f"{r['tokens_per_target_call']:.2f} | {r['identical']}/{r['prompts']} |"
            )
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
    p.add_argument(
        "--adapt-target",
        default=None,
        help="adapt on this preset's traffic (default: the bundle's target)",
    )
    p.add_argument("--name", default="adapt_1p5b")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    write(run(a), a.name)


if __name__ == "__main__":
    main()
