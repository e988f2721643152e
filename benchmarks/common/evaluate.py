"""Acceptance of a drafter against a target on per-task prompts (the paper's table, one cell).

``task_prompts`` turns held-out corpus documents (``distill.data``) into target-id prompts ending
where the answer starts; ``evaluate_drafter`` decodes them speculatively (greedy, fixed draft
length, one fresh n-gram cache per call) and reports the acceptance rate (accepted / proposed
drafts), target tokens per target call, and teacher-forced top-1 agreement: the share of the
target's greedy continuation, spelled in drafter ids, that the drafter predicts top-1 given the
true prefix (what the drafter has learned, independent of the draft-length policy). It also
returns the generated ids, so callers check greedy outputs against target-only decoding.
Used by the early-exit and headline benchmarks (no product path measures a drafter this way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnidraft_deploy.distill.align import MapperLike, translate
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder

_MARKERS = ("\nAnswer:", "\nAssistant:", "\nSummary:")  # a prompt ends where the answer starts


@dataclass(frozen=True)
class EvalSettings:
    draft_len: int = 4
    max_new_tokens: int = 48
    max_prompt_tokens: int = 160
    min_prompt_tokens: int = 4

    def __post_init__(self) -> None:
        if self.draft_len < 1 or self.max_new_tokens < 1:
            raise ValueError(f"bad evaluation settings {self}")


def answer_prefix(doc: str) -> str | None:
    """The document up to (and with) its first answer marker, or None without one."""
    for marker in _MARKERS:
        if marker in doc:
            return doc[: doc.index(marker) + len(marker)]
    return None


def prompt_text(doc: str, max_chars: int = 600) -> str:
    """The document up to its answer marker, else its first ``max_chars`` characters."""
    return answer_prefix(doc) or doc[:max_chars]


def task_prompts(
    tok: Any, docs: dict[str, list[str]], n: int, settings: EvalSettings
) -> dict[str, list[list[int]]]:
    """Up to ``n`` target-id prompts per task (``tok``: a ``TokenizerLike``), in document order."""
    bos = [tok.bos_id] if tok.bos_id is not None else []
    out: dict[str, list[list[int]]] = {}
    for task, texts in docs.items():
        prompts = []
        for doc in texts:
            ids = (bos + tok.encode(prompt_text(doc)))[-settings.max_prompt_tokens :]
            if len(ids) >= settings.min_prompt_tokens:
                prompts.append(ids)
            if len(prompts) == n:
                break
        out[task] = prompts
    return out


@torch.no_grad()
def teacher_forced_top1(
    drafter: Transformer, mapper: MapperLike, prompts: list[list[int]], outputs: list[list[int]]
) -> float:
    """Share of the continuations' drafter ids the drafter predicts top-1, teacher-forced."""
    hits = total = 0
    for p, o in zip(prompts, outputs, strict=True):
        ids, spans = translate(mapper, p + o)
        start = spans[len(p)][0] if o else len(ids)
        if start < 1 or start >= len(ids):
            continue
        pred = drafter.forward_train(torch.tensor(ids)[None])[0].argmax(-1)
        hits += int((pred[start - 1 : -1] == torch.tensor(ids[start:])).sum())
        total += len(ids) - start
    return hits / max(total, 1)


def evaluate_drafter(
    target: Any,
    drafter: Transformer,
    mapper: Any,
    prompts: list[list[int]],
    settings: EvalSettings,
    *,
    stop_at_eos: bool = False,
    teacher_forced: bool = True,
) -> tuple[dict[str, float], list[list[int]]]:
    """Greedy speculative decoding of ``prompts`` with ``drafter`` (eager) against ``target``
    (a ``CausalLM``), one decoder (and n-gram cache) for the whole stream. Returns (figures,
    generated target ids per prompt); ``teacher_forced``: also the drafter's top-1 agreement."""
    cfg = DecodeConfig(max_new_tokens=settings.max_new_tokens)
    dec = build_decoder(target, EagerLM(drafter), mapper, policy="fixed", config=cfg,
                        draft_len=settings.draft_len, ngram_cache=NGramCache(),
                        stop_at_eos=stop_at_eos)  # fmt: skip
    acc = prop = gen = calls = 0
    outputs = []
    for p in prompts:
        out, st = dec.generate(p)
        outputs.append(out)
        acc, prop = acc + st.accepted, prop + st.proposed
        gen, calls = gen + st.n_generated, calls + st.target_calls
    figures = {
        "acceptance_rate": acc / max(prop, 1),
        "tokens_per_target_call": gen / max(calls, 1),
        "accepted": acc,
        "proposed": prop,
        "prompts": float(len(prompts)),
        "generated": float(gen),
    }
    if teacher_forced:
        figures["teacher_forced_top1"] = teacher_forced_top1(drafter, mapper, prompts, outputs)
    return figures, outputs
