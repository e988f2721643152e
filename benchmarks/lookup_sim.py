"""How much could lookup proposals give on the real pair, whatever they cost? A replay, no timing.

    .venv/bin/python -m benchmarks.lookup_sim [--target-quant w8a8-inv] [--max-new-tokens 64]

Decodes the 24 real-pair prompts greedily with our ORT target graph (``ort_pair.verify_graph``),
then replays each output against ``LookupProposer``: every step proposes up to ``--k`` ids from
the longest matching suffix and accepts the prefix that equals the output, as greedy verification
would. Columns per task: target tokens per step (an upper bound on lookup's speedup, since steps
cost at least one target call), share of steps with a proposal, and accepted / proposed, for
``min_ngram`` 1 and 2 and for three histories: the prompt and output alone ("own"), plus the other
prompts and outputs of the same task, plus those of every task (what ``keep_history`` carries in a
session; a prompt never sees its own earlier output). Writes ``reports/lookup_sim/lookup_sim.json``
and the ``.md`` rendered from it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks import ort_pair as op
from benchmarks.common.pair import task_prompts
from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.real_pair import TASKS
from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only
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


def replay_table(runs: list[tuple[str, list[int], list[int]]], k: int) -> dict[str, Any]:
    """min n-gram -> history scope -> task -> summed (steps, proposing, accepted, proposed)."""
    table: dict[str, Any] = {}
    for min_ngram in (1, 2):
        for scope in ("own", "task", "all"):
            agg = {t: [0, 0, 0, 0] for t in TASKS}
            for i, (task, ids, out) in enumerate(runs):
                hist = [p + o for j, (t, p, o) in enumerate(runs)
                        if j != i and (scope == "all" or (scope == "task" and t == task))]  # fmt: skip
                for n, v in enumerate(replay(ids, out, hist, k, min_ngram)):
                    agg[task][n] += v
            table.setdefault(str(min_ngram), {})[scope] = agg
    return table


def to_markdown(d: dict[str, Any]) -> str:
    lines = [f"# Lookup replay over the real pair's greedy outputs ({d['target_quant']} target)",
             "", *meta_lines(d["meta"]), f"{d['prompts']} prompts x {d['max_new_tokens']} new "
             f"tokens, up to {d['k']} proposals a step.", "",
             "| min n-gram | history | " + " | ".join(TASKS) + " |", "|---|---|" + "---|" * len(TASKS)]  # fmt: skip
    for min_ngram, scopes in d["table"].items():
        for scope, agg in scopes.items():
            cells = [f"{(v[2] + v[0]) / v[0]:.2f} tok/step, {v[1] / v[0]:.2f} proposing, "
                     f"{v[2] / max(v[3], 1):.2f} accepted" for v in (agg[t] for t in TASKS)]  # fmt: skip
            lines.append(f"| {min_ngram} | {scope} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-quant", default="w8a8-inv")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("reports/lookup_sim/lookup_sim.md"))
    a = ap.parse_args()
    load0 = os.getloadavg()
    tok = load_tokenizer("qwen2")
    path, info, _ = op.verify_graph(op.TARGET, "target", a.target_quant)
    target = op.ort_graph(path, info, a.threads)
    cfg = DecodeConfig(max_new_tokens=a.max_new_tokens, eos_ids=tuple(tok.eos_ids),
                       vocab_limit=tok.vocab_size)  # fmt: skip
    runs = [(task, ids, generate_target_only(target, ids, cfg)[0])
            for task, ids in task_prompts(tok, TASKS)]  # fmt: skip
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "target_quant":
               a.target_quant, "max_new_tokens": a.max_new_tokens, "k": a.k, "prompts": len(runs),
               "table": replay_table(runs, a.k)}  # fmt: skip
    write_report(a.out.with_suffix(""), payload, markdown=to_markdown)
    print(a.out.read_text())


if __name__ == "__main__":
    main()
