"""``HybridProposer``: per step, model drafts, lookup drafts or none, whichever the cost model favours.

It has ``CrossVocabDrafter``'s interface (``reset``, ``propose``, ``commit``, ``seconds``, ``calls``),
so ``SpeculativeDecoder`` drives it unchanged. Each step it compares the expected net saving
(``value * E[extra tokens] - extra cost``, ``cost`` module) of

- a lookup proposal (``lookup.LookupProposer``: target ids, no drafter call; its conditional
  acceptance is an EMA per matched n-gram length), cut to the length that pays (``best_length``).
  The EMA learns on every step with a lookup candidate, whichever source drafted: the committed
  ids say how many of the candidate's ids the target would have accepted (``_score_lookup``). So
  a lookup that is never chosen is still measured, and a poor one is dropped after a few steps
  instead of being tried from an optimistic prior (the earlier design: prior 0.6, learned only
  when chosen, lost to the drafter alone on four of five real-pair tasks);
- model drafts (``CrossVocabDrafter`` under ``draft_len.CostAwareDraftLen``, which stops drafting
  token by token when one more does not pay);
- a plain target step (saving 0).

A generation's first step never drafts with the model: the drafter would first have to read the
whole prompt (its prefill: ~0.2 s for SmolLM2 on a 45-token chat prompt, 2 cores), and its
drafts would widen the verification, all between the target's prefill and the first text. The
first step is a lookup or plain step instead, and the drafter reads the prompt on the second
step, after the first text is out (the first step is the one with an empty ``trace``; the cost
is at most one step's drafts).

A step without model drafts still keeps the drafter's context in sync: the committed ids are
appended to it (its KV is caught up by the next drafting call). Lookup proposals are
deterministic, so their proposal law is one-hot (``q = 1``): ``exact`` mode stays exact.
``trace`` records every step (``cost.StepRecord``) for the predicted-vs-measured comparison.
"""

from __future__ import annotations

import torch

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM, DraftLengthPolicy
from omnidraft_deploy.speculative.cost import CostProfile, StepRecord, best_length, step_ms
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen
from omnidraft_deploy.speculative.drafter import CrossVocabDrafter, Mode, Proposal
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.vocab.mapper import VocabMapper


def _empty() -> Proposal:
    return Proposal([], torch.zeros(0), None, [], [], 0)


