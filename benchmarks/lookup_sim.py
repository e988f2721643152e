"""How much could lookup proposals give on the real pair, whatever they cost? A replay, no timing.

    .venv/bin/python benchmarks/lookup_sim.py [--target-quant w8a8-inv] [--max-new-tokens 64]

Decodes the 24 real-pair prompts greedily with our ORT target graph (``ort_pair.verify_graph``),
then replays each output against ``LookupProposer``: every step proposes up to ``--k`` ids from
the longest matching suffix and accepts the prefix that equals the output, as greedy verification
would. Columns per task: target tokens per step (an upper bound on lookup's speedup, since steps
cost at least one target call), share of steps with a proposal, and accepted / proposed, for
``min_ngram`` 1 and 2 and for three histories: the prompt and output alone ("own"), plus the other
prompts and outputs of the same task, plus those of every task (what ``keep_history`` carries in a
session; a prompt never sees its own earlier output). Writes ``reports/lookup_sim/lookup_sim.md``.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

import ort_pair as op  # type: ignore[import-not-found]  # benchmarks/, beside this script
import real_pair as rpb  # type: ignore[import-not-found]

from omnidraft_deploy import real_pair as rp
from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.speculative.lookup import LookupConfig, LookupProposer
from omnidraft_deploy.vocab.tokenizers import load_tokenizer


def replay(prompt: list[int], out: list[int], history: list[list[int]], k: int,
           min_ngram: int) -> tuple[int, int, int, int]:  # fmt: skip
    """(steps, steps with a proposal, accepted, proposed) of lookup over one greedy output."""
    lk = LookupProposer(LookupConfig(min_ngram=min_ngram, max_ngram=4, max_tokens=1 << 16))
    for h in history:
        lk.extend(h)
    lk.extend(prompt)
    p = steps = with_prop = accepted = proposed = 0
    while p < len(out):
        ids, _ = lk.propose(k)
        a = 0
        while a < len(ids) and p + a < len(out) and ids[a] == out[p + a]:
            a += 1
        steps, with_prop = steps + 1, with_prop + bool(ids)
        accepted, proposed = accepted + a, proposed + len(ids)
        lk.extend(out[p : p + a + 1])
        p += a + 1
    return steps, with_prop, accepted, proposed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-quant", default="w8a8-inv")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("reports/lookup_sim/lookup_sim.md"))
    a = ap.parse_args()
    tok = load_tokenizer("qwen2")
    path, info, _ = op.verify_graph(op.TARGET, "target", a.target_quant)
    target = op.ort_graph(path, info, a.threads)
    cfg = rp.DecodeConfig(max_new_tokens=a.max_new_tokens, eos_ids=tuple(tok.eos_ids),
                          vocab_limit=tok.vocab_size)  # fmt: skip
    runs = []
    for task, ids in rpb._prompts(tok, set(rpb.TASKS)):
        out, _ = rp.generate_target_only(target, ids, cfg)
        runs.append((task, ids, out))
    lines = [f"# Lookup replay over the real pair's greedy outputs ({a.target_quant} target)", "",
             f"`benchmarks/lookup_sim.py --target-quant {a.target_quant}`; {len(runs)} prompts x "
             f"{a.max_new_tokens} new tokens, up to {a.k} proposals a step; load average "
             f"{os.getloadavg()[0]:.2f}.", "",
             "| min n-gram | history | " + " | ".join(rpb.TASKS) + " |",
             "|---|---|" + "---|" * len(rpb.TASKS)]  # fmt: skip
    for min_ngram in (1, 2):
        for scope in ("own", "task", "all"):
            agg: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
            for i, (task, ids, out) in enumerate(runs):
                hist = [p + o for j, (t, p, o) in enumerate(runs)
                        if j != i and (scope == "all" or (scope == "task" and t == task))]  # fmt: skip
                for n, v in enumerate(replay(ids, out, hist, a.k, min_ngram)):
                    agg[task][n] += v
            cells = [f"{(v[2] + v[0]) / v[0]:.2f} tok/step, {v[1] / v[0]:.2f} proposing, "
                     f"{v[2] / max(v[3], 1):.2f} accepted" for v in (agg[t] for t in rpb.TASKS)]  # fmt: skip
            lines.append(f"| {min_ngram} | {scope} | " + " | ".join(cells) + " |")
    write_text_atomic(a.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
