"""Online distillation: a replay buffer fed by the decoder, and the learner that drains it.

Data flow (OmniDraft Sec. 3.3, online adaptation): after every verification step the speculative
decoder calls ``observe(context_ids, new_ids, topk_ids (n, k), topk_probs (n, k))`` with TARGET ids
(the committed tokens and the target's top-k at each committed position). ``ReplayBuffer`` keeps
the last / a uniform sample of these steps. ``OnlineDistiller.update()`` samples ``batch_size``
steps, translates them into drafter rows (``align.build_example``) and takes ``steps_per_update``
optimiser steps of ``L_DM + lam * L_Ngram`` with ``Transformer.forward_train``.

Held-out guard (``guard=True``): observations of the traffic since the last update are held out
of the buffer until that update has run; the update trains on the older observations, and is kept
only if it lowers the hybrid loss on the held-out ones (otherwise weights and optimiser state go
back). An update must generalise to text it has not seen, so a few prompts of adaptation cannot
overfit the drafter to them (measured on the early-exit drafter without the guard: acceptance
on held-out prompts 0.098 after offline distillation, 0.090 after six prompts of adaptation).

Thread safety: the buffer is guarded by its own lock (``observe`` from the decoding thread,
``sample`` from the learner). The learner trains a private copy of the drafter; the decoder's
drafter is only written in ``_publish``, which copies the trained weights in place while holding
``OnlineDistiller.weights_lock``. The decoder uses the drafter read-only; when ``update()`` runs in a
background thread, wrap each drafter forward in ``with distiller.weights_lock:`` so a forward never
sees half-copied weights. Called between requests, no locking is needed by the caller.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import threading
import time
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from omnidraft_deploy.distill.align import MapperLike, build_example, dm_inverse, stack_examples
from omnidraft_deploy.distill.losses import hybrid_loss_rows, ngram_loss
from omnidraft_deploy.distill.offline import freeze_all_but_last
from omnidraft_deploy.host.threads import FreeCoreThreads
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observation:
    context_ids: tuple[int, ...]  # target ids before the step (left-truncated)
    new_ids: tuple[int, ...]  # target ids committed by the step
    topk_ids: Tensor  # (n, k) int64 target ids
    topk_probs: Tensor  # (n, k) float32


def observation(context_ids: list[int], new_ids: list[int], topk_ids: Tensor,
                topk_probs: Tensor, max_context: int) -> Observation:  # fmt: skip
    """A checked, detached ``Observation`` (context left-truncated to ``max_context`` ids)."""
    if topk_ids.shape != topk_probs.shape or topk_ids.shape[0] != len(new_ids):
        raise ValueError(
            f"top-k shapes {tuple(topk_ids.shape)}/{tuple(topk_probs.shape)} do "
            f"not match {len(new_ids)} new tokens"
        )
    ctx = tuple(context_ids[-max_context:]) if max_context else ()
    return Observation(ctx, tuple(new_ids), topk_ids.detach().to(torch.long).clone(),
                       topk_probs.detach().float().clone())  # fmt: skip


class BufferPolicy(StrEnum):
    FIFO = "fifo"  # keep the most recent observations (tracks drift)
    RESERVOIR = "reservoir"  # uniform sample of everything seen (stable mixture)


class ReplayBuffer:
    """Bounded store of decoder observations; an instance is a valid decoder observer."""

    def __init__(
        self,
        capacity: int = 512,
        *,
        policy: BufferPolicy = BufferPolicy.FIFO,
        max_context: int = 256,
        seed: int = 0,
    ) -> None:
        if capacity < 1 or max_context < 0:
            raise ValueError(
                f"need capacity >= 1 and max_context >= 0, got {capacity}, {max_context}"
            )
        self.capacity, self.policy, self.max_context = capacity, BufferPolicy(policy), max_context
        self._items: list[Observation] = []
        self._next = 0  # FIFO write slot once full
        self.n_seen = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def observe(
        self, context_ids: list[int], new_ids: list[int], topk_ids: Tensor, topk_probs: Tensor
    ) -> None:
        """Decoder callback; ``topk_ids / topk_probs: (len(new_ids), k)``."""
        self.add(observation(context_ids, new_ids, topk_ids, topk_probs, self.max_context))

    def add(self, obs: Observation) -> None:
        with self._lock:
            self.n_seen += 1
            if len(self._items) < self.capacity:
                self._items.append(obs)
            elif self.policy is BufferPolicy.FIFO:
                self._items[self._next] = obs
                self._next = (self._next + 1) % self.capacity
            else:
                slot = self._rng.randrange(self.n_seen)
                if slot < self.capacity:
                    self._items[slot] = obs

    __call__ = observe

    def sample(self, n: int) -> list[Observation]:
        """``min(n, len)`` distinct observations chosen uniformly."""
        with self._lock:
            return self._rng.sample(self._items, min(n, len(self._items)))

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


@dataclass(frozen=True)
class UpdateStats:
    steps: int
    loss: float  # mean hybrid loss over the steps (before each step)
    dm_rows: int
    ngram_spans: int
    seconds: float
    kept: bool = True  # False: the held-out guard rolled the steps back
    heldout_before: float = float("nan")  # guard: held-out loss before / after the steps
    heldout_after: float = float("nan")


class OnlineDistiller:
    """Trains ``drafter`` online from a ``ReplayBuffer``; see the module docstring on threads."""

    def __init__(
        self,
        drafter: Transformer,
        mapper: MapperLike,
        *,
        lr: float = 1e-3,
        lam: float = 0.5,
        batch_size: int = 8,
        steps_per_update: int = 1,
        optimizer: str = "adamw",
        seq_len: int = 128,
        buffer: ReplayBuffer | None = None,
        guard: bool = False,
        seqkd: float = 0.0,
        train_layers: int = 0,
    ) -> None:
        if batch_size < 1 or steps_per_update < 1 or lr <= 0 or lam < 0 or seqkd < 0:
            raise ValueError(
                f"bad hyper-parameters: lr={lr} lam={lam} batch_size={batch_size} "
                f"steps_per_update={steps_per_update} seqkd={seqkd}"
            )
        if mapper.draft_vocab_size != drafter.args.vocab_size:
            raise ValueError(
                f"mapper drafter vocab {mapper.draft_vocab_size} != model {drafter.args.vocab_size}"
            )
        self.drafter, self.mapper, self.lam, self.seqkd = drafter, mapper, lam, seqkd
        self.batch_size, self.steps_per_update = batch_size, steps_per_update
        self.seq_len = min(seq_len, drafter.args.max_seq_len)
        self.buffer = buffer if buffer is not None else ReplayBuffer()
        self.weights_lock = threading.Lock()
        self._inverse = dm_inverse(mapper.draft_to_target, mapper.target_vocab_size)
        self._student = copy.deepcopy(drafter).train()
        if train_layers:  # autograd starts at the first trained block (``offline``)
            freeze_all_but_last(self._student, train_layers)
        self._opt = _make_optimizer(optimizer, self._student, lr)
        self._update_lock = threading.Lock()  # one update() at a time
        self._threads = FreeCoreThreads()  # torch threads of each update: the free cores
        self.guard = guard
        self._held: list[Observation] = []  # guard: traffic since the last update
        self._held_lock = threading.Lock()  # observe() must not wait for a running update

    def observe(
        self, context_ids: list[int], new_ids: list[int], topk_ids: Tensor, topk_probs: Tensor
    ) -> None:
        """Forward to the buffer (guard: hold it out until the next update), so the distiller
        itself can be passed as the observer."""
        if not self.guard:
            self.buffer.observe(context_ids, new_ids, topk_ids, topk_probs)
            return
        obs = observation(context_ids, new_ids, topk_ids, topk_probs, self.buffer.max_context)
        with self._held_lock:
            self._held.append(obs)

    __call__ = observe

    def batch_loss(self, model: Transformer, batch: dict[str, Tensor]) -> Tensor:
        """Sum over the batch rows of ``hybrid_loss_rows`` (weights are batch-normalised), plus
        ``seqkd`` times the hard-label cross-entropy on every supervised row (sequence-level KD:
        the committed token itself, whatever the target's probability of it)."""
        total = torch.zeros(())
        rows = ((batch["dm_weight"] > 0) | (batch["ngram_weight"] > 0)).float()
        hard = rows / rows.sum().clamp_min(1.0)
        for b in range(batch["draft_ids"].shape[0]):
            logits = model.forward_train(batch["draft_ids"][b : b + 1])  # (1, T, V_d)
            if self.seqkd:
                total = total + self.seqkd * ngram_loss(
                    logits, batch["next_draft_ids"][b : b + 1], hard[b : b + 1]
                )
            total = total + hybrid_loss_rows(
                logits,
                batch["topk_draft_ids"][b : b + 1],
                batch["topk_probs"][b : b + 1],
                batch["dm_weight"][b : b + 1],
                batch["next_draft_ids"][b : b + 1],
                batch["ngram_weight"][b : b + 1],
                self.lam,
            )
        return total

    def make_batch(self, observations: list[Observation]) -> tuple[dict[str, Tensor], int, int]:
        examples = [
            build_example(
                self.mapper,
                list(o.context_ids),
                list(o.new_ids),
                o.topk_ids,
                o.topk_probs,
                seq_len=self.seq_len,
                inverse=self._inverse,
            )
            for o in observations
        ]
        return (
            stack_examples(examples),
            sum(e.dm_rows for e in examples),
            sum(e.ngram_spans for e in examples),
        )

    def update(self) -> UpdateStats:
        """Take ``steps_per_update`` steps on fresh samples, then publish the weights (guard:
        only if the held-out loss went down; the held-out traffic then joins the buffer)."""
        with self._update_lock, self._threads:
            return self._guarded() if self.guard else self._steps(publish=True)

    def _guarded(self) -> UpdateStats:
        with self._held_lock:
            held, self._held = self._held, []
        held_batch = self._heldout_batch(held)
        if held_batch is None or len(self.buffer) == 0:
            self._release(held)
            return UpdateStats(0, float("nan"), 0, 0, 0.0)
        before, saved = self._heldout_loss(held_batch), self._snapshot()
        stats = self._steps(publish=False)
        after = self._heldout_loss(held_batch)
        kept = stats.steps > 0 and after < before
        if kept:
            self._publish()
        else:  # the decoder's drafter still holds the weights the student goes back to
            self._restore(saved)
        self._release(held)
        log.debug("guarded update: held-out loss %.4f -> %.4f, kept %s", before, after, kept)
        return dataclasses.replace(stats, kept=kept, heldout_before=before, heldout_after=after)

    def _heldout_batch(self, held: list[Observation]) -> dict[str, Tensor] | None:
        if not held:
            return None
        batch, dm_rows, spans = self.make_batch(held)
        return batch if self._has_signal(dm_rows, spans) else None

    def _has_signal(self, dm_rows: int, spans: int) -> bool:
        """Whether a batch has rows the hybrid loss reads (DM rows, or n-gram spans at lam > 0)."""
        return dm_rows > 0 or (spans > 0 and self.lam > 0)

    @torch.no_grad()
    def _heldout_loss(self, batch: dict[str, Tensor]) -> float:
        return float(self.batch_loss(self._student.eval(), batch))

    def _snapshot(self) -> tuple[list[Tensor], dict]:
        params = [p.detach().clone() for p in self._student.parameters() if p.requires_grad]
        return params, copy.deepcopy(self._opt.state_dict())

    def _restore(self, saved: tuple[list[Tensor], dict]) -> None:
        params, opt_state = saved
        with torch.no_grad():
            trainable = [p for p in self._student.parameters() if p.requires_grad]
            for dst, src in zip(trainable, params, strict=True):
                dst.copy_(src)
        self._opt.load_state_dict(opt_state)

    def _release(self, held: list[Observation]) -> None:
        for o in held:
            self.buffer.add(o)

    def _steps(self, *, publish: bool) -> UpdateStats:
        """``steps_per_update`` optimiser steps on buffer samples (caller holds the update lock)."""
        t0, losses, n_dm, n_ng = time.perf_counter(), [], 0, 0
        self._student.train()
        for _ in range(self.steps_per_update):
            obs = self.buffer.sample(self.batch_size)
            if not obs:
                break
            batch, dm_rows, spans = self.make_batch(obs)
            if not self._has_signal(dm_rows, spans):
                continue
            self._opt.zero_grad(set_to_none=True)
            loss = self.batch_loss(self._student, batch)
            loss.backward()
            self._opt.step()
            losses.append(float(loss.detach()))
            n_dm, n_ng = n_dm + dm_rows, n_ng + spans
        if losses and publish:
            self._publish()
        mean = sum(losses) / len(losses) if losses else float("nan")
        stats = UpdateStats(len(losses), mean, n_dm, n_ng, time.perf_counter() - t0)
        log.debug("online update: %s", stats)
        return stats

    def _publish(self) -> None:
        """Copy the student's weights into the decoder's drafter in place, under the lock."""
        with torch.no_grad(), self.weights_lock:
            for dst, src in zip(self.drafter.parameters(), self._student.parameters(), strict=True):
                dst.copy_(src)

    def load_student_state(self, state: dict[str, Tensor]) -> None:
        """Replace the student's weights (e.g. from an exported train step) and publish them."""
        with self._update_lock:
            self._student.load_state_dict(state, strict=False)
            self._publish()


def _make_optimizer(name: str, model: Transformer, lr: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise KeyError(f"unknown optimizer {name!r}; choose from ['adamw', 'sgd']")
