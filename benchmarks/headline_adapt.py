"""Headline: a 4.5M-param Llama-2-vocabulary drafter adapts online to the real Qwen2.5-Coder-0.5B.

Target: Qwen2.5-Coder-0.5B-Instruct (pinned GGUF asset ``qwen2.5-0.5b-gguf``, Qwen2 vocabulary)
through ``reference.hf_adapter.load_preset_weights``; drafter: ``trained-llama2-drafter``
(``distill.pretrain``). Both run eagerly in PyTorch on CPU (not ONNX Runtime). A stream of held-out
code prompts is decoded greedily; the first ``n_adapt`` feed ``OnlineDistiller`` (hybrid loss,
update after every prompt), then ``n_eval`` prompts are timed three ways: target alone, speculative
with the pre-trained drafter, speculative with the adapted drafter.

    .venv/bin/python benchmarks/headline_adapt.py [--n-adapt 16 --n-eval 4]
Writes reports/headline_adapt.{json,md}. Slow (minutes); needs the optional model asset.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from pathlib import Path

import torch

from omnidraft_deploy.distill.data import build_corpus, split
from omnidraft_deploy.distill.online import OnlineDistiller, ReplayBuffer
from omnidraft_deploy.distill.pretrain import get_pretrain_config, load_pretrained
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.pipeline import build_mapper
from omnidraft_deploy.reference.hf_adapter import load_preset_weights
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import FixedDraftLen
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

log = logging.getLogger("headline_adapt")


def _prompts(n: int, prompt_tokens: int) -> list[list[int]]:
    tok = load_tokenizer("qwen2")
    pcfg = get_pretrain_config("trained-llama2-drafter")
    _, held = split(build_corpus(pcfg.data), pcfg.data.heldout_frac)
    docs = [tok.encode(d) for d in held["code"]]
    return [d[:prompt_tokens] for d in docs if len(d) > prompt_tokens + 8][:n]


def _spec(
    target: Transformer,
    drafter: Transformer,
    mapper: object,
    cfg: DecodeConfig,
) -> SpeculativeDecoder:
    return SpeculativeDecoder(
        EagerLM(target),
        EagerLM(drafter),
        mapper,  # type: ignore[arg-type]
        FixedDraftLen(4),
        NGramCache(),
        config=cfg,
    )


def _timed(gen, prompts: list[list[int]]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    wall = acc = prop = n = calls = 0.0
    for p in prompts:
        _, st = gen(p)
        wall, n, calls = wall + st.wall_s, n + st.n_generated, calls + st.target_calls
        acc, prop = acc + st.accepted, prop + st.proposed
    return {
        "tokens_per_s": n / wall,
        "acceptance_rate": acc / max(prop, 1.0),
        "tokens_per_target_call": n / max(calls, 1.0),
        "wall_s": wall,
        "n_generated": n,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-adapt", type=int, default=16)
    ap.add_argument("--n-eval", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out-dir", default="reports")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    target, _ = load_preset_weights("qwen2.5-0.5b", max_seq_len=512)
    drafter = load_pretrained("trained-llama2-drafter")
    mapper = build_mapper(load_tokenizer("llama2"), load_tokenizer("qwen2"))
    cfg = DecodeConfig(max_new_tokens=a.max_new_tokens, vocab_limit=mapper.target_vocab_size)
    prompts = _prompts(a.n_adapt + a.n_eval, 48)
    adapt_p, eval_p = prompts[: a.n_adapt], prompts[a.n_adapt :]
    res: dict = {"n_adapt": a.n_adapt, "n_eval": len(eval_p), "max_new_tokens": a.max_new_tokens}
    res["target_only"] = _timed(lambda p: generate_target_only(EagerLM(target), p, cfg), eval_p)
    res["before"] = _timed(_spec(target, drafter, mapper, cfg).generate, eval_p)
    adapted = copy.deepcopy(drafter)
    dist = OnlineDistiller(
        adapted,
        mapper,
        lr=1e-3,
        lam=1.0,
        batch_size=4,
        steps_per_update=2,
        seq_len=96,
        buffer=ReplayBuffer(256, max_context=96),
    )
    dec, t0, trace = _spec(target, adapted, mapper, cfg), time.perf_counter(), []
    for p in adapt_p:
        _, st = dec.generate(p, observer=dist)
        trace.append(st.acceptance_rate)
        dist.update()
    res["adapt_wall_s"], res["adapt_acceptance_trace"] = time.perf_counter() - t0, trace
    res["after"] = _timed(_spec(target, adapted, mapper, cfg).generate, eval_p)
    for k in ("before", "after"):
        res[k]["speedup_vs_target"] = res[k]["tokens_per_s"] / res["target_only"]["tokens_per_s"]
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "headline_adapt.json").write_text(json.dumps(res, indent=1))
    lines = [
        "# Headline: trained-llama2-drafter -> Qwen2.5-Coder-0.5B (eager PyTorch, CPU)",
        "",
        "| run | acceptance | tokens/target call | tokens/s | speedup |",
        "|---|---|---|---|---|",
    ]
    for k in ("target_only", "before", "after"):
        r = res[k]
        lines.append(
            f"| {k} | {r['acceptance_rate']:.3f} | {r['tokens_per_target_call']:.2f} | "
            f"{r['tokens_per_s']:.2f} | {r.get('speedup_vs_target', 1.0):.2f} |"
        )
    (out / "headline_adapt.md").write_text("\n".join(lines) + "\n")
    log.info("\n%s", "\n".join(lines))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
