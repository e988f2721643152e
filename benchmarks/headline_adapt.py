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
(``exporters.training_graph.bind_weights`` / ``swap_initializers``: no re-export), and the last
``--n-eval`` prompts are timed side by side, round-robin per prompt, three ways: target alone,
speculative with the pre-trained drafter, speculative with the adapted drafter. Greedy outputs of
all three must be identical (checked, reported).

    .venv/bin/python benchmarks/headline_adapt.py [--n-adapt 16 --n-eval 6 --max-new-tokens 48]

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy.catalog.presets import ModelSpec, get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, adapt_stream, make_distiller
from omnidraft_deploy.distill.data import build_corpus, split
from omnidraft_deploy.distill.pretrain import pretrain_config
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.resolve.load import load_model
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import make_policy
from omnidraft_deploy.speculative.stats import DecodeStats
from omnidraft_deploy.vocab.build import build_mapper
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

log = logging.getLogger("headline_adapt")
DRAFTER = "trained-llama2-drafter"
TARGET = "qwen2.5-0.5b"
RunFn = Callable[[list[int]], tuple[list[int], DecodeStats]]


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
    from omnidraft_deploy.exporters.training_graph import (
        bind_weights,
        param_aliases,
        swap_initializers,
    )
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

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


def _decoder(
    target: CausalLM,
    drafter: CausalLM,
    mapper: Any,
    cfg: DecodeConfig,
    policy: str,
    cache: NGramCache,
) -> RunFn:
    dec = SpeculativeDecoder(target, drafter, mapper, make_policy(policy, 4), cache, config=cfg)
    return lambda p: dec.generate(p)


def _side_by_side(
    methods: dict[str, RunFn], prompts: list[list[int]]
) -> tuple[dict[str, Any], list[list[int]]]:
    """Round-robin per prompt (so load drift hits every method alike): sums per method, and the
    target-only outputs."""
    runs: dict[str, list[tuple[list[int], DecodeStats]]] = {m: [] for m in methods}
    for i, p in enumerate(prompts):
        for name, fn in methods.items():
            runs[name].append(fn(p))
            log.info(
                "eval prompt %d/%d %s: %.2f s", i + 1, len(prompts), name, runs[name][-1][1].wall_s
            )
    ref = [out for out, _ in runs["target_only"]]
    res: dict[str, Any] = {}
    for name, rs in runs.items():
        wall = sum(st.wall_s for _, st in rs)
        n = sum(st.n_generated for _, st in rs)
        res[name] = {
            "wall_s": wall,
            "n_generated": n,
            "tokens_per_s": n / wall,
            "acceptance_rate": sum(st.accepted for _, st in rs)
            / max(1, sum(st.proposed for _, st in rs)),
            "tokens_per_target_call": n / max(1, sum(st.target_calls for _, st in rs)),
            "identical_to_target_only": sum(o == r for (o, _), r in zip(rs, ref, strict=True)),
        }
    for r in res.values():
        r["speedup_vs_target"] = r["tokens_per_s"] / res["target_only"]["tokens_per_s"]
    return res, ref


