"""The Python decoder replays a golden trace: is a committed trace still what Python decodes?

``rerecord`` runs ``trace.record_pair`` again with the trace's settings, but over ``ReplayLM``
models that answer each call with the logits the trace recorded (and refuse any other call) and
with the recorded uniform draws injected at ``torch.rand``. No weights are needed, so the check is
cheap and runs for the real pair's traces without the model assets. When the Python decoder, a
draft-length policy or the lookup changed since the trace was written, the re-recorded trace differs
(or a call is refused): the trace is stale, and the Java core is held to an old Python.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.golden.trace import TraceConfig, record_pair, scalar_rand
from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.drafter import Mode
from omnidraft_deploy.vocab.mapper import VocabMapper


class StaleTrace(AssertionError):
    """The Python decoder made a call the trace did not record."""


class Replay:
    """The recorded calls of every run of one trace, answered in order across runs."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.calls = [c for run in runs for c in run["calls"]]
        self.draws = [float(u) for run in runs for u in run["uniforms"]]
        self.next_call = 0

    def answer(self, role: str, token_ids: Tensor, start_pos: int, vocab: int) -> Tensor:
        made = f"{role}.forward({token_ids.tolist()}, {start_pos})"
        if self.next_call >= len(self.calls):
            raise StaleTrace(f"call #{self.next_call}: python made {made}; the trace has no more")
        c = self.calls[self.next_call]
        recorded = f"{c['role']}.forward({c['ids']}, {c['start']})"
        if made != recorded:
            raise StaleTrace(
                f"call #{self.next_call}: python made {made}; the trace recorded {recorded}"
            )
        self.next_call += 1
        out = torch.full((len(c["rows"]), vocab), float("nan"))
        for r, row in enumerate(c["rows"]):
            if row is not None:  # a drafter's unread rows stay NaN, as the recorder returned them
                idx = np.frombuffer(base64.b64decode(row["idx"]), "<i4").astype(np.int64)
                val = np.frombuffer(base64.b64decode(row["val"]), "<f4")
                out[r] = float("-inf")
                out[r, torch.from_numpy(idx)] = torch.from_numpy(val.copy())
        return out

    def uniforms(self) -> contextlib.AbstractContextManager[None]:
        """Scalar ``torch.rand`` draws inside the block return the recorded values, in order."""
        draws = iter(self.draws)
        return scalar_rand(lambda x: x.fill_(next(draws)))


class ReplayLM:
    """A ``CausalLM`` of one role whose every call is answered by ``Replay``."""

    def __init__(self, replay: Replay, role: str, vocab_size: int, max_seq_len: int) -> None:
        self.replay, self.role = replay, role
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        return self.replay.answer(self.role, token_ids, start_pos, self.vocab_size)


def config_of(trace: dict[str, Any]) -> TraceConfig:
    """The ``TraceConfig`` a (one-pair) trace was recorded with."""
    profile = trace.get("cost_profile")
    return TraceConfig(
        name=trace["name"], mode=Mode(trace["mode"]), temperature=trace["temperature"],
        policy=trace["policy"], draft_len=trace["draft_len"],
        max_new_tokens=trace["max_new_tokens"], topk=trace["topk"],
        cache_policy=trace["cache_policy"], cache_max_entries=trace["cache_max_entries"],
        prompts=tuple(run["prompt"] for run in trace["runs"]),
        profile=None if profile is None else CostProfile.from_json(json.dumps(profile)),
    )  # fmt: skip


def rerecord(
    trace: dict[str, Any], mapper: VocabMapper, target_tok: TokenizerLike
) -> dict[str, Any]:
    """``record_pair`` again over the trace's own calls and draws, as JSON would store it."""
    replay = Replay(trace["runs"])
    target = ReplayLM(replay, "target", trace["target_model_vocab"], trace["target_max_seq_len"])
    drafter = ReplayLM(
        replay, "drafter", trace["drafter_model_vocab"], trace["drafter_max_seq_len"]
    )
    meta = {k: trace[k] for k in ("name", "target", "drafter", "target_tokenizer",
                                  "drafter_tokenizer", "vocab_map")}  # fmt: skip
    with replay.uniforms():
        again = record_pair(config_of(trace), target=target, drafter=drafter,
                            target_tok=target_tok, drafter_tok=target_tok, mapper=mapper,
                            meta=meta)  # fmt: skip
    out: dict[str, Any] = json.loads(json.dumps(again, ensure_ascii=False, sort_keys=True))
    return out
