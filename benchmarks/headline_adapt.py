"""Headline: a 4.5M-param Llama-2-vocabulary drafter adapts online to the real Qwen2.5-Coder-0.5B.

Target: Qwen2.5-Coder-0.5B-Instruct (pinned GGUF asset ``qwen2.5-0.5b-gguf``, Qwen2 vocabulary,
dequantised to fp32); drafter: ``trained-llama2-drafter`` (``distill.pretrain``, 2 layers x 128,
tied 32000-row embedding: ~1% of the target's parameters, as 68M is of 8B). Both graphs run on
ONNX Runtime CPU (``--runtime ort``, default; fp32 graphs exported with ``exporters.onnx`` and
driven by ``runtime.onnxruntime_model.OrtModel``) or eagerly in PyTorch (``--runtime eager``).

A stream of held-out code prompts is decoded greedily. The first ``--n-adapt`` prompts are decoded
speculatively (ORT target, eager drafter whose weights the learner updates) and feed
``OnlineDistiller`` (hybrid loss L_DM + lambda * L_Ngram, one update after every prompt). The
adapted weights are then swapped into the drafter's ONNX graph by initializer name
(``bundle.weight_swap.bind_weights`` / ``swap_initializers``: no re-export), and the last
``--n-eval`` prompts are timed side by side, round-robin per prompt, three ways: target alone,
speculative with the pre-trained drafter, speculative with the adapted drafter. Greedy outputs of
all three must be identical (checked, reported).

    .venv/bin/python -m benchmarks.headline_adapt [--n-adapt 16 --n-eval 6 --max-new-tokens 48]

Writes reports/headline_adapt/headline_adapt.{json,md,png}. Slow (the first run exports the 0.5B target to ONNX,
~2 GB, cached under the asset cache); needs ``omnidraft assets fetch --models``.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.evaluate import teacher_forced_top1
from benchmarks.common.pair import load_pair
from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report
from benchmarks.common.timer import RunFn, decoder_run, run_side_by_side, target_run
from omnidraft_deploy.catalog.presets import ModelSpec, get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, adapt_stream, make_distiller
from omnidraft_deploy.distill.data import build_corpus, split
from omnidraft_deploy.distill.pretrain import pretrain_config
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder, pair_config
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

log = logging.getLogger("headline_adapt")
DRAFTER = "trained-llama2-drafter"
TARGET = "qwen2.5-0.5b"
# timer method -> the row it is in the report (``ours_*``: compared with ``ours_target``)
ROWS = {"ours_target": "target_only", "ours_before": "before", "ours_after": "after"}


def _prompts(n: int, prompt_tokens: int) -> list[list[int]]:
    tok = load_tokenizer("qwen2")
    pcfg = pretrain_config(get_preset(DRAFTER))
    _, held = split(build_corpus(pcfg.data), pcfg.data.heldout_frac)
    docs = [tok.encode(d) for d in held["code"]]
    return [d[:prompt_tokens] for d in docs if len(d) > prompt_tokens + 8][:n]


def _onnx_graph(
    model: Transformer, spec: ModelSpec, path: Path, *, swappable: bool = False
) -> tuple[Path, Any]:
    """Export ``model`` (fp32, dynamic T) to ``path`` unless cached there; returns (path, info)."""
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    info = graph_info(model, spec, file=path.name, quantization="fp32", seq_len=None)
    if not path.is_file():
        t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        export_onnx(model, path, info=info, swappable=swappable)
        log.info("exported %s in %.0f s", path, time.perf_counter() - t0)
    return path, info


def _swap_drafter(
    path: Path, info: Any, drafter: Transformer, out: Path, probe: list[int]
) -> tuple[Any, dict[str, float]]:
    """The drafter graph at ``path`` with ``drafter``'s weights swapped in (written to ``out``),
    and the swap's cost and its max |logit diff| against the eager drafter on ``probe``."""
    import onnx
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    from omnidraft_deploy.bundle.weight_swap import bind_weights, param_aliases, swap_initializers

    t0 = time.perf_counter()
    proto = onnx.load(str(path))
    params = dict(drafter.named_parameters())
    binding = bind_weights(proto, list(params), param_aliases(drafter))
    onnx.save(swap_initializers(proto, binding, params), str(out))
    model = OrtModel(out, info)
    seconds = time.perf_counter() - t0
    ids = torch.tensor(probe)
    diff = (model.forward(ids, 0) - EagerLM(drafter).forward(ids, 0)).abs().max()
    return model, {"swap_s": seconds, "swap_max_abs_logit_diff": float(diff)}