@torch.no_grad()
def _teacher_forced_top1(
    drafter: Transformer, mapper: Any, prompts: list[list[int]], outputs: list[list[int]]
) -> float:
    """Share of the target's continuation (spelled in drafter ids) the drafter predicts top-1,
    teacher-forced: what the drafter learned, independent of the draft-length policy."""
    from omnidraft_deploy.distill.align import translate

    hits = total = 0
    for p, o in zip(prompts, outputs, strict=True):
        ids, spans = translate(mapper, p + o)
        start = spans[len(p)][0] if o else len(ids)
        pred = drafter.forward_train(torch.tensor(ids)[None])[0].argmax(-1)
        hits += int((pred[start - 1 : -1] == torch.tensor(ids[start:])).sum())
        total += len(ids) - start
    return hits / max(total, 1)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _write(res: dict[str, Any], out: Path) -> None:
    from omnidraft_deploy.bundle.atomic import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "headline_adapt.json", json.dumps(res, indent=1))
    rows = [
        f"# Headline: {DRAFTER} (4.5M) -> Qwen2.5-Coder-0.5B-Instruct, {res['runtime']} CPU",
        "",
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
    write_text_atomic(out / "headline_adapt.md", "\n".join(rows) + "\n")
    log.info("\n%s", "\n".join(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
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
    fig.savefig(out / "headline_adapt.png", dpi=110)


def main(argv: list[str] | None = None) -> None:
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
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(a.threads)
    from omnidraft_deploy.catalog.assets import cache_root

    t_spec, d_spec = get_preset(TARGET), get_preset(DRAFTER)  # resolved once
    target = load_model(t_spec, max_seq_len=a.max_seq_len)
    drafter = load_model(d_spec)
    mapper = build_mapper(load_tokenizer("llama2"), load_tokenizer("qwen2"))
    cfg = DecodeConfig(max_new_tokens=a.max_new_tokens, vocab_limit=mapper.target_vocab_size)
    pool = _prompts(10_000, 48)  # every held-out code document long enough (88)
    if a.n_adapt + a.n_eval > len(pool):
        raise SystemExit(f"--n-adapt + --n-eval must be <= {len(pool)} held-out prompts")
    adapt_p, eval_p = pool[: a.n_adapt], pool[len(pool) - a.n_eval :]  # eval set fixed
    res: dict[str, Any] = {
        "runtime": "ONNX Runtime" if a.runtime == "ort" else "eager PyTorch",
        "threads": a.threads,
        "n_adapt": len(adapt_p),
        "n_eval": len(eval_p),
        "max_new_tokens": a.max_new_tokens,
        "policy": a.policy,
        "steps_per_update": a.steps_per_update,
        "lr": a.lr,
        "batch_size": a.batch_size,
        "optimizer": a.optimizer,
        "drafter_params": sum(p.numel() for p in drafter.parameters()),
        "target_params": sum(p.numel() for p in target.parameters()),
    }
    adapted = copy.deepcopy(drafter)
    if a.runtime == "ort":
        from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

        work = cache_root() / "headline"
        tpath, tinfo = _onnx_graph(
            target, t_spec, work / f"qwen2.5-0.5b-fp32-s{a.max_seq_len}.onnx"
        )
        (work / "drafter-before.onnx").unlink(missing_ok=True)  # small: exported fresh every run
        dpath, dinfo = _onnx_graph(drafter, d_spec, work / "drafter-before.onnx", swappable=True)
        target_lm: CausalLM = OrtModel(tpath, tinfo)
        before_lm: CausalLM = OrtModel(dpath, dinfo)
        del target  # the eager 0.5B model is not needed beside its ONNX twin
    else:
        target_lm, before_lm = EagerLM(target), EagerLM(drafter)

    adapt_cache = NGramCache()
    acfg = AdaptConfig(lr=a.lr, lam=1.0, batch_size=a.batch_size,
                       steps_per_update=a.steps_per_update, optimizer=a.optimizer, seq_len=96)  # fmt: skip
    dec = SpeculativeDecoder(
        target_lm, EagerLM(adapted), mapper, make_policy(a.policy, 4), adapt_cache, config=cfg
    )
    report = adapt_stream(dec, make_distiller(adapted, mapper, acfg), adapt_p)
    res["adapt_wall_s"], res["adapt_acceptance_trace"] = report.seconds, report.acceptance

    if a.runtime == "ort":
        probe = [1] + load_tokenizer("llama2").encode("def main():\n    return 0")
        after_lm, swap = _swap_drafter(
            dpath, dinfo, adapted, dpath.with_name("drafter-after.onnx"), probe
        )
        res |= swap
    else:
        after_lm = EagerLM(adapted)
    methods: dict[str, RunFn] = {
        "target_only": lambda p: generate_target_only(target_lm, p, cfg),
        # before: the shipped state (empty n-gram cache); after: adapted weights and the n-gram
        # cache grown during adaptation (both are the drafter's online state)
        "before": _decoder(target_lm, before_lm, mapper, cfg, a.policy, NGramCache()),
        "after": _decoder(target_lm, after_lm, mapper, cfg, a.policy, copy.deepcopy(adapt_cache)),
    }
    res["eval"], outs = _side_by_side(methods, eval_p)
    for k, model in (("before", drafter), ("after", adapted)):
        res["eval"][k]["teacher_forced_top1"] = _teacher_forced_top1(model, mapper, eval_p, outs)
    res["loadavg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    _write(res, Path(a.out_dir))


def rewrite_report(out_dir: str = "reports/headline_adapt") -> None:
    """Re-render the Markdown / PNG of ``out_dir/headline_adapt.json`` (no model runs)."""
    _write(json.loads((Path(out_dir) / "headline_adapt.json").read_text()), Path(out_dir))


if __name__ == "__main__":
    main()