class HybridProposer:
    def __init__(self, model: CrossVocabDrafter | None, lookup: LookupProposer | None,
                 profile: CostProfile, *, k_max: int = 8, lookup_prior: float = 0.3,
                 ema: float = 0.2) -> None:  # fmt: skip
        if model is None and lookup is None:
            raise ValueError("a hybrid proposer needs a drafter model, a lookup proposer or both")
        if model is not None and not isinstance(model.policy, CostAwareDraftLen):
            raise TypeError("the hybrid proposer's drafter needs a CostAwareDraftLen policy")
        self.model, self.lookup, self.profile, self.k_max = model, lookup, profile, k_max
        self.ema, self.prior = ema, lookup_prior
        self.lookup_rate: dict[int, float] = {}
        self.trace: list[StepRecord] = []
        self._source, self._match = "none", 0
        self._candidate: list[int] = []  # this step's lookup proposal, uncut (scored at commit)

    @property
    def seconds(self) -> float:
        return self.model.seconds if self.model is not None else 0.0

    @seconds.setter
    def seconds(self, value: float) -> None:
        if self.model is not None:
            self.model.seconds = value

    @property
    def calls(self) -> int:
        return self.model.calls if self.model is not None else 0

    @calls.setter
    def calls(self, value: int) -> None:
        if self.model is not None:
            self.model.calls = value

    def reset(self, prompt_ids: list[int]) -> None:
        if self.model is not None:
            self.model.reset(prompt_ids)
        if self.lookup is not None:
            self.lookup.reset(prompt_ids)
        self.trace = []

    def keep_cached(self, prefix_target_ids: list[int]) -> None:
        if self.model is not None:
            self.model.keep_cached(prefix_target_ids)

    def _saving(self, acceptance: float, k: int, *, model: bool) -> float:
        """Expected time saved by a k-proposal step over a plain step (ms; may be negative)."""
        if k == 0:
            return 0.0
        gain = self.profile.value_ms * sum(acceptance**i for i in range(1, k + 1))
        cost = step_ms(self.profile, k if model else 0, k, lookup=not model)
        return gain - (cost - self.profile.target(1))

    def _policy(self) -> CostAwareDraftLen | None:
        return None if self.model is None else self.model.policy  # type: ignore[return-value]

    def propose(self, generator: torch.Generator | None) -> Proposal:
        ids, match = self.lookup.propose(self.k_max) if self.lookup is not None else ([], 0)
        self._candidate, self._match = list(ids), match
        a_look = self.lookup_rate.get(match, self.prior)
        k_look = best_length(self.profile, a_look, len(ids), model=False)
        save_look = self._saving(a_look, k_look, model=False)
        policy = self._policy() if self.trace else None  # first step: no model drafts (module doc)
        save_model = 0.0
        if policy is not None:
            a_mod = policy.rate
            save_model = self._saving(a_mod, best_length(self.profile, a_mod, self.k_max,
                                                         model=True), model=True)  # fmt: skip
        if k_look > 0 and save_look >= save_model:
            self._source = "lookup"
            self._model_idle()
            ids = ids[:k_look]
            return Proposal(ids, torch.ones(len(ids)), None, [1] * len(ids), [False] * len(ids), 0)
        if policy is not None:
            policy.enabled = True  # the policy itself may still choose k = 0 (a plain step)
            prop = self.model.propose(generator)  # type: ignore[union-attr]
            self._source = "model" if prop.n_drafted else "none"
            return prop
        self._source = "none"
        self._model_idle()
        return _empty()

    def _model_idle(self) -> None:
        """Run the drafter's bookkeeping for a step it does not draft (no model call)."""
        policy = self._policy()
        if policy is not None and self.model is not None:
            policy.enabled = False
            self.model.propose(None)

    def _score_lookup(self, new_ids: list[int]) -> None:
        """Update the acceptance EMA of this step's lookup candidate from the committed ids.

        ``new_ids`` are the target's tokens at the candidate's positions (the accepted drafts and
        the target's own next token), so candidate id ``j`` would have been accepted iff ids
        ``0..j`` all equal them: the first mismatch is a rejection, and positions past
        ``new_ids`` are unknown (not scored). On a lookup step this is exactly the observed
        accept/reject sequence. In ``exact`` mode it is an estimate (the committed token was
        sampled), which only steers the choice: the output law does not depend on it.
        """
        rate = self.lookup_rate.get(self._match, self.prior)
        for guess, actual in zip(self._candidate, new_ids, strict=False):
            hit = guess == actual
            rate += self.ema * (float(hit) - rate)
            if not hit:
                break
        self.lookup_rate[self._match] = rate

    def commit(self, proposal: Proposal, n_accepted: int, next_id: int) -> None:
        new_ids = [*proposal.target_ids[:n_accepted], next_id]
        self.trace.append(StepRecord(self._source, proposal.n_drafted,
                                     len(proposal.target_ids), n_accepted))  # fmt: skip
        if self.lookup is not None:
            self.lookup.extend(new_ids)
        if self._candidate:
            self._score_lookup(new_ids)
        if self.model is None:
            return
        if self._source == "model":
            self.model.commit(proposal, n_accepted, next_id)
            return
        for t in new_ids:  # no drafts this step: append the committed ids to its context
            self.model.commit(_empty(), 0, t)


def make_proposer(
    drafter: CausalLM | None,
    mapper: VocabMapper,
    policy: DraftLengthPolicy,
    *,
    mode: Mode,
    target_vocab: int,
    temperature: float,
    ngram_cache: NGramCache | None,
    lookup: LookupProposer | None = None,
    profile: CostProfile | None = None,
) -> CrossVocabDrafter | HybridProposer:
    """The decoder's proposer: the cross-vocabulary drafter alone (no ``profile``), or the hybrid
    over it and/or a lookup proposer, chosen per step by the measured cost ``profile``."""
    model = None
    if drafter is not None:
        model = CrossVocabDrafter(drafter, mapper, policy, mode=mode, target_vocab=target_vocab,
                                  temperature=temperature, ngram_cache=ngram_cache)  # fmt: skip
    if profile is None:
        if model is None or lookup is not None:
            raise ValueError("lookup drafts and drafter-less decoding need a cost profile")
        return model
    k_max = int(getattr(policy, "max_len", 0) or 8)
    return HybridProposer(model, lookup, profile, k_max=k_max)
