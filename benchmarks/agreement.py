"""How often the drafter's next token is the target's, teacher-forced on the target's own output.

Acceptance in a speculative run mixes three things: whether the drafter agrees with the target,
whether its token lines up with the target's tokenization, and what the draft-length policy chose
to risk. This benchmark isolates the first two, the ceiling a policy works under: the target
decodes greedily (its own graph, target-only), then the drafter reads the same committed text
(as the decoder feeds it: each target token spelled in drafter tokens, ``VocabMapper``) and, at
every position, its greedy next token is put in one of four classes:

- ``match``: the drafter token maps directly to the target's token (a DM proposal accepted);
- ``merge``: the drafter's text is a strict prefix of the target token's (the n-gram cache must
  merge several drafter tokens into it, or the proposal is rejected);
- ``split``: the target token's text is a strict prefix of the drafter's;
- ``disagree``: anything else: the models disagree on the text.

    python -m benchmarks.agreement --bundle bundles/q15-w8a8 --per-task 2 --max-new-tokens 48

Report: ``reports/agreement/agreement.{json,md}`` (command, revision, machine, load average).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omnidraft_deploy.runtime.bundle import open_bundle

from benchmarks.common.pair import prompt_texts
from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.protocols import CausalLM, TokenizerLike
from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat
from omnidraft_deploy.vocab.mapper import VocabMapper

CLASSES = ("match", "merge", "split", "disagree")
OUT = Path("reports/agreement")


def target_greedy(target: CausalLM, ids: list[int], n: int, vocab: int) -> list[int]:
    """``n`` greedy target ids after ``ids`` (ids past ``vocab``, the padded rows, never win; no
    stop at EOS). A call writes the cache from its position on, so no reset is needed between
    prompts."""
    cfg = DecodeConfig(max_new_tokens=n, eos_ids=(), vocab_limit=vocab)
    return generate_target_only(target, ids, cfg)[0]


def classify(draft_text: str, target_text: str, mapped: bool) -> str:
    if mapped:
        return "match"
    if target_text.startswith(draft_text) and len(draft_text) < len(target_text):
        return "merge"
    if draft_text.startswith(target_text) and len(target_text) < len(draft_text):
        return "split"
    return "disagree"


def drafter_classes(drafter: CausalLM, mapper: VocabMapper, dtok: TokenizerLike,
                    ttok: TokenizerLike, prompt: list[int], out: list[int]) -> list[str]:  # fmt: skip
    """The class of the drafter's greedy token at each position of ``out``, teacher-forced."""
    ids = mapper.drafter_context(prompt)
    vocab = mapper.draft_vocab_size
    logits, pos, classes = drafter.forward(torch.tensor(ids), 0)[-1], len(ids), []
    for i, t in enumerate(out):
        d = int(np.argmax(logits[:vocab].numpy()))
        mapped = mapper.draft_to_target_list[d] == t
        classes.append(classify(dtok.decode([d]), ttok.decode([t]), mapped))
        if i + 1 < len(out):
            feed = mapper.target_to_draft(t)
            logits = drafter.forward(torch.tensor(feed), pos)[-1]
            pos += len(feed)
    return classes


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--per-task", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    b = open_bundle(a.bundle, threads=a.threads)
    files = b.manifest.files
    ttok = load_bundle_tokenizer(b.root, "target", files)
    dtok = load_bundle_tokenizer(b.root, "drafter", files)
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for task in dict.fromkeys(q["task"] for q in prompt_texts(code_edit=True)):
        texts = [q["text"] for q in prompt_texts(code_edit=True) if q["task"] == task]
        for text in texts[: a.per_task]:
            prompt = ttok.encode(render_chat(getattr(ttok, "chat_template", None), text))
            out = target_greedy(b.target, prompt, a.max_new_tokens, b.mapper.target_vocab_size)
            for c in drafter_classes(b.drafter, b.mapper, dtok, ttok, prompt, out):
                counts[task][c] += 1
                counts["overall"][c] += 1
            print(task, dict(counts[task]), flush=True)
    rows = {t: {c: n[c] / max(1, sum(n.values())) for c in CLASSES} for t, n in counts.items()}
    payload: dict[str, Any] = {"meta": run_meta(threads=a.threads), "bundle": a.bundle,
                               "counts": {t: dict(n) for t, n in counts.items()},
                               "shares": rows}  # fmt: skip
    write_report(OUT / "agreement", payload, markdown=_markdown)


def _markdown(payload: dict[str, Any]) -> str:
    lines = [f"# Drafter/target agreement, teacher-forced ({payload['bundle']})", "",
             *meta_lines(payload["meta"]), "",
             "| task | positions | " + " | ".join(CLASSES) + " |",
             "|---|---|" + "---|" * len(CLASSES)]  # fmt: skip
    for task, shares in payload["shares"].items():
        n = sum(payload["counts"][task].values())
        lines.append(f"| {task} | {n} | " + " | ".join(f"{shares[c]:.2f}" for c in CLASSES) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
