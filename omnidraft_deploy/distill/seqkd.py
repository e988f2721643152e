"""Sequence-level distillation text for a pre-trained drafter (Kim & Rush 2016, arXiv:1606.07947).

With greedy verification a drafted token is accepted exactly when it is the target's argmax, so
the text a drafter should imitate is the target's own greedy output, not the corpus: its
templates, its repetitions, its mistakes. ``teacher_texts`` asks the (compact-vocabulary) target
for greedy continuations of corpus prompts and returns prompt + continuation as text; the drafter
re-tokenises that text with its own tokenizer (``kd_stream``), so no vocabulary mapping is needed.

Prompts (``corpus_prompts``, seeded): half are a document up to its answer marker (``Answer:``,
``Assistant:``, ``Summary:``: the shape of the shipped benchmark prompts), the others a document's
first 4-96 tokens (continuing mid-text, as decoding does after the first draft). Like the
benchmark and ``omnidraft run``, the target sees the prompt without BOS. Tokenizers are used here
because this module sits at the edge between text and the two vocabularies.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Protocol

import torch
from torch import Tensor
from torch.func import vmap
from tqdm import tqdm

from omnidraft_deploy.host.threads import FreeCoreThreads
from omnidraft_deploy.reference.model import Transformer

MARKERS = {"math": "\nAnswer:", "instruction": "\nAssistant:", "summarisation": "\nSummary:"}
MAX_PROMPT = 192  # tokens; longer marker prompts are skipped
MAX_CUT = 96  # random cuts take the first 4..MAX_CUT tokens


class TextTokenizer(Protocol):
    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def corpus_prompts(
    docs: dict[str, list[str]], tok: TextTokenizer, n: int, seed: int
) -> list[list[int]]:
    """``n`` prompts (teacher ids), tasks in turn, documents drawn with ``random.Random(seed)``."""
    rng, tasks = random.Random(seed), sorted(t for t in docs if docs[t])
    prompts: list[list[int]] = []
    for attempt in range(20 * n):
        if len(prompts) == n:
            break
        task = tasks[attempt % len(tasks)]
        doc = rng.choice(docs[task])
        marker = MARKERS.get(task)
        if marker and marker in doc and rng.random() < 0.5:
            ids = tok.encode(doc[: doc.index(marker) + len(marker)])
        else:
            ids = tok.encode(doc)[: rng.randint(4, MAX_CUT)]
        if 2 <= len(ids) <= MAX_PROMPT:
            prompts.append(ids)
    return prompts


@torch.no_grad()
def greedy_batch(model: Transformer, prompts: list[Tensor], n: int) -> Tensor:
    """``(B, n)`` greedy continuations of ``B`` prompts ``(T_b,)`` (``T_b + n <= max_seq_len``).

    Host-held caches ``(B, 1, KV, S, D)`` and ``forward_explicit`` mapped over the batch with
    ``torch.func.vmap`` (the model is written for one sequence); each prompt is prefilled alone, so
    lengths may differ, then every row decodes one token per batched call at its own position.
    """
    caches = [torch.zeros(len(prompts), *shape) for shape in model.cache_shapes()]
    first = []
    for b, ids in enumerate(prompts):
        out = model.forward_explicit(ids[None], torch.arange(len(ids)), *(c[b] for c in caches))
        for cache, new in zip(caches, out[1:], strict=True):
            cache[b, :, :, : len(ids)] = new
        first.append(out[0][0, -1].argmax())
    step = vmap(model.forward_explicit, in_dims=(0, 0, *[0] * len(caches)))
    rows, pos = torch.arange(len(prompts)), torch.tensor([len(p) for p in prompts])
    tokens = [torch.stack(first)]  # each (B,)
    for _ in range(n - 1):
        out = step(tokens[-1].view(-1, 1, 1), pos.view(-1, 1), *caches)
        for cache, new in zip(caches, out[1:], strict=True):  # new: (B, 1, KV, 1, D)
            cache[rows, :, :, pos] = new[:, :, :, 0]
        pos = pos + 1
        tokens.append(out[0][:, 0, -1].argmax(-1))  # logits (B, 1, 1, V)
    return torch.stack(tokens, 1)


def teacher_texts(
    compact: Transformer,
    used_ids: Tensor,
    tok: TextTokenizer,
    prompts: list[list[int]],
    new_tokens: int,
    batch_size: int = 64,
) -> list[tuple[str, bool]]:
    """(prompt + greedy continuation as text, whether it ended at EOS) per prompt.

    ``compact``: the teacher on its compact vocabulary (``pretrain``); ``used_ids: (n,)`` the full
    id of each compact id. Prompts holding an id outside ``used_ids`` are skipped; a continuation
    is cut before its first EOS. Batches hold prompts of similar length (shortest first) and a
    model copy whose cache is just long enough: every step copies the whole cache.
    """
    lut = {int(t): i for i, t in enumerate(used_ids)}
    stop = {lut[e] for e in tok.eos_ids if e in lut}
    kept = sorted((ids for ids in prompts if all(t in lut for t in ids)), key=len)
    out = []
    batches = tqdm(range(0, len(kept), batch_size), desc="teacher text (batches)", mininterval=5)
    with FreeCoreThreads() as threads:
        for i in batches:
            threads.adjust()
            chunk = kept[i : i + batch_size]
            model = Transformer(replace(compact.args, max_seq_len=len(chunk[-1]) + new_tokens))
            model.load_state_dict(compact.state_dict())
            compact_ids = [torch.tensor([lut[t] for t in ids]) for ids in chunk]
            new = greedy_batch(model.eval(), compact_ids, new_tokens)
            for ids, row in zip(chunk, new.tolist(), strict=True):
                end = next((j for j, t in enumerate(row) if t in stop), len(row))
                text = tok.decode(ids + [int(used_ids[t]) for t in row[:end]])
                out.append((text, end < len(row)))
    return out


def kd_stream(texts: list[tuple[str, bool]], tok: TextTokenizer) -> list[int]:
    """One drafter token stream: ``[BOS] text [EOS if the teacher stopped] ...``."""
    bos = [tok.bos_id] if tok.bos_id is not None else []
    ids: list[int] = []
    for text, ended in texts:
        ids += bos + tok.encode(text) + ([tok.eos_ids[0]] if ended else [])
    return ids
