"""The speculative decoding loop: draft -> map -> verify -> commit/rollback. Orchestration only.

This module handles TARGET-vocabulary ids only. The drafter's vocabulary lives behind
``CrossVocabDrafter`` and ``VocabMapper``; tokenizers appear only at the edges (CLI, benchmarks).

Target KV invariant: after every step the target cache holds ``committed[:-1]``; the next call feeds
``[committed[-1], *proposals]`` at position ``len(committed) - 1`` and reads the logits rows of those
inputs only (``tail_logits``), row ``i`` scoring the token after input ``i``. The first step is the
prompt's prefill: it feeds ``[*prompt, *proposals]`` at 0 and reads the same rows, so verifying the
first proposals costs a few prefill rows, not a call of its own (target-only decoding gets its
first token from its prefill too). Rejected positions need no undo: the next call starts at the
new ``len(committed) - 1`` and overwrites them (static cache, position-masked attention). Where
the cache still holds the prompt's first tokens from an earlier call (a served session's system
turn, an earlier turn of a chat), the prefill starts after them (``kv_reuse``), on both paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM, DraftLengthPolicy, last_logits, tail_logits
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.cost_learning import CostLearner
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen
from omnidraft_deploy.speculative.drafter import Mode, Proposal
from omnidraft_deploy.speculative.hybrid import HybridProposer, make_proposer
from omnidraft_deploy.speculative.kv_reuse import keep, reusable
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.speculative.sampling import logits_to_probs, sample
from omnidraft_deploy.speculative.stats import DecodeStats
from omnidraft_deploy.speculative.verify import accept_greedy, greedy_ids, non_finite_rows, verify
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)
Observer = Callable[[list[int], list[int], Tensor, Tensor], None]
"""observe(context_ids, new_ids, topk_ids (n, k), topk_probs (n, k)) after every step."""


@dataclass(frozen=True)
class DecodeConfig:
    mode: Mode = Mode.GREEDY
    temperature: float = 0.0  # 0 -> greedy; must be > 0 for exact / omnidraft
    max_new_tokens: int = 64
    eos_ids: tuple[int, ...] = ()
    vocab_limit: int | None = None  # ignore logits at ids >= this (padded embedding rows)
    top_p: float | None = None  # nucleus sampling: the law sampled is the target's top-p one
    observer_topk: int = 8
    # torch intra-op threads for the host maths while decoding (None: leave torch's setting).
    # 1 when the models are runtime graphs: a multi-threaded torch op between two ONNX Runtime
    # calls fights ORT's spinning pool for the same cores (runtime.run sets it).
    host_threads: int | None = None
    # follow the latencies the loop pays and price drafts with them (``cost_learning``); needs a
    # cost profile (the hybrid's or the cost-aware policy's)
    learn_costs: bool = False

    def __post_init__(self) -> None:
        greedy = self.mode is Mode.GREEDY
        if greedy != (self.temperature <= 0):
            raise ValueError(
                f"mode {self.mode.value} needs temperature "
                f"{'== 0' if greedy else '> 0'}, got {self.temperature}"
            )
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def _limit(logits: Tensor, limit: int | None) -> Tensor:
    """Check the target's logits and mask the rows past ``limit`` (padded vocabulary rows).

    NaN / +inf logits, or a row with nothing but -inf, raise: an overflow in the model or a broken
    graph would otherwise decode as token 0 in both the speculative and the target-only path, and
    the two would still "agree".
    """
    rows = logits.reshape(-1, logits.shape[-1])
    if not bool(torch.isfinite(rows.sum(-1)).all()):  # one pass in the common, all-finite case
        bad_rows = (torch.isnan(rows) | torch.isposinf(rows)).any(-1) | torch.isneginf(rows).all(-1)
        if bool(bad_rows.any()):  # -inf alone is a legal mask; NaN, +inf or all -inf is not
            raise non_finite_rows(bad_rows.nonzero().flatten().tolist())
    if limit is None or limit >= logits.shape[-1]:
        return logits
    masked = logits.clone()  # the caller's tensor is left as it was
    masked[..., limit:] = float("-inf")
    return masked


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (None: unchanged), restored after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n is not None:
            torch.set_num_threads(before)


def _wants_topk(observer: Observer | None) -> bool:
    """Observers may declare ``wants_topk = False`` (a text streamer without step stats): then
    the decoder skips the full-vocabulary softmax + top-k it would compute for them."""
    return observer is not None and bool(getattr(observer, "wants_topk", True))


def _finish(new_ids: list[int], cfg: DecodeConfig) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) or at max_new_tokens, whichever comes first (an EOS past the
    budget is cut like any token: target-only never reaches it); return (ids, done)."""
    ids = new_ids[: cfg.max_new_tokens]
    for i, t in enumerate(ids):
        if t in cfg.eos_ids:
            return ids[: i + 1], True
    return ids, len(new_ids) >= cfg.max_new_tokens


