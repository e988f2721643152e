"""Online adaptation as one loop: generate with the learner as observer, update, publish.

``adapt_stream`` is the loop every caller shares (``omnidraft adapt BUNDLE``,
``benchmarks/headline_adapt.py``, ``benchmarks/distill_table.py``): for each prompt (target ids)
the speculative decoder generates with ``OnlineDistiller`` as its observer, then ``update()``
trains the learner's private copy and copies the weights into the decoder's eager drafter
(``OnlineDistiller._publish``). ``publish`` (optional) receives the adapted drafter after the last
prompt, e.g. to swap the weights into an exported graph and save the bundle atomically
(``exporters.bundle``); it is a callback because the core never imports exporters.

``train_offline`` is the same learner on replies collected beforehand (``omnidraft distill``:
the target's replies to a request set, ``distill.reply_rows``): every observation goes into the
buffer, then ``update()`` runs until the epochs are done or the deadline passes. One learner, one
loss (``L_DM + lam * L_Ngram``, plus ``seqkd`` times the hard-label term) for both verbs.

``make_distiller`` builds the learner from an ``AdaptConfig`` (frozen, every field a CLI flag or
a benchmark setting); ``AdaptConfig.optimizer`` is ``adamw`` for the PyTorch step, ``sgd`` where
the same update must match an exported train step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from omnidraft_deploy.distill.align import MapperLike
from omnidraft_deploy.distill.online import (
    BufferPolicy,
    Observation,
    OnlineDistiller,
    ReplayBuffer,
)
from omnidraft_deploy.distill.replies import Reply
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.speculative.decoder import SpeculativeDecoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdaptConfig:
    lr: float = 1e-3
    lam: float = 1.0  # weight of L_Ngram in L_DM + lam * L_Ngram
    batch_size: int = 4  # observations per optimiser step
    steps_per_update: int = 4  # optimiser steps after each prompt
    optimizer: str = "adamw"  # adamw | sgd
    seq_len: int = 96  # drafter-token window of one training row
    buffer_size: int = 256
    buffer_policy: BufferPolicy = BufferPolicy.FIFO
    guard: bool = True  # keep an update only if it lowers the loss on traffic it has not seen
    seqkd: float = 0.0  # weight of the hard-label (sequence-level KD) term on top of the hybrid
    train_layers: int = 0  # > 0: only the last blocks and the final norm train

    def __post_init__(self) -> None:
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer {self.optimizer!r} not one of adamw, sgd")
        if self.lr <= 0 or self.lam < 0 or self.batch_size < 1 or self.steps_per_update < 1:
            raise ValueError(f"bad adaptation settings: {self}")
        if self.seqkd < 0 or self.train_layers < 0:
            raise ValueError(f"seqkd {self.seqkd} / train_layers {self.train_layers} below 0")
        if self.seq_len < 2 or self.buffer_size < 1:
            raise ValueError(f"seq_len {self.seq_len} / buffer_size {self.buffer_size} too small")


@dataclass(frozen=True)
class AdaptReport:
    acceptance: list[float] = field(default_factory=list)  # per prompt, while adapting
    optimizer_steps: int = 0
    seconds: float = 0.0
    rolled_back: int = 0  # updates the held-out guard undid (``AdaptConfig.guard``)

    @property
    def mean_acceptance(self) -> float:
        return sum(self.acceptance) / max(1, len(self.acceptance))


def make_distiller(drafter: Transformer, mapper: MapperLike, cfg: AdaptConfig) -> OnlineDistiller:
    """The learner for ``drafter`` (its weights are updated in place by every ``update()``)."""
    buffer = ReplayBuffer(cfg.buffer_size, policy=cfg.buffer_policy, max_context=cfg.seq_len)
    return OnlineDistiller(drafter, mapper, lr=cfg.lr, lam=cfg.lam, batch_size=cfg.batch_size,
                           steps_per_update=cfg.steps_per_update, optimizer=cfg.optimizer,
                           seq_len=cfg.seq_len, buffer=buffer, guard=cfg.guard, seqkd=cfg.seqkd,
                           train_layers=cfg.train_layers)  # fmt: skip


def adapt_stream(
    decoder: SpeculativeDecoder,
    distiller: OnlineDistiller,
    prompts: Sequence[list[int]],
    *,
    update: Callable[[], int] | None = None,
    publish: Callable[[Transformer], None] | None = None,
) -> AdaptReport:
    """Generate each prompt (target ids) with ``distiller`` observing, update after each.

    ``decoder``'s drafter must run ``distiller.drafter`` (e.g. ``EagerLM`` of it), so each prompt
    drafts with the weights learned so far. ``update`` replaces the PyTorch step
    (``distiller.update``), e.g. by an exported train step that then loads the weights into
    ``distiller.drafter``; it returns the optimiser steps it took. Returns the acceptance per prompt.
    """
    if update is not None and distiller.guard:
        raise ValueError("the held-out guard runs in distiller.update(); an external update "
                         "step needs a distiller made with AdaptConfig(guard=False)")  # fmt: skip
    t0, trace, steps, rolled_back = time.perf_counter(), [], 0, 0
    for i, prompt in enumerate(prompts):
        _, stats = decoder.generate(prompt, observer=distiller)
        trace.append(stats.acceptance_rate)
        if update is not None:
            steps += update()
        else:
            upd = distiller.update()
            steps, rolled_back = steps + upd.steps, rolled_back + (not upd.kept)
        log.info("adapt %d/%d: acceptance %.3f", i + 1, len(prompts), stats.acceptance_rate)
    if publish is not None:
        publish(distiller.drafter)
    return AdaptReport(trace, steps, time.perf_counter() - t0, rolled_back)


@dataclass(frozen=True)
class TrainReport:
    losses: list[float]  # mean hybrid loss of each update
    optimizer_steps: int
    seconds: float
    planned_updates: int
    stopped_early: bool  # the deadline passed first


def train_offline(
    distiller: OnlineDistiller,
    observations: Sequence[Observation],
    *,
    epochs: float,
    deadline: float | None = None,
    progress: Callable[[range], Iterable[int]] = lambda r: r,
) -> TrainReport:
    """Train on ``observations`` for ``epochs`` passes (batches drawn at random from them), or
    until ``time.monotonic()`` passes ``deadline``; the weights go into ``distiller.drafter``."""
    if distiller.guard:
        raise ValueError("train_offline holds nothing out itself: make the distiller with "
                         "AdaptConfig(guard=False) and measure on a held-out split")  # fmt: skip
    if not observations or epochs <= 0:
        raise ValueError(f"need observations and epochs > 0, got {len(observations)}, {epochs}")
    if distiller.buffer.capacity < len(observations):
        raise ValueError(f"buffer of {distiller.buffer.capacity} for {len(observations)} replies")
    for obs in observations:
        distiller.buffer.add(obs)
    per_update = distiller.batch_size * distiller.steps_per_update
    planned = max(1, math.ceil(epochs * len(observations) / per_update))
    t0, losses, steps, early = time.perf_counter(), [], 0, False
    for _ in progress(range(planned)):
        if deadline is not None and time.monotonic() > deadline:
            early = True
            break
        upd = distiller.update()
        steps += upd.steps
        if upd.steps:
            losses.append(upd.loss)
    return TrainReport(losses, steps, time.perf_counter() - t0, planned, early)


@dataclass(frozen=True)
class Learned:
    drafter: Transformer  # trained (its weights are what would be published)
    before: float  # held-out agreement of the drafter as it came
    after: float
    train_replies: int
    held_replies: int
    report: TrainReport

    @property
    def better(self) -> bool:
        return self.after > self.before


def learn_replies(
    drafter: Transformer,
    mapper: MapperLike,
    replies: Sequence[Reply],
    cfg: AdaptConfig,
    *,
    epochs: float,
    deadline: float | None = None,
    progress: Callable[[range], Iterable[int]] = lambda r: r,
) -> Learned:
    """Split ``replies`` (``replies.heldout``), measure the held-out agreement of ``drafter``,
    train it in place on the others (``train_offline``), measure again. Needs two replies."""
    from omnidraft_deploy.distill.replies import heldout
    from omnidraft_deploy.distill.reply_rows import held_rows, reply_agreement, reply_observations

    train, held = heldout([r for r in replies if r.prompt and r.reply])
    if not train or not held:
        raise ValueError(f"{len(train) + len(held)} non-empty replies: distill needs at least 2 "
                         "(one to train on, one held out)")  # fmt: skip
    seq_len = min(cfg.seq_len, drafter.args.max_seq_len)
    rows = held_rows(mapper, held, seq_len)  # type: ignore[arg-type]
    before = reply_agreement(drafter, rows)
    obs = reply_observations(train, max_context=seq_len, vocab=mapper.target_vocab_size)
    cfg = dataclasses.replace(cfg, guard=False, buffer_size=len(obs), seq_len=seq_len)
    distiller = make_distiller(drafter, mapper, cfg)
    report = train_offline(distiller, obs, epochs=epochs, deadline=deadline, progress=progress)
    return Learned(drafter, before, reply_agreement(drafter, rows), len(train), len(held), report)
