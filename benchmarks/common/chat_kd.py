"""Offline sequence-level distillation of a cross-vocabulary drafter on its target's chat replies.

With greedy verification a drafted token is accepted exactly when it is the target's argmax, so
what a drafter should imitate is the target's own greedy reply to the kind of request a user sends
(Kim & Rush 2016, arXiv:1606.07947): its openings ("Certainly! Here's ..."), its markdown, its
way of laying out a worked answer. ``seqkd`` does this for base-model text; this module does it
for an instruct target behind its chat template, in five request shapes (math, code, chat,
summarisation, code edits) built from the offline corpus's *training* split (``distill.data``),
so no benchmark or held-out prompt is ever a training prompt.

A training row is what the decoder feeds the drafter (``VocabMapper``): the target's prompt ids
spelled in drafter ids (``drafter_context``), then each reply token spelled in drafter ids
(``target_to_draft``). The loss is the drafter's cross-entropy on the reply positions only: the
hard-label form of ``L_DM + L_Ngram`` (a directly mapped token is one drafter label, a merged one
several). AdamW, warmup + cosine; the whole drafter, or only its last blocks
(``TrainConfig.train_layers``): on SmolLM2-135M a full step over a row of 300 drafter tokens took
20 s on one shared core, which bounds how much traffic an offline pass can take here.

Who produces the replies (the bundle's own target graph, or llama.cpp on the same GGUF) is the
caller's choice: ``benchmarks/kd_drafter.py``.
"""

from __future__ import annotations

import ast
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from omnidraft_deploy.distill.offline import freeze_all_but_last
from omnidraft_deploy.reference.model import Transformer

TASKS = ("math", "code", "chat", "summarisation", "code_edit")
EDITS = (
    "Add type hints and a docstring to this function, and keep its behaviour:",
    "Rewrite this function to be easier to read, without changing what it does:",
    "Explain what this function does, then suggest one improvement:",
    "Find a possible bug in this function and show the fixed version:",
)
CHATS = (
    "What does `{name}` do in Python?",
    "Can you explain `{name}` in simple terms?",
    "When would I use `{name}` in a Python program? Give a short example.",
)
# everyday requests: template x topic (seeded); none is a benchmark prompt (checked by the caller)
EVERYDAY = (
    "Give me three tips for {t}.",
    "What are the pros and cons of {t}?",
    "How should a beginner get started with {t}?",
    "Write a short, polite email to a neighbour about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are common mistakes people make with {t}?",
)
TOPICS = (
    "growing tomatoes on a balcony",
    "learning to play the guitar",
    "saving money on groceries",
    "running a first 5 km race",
    "keeping a houseplant alive",
    "planning a weekend trip by train",
    "writing a cover letter",
    "baking sourdough bread",
    "learning a second language",
    "sleeping better",
    "public speaking",
    "cycling to work",
    "keeping a reading habit",
    "organising a small birthday party",
    "choosing a laptop for university",
    "composting at home",
    "taking better phone photos",
    "making a monthly budget",
    "teaching a dog to sit",
    "preparing for a job interview",
    "reducing screen time",
    "starting to meditate",
    "cooking rice without a rice cooker",
    "volunteering locally",
)


class SpellingMapper(Protocol):
    """What ``chat_kd`` needs of ``vocab.mapper.VocabMapper``."""

    def drafter_context(self, target_ids: list[int]) -> list[int]: ...

    def target_to_draft(self, target_id: int) -> list[int]: ...


def _functions(source: str, max_lines: int) -> list[ast.FunctionDef]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and n.end_lineno is not None and 4 <= n.end_lineno - n.lineno < max_lines]  # fmt: skip


def _without_docstring(source: str, fn: ast.FunctionDef) -> str:
    lines = source.splitlines()[fn.lineno - 1 : fn.end_lineno]
    text = "\n".join(lines)
    first = text.splitlines()[0]
    indent = len(first) - len(first.lstrip())
    text = "\n".join(line[indent:] for line in text.splitlines())
    return re.sub(r'\n\s*(""".*?"""|\'\'\'.*?\'\'\')', "", text, count=1, flags=re.S)


def _signature_prompt(source: str, fn: ast.FunctionDef) -> str | None:
    doc = ast.get_docstring(fn)
    if not doc or len(doc) < 30 or fn.name.startswith("_"):
        return None
    header = source.splitlines()[fn.lineno - 1].strip()
    if not header.endswith(":"):
        return None
    summary = " ".join(doc.strip().split("\n\n")[0].split())
    return f'{header}\n    """{summary}"""\n'


def _lower_first(summary: str) -> str:
    """'Return the data ...' -> 'returns the data ...' (a request: 'Write a function that ...')."""
    word, _, rest = summary.partition(" ")
    verb = word.lower()
    verb = (
        verb
        if verb.endswith("s") or not verb.isalpha()
        else verb + ("es" if verb.endswith(("sh", "ch", "x")) else "s")
    )
    return f"{verb} {rest}".rstrip()


