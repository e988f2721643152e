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
job: ``cli.main.publish_for``, passed in) happens only when the held-out agreement rose.

``distill_bundle`` is the verb's flow (``DistillRun``: its flags). ``--minutes`` bounds the whole
run: teaching stops taking requests at ``TEACH_SHARE`` of it, training at its end. A single-target
publish gives the bundle a new manifest, so a new id and default state folder: the replies file
goes with it, and the eager weights published are kept there (``runtime.adapted.save_distilled``)
so that the next run starts from the drafter the bundle holds.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from omnidraft_deploy.runtime.adapt import starting_drafter
from omnidraft_deploy.runtime.bundle import OpenBundle
from omnidraft_deploy.runtime.run import bundle_decoder

from omnidraft_deploy.bundle.folder import read_manifest
from omnidraft_deploy.bundle.targets import select
from omnidraft_deploy.distill.adapt import AdaptConfig, Learned, learn_replies
from omnidraft_deploy.distill.replies import (
    REPLIES,
    Reply,
    append_reply,
    load_replies,
    request_key,
)
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


def learn(bundle: OpenBundle, replies: Sequence[Reply], cfg: AdaptConfig, *, epochs: float,
          state: Path | None, deadline: float | None = None,
          progress: Progress = lambda r: r) -> Learned:  # fmt: skip
    """Measure, train, measure (module docstring), from the drafter the bundle decodes with."""
    return learn_replies(starting_drafter(bundle, state), bundle.mapper, replies, cfg,
                         epochs=epochs, deadline=deadline, progress=progress)  # fmt: skip


@dataclass(frozen=True)
class DistillRun:
    """``omnidraft distill``'s settings (every field a flag)."""

    bundle: Path
    target: str | None
    state: Path  # the target's state folder
    requests: Sequence[Request]
    cfg: AdaptConfig
    replies: int = 200
    minutes: float | None = None
    max_new_tokens: int = 96
    chat: bool = True
    threads: int | None = None
    epochs: float = 2.0
    teach_only: bool = False


TEACH_SHARE = 0.7  # of --minutes: teaching; the rest trains
Publish = Callable[[Transformer], Path]  # the new drafter -> where it went (the exporters' job)


def distill_bundle(run: DistillRun, *, publish: Publish, restate: Callable[[], Path],
                   bar: Callable[[str, str], Progress], err: TextIO) -> str:  # fmt: skip
    """Teach, learn and, when better, ``publish`` (module docstring); returns the result line.
    ``restate``: the target's state folder after a publish (a single-target bundle's id changes
    with its manifest); ``bar(desc, unit)``: a progress bar over an iterable (stderr)."""
    from omnidraft_deploy.runtime.adapted import check_swappable, save_distilled
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.run import decoding_profile

    t0, path = time.monotonic(), run.state / REPLIES
    stop = None if run.minutes is None else t0 + 60 * run.minutes
    if run.threads:
        torch.set_num_threads(run.threads)  # the learner's FreeCoreThreads gives way below it
    bundle = open_bundle(run.bundle, target=run.target, state=run.state, threads=run.threads)
    if bundle.manifest.targets and not run.teach_only:  # refused before any teaching
        check_swappable(bundle.manifest, bundle.root)
    chat = run.chat and bool(getattr(bundle.tokenizer, "chat_template", None))
    left, had = todo(bundle, run.requests, path, budget=run.replies,
                     max_new_tokens=run.max_new_tokens, chat=chat)  # fmt: skip
    print(f"distill: {had} replies in {path}, {len(left)} to ask ({len(run.requests)} requests, "
          f"{'chat template' if chat else 'plain text'}, teacher: the bundle's target)", file=err,
          flush=True)  # fmt: skip
    if left:
        taught = teach(bundle, left, path, max_new_tokens=run.max_new_tokens, chat=chat, had=had,
                       deadline=None if stop is None else t0 + TEACH_SHARE * (stop - t0),
                       profile=decoding_profile(bundle, run.state), progress=bar("teach", "reply"))  # fmt: skip
        print(f"distill: taught {taught.taught} replies ({taught.tokens} tokens) in "
              f"{taught.seconds:.0f} s{'; time budget reached' if taught.stopped_early else ''}"
              f"{f'; {taught.skipped} longer than the context skipped' if taught.skipped else ''}",
              file=err, flush=True)  # fmt: skip
    if run.teach_only:
        return f"replies: {path}"
    teacher = teacher_name(bundle)
    replies = [r for r in load_replies(path) if r.teacher == teacher]
    got = learn(bundle, replies, run.cfg, epochs=run.epochs, state=run.state, deadline=stop,
                progress=bar("train", "step"))  # fmt: skip
    r = got.report
    print(f"held-out agreement ({got.held_replies} replies held out, {got.train_replies} trained "
          f"on, {r.optimizer_steps} steps in {r.seconds:.0f} s"
          f"{', time budget reached' if r.stopped_early else ''}): before {got.before:.3f} -> "
          f"after {got.after:.3f}", flush=True)  # fmt: skip
    if not got.better:
        return "not published (held-out agreement did not rise); the bundle's drafter is unchanged"
    print("distill: publishing the new drafter", file=err, flush=True)
    written = publish(got.drafter)
    if not bundle.manifest.targets:  # a new bundle id: its state folder may be another
        new_state = restate()
        save_distilled(select(read_manifest(run.bundle), run.target), new_state, got.drafter)
        carry(path, new_state)
    return f"published: {written}"


def carry(replies: Path, state: Path) -> None:
    """The replies file into the state folder ``state`` if it is not there (copied whole, then
    renamed into place): a single-target publish moves the bundle's default state folder."""
    dest = state / replies.name
    if dest.resolve() == replies.resolve() or not replies.exists():
        return
    tmp = state / f".{replies.name}.tmp"
    shutil.copyfile(replies, tmp)
    tmp.replace(dest)
