"""``CrossVocabDrafter``: drafts in the drafter's vocabulary, proposes in the target's.

It owns the drafter-side state: the committed text as drafter ids (``draft_ids``, starting with the
drafter's BOS stored in the map, ``VocabMapper.drafter_bos``) and how many of those positions hold
valid KV (``kv_len``). Invariant after every ``commit``: the bytes of ``draft_ids`` equal the bytes
of the committed target ids, except that each byte the drafter cannot spell is one placeholder
token (``vocab.build``); ``placeholder_bytes`` counts those bytes since ``reset`` (a loss of drafter
context only, logged once per ``reset``). And ``kv_len < len(draft_ids)`` so the next ``propose``
always has at least one token to feed and gets fresh logits from it.

Proposal construction (OmniDraft section 3): walk the drafted tokens left to right; at each
position take the longest cached n-gram (merged probability = product of the drafted tokens'
probabilities), else the direct mapping, else stop. ``exact`` mode restricts the drafter to DM
tokens and skips the n-gram cache, so every proposal's probability is known exactly (TLI).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM, DraftLengthPolicy, last_logits
from omnidraft_deploy.speculative.draft_len import confidence_features
from omnidraft_deploy.speculative.kv_reuse import keep, reusable
from omnidraft_deploy.speculative.sampling import has_mass, logits_to_probs, restrict, sample
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)


class Mode(StrEnum):
    GREEDY = "greedy"  # argmax drafter, argmax verification: output == target greedy
    EXACT = "exact"  # DM-restricted drafter, rejection sampling: output ~ target exactly
    OMNIDRAFT = "omnidraft"  # paper's merged-probability proposals: measured, not exact


class ProposalRows:
    """The proposal distributions over target ids (``rows[i]``: (V_target_model,)), built on
    demand from the drafter rows: verification reads only the first rejected position's row, so
    the other proposals never pay for the full-vocabulary scatter (``VocabMapper.map_probs``)."""

    def __init__(self, build: Callable[[int], Tensor], n: int) -> None:
        self._build, self._n = build, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Tensor:
        if not 0 <= i < self._n:
            raise IndexError(f"proposal row {i} of {self._n}")
        return self._build(i)


@dataclass
class Proposal:
    target_ids: list[int]
    q: Tensor  # (n,) proposal probability of each target id
    rows: ProposalRows | Tensor | None  # (n, V_target_model) proposal laws for the residual
    spans: list[int]  # drafter tokens behind each proposal
    merged: list[bool]  # whether each came from the n-gram cache
    n_drafted: int


class CrossVocabDrafter:
    def __init__(
        self,
        lm: CausalLM,
        mapper: VocabMapper,
        policy: DraftLengthPolicy,
        *,
        mode: Mode,
        target_vocab: int,
        temperature: float = 0.0,
        ngram_cache: NGramCache | None = None,
    ) -> None:
        self.lm, self.mapper, self.policy, self.mode = lm, mapper, policy, mode
        self.target_vocab, self.temperature = target_vocab, temperature
        self.ngram_cache = ngram_cache
        self.draft_ids: list[int] = []
        self.placeholder_bytes = 0
        self.kv_len = 0
        self._fed_len = 0
        self._drafts: list[int] = []
        self.seconds = 0.0
        self.calls = 0

    def reset(self, prompt_target_ids: list[int]) -> None:
        self.policy.new_context()
        ids = self.mapper.drafter_context(prompt_target_ids)
        # the drafter's cache may hold this context's start already (``kv_reuse``)
        self.draft_ids, self.kv_len, self._fed_len = ids, reusable(self.lm, ids), 0
        self.placeholder_bytes = 0
        self._count_placeholders(prompt_target_ids)

    def keep_cached(self, prefix_target_ids: list[int]) -> None:
        """Let the next ``reset`` reuse at most this text's start from the drafter's cache (its
        drafter spelling; nothing for an empty one): ``kv_reuse``."""
        n = len(self.mapper.drafter_context(prefix_target_ids)) if prefix_target_ids else 0
        keep(self.lm, n)

    def _count_placeholders(self, target_ids: list[int]) -> None:
        lost = sum(self.mapper.placeholder_bytes(t) for t in target_ids)
        if lost and not self.placeholder_bytes:
            log.warning(
                "the drafter cannot spell some bytes of this text; it sees a placeholder token "
                "for them (drafts may get worse, output is unaffected)"
            )
        self.placeholder_bytes += lost

    def _forward(self, ids: list[int], start: int) -> Tensor:
        t0 = time.perf_counter()
        logits = last_logits(self.lm, torch.tensor(ids, dtype=torch.long), start)  # (V_graph,)
        # (V_graph,) -> (V_d,): a graph padded past its tokenizer (every Qwen: 151936 rows, 151665
        # ids) never drafts a padded row, as ``DecodeConfig.vocab_limit`` masks the target's
        logits = logits[: self.mapper.draft_vocab_size]
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return logits

    def _draft_probs(self, logits: Tensor) -> Tensor:
        """The sampling law of one drafted token (sampling modes only): (V_map,)."""
        probs = logits_to_probs(logits, self.temperature)
        return restrict(probs, self.mapper.dm_draft_mask) if self.mode is Mode.EXACT else probs

    def _pick(
        self, logits: Tensor, generator: torch.Generator | None
    ) -> tuple[int, float, Tensor | None] | None:
        """(drafted id, its proposal probability, its sampling law or None when greedy); ``logits``:
        (V_d,), already cut to the map's drafter vocabulary by ``_forward``. Greedy drafting is
        one numpy argmax over the row: no probability row is built. None when the sampling law
        has no mass (``exact``: every DM token's probability underflowed to 0, e.g. a lead of
        more than ~10 logits at T = 0.1): nothing is drafted, so the target samples the step
        itself and the output law stays exactly the target's."""
        if self.temperature <= 0:
            return int(np.argmax(logits.numpy())), 1.0, None
        probs = self._draft_probs(logits)
        if not has_mass(probs):
            return None
        d = sample(probs, generator)
        return d, float(probs[d]), probs

    def draft(
        self, generator: torch.Generator | None
    ) -> tuple[list[int], list[float], list[Tensor]]:
        """Run the drafter for up to ``policy.next_draft_len()`` tokens (drafter ids); returns the
        ids, their proposal probabilities and (sampling modes) their sampling laws."""
        room = self.lm.max_seq_len - len(self.draft_ids) - 1
        k = max(0, min(self.policy.next_draft_len(), room))
        drafts: list[int] = []
        q_tok: list[float] = []
        rows: list[Tensor] = []
        feed, start = self.draft_ids[self.kv_len :], self.kv_len
        for i in range(k):
            logits = self._forward(feed, start).detach().float()
            start += len(feed)
            picked = self._pick(logits, generator)
            if picked is None:  # no law to draw from: propose what was drafted so far
                break
            d, q, probs = picked
            drafts.append(d)
            q_tok.append(q)
            if probs is not None:
                rows.append(probs)
            if d in self.mapper.draft_eos:
                break
            # the confidence of the law the token was drawn from: greedy, the drafter's own
            # softmax (a one-hot law says nothing); sampling, the (restricted) sampling law
            with np.errstate(divide="ignore"):
                law = logits.numpy() if probs is None else np.log(probs.numpy())
            feats = confidence_features(law)
            if not self.policy.keep_drafting(i, feats):
                break
            feed = [d]
        self._fed_len, self._drafts = start, drafts
        return drafts, q_tok, rows

    def _target_row(self, draft_row: Tensor) -> Tensor:
        row = self.mapper.map_probs(draft_row)
        pad = self.target_vocab - row.shape[-1]
        return torch.nn.functional.pad(row, (0, pad)) if pad > 0 else row[: self.target_vocab]

    def _lazy_rows(self, laws: list[tuple[Tensor, int, float | None]]) -> ProposalRows:
        """Proposal ``i``'s law over target ids: the DM-mapped drafter row, with a merged n-gram
        proposal's own probability written at its id (``laws[i]``: drafter row, id, merged q)."""

        def build(i: int) -> Tensor:
            draft_row, t, merged_q = laws[i]
            row = self._target_row(draft_row)
            if merged_q is not None:
                row[t] = merged_q
            return row

        return ProposalRows(build, len(laws))

    def propose(self, generator: torch.Generator | None) -> Proposal:
        """Draft, then turn the drafter tokens into target-vocabulary proposals."""
        drafts, q_tok, rows = self.draft(generator)
        ids: list[int] = []
        qs: list[float] = []
        laws: list[tuple[Tensor, int, float | None]] = []
        spans: list[int] = []
        merged: list[bool] = []
        d2t = self.mapper.draft_to_target_list
        j = 0
        while j < len(drafts):
            hit = None
            if self.ngram_cache is not None and self.mode is not Mode.EXACT:
                hit = self.ngram_cache.match(drafts, j)
            if hit is not None and hit[1] >= 2:
                t, n = hit
                q = math.prod(q_tok[j : j + n])
            elif d2t[drafts[j]] >= 0:
                t, n = d2t[drafts[j]], 1
                q = q_tok[j]
            else:
                break
            if rows:  # sampling: q of a DM token is the marginal over every drafter spelling
                if n == 1:
                    q = self.mapper.marginal(rows[j], t)
                laws.append((rows[j], t, q if n > 1 else None))
            ids.append(t)
            qs.append(q)
            spans.append(n)
            merged.append(n > 1)
            j += n
        lazy = self._lazy_rows(laws) if rows else None
        return Proposal(
            ids, torch.tensor(qs, dtype=torch.float32), lazy, spans, merged, len(drafts)
        )

    def commit(self, proposal: Proposal, n_accepted: int, next_id: int) -> None:
        """Keep the accepted drafts, append the target's own token, roll the KV pointer back."""
        kept = sum(proposal.spans[:n_accepted])
        tail = self.mapper.target_to_draft(next_id)
        self._count_placeholders([next_id])
        old_len = len(self.draft_ids)
        self.draft_ids = [*self.draft_ids, *self._drafts[:kept], *tail]
        self.kv_len = min(self._fed_len, old_len + kept, len(self.draft_ids) - 1)
        self.kv_len = max(self.kv_len, 0)
        if self.ngram_cache is not None and len(tail) >= 2:
            self.ngram_cache.update(tail, next_id)
        self.policy.update(proposal.n_drafted, kept)