def _side_by_side(methods: dict[str, RunFn], prompts: list[list[int]],
                  threads: int) -> tuple[dict[str, Any], list[list[int]]]:  # fmt: skip
    """Round-robin per prompt (``common.timer``: load drift hits every method alike): sums per
    report row, and the target-only outputs."""
    res = run_side_by_side(methods, [("code", p) for p in prompts], threads=threads, repeats=1,
                           warmup=False)  # fmt: skip
    out: dict[str, Any] = {}
    for method, name in ROWS.items():
        rs = [r for r in res.rows if r["method"] == method]
        wall, n = sum(r["wall_s"] for r in rs), int(sum(r["n_generated"] for r in rs))
        out[name] = {"wall_s": wall, "n_generated": n, "tokens_per_s": n / wall,
                     "acceptance_rate": sum(r["accepted"] for r in rs)
                     / max(1, sum(r["proposed"] for r in rs)),
                     "tokens_per_target_call": n / max(1, int(sum(r["target_calls"] for r in rs))),
                     "identical_to_target_only": sum(bool(r["equal_ours_target"]) for r in rs)}  # fmt: skip
    for r in out.values():
        r["speedup_vs_target"] = r["tokens_per_s"] / out["target_only"]["tokens_per_s"]
    return out, res.outputs["ours_target"]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def to_markdown(res: dict[str, Any]) -> str:
    rows = [
        f"# Headline: {DRAFTER} (4.5M) -> Qwen2.5-Coder-0.5B-Instruct, {res['runtime']} CPU",
        "",
        *(meta_lines(res["meta"]) if "meta" in res else []),
        f"torch threads {res['threads']}, greedy, {res['policy']} draft length (start 4), "
        f"{res['n_eval']} held-out code "
        f"prompts x {res['max_new_tokens']} new tokens, timed round-robin in one run; adaptation: "
        f"{res['n_adapt']} prompts, {res['steps_per_update']} {res['optimizer']} steps of "
        f"{res['batch_size']} observations "
        f"(lr {res['lr']:g}) after each, "
        f"{res['adapt_wall_s']:.0f} s; weight swap into the ONNX "
        f"graph {res.get('swap_s', 0.0):.2f} s (max |logit diff| vs eager "
        f"{res.get('swap_max_abs_logit_diff', 0.0):.1e}). Load average at end: {res['loadavg']}.",
        "",
        "| run | acceptance | tokens / target call | drafter top-1 (teacher-forced) | tokens/s | "
        "speedup vs target-only | identical to target-only |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in ("target_only", "before", "after"):
        r = res["eval"][k]
        rows.append(
            f"| {k} | {r['acceptance_rate']:.3f} | {r['tokens_per_target_call']:.2f} | "
            f"{_fmt(r.get('teacher_forced_top1'))} | "
            f"{r['tokens_per_s']:.2f} | {r['speedup_vs_target']:.2f}x | "
            f"{r['identical_to_target_only']}/{res['n_eval']} |"
        )
    rows += [
        "",
        "Acceptance per adaptation prompt: "
        + ", ".join(f"{a:.2f}" for a in res["adapt_acceptance_trace"]),
    ]
    return "\n".join(rows) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    fig, (a1, a2) = pyplot().subplots(1, 2, figsize=(10, 3.6))
    trace = res["adapt_acceptance_trace"]
    a1.plot(range(1, len(trace) + 1), trace, marker="o")
    a1.axhline(
        res["eval"]["before"]["acceptance_rate"], ls="--", c="grey", label="held-out, before"
    )
    a1.axhline(res["eval"]["after"]["acceptance_rate"], ls="--", c="green", label="held-out, after")
    a1.set(xlabel="adaptation prompt", ylabel="acceptance rate", title="online adaptation")
    a1.legend()
    names = ["target_only", "before", "after"]
    a2.bar(names, [res["eval"][k]["speedup_vs_target"] for k in names], color=["grey", "C0", "C2"])
    a2.axhline(1.0, c="k", lw=0.8)
    a2.set(ylabel="speedup vs target-only", title=f"{res['runtime']} CPU wall clock")
    fig.tight_layout()
    save_figure(fig, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", choices=["ort", "eager"], default="ort")
    ap.add_argument("--n-adapt", type=int, default=16)
    ap.add_argument("--n-eval", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policy", default="heuristic", choices=["fixed", "heuristic", "predictor"])
    ap.add_argument("--steps-per-update", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--out-dir", default="reports/headline_adapt")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    pair = load_pair(TARGET, DRAFTER, max_seq_len=a.max_seq_len)
    target, drafter, mapper = pair.target, pair.drafter, pair.mapper
    del pair  # the eager target may go once its ONNX twin is loaded (``_runtimes``)
    cfg = pair_config(mapper, DecodeConfig(max_new_tokens=a.max_new_tokens), stop_at_eos=False)
    pool = _prompts(10_000, 48)  # every held-out code document long enough (88)
    if a.n_adapt + a.n_eval > len(pool):
        raise SystemExit(f"--n-adapt + --n-eval must be <= {len(pool)} held-out prompts")
    adapt_p, eval_p = pool[: a.n_adapt], pool[len(pool) - a.n_eval :]  # eval set fixed
    res: dict[str, Any] = {
        "runtime": "ONNX Runtime" if a.runtime == "ort" else "eager PyTorch",
        "threads": a.threads, "n_adapt": len(adapt_p), "n_eval": len(eval_p),
        "max_new_tokens": a.max_new_tokens, "policy": a.policy,
        "steps_per_update": a.steps_per_update, "lr": a.lr, "batch_size": a.batch_size,
        "optimizer": a.optimizer, "drafter_params": sum(p.numel() for p in drafter.parameters()),
        "target_params": sum(p.numel() for p in target.parameters()),
    }  # fmt: skip
    adapted = copy.deepcopy(drafter)
    target_lm, before_lm, swap_to = _runtimes(a, target, drafter)
    del target
    adapt_cache = NGramCache()
    acfg = AdaptConfig(lr=a.lr, lam=1.0, batch_size=a.batch_size,
                       steps_per_update=a.steps_per_update, optimizer=a.optimizer, seq_len=96)  # fmt: skip
    dec = build_decoder(target_lm, EagerLM(adapted), mapper, config=cfg, policy=a.policy,
                        ngram_cache=adapt_cache, stop_at_eos=False)  # fmt: skip
    report = adapt_stream(dec, make_distiller(adapted, mapper, acfg), adapt_p)
    res["adapt_wall_s"], res["adapt_acceptance_trace"] = report.seconds, report.acceptance
    after_lm: CausalLM = EagerLM(adapted)
    if swap_to is not None:
        probe = [1] + load_tokenizer("llama2").encode("def main():\n    return 0")
        after_lm, swap = _swap_drafter(*swap_to, adapted, swap_to[0].with_name("drafter-after.onnx"),
                                       probe)  # fmt: skip
        res |= swap
    # before: the shipped state (empty n-gram cache); after: adapted weights and the n-gram
    # cache grown during adaptation (both are the drafter's online state)
    drafters = {"ours_before": (before_lm, NGramCache()),
                "ours_after": (after_lm, copy.deepcopy(adapt_cache))}  # fmt: skip
    methods = {"ours_target": target_run(target_lm, cfg)} | {
        row: decoder_run(build_decoder(target_lm, lm, mapper, config=cfg, policy=a.policy,
                                       ngram_cache=c, stop_at_eos=False))
        for row, (lm, c) in drafters.items()}  # fmt: skip
    res["eval"], outs = _side_by_side(methods, eval_p, a.threads)
    for k, model in (("before", drafter), ("after", adapted)):
        res["eval"][k]["teacher_forced_top1"] = teacher_forced_top1(model, mapper, eval_p, outs)
    res["meta"] = run_meta(threads=a.threads, load_avg_start=load0)
    res["loadavg"] = " ".join(f"{x:.2f}" for x in res["meta"]["load_avg_end"])
    write_report(Path(a.out_dir) / "headline_adapt", res, markdown=to_markdown, plot=plot)


def _runtimes(a: argparse.Namespace, target: Transformer, drafter: Transformer
              ) -> tuple[CausalLM, CausalLM, tuple[Path, Any] | None]:  # fmt: skip
    """(target, drafter before adaptation) on the chosen runtime, and for ONNX Runtime the
    drafter graph (path, info) the adapted weights are swapped into (None: eager)."""
    if a.runtime != "ort":
        return EagerLM(target), EagerLM(drafter), None
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    from omnidraft_deploy.catalog.assets import cache_root

    work = cache_root() / "headline"
    tpath, tinfo = _onnx_graph(target, get_preset(TARGET),
                               work / f"qwen2.5-0.5b-fp32-s{a.max_seq_len}.onnx")  # fmt: skip
    (work / "drafter-before.onnx").unlink(missing_ok=True)  # small: exported fresh every run
    dpath, dinfo = _onnx_graph(drafter, get_preset(DRAFTER), work / "drafter-before.onnx",
                               swappable=True)  # fmt: skip
    return OrtModel(tpath, tinfo), OrtModel(dpath, dinfo), (dpath, dinfo)


def rewrite_report(out_dir: str = "reports/headline_adapt") -> None:
    """Re-render the Markdown / PNG of ``out_dir/headline_adapt.json`` (no model runs)."""
    stem = Path(out_dir) / "headline_adapt"
    res = json.loads(stem.with_suffix(".json").read_text())
    write_report(stem, res, markdown=to_markdown, plot=plot)


if __name__ == "__main__":
    main()
