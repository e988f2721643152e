"""Does the target graph give the same argmax for a token fed alone and inside a T-token call?

    .venv/bin/python benchmarks/batch_invariance.py [--quant int8] [--width 4] [--tokens 32]

Greedy speculative output equals target-only only if the graph's argmax does not depend on how
many tokens one call feeds. For every 4th benchmark prompt: decode target-only (1-token calls),
then re-score the same text in ``--width``-token calls, as verification does, and print how many
positions change their argmax and by what top-1/top-2 logit gap (near-ties).
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

import ort_pair as op  # type: ignore[import-not-found]  # benchmarks/, beside this script
import torch

from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only
from omnidraft_deploy.vocab.tokenizers import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    tok = load_tokenizer("qwen2")
    path, info, _ = op.verify_graph(op.TARGET, "target", a.quant)
    target = op.ort_graph(path, info, 1)
    limit = 151665
    cfg = DecodeConfig(max_new_tokens=a.tokens, eos_ids=tuple(tok.eos_ids), vocab_limit=limit)
    raw = json.loads(resources.files("omnidraft_deploy").joinpath(
        "data/real_pair_prompts.json").read_text("utf-8"))  # fmt: skip
    for p in raw[::4]:
        ids = tok.encode(p["text"])
        out, _ = generate_target_only(target, ids, cfg)
        full, gaps = ids + out, []
        for i in range(0, len(out) - a.width, a.width - 1):
            pos = len(ids) - 1 + i
            logits = target.forward(torch.tensor(full[pos : pos + a.width]), pos)[:, :limit]
            for j, best in enumerate(logits.argmax(-1).tolist()):
                if best != full[pos + j + 1]:
                    top = logits[j].topk(2).values
                    gaps.append(round(float(top[0] - top[1]), 4))
        print(f"{p['task']}: {len(gaps)} argmax changes, top-1/top-2 gaps {gaps}", flush=True)


if __name__ == "__main__":
    main()