def check_prompt(prompt_ids: list[int], vocab: int, capacity: int) -> None:
    """Refuse a prompt the target cannot read: empty, an id outside ``[0, vocab)`` (-1 included:
    it would index from the end), or longer than the target's KV capacity."""
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    bad = [t for t in prompt_ids if isinstance(t, bool | float) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt ids {bad[:5]} are outside the target vocabulary [0, {vocab})")
    if len(prompt_ids) > capacity:
        raise ValueError(
            f"a prompt of {len(prompt_ids)} tokens does not fit the target's capacity of "
            f"{capacity} tokens (max_seq_len); shorten it or export with a larger --max-seq-len"
        )


def _capacity_note(stats: DecodeStats, n_out: int, cfg: DecodeConfig, ended_eos: bool) -> None:
    """Say when the KV capacity, not max_new_tokens or EOS, ended the generation."""
    if not ended_eos and n_out < cfg.max_new_tokens:
        stats.stopped_by_capacity = True
        log.warning(
            "stopped after %d of %d new tokens: the target's KV capacity (max_seq_len) is full",
            n_out,
            cfg.max_new_tokens,
        )


def generate_target_only(
    target: CausalLM,
    prompt_ids: list[int],
    cfg: DecodeConfig,
    generator: torch.Generator | None = None,
) -> tuple[list[int], DecodeStats]:
    """Plain autoregressive decoding with the target: the reference the speculative path must match."""
    check_prompt(prompt_ids, cfg.vocab_limit or target.vocab_size, target.max_seq_len)
    with torch_threads(cfg.host_threads):
        return _target_only(target, prompt_ids, cfg, generator)


def _target_only(
    target: CausalLM, prompt_ids: list[int], cfg: DecodeConfig, generator: torch.Generator | None
) -> tuple[list[int], DecodeStats]:
    stats, t0 = DecodeStats(), time.perf_counter()
    out: list[int] = []
    pos = stats.prompt_reused = reusable(target, prompt_ids)  # in the cache already
    feed = list(prompt_ids[pos:])
    while True:
        row = last_logits(target, torch.tensor(feed, dtype=torch.long), pos)
        stats.target_calls += 1
        pos += len(feed)
        if cfg.temperature <= 0:
            tok = greedy_ids(row, cfg.vocab_limit)[0]
        else:
            probs = logits_to_probs(_limit(row, cfg.vocab_limit), cfg.temperature, top_p=cfg.top_p)
            tok = sample(probs, generator)
        out.append(tok)
        out, done = _finish(out, cfg)
        if done or pos >= target.max_seq_len:
            _capacity_note(stats, len(out), cfg, done and len(out) < cfg.max_new_tokens)
            break
        feed = [tok]
    stats.n_generated, stats.wall_s = len(out), time.perf_counter() - t0
    stats.target_s = stats.wall_s
    return out, stats


class SpeculativeDecoder:
    """Cross-vocabulary speculative decoding of ``target`` with ``drafter``, wired by composition."""

    def __init__(
        self,
        target: CausalLM,
        drafter: CausalLM | None,
        mapper: VocabMapper,
        policy: DraftLengthPolicy,
        ngram_cache: NGramCache | None = None,
        *,
        config: DecodeConfig = DecodeConfig(),
        lookup: LookupProposer | None = None,
        profile: CostProfile | None = None,
        costs: CostLearner | None = None,
    ) -> None:
        """``profile`` (``cost.CostProfile``): choose per step between drafter drafts, ``lookup``
        drafts and none by measured cost (``hybrid``); ``drafter`` None: lookup only. With
        ``config.learn_costs``: price drafts with the latencies the loop pays, learned by
        ``costs`` (one a caller keeps across requests; ``run`` / ``serve`` do not learn, see
        ``cost_learning``) or by a new learner over the profile."""
        self.target, self.mapper, self.cfg = target, mapper, config
        self.drafter = make_proposer(drafter, mapper, policy, mode=config.mode,
                                     target_vocab=target.vocab_size, temperature=config.temperature,
                                     ngram_cache=ngram_cache, lookup=lookup, profile=profile)  # fmt: skip
        self.policy = policy
        base = profile if profile is not None else getattr(policy, "profile", None)
        if config.learn_costs and costs is None:
            if not isinstance(base, CostProfile):
                raise ValueError(
                    "learn_costs needs a cost profile (the hybrid's or the cost policy's)"
                )
            costs = CostLearner(base)
        self.costs = costs if config.learn_costs else None

    def _learn(self, width: int, pos: int, target_s: float, calls: int, drafter_s: float) -> None:
        """Fold one step's measured calls into ``costs`` and price the next drafts with them."""
        if self.costs is None:
            return
        self.costs.observe_target(width, pos, 1e3 * target_s)
        self.costs.observe_drafter(calls, 1e3 * drafter_s)
        learned = self.costs.profile()
        if isinstance(self.policy, CostAwareDraftLen):
            self.policy.profile = learned
        if isinstance(self.drafter, HybridProposer):
            self.drafter.profile = learned

    def _verify(
        self, prop: Proposal, n_prop: int, logits: Tensor, generator: torch.Generator | None
    ) -> tuple[int, int]:
        """(accepted, next id) for the first ``n_prop`` proposals; ``logits``: (n_prop + 1, V)."""
        ids = prop.target_ids[:n_prop]
        if self.cfg.mode is Mode.GREEDY:
            return accept_greedy(ids, greedy_ids(logits, self.cfg.vocab_limit))
        limited = _limit(logits, self.cfg.vocab_limit)
        probs = logits_to_probs(limited, self.cfg.temperature, top_p=self.cfg.top_p)
        return verify(ids, prop.q[:n_prop], prop.rows, probs, generator)

    def _observe(self, observer: Observer | None, committed: list[int], kept: list[int],
                 logits: Tensor) -> None:  # fmt: skip
        if observer is None or not kept:
            return
        if not _wants_topk(observer):
            observer(list(committed), kept, torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0))
            return
        rows = logits[: len(kept), : self.cfg.vocab_limit or logits.shape[-1]].float()
        top = torch.softmax(rows, -1).topk(self.cfg.observer_topk, -1)
        observer(list(committed), kept, top.indices, top.values)

    def keep_cached(self, prefix_target_ids: list[int]) -> None:
        """Let the next ``generate`` reuse at most ``prefix_target_ids`` (target ids; [] for a
        cold start) from the target's and the drafter's caches (``kv_reuse``): what a benchmark
        gives every configuration alike."""
        keep(self.target, len(prefix_target_ids))
        keep_drafter = getattr(self.drafter, "keep_cached", None)
        if keep_drafter is not None:
            keep_drafter(prefix_target_ids)

    def generate(
        self,
        prompt_ids: list[int],
        *,
        generator: torch.Generator | None = None,
        observer: Observer | None = None,
    ) -> tuple[list[int], DecodeStats]:
        """Generate up to ``max_new_tokens`` target ids after ``prompt_ids`` (target ids)."""
        check_prompt(prompt_ids, self.cfg.vocab_limit or self.target.vocab_size,
                     self.target.max_seq_len)  # fmt: skip
        with torch_threads(self.cfg.host_threads):
            return self._generate(prompt_ids, generator, observer)

    def _generate(
        self, prompt_ids: list[int], generator: torch.Generator | None, observer: Observer | None
    ) -> tuple[list[int], DecodeStats]:
        cap = self.target.max_seq_len
        cfg, stats, t_start = self.cfg, DecodeStats(), time.perf_counter()
        self.drafter.reset(prompt_ids)
        self.drafter.seconds, self.drafter.calls = 0.0, 0
        committed, out = list(prompt_ids), list[int]()
        # committed[:fed] are in the target's cache: the first step is the prompt's prefill, from
        # where the cache stops holding this prompt (``kv_reuse``)
        fed = stats.prompt_reused = reusable(self.target, prompt_ids)
        while True:
            s0, c0 = self.drafter.seconds, self.drafter.calls
            prop = self.drafter.propose(generator)
            room = cap - len(committed)  # the feed may reach position cap - 1, as target-only
            n_prop = max(0, min(len(prop.target_ids), room))
            feed = [*committed[fed:], *prop.target_ids[:n_prop]]
            t0 = time.perf_counter()  # only the rows verification reads (the prefill's: none)
            logits = tail_logits(self.target, torch.tensor(feed, dtype=torch.long), fed, n_prop + 1)
            dt = time.perf_counter() - t0
            stats.target_s += dt
            if stats.target_calls:  # not the prefill step (its calls are the prompt's)
                self._learn(len(feed), fed, dt, self.drafter.calls - c0, self.drafter.seconds - s0)
            stats.target_calls += 1
            n_acc, next_id = self._verify(prop, n_prop, logits, generator)
            new_ids = [*prop.target_ids[:n_acc], next_id]
            out_next, done = _finish([*out, *new_ids], cfg)
            kept = new_ids[: len(out_next) - len(out)]  # what the caller gets (EOS / budget)
            self._observe(observer, committed, kept, logits)
            self.drafter.commit(prop, n_acc, next_id)
            self._record(stats, prop.merged[:n_prop], n_acc, prop.n_drafted)
            committed += new_ids
            fed = len(committed) - 1  # the next id is fed with the next step's proposals
            out = out_next
            if done or len(committed) > cap:
                _capacity_note(stats, len(out), cfg, done and len(out) < cfg.max_new_tokens)
                break
        stats.n_generated = len(out)
        stats.drafter_s, stats.drafter_calls = self.drafter.seconds, self.drafter.calls
        stats.wall_s = time.perf_counter() - t_start
        stats.overhead_s = max(0.0, stats.wall_s - stats.target_s - stats.drafter_s)
        return out, stats

    @staticmethod
    def _record(stats: DecodeStats, merged: list[bool], n_acc: int, n_drafted: int) -> None:
        stats.proposed += len(merged)
        stats.accepted += n_acc
        stats.merged_proposed += sum(merged)
        stats.merged_accepted += sum(merged[:n_acc])
        stats.accept_counts.append(n_acc)
        stats.draft_len_trace.append(n_drafted)
