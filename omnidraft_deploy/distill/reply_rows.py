"""The teacher's replies as the drafter sees them: training observations and held-out agreement.

With greedy verification a drafted token is accepted exactly when it is the target's argmax, so
what a drafter should imitate is the target's own greedy reply to the kind of request a user
sends (sequence-level KD, Kim & Rush 2016, arXiv:1606.07947).

- ``reply_observations``: each reply becomes one ``online.Observation`` (the prompt as context,
  the reply as the committed tokens, the target's top-k at each): the rows the online learner
  builds from live traffic (``align.build_example``), so ``distill`` and ``adapt`` train the same
  ``L_DM + lam * L_Ngram`` with the same learner (``distill.adapt``). A reply without top-k (older
  files, a llama.cpp teacher) is supervised by its own token with probability 1, padded to ``k``.
- ``kd_row`` / ``reply_agreement``: the held-out measure. The decoder's view of prompt + reply in
  drafter ids (``VocabMapper.drafter_context`` for the prompt, ``target_to_draft`` for each reply
  token); agreement is the share of reply positions where the drafter's argmax is the next
  drafter id, teacher-forced (``benchmarks/kd_drafter`` reported the same figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from omnidraft_deploy.distill.online import Observation, observation
from omnidraft_deploy.distill.replies import Reply
from omnidraft_deploy.reference.model import Transformer

TOPK = 8  # the decoder's observer top-k (``DecodeConfig.observer_topk``)


class SpellingMapper(Protocol):
    """What ``kd_row`` needs of ``vocab.mapper.VocabMapper``."""

    def drafter_context(self, target_ids: list[int]) -> list[int]: ...

    def target_to_draft(self, target_id: int) -> list[int]: ...


def _topk(reply: Reply, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, k)`` ids and probabilities of ``reply`` (one-hot on the reply token when absent)."""
    n = len(reply.reply)
    ids, probs = torch.zeros(n, k, dtype=torch.long), torch.zeros(n, k)
    if reply.topk_ids:
        got = torch.tensor(reply.topk_ids, dtype=torch.long)[:, :k]
        ids[:, : got.shape[1]] = got
        probs[:, : got.shape[1]] = torch.tensor(reply.topk_probs, dtype=torch.float32)[:, :k]
    else:
        ids[:, 0], probs[:, 0] = torch.tensor(reply.reply, dtype=torch.long), 1.0
    return ids, probs


def reply_observations(
    replies: Sequence[Reply], *, max_context: int, vocab: int, k: int = TOPK
) -> list[Observation]:
    """One observation per non-empty reply; ids at or above ``vocab`` (padded embedding rows of
    the target) are dropped from the top-k (probability 0)."""
    out = []
    for r in replies:
        if not r.reply or not r.prompt:
            continue
        ids, probs = _topk(r, k)
        keep = ids < vocab
        ids, probs = torch.where(keep, ids, 0), torch.where(keep, probs, 0.0)
        out.append(observation(r.prompt, r.reply, ids, probs, max_context))
    return out


@dataclass(frozen=True)
class KDRow:
    """One reply as the drafter reads it: ``ids`` (drafter ids), the reply from ``ids[start:]``."""

    ids: tuple[int, ...]
    start: int  # index of the first reply drafter id (>= 1: there is always a context)


def kd_row(mapper: SpellingMapper, prompt: list[int], reply: list[int], max_len: int) -> KDRow:
    """The drafter's view of target ``prompt`` + ``reply`` ids, cut to ``max_len`` drafter ids
    (the prompt is cut from the left: the reply is what is measured)."""
    ctx = mapper.drafter_context(prompt)
    out = [d for t in reply for d in mapper.target_to_draft(t)]
    if not ctx or not out:
        raise ValueError("kd_row: an empty prompt or reply")
    keep = max(1, max_len - len(out))
    ctx = ctx[-keep:]
    ids = (ctx + out)[:max_len]
    return KDRow(tuple(ids), len(ctx))


@torch.no_grad()
def reply_agreement(model: Transformer, rows: Sequence[KDRow]) -> float:
    """Share of reply positions where the drafter's argmax is the next reply id (teacher-forced)."""
    hit = total = 0
    was_training = model.training
    model.eval()
    for row in rows:
        ids = torch.tensor(row.ids)
        pred = model.forward_train(ids[None])[0][row.start - 1 : -1].argmax(-1)
        hit += int((pred == ids[row.start :]).sum())
        total += len(ids) - row.start
    model.train(was_training)
    return hit / max(1, total)


def held_rows(mapper: SpellingMapper, replies: Sequence[Reply], max_len: int) -> list[KDRow]:
    """``kd_row`` of every reply whose prompt and reply the drafter can spell."""
    rows = []
    for r in replies:
        ctx, out = (
            mapper.drafter_context(r.prompt),
            [d for t in r.reply for d in mapper.target_to_draft(t)],
        )
        if ctx and out:
            rows.append(kd_row(mapper, r.prompt, r.reply, max_len))
    return rows
