"""What the shipped n-gram cache's seed does to a first request: drafts per target call, A/B.

A target token whose drafter spelling takes several drafter ids can only be proposed through an
n-gram cache entry (``speculative.drafter.CrossVocabDrafter.propose``): without one the draft
breaks at that token. The shipped cache is the only one a first request has. This benchmark
decodes each prompt on a fresh copy of each seed, same bundle, same cost profile, greedy:

- ``prompts``: the seed bundles had before (the shipped prompt set's merged tokens);
- ``rank``: ``exporters.export.initial_ngram_cache``, every merged target token by merge rank
  (the first 65,536).

Counts (target tokens per target call, acceptance) do not depend on the machine's speed once the
profile is fixed; the wall times are recorded but this is not a timing run. Outputs are compared
with each other (greedy: both must equal target-only; ``validate`` proves that per bundle).

    python -m benchmarks.ngram_seed --bundle bundles/q15-kd --threads 2
    python -m benchmarks.ngram_seed --coverage reports/kd_drafter   # no bundle, no graphs

``--coverage DIR``: on the target's own chat replies (``kd_drafter``'s ``*replies*.jsonl``), the
share of reply tokens that are merged (drafter spelling n >= 2) and the share of those the seed
covers, at several seed sizes (the pair's presets: ``--target`` / ``--drafter``).
"""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters.export import initial_ngram_cache

from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.real_pair_bundle import load_prompts
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat
from omnidraft_deploy.vocab.mapper import VocabMapper

OUT = Path("reports/ngram_seed")
TASKS = "math,code,chat,summarisation,code_edit"
PALINDROME = ("Write a Python function that checks whether a string is a palindrome, ignoring "
              "case and punctuation.")  # fmt: skip


def prompt_seed(mapper: VocabMapper, tok: Any) -> NGramCache:
    """The seed before: the shipped prompt set's merged target tokens."""
    from omnidraft_deploy.catalog.prompts import load_prompts as shipped

    cache = NGramCache()
    for p in shipped():
        for t in tok.encode(p.text):
            if len(spelling := mapper.target_to_draft(t)) >= 2:
                cache.update(spelling, t)
    return cache


def run(a: argparse.Namespace) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.profile import measure_bundle

    torch.set_num_threads(1)
    load0 = os.getloadavg()
    b = open_bundle(a.bundle, threads=a.threads)
    prof = measure_bundle(b, k_max=2 * b.manifest.draft_len, reps=3)["drafter"]
    tok = load_bundle_tokenizer(b.root, "target", b.manifest.files)
    cfg = DecodeConfig(max_new_tokens=a.max_new_tokens, host_threads=1)
    chat = render_chat(getattr(tok, "chat_template", None), PALINDROME)
    prompts = [("palindrome", tok.encode(chat)), *load_prompts(tok, TASKS.split(","), 2)]
    seeds = {"prompts": prompt_seed(b.mapper, tok), "rank": initial_ngram_cache(b.mapper)}
    rows: list[dict[str, Any]] = []
    for task, ids in prompts:
        outs = {}
        for name, seed in seeds.items():
            dec = build_decoder(b.target, b.drafter, b.mapper, policy="cost", config=cfg,
                                draft_len=b.manifest.draft_len, profile=prof,
                                ngram_cache=copy.deepcopy(seed))  # fmt: skip
            outs[name], st = dec.generate(ids)
            rows.append({"task": task, "seed": name, "entries": len(seed),
                         "tokens_per_call": st.tokens_per_target_call,
                         "acceptance": st.acceptance_rate, "wall_s": st.wall_s})  # fmt: skip
            print(f"{task} {name}: {st.tokens_per_target_call:.2f} tokens/call", flush=True)
        rows[-1]["identical"] = rows[-2]["identical"] = outs["prompts"] == outs["rank"]
    meta = run_meta(threads=a.threads, load_avg_start=load0)
    write_report(OUT / a.name, {"meta": meta, "bundle": str(a.bundle), "rows": rows},
                 markdown=_md)  # fmt: skip


def _mean(rows: list[dict[str, Any]], seed: str, key: str) -> float:
    vals = [r[key] for r in rows if r["seed"] == seed]
    return sum(vals) / len(vals)


def _md(p: dict[str, Any]) -> str:
    rows = p["rows"]
    head = [f"# n-gram cache seed, first requests ({p['bundle']})", "", *meta_lines(p["meta"]), "",
            "| prompt | seed | entries | target tokens / call | acceptance | identical |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    body = [f"| {r['task']} | {r['seed']} | {r['entries']} | {r['tokens_per_call']:.2f} | "
            f"{r['acceptance']:.3f} | {r['identical']} |" for r in rows]  # fmt: skip
    means = [f"| mean | {s} | | {_mean(rows, s, 'tokens_per_call'):.3f} | "
             f"{_mean(rows, s, 'acceptance'):.3f} | |" for s in ("prompts", "rank")]  # fmt: skip
    return "\n".join(head + body + means) + "\n"


def coverage(a: argparse.Namespace) -> None:
    import json

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.vocab.pair import load_pair_vocab

    mapper = load_pair_vocab(get_preset(a.target), get_preset(a.drafter)).mapper
    replies = [json.loads(x)["reply"] for f in sorted(a.coverage.glob("*replies*.jsonl"))
               for x in f.read_text().splitlines()]  # fmt: skip
    ids = [t for r in replies for t in r]
    merged = [t for t in ids if len(mapper.target_to_draft(t)) >= 2]
    sizes = {n: {t for _, t, _ in initial_ngram_cache(mapper, n).items()}
             for n in (2048, 8192, 32768, 65536)}  # fmt: skip
    cov = {str(n): sum(t in seed for t in merged) / len(merged) for n, seed in sizes.items()}
    payload = {"meta": run_meta(threads=None), "replies": len(replies), "tokens": len(ids),
               "merged": len(merged), "distinct_merged": len(set(merged)), "coverage": cov}  # fmt: skip
    write_report(OUT / "coverage", payload, markdown=_coverage_md)


def _coverage_md(p: dict[str, Any]) -> str:
    rows = [f"| {n} | {c:.3f} |" for n, c in p["coverage"].items()]
    return "\n".join([
        "# n-gram seed coverage of the target's own replies", "", *meta_lines(p["meta"]), "",
        f"{p['replies']} replies, {p['tokens']} target tokens; merged (drafter spelling n >= 2): "
        f"{p['merged']} ({p['merged'] / p['tokens']:.1%}), {p['distinct_merged']} distinct.", "",
        "| seed entries | merged occurrences covered |", "|---|---|", *rows]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--coverage", type=Path, help="folder of kd_drafter reply files (no bundle)")
    p.add_argument("--target", default="qwen2.5-1.5b")
    p.add_argument("--drafter", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--name", default="ngram_seed")
    a = p.parse_args(argv)
    if a.coverage is None and a.bundle is None:
        p.error("give --bundle (the A/B) or --coverage DIR")
    coverage(a) if a.coverage is not None else run(a)


if __name__ == "__main__":
    main()
