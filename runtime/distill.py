"""``omnidraft distill BUNDLE``, the runtime half: the target teaches, the drafter learns.

``teach``: each request (``distill.requests``) is rendered with the target's chat template and
answered by the bundle's own target graph, decoding speculatively and greedily through the
bundle's decoder (``runtime.run.bundle_decoder``): greedy speculative output equals the target's
own output, so the replies are the target's at the speed the product already has. An observer
keeps the target's top-k at every reply token (what ``L_DM`` needs). Each reply is appended to the
target's replies file as it finishes (``distill.replies``); a request whose key the file already
holds is skipped, so a killed run resumes where it stopped.

``learn``: the replies are split by key into train and held-out (``replies.heldout``); the eager
drafter (``runtime.adapt.starting_drafter``: the drafter the bundle decodes with now) is measured
on the held-out replies (``reply_rows.reply_agreement``), trained on the others by the learner
``adapt`` uses (``distill.adapt.train_offline``), and measured again. Publishing (the exporters'
job: ``omnidraft_deploy.cli.distill``) happens only when the held-out agreement rose.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from omnidraft_deploy.runtime.adapt import starting_drafter
from omnidraft_deploy.runtime.bundle import OpenBundle
from omnidraft_deploy.runtime.run import bundle_decoder

from omnidraft_deploy.distill.adapt import AdaptConfig, TrainReport, make_distiller, train_offline
from omnidraft_deploy.distill.replies import Reply, append_reply, heldout, load_replies, request_key
from omnidraft_deploy.distill.reply_rows import held_rows, reply_agreement, reply_observations
from omnidraft_deploy.distill.requests import Request
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig

Progress = Callable[[Iterable[int]], Iterable[int]]


class TopKRows:
    """Decoder observer: the committed target ids and the target's top-k at each."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.topk_ids: list[list[int]] = []
        self.topk_probs: list[list[float]] = []

    def __call__(self, context: list[int], new: list[int], ids: torch.Tensor,
                 probs: torch.Tensor) -> None:  # fmt: skip
        self.ids += new
        self.topk_ids += ids.tolist()
        self.topk_probs += [[round(p, 6) for p in row] for row in probs.tolist()]


def teacher_name(bundle: OpenBundle) -> str:
    """``bundle:`` and the first 16 hex digits of the target graph's sha256."""
    return "bundle:" + bundle.manifest.files[bundle.manifest.graphs["target"].file].sha256[:16]


def prompt_ids(bundle: OpenBundle, text: str, chat: bool) -> list[int]:
    """``text`` as the target reads it: rendered with its chat template when ``chat``."""
    tok = bundle.tokenizer
    if not chat:
        return [int(i) for i in tok.encode(text)]
    from omnidraft_deploy.vocab.bundle_tokenizer import render_chat

    source = getattr(tok, "chat_template_source", None)
    return [int(i) for i in tok.encode(render_chat(tok.chat_template, text, source=source))]


def answer(bundle: OpenBundle, prompt: list[int], max_new_tokens: int,
           profile: CostProfile | None) -> tuple[list[int], TopKRows]:  # fmt: skip
    """The target's greedy reply to ``prompt`` (cut before its first end-of-turn id) and the
    top-k rows of it."""
    room = bundle.target.max_seq_len - len(prompt)
    cfg = DecodeConfig(max_new_tokens=min(max_new_tokens, room))
    rows, decoder = TopKRows(), bundle_decoder(bundle, cfg.max_new_tokens, cfg, profile)
    out, _ = decoder.generate(prompt, observer=rows)
    stop = set(bundle.mapper.target_eos)
    end = next((i for i, t in enumerate(out) if t in stop), len(out))
    if rows.ids[: len(out)] != out:  # the observer saw another sequence: keep the reply only
        rows = TopKRows()
    return out[:end], rows


@dataclass(frozen=True)
class TeachReport:
    had: int  # replies of this teacher in the file before this run
    taught: int  # replies added by this run
    skipped: int  # requests too long for the target's context
    tokens: int  # reply tokens added
    seconds: float
    stopped_early: bool  # the deadline passed before the budget was reached


