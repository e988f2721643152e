"""Golden decoding traces: what the Python reference runtime did, replayable by the Android core.

A trace records one ``SpeculativeDecoder`` session over a real tokenizer pair: the prompt ids, every
model call (role, ids, start position) with the logits it returned, every uniform random draw, the
committed tokens, accept counts, draft lengths, the streamed text and the n-gram cache bytes before
and after. ``android_demo`` feeds the recorded logits back through its ``CausalLm`` interface and
must make exactly the same calls and produce the same tokens, text and cache bytes.

Why the decisions depend only on recorded data (so a trace is a complete test vector):

* ``TraceLM`` sparsifies every logits row it returns to its top ``topk`` entries (others ``-inf``)
  *before* the decoder sees it, and records exactly those entries (float32 bits, base64). Greedy
  decisions are unchanged by this (argmax is kept); sampling modes sample from the top-k
  distribution, which is what the decoder saw and what Java recomputes.
* Drafter calls: the decoder reads only the last row (``drafter._forward`` takes ``[-1]``); the
  other rows are returned as NaN and recorded as null, so a reader that used them would fail.
* Uniform draws: ``record_uniforms`` observes every ``torch.rand`` call of the sampling and
  verification code and records the value; a replay consumes them in order instead of an RNG.
* Costs: a ``cost`` trace decodes as ``omnidraft run`` does with a measured profile
  (``runtime/run.py`` ``bundle_decoder``: ``CostAwareDraftLen`` up to 2 * ``draft_len``, lookup
  proposals beside the drafter, ``HybridProposer``), with fixed costs recorded in the trace
  (``cost_profile``) instead of a measurement, so both sides price every step alike. Each step's
  choice is recorded too (``record_steps``): source, proposals, lookup candidate, accept count and
  the estimates that steer the next choice.

Trace file (``<name>.json.gz``): see ``record_pair``; arrays of ids are JSON lists, logits rows are
``{"idx": b64 <i4, "val": b64 <f4}`` (the top-k ids and their float32 logits, descending).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import to_bytes as ngram_to_bytes
from omnidraft_deploy.protocols import CausalLM, TokenizerLike
from omnidraft_deploy.request.streaming import TextStreamer
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen
from omnidraft_deploy.speculative.drafter import Mode, Proposal
from omnidraft_deploy.speculative.factory import build_decoder
from omnidraft_deploy.speculative.hybrid import HybridProposer
from omnidraft_deploy.speculative.lookup import LookupConfig, LookupProposer
from omnidraft_deploy.vocab.mapper import VocabMapper

TRACE_FORMAT = 1


def _b64(arr: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype=dtype).tobytes()).decode("ascii")


class TraceLM:
    """A ``CausalLM`` that sparsifies and records every call of ``lm`` into ``calls``."""

    def __init__(self, lm: CausalLM, role: str, topk: int, calls: list[dict[str, Any]]) -> None:
        self.lm, self.role, self.topk, self.calls = lm, role, topk, calls

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.lm.max_seq_len

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        logits = self.lm.forward(token_ids, start_pos).float()  # (T, V)
        top = logits.topk(min(self.topk, logits.shape[-1]), dim=-1)
        out = torch.full_like(logits, float("-inf")).scatter_(-1, top.indices, top.values)
        rows: list[dict[str, str] | None] = [
            {"idx": _b64(i.numpy(), "<i4"), "val": _b64(v.numpy(), "<f4")}
            for i, v in zip(top.indices, top.values, strict=True)
        ]
        if self.role == "drafter":  # the drafter reads the last row only (see module docstring)
            out[:-1] = float("nan")
            rows = [None if i < len(rows) - 1 else row for i, row in enumerate(rows)]
        self.calls.append(
            {"role": self.role, "ids": token_ids.tolist(), "start": start_pos, "rows": rows}
        )
        return out


@contextlib.contextmanager
def scalar_rand(on_draw: Callable[[Tensor], object]) -> Iterator[None]:
    """Inside the block every scalar ``torch.rand`` result passes through ``on_draw`` before it is
    returned (which may read it or overwrite it in place); other draws are left alone."""
    real = torch.rand

    def hooked(*args: Any, **kwargs: Any) -> Tensor:
        x = real(*args, **kwargs)
        if x.numel() == 1:
            on_draw(x)
        return x

    torch.rand = hooked  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.rand = real  # type: ignore[assignment]


def record_uniforms(draws: list[float]) -> contextlib.AbstractContextManager[None]:
    """Append the value of every scalar ``torch.rand`` call made inside the block to ``draws``."""
    return scalar_rand(lambda x: draws.append(float(x)))


def record_steps(hybrid: HybridProposer, steps: list[dict[str, Any]]) -> None:
    """Append one record per step of ``hybrid`` to ``steps``: the proposals and their source, the
    lookup candidate (ids, matched n-gram length) it weighed, the accept count, and after the
    commit the estimates the next choice reads (the drafter's acceptance rate, token value and
    acceptance head; the lookup acceptance of this step's match)."""
    propose, commit = hybrid.propose, hybrid.commit
    policy = hybrid.model.policy if hybrid.model is not None else None

    def recorded_propose(generator: torch.Generator | None) -> Proposal:
        look = hybrid.lookup  # propose is pure: asking it first changes nothing
        cand, match = look.propose(hybrid.k_max) if look is not None else ([], 0)
        prop = propose(generator)
        steps.append({"proposal": list(prop.target_ids), "n_drafted": prop.n_drafted,
                      "lookup": cand, "match": match})  # fmt: skip
        return prop

    def recorded_commit(proposal: Proposal, n_accepted: int, next_id: int) -> None:
        commit(proposal, n_accepted, next_id)
        step = steps[-1]
        step |= {"source": hybrid.trace[-1].source, "accepted": n_accepted,
                 "lookup_rate": hybrid.lookup_rate.get(step["match"], hybrid.prior)}  # fmt: skip
        if isinstance(policy, CostAwareDraftLen):
            step |= {"rate": policy.rate, "value": policy.value,
                     "weights": [float(w) for w in policy.weights]}  # fmt: skip

    hybrid.propose = recorded_propose  # type: ignore[method-assign]
    hybrid.commit = recorded_commit  # type: ignore[method-assign]


@dataclass(frozen=True)
class TraceConfig:
    name: str  # file stem
    mode: Mode = Mode.GREEDY
    temperature: float = 0.0
    # "fixed" | "heuristic" | "cost": the runtime's decoder with a cost profile (module docstring)
    policy: str = "fixed"
    draft_len: int = 4
    max_new_tokens: int = 24
    topk: int = 32
    seed: int = 0
    cache_policy: str = "lru"
    cache_max_entries: int = 64  # small, so that eviction happens within a trace
    prompts: tuple[str, ...] = field(default_factory=tuple)
    profile: CostProfile | None = None  # the fixed costs of a "cost" trace

    def __post_init__(self) -> None:
        if self.policy not in ("fixed", "heuristic", "cost"):
            choose = "choose from ['cost', 'fixed', 'heuristic']"
            raise KeyError(f"trace policy {self.policy!r}; {choose}")
        if (self.policy == "cost") != (self.profile is not None):
            raise ValueError(f"a cost profile goes with the cost policy only, got {self.policy!r}")


def record_pair(
    cfg: TraceConfig,
    *,
    target: CausalLM,
    drafter: CausalLM,
    target_tok: TokenizerLike,
    drafter_tok: TokenizerLike,
    mapper: VocabMapper,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Run every prompt of ``cfg`` through one decoder (shared n-gram cache and policy state)."""
    calls: list[dict[str, Any]] = []
    cache = NGramCache(max_entries=cfg.cache_max_entries, policy=cfg.cache_policy)
    drafter_bos = mapper.drafter_bos  # the decoder takes it from the map (ODVM v2 role table)
    # the runtime's factory, as ``runtime.run.bundle_decoder`` calls it: the pair's vocabulary
    # limit and EOS ids come from the mapper; a cost profile brings lookup proposals beside
    decode_cfg = DecodeConfig(mode=cfg.mode, temperature=cfg.temperature,
                              max_new_tokens=cfg.max_new_tokens)  # fmt: skip
    dec = build_decoder(TraceLM(target, "target", cfg.topk, calls),
                        TraceLM(drafter, "drafter", cfg.topk, calls), mapper,
                        policy=cfg.policy, draft_len=cfg.draft_len, config=decode_cfg,
                        profile=cfg.profile, ngram_cache=cache,
                        lookup=None if cfg.profile is None else LookupProposer())  # fmt: skip
    steps: list[dict[str, Any]] = []
    if isinstance(dec.drafter, HybridProposer):
        record_steps(dec.drafter, steps)
    sizes = {"draft_vocab_size": mapper.draft_vocab_size,
             "target_vocab_size": mapper.target_vocab_size}  # fmt: skip
    generator = torch.Generator().manual_seed(cfg.seed)
    runs = []
    for text in cfg.prompts:
        prompt_ids = target_tok.encode(text)
        calls.clear()
        steps.clear()
        draws: list[float] = []
        out = io.StringIO()
        streamer = TextStreamer(target_tok, out)
        with record_uniforms(draws):
            ids, stats = dec.generate(prompt_ids, generator=generator, observer=streamer)
        runs.append(
            {
                "prompt": text,
                "prompt_ids": prompt_ids,
                "calls": list(calls),
                "uniforms": draws,
                "output_ids": ids,
                "text": target_tok.decode(ids),
                "streamed": out.getvalue(),
                "accept_counts": stats.accept_counts,
                "draft_len_trace": stats.draft_len_trace,
                "merged_proposed": stats.merged_proposed,
                "merged_accepted": stats.merged_accepted,
                "target_calls": stats.target_calls,
                "drafter_calls": stats.drafter_calls,
                "ngram_cache_after": base64.b64encode(ngram_to_bytes(cache, **sizes)).decode(),
                **({"steps": list(steps)} if cfg.profile is not None else {}),
            }
        )
    return {
        "format": TRACE_FORMAT,
        **meta,
        "mapping_hash": mapper.content_hash(),
        "mode": cfg.mode.value,
        "temperature": cfg.temperature,
        "policy": cfg.policy,
        "draft_len": cfg.draft_len,
        "max_new_tokens": cfg.max_new_tokens,
        "topk": cfg.topk,
        "eos_ids": list(mapper.target_eos),
        "vocab_limit": mapper.target_vocab_size,
        "drafter_bos": drafter_bos,
        "target_model_vocab": target.vocab_size,
        "drafter_model_vocab": drafter.vocab_size,
        "target_max_seq_len": target.max_seq_len,
        "drafter_max_seq_len": drafter.max_seq_len,
        "cache_policy": cfg.cache_policy,
        "cache_max_entries": cfg.cache_max_entries,
        **(_cost_meta(cfg.profile) if cfg.profile is not None else {}),
        "runs": runs,
    }


def _cost_meta(profile: CostProfile) -> dict[str, Any]:
    """What a replay needs to build the same decoder: the costs and the lookup's settings."""
    return {"cost_profile": json.loads(profile.to_json()),
            "lookup": dataclasses.asdict(LookupConfig())}  # fmt: skip