def request_texts(docs: dict[str, list[str]], sources: Sequence[str], per_task: int,
                  seed: int) -> list[tuple[str, str]]:  # fmt: skip
    """``per_task`` (task, user text) requests per task of ``TASKS``, seeded.

    ``docs``: the corpus *training* split (``distill.data.split``); ``sources``: Python source
    files' texts (functions for the code and code-edit requests).
    """
    rng = random.Random(seed)
    fns = [(s, f) for s in sources for f in _functions(s, 30)]
    rng.shuffle(fns)
    sigs = [p for s, f in fns if (p := _signature_prompt(s, f))]
    asks = [f"Write a Python function that {_lower_first(p.split(chr(34) * 3)[1])}" for p in sigs]
    edits = [_without_docstring(s, f) for s, f in fns if len(_without_docstring(s, f)) < 1200]
    names = [m.group(1) for d in docs.get("instruction", []) if (m := re.search(r"`([^`]+)`", d))]
    maths = [
        d[: d.index("Answer:") + len("Answer:")] for d in docs.get("math", []) if "Answer:" in d
    ]
    summaries = [d[: d.index("Summary:") + len("Summary:")]
                 for d in docs.get("summarisation", []) if "Summary:" in d]  # fmt: skip
    pools: dict[str, list[str]] = {
        "math": maths,
        "code": sigs[: len(sigs) // 2] + asks[len(sigs) // 2 :],
        "chat": [f"User: {rng.choice(CHATS).format(name=n)}\nAssistant:" for n in names[:200]]
        + [f"User: {e.format(t=t)}\nAssistant:" for e in EVERYDAY for t in TOPICS],
        "summarisation": summaries,
        "code_edit": [f"{rng.choice(EDITS)}\n\n```python\n{e}\n```" for e in edits],
    }
    out: list[tuple[str, str]] = []
    for task in TASKS:
        pool = list(dict.fromkeys(pools[task]))
        if len(pool) < per_task:
            raise ValueError(f"{task}: only {len(pool)} distinct requests, {per_task} wanted")
        out += [(task, t) for t in rng.sample(pool, per_task)]
    return out


@dataclass(frozen=True)
class KDRow:
    """One reply as the drafter reads it: ``ids`` (drafter ids), loss on ``ids[start:]``."""

    ids: tuple[int, ...]
    start: int  # index of the first reply drafter id (>= 1: there is always a context)


def kd_row(mapper: SpellingMapper, prompt: list[int], reply: list[int], max_len: int) -> KDRow:
    """The drafter's view of target ``prompt`` + ``reply`` ids, cut to ``max_len`` drafter ids
    (the prompt is cut from the left: the reply is what is learned)."""
    ctx = mapper.drafter_context(prompt)
    out = [d for t in reply for d in mapper.target_to_draft(t)]
    if not ctx or not out:
        raise ValueError("kd_row: an empty prompt or reply")
    keep = max(1, max_len - len(out))
    ctx = ctx[-keep:]
    ids = (ctx + out)[:max_len]
    return KDRow(tuple(ids), len(ctx))


def reply_loss(model: Transformer, row: KDRow) -> Tensor:
    """Mean cross-entropy of the drafter's next-token predictions on the reply ids of ``row``."""
    ids = torch.tensor(row.ids)
    logits = model.forward_train(ids[None])[0]  # (T, V)
    return F.cross_entropy(logits[row.start - 1 : -1].float(), ids[row.start :])


@torch.no_grad()
def reply_agreement(model: Transformer, rows: Sequence[KDRow]) -> float:
    """Share of reply positions where the drafter's argmax is the next reply id (teacher-forced)."""
    hit = total = 0
    for row in rows:
        ids = torch.tensor(row.ids)
        pred = model.forward_train(ids[None])[0][row.start - 1 : -1].argmax(-1)
        hit += int((pred == ids[row.start :]).sum())
        total += len(ids) - row.start
    return hit / max(1, total)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 2
    lr: float = 3e-5
    warmup: int = 10
    weight_decay: float = 0.0
    clip: float = 1.0
    seed: int = 0
    train_layers: int = 0  # > 0: only the last blocks and the final norm train (cost: see below)


def lr_at(step: int, steps: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def train_on_replies(model: Transformer, rows: Sequence[KDRow], cfg: TrainConfig,
                     on_step: Callable[[int, float], None] | None = None) -> list[float]:  # fmt: skip
    """Train ``model`` on ``rows`` (one row per step, shuffled each epoch): every parameter, or
    with ``cfg.train_layers`` only the last blocks and the final norm, so that autograd starts
    there and the frozen prefix costs one forward pass (``offline.freeze_all_but_last``).
    Returns the loss of every step."""
    if not rows:
        raise ValueError("train_on_replies: no rows")
    if cfg.train_layers:
        freeze_all_but_last(model, cfg.train_layers)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps, losses = cfg.epochs * len(rows), list[float]()
    model.train()
    bar = tqdm(total=steps, desc="distil drafter (rows)", mininterval=10)
    t0 = time.time()
    for epoch in range(cfg.epochs):
        order = list(rows)
        rng.shuffle(order)
        for row in order:
            for group in opt.param_groups:
                group["lr"] = lr_at(len(losses), steps, cfg)
            loss = reply_loss(model, row)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            opt.step()
            losses.append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
            if on_step:
                on_step(len(losses), time.time() - t0)
    bar.close()
    model.eval()
    return losses