def todo(bundle: OpenBundle, requests: Sequence[Request], path: Path, *, budget: int,
         max_new_tokens: int, chat: bool) -> tuple[list[tuple[str, Request]], int]:  # fmt: skip
    """(key, request) still to answer, at most ``budget`` replies in the file in all, and how many
    this teacher's replies the file already holds."""
    teacher = teacher_name(bundle)
    done = {r.key for r in load_replies(path) if r.teacher == teacher}
    keyed = [(request_key(r.task, r.text, max_new_tokens, chat), r) for r in requests]
    have = sum(k in done for k, _ in keyed)
    left = [(k, r) for k, r in dict(keyed).items() if k not in done]  # one answer per key
    return left[: max(0, budget - have)], have


def teach(bundle: OpenBundle, todo_list: Sequence[tuple[str, Request]], path: Path, *,
          max_new_tokens: int, chat: bool, had: int = 0, deadline: float | None = None,
          profile: CostProfile | None = None, progress: Progress = lambda r: r) -> TeachReport:  # fmt: skip
    """Answer ``todo_list`` (``todo``) in order, appending each reply to ``path`` as it finishes
    (module docstring); stops early once ``time.monotonic()`` passes ``deadline``."""
    t0, taught, skipped, tokens, teacher = time.perf_counter(), 0, 0, 0, teacher_name(bundle)
    for i in progress(range(len(todo_list))):
        if deadline is not None and time.monotonic() > deadline:
            return TeachReport(had, taught, skipped, tokens, time.perf_counter() - t0, True)
        key, req = todo_list[i]
        prompt = prompt_ids(bundle, req.text, chat)
        if len(prompt) >= bundle.target.max_seq_len:
            skipped += 1
            continue
        reply, rows = answer(bundle, prompt, max_new_tokens, profile)
        n = len(reply)
        append_reply(path, Reply(key, req.task, req.text, teacher, prompt, reply,
                                 rows.topk_ids[:n] if rows.ids else [],
                                 rows.topk_probs[:n] if rows.ids else []))  # fmt: skip
        taught, tokens = taught + 1, tokens + n
    return TeachReport(had, taught, skipped, tokens, time.perf_counter() - t0, False)


@dataclass(frozen=True)
class Learned:
    drafter: Transformer  # trained (its weights are what would be published)
    before: float  # held-out agreement of the drafter the bundle decodes with now
    after: float
    train_replies: int
    held_replies: int
    report: TrainReport

    @property
    def better(self) -> bool:
        return self.after > self.before


def learn(bundle: OpenBundle, replies: Sequence[Reply], cfg: AdaptConfig, *, epochs: float,
          state: Path | None, deadline: float | None = None,
          progress: Progress = lambda r: r) -> Learned:  # fmt: skip
    """Measure, train, measure (module docstring). Needs two replies at least."""
    train, held = heldout([r for r in replies if r.prompt and r.reply])
    if not train or not held:
        raise ValueError(f"{len(train) + len(held)} non-empty replies: distill needs at least 2 "
                         "(one to train on, one held out)")  # fmt: skip
    drafter = starting_drafter(bundle, state)
    seq_len = min(cfg.seq_len, drafter.args.max_seq_len)
    rows = held_rows(bundle.mapper, held, seq_len)
    before = reply_agreement(drafter, rows)
    obs = reply_observations(train, max_context=seq_len, vocab=bundle.mapper.target_vocab_size)
    cfg = dataclasses.replace(cfg, guard=False, buffer_size=len(obs), seq_len=seq_len)
    distiller = make_distiller(drafter, bundle.mapper, cfg)
    report = train_offline(distiller, obs, epochs=epochs, deadline=deadline, progress=progress)
    after = reply_agreement(distiller.drafter, rows)
    return Learned(distiller.drafter, before, after, len(train), len(held), report)
