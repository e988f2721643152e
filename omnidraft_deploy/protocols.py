"""The seams of the system, as Protocols: models, draft-length policies, eviction policies, tokenizers.

Everything that runs a network (eager PyTorch, ONNX Runtime, ExecuTorch, QNN HTP) implements
``CausalLM``; the speculative loop only ever talks to this interface (and, through
``tail_logits`` / ``last_logits``, to the optional ``TailRowsLM`` capability).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from torch import Tensor


@runtime_checkable
class CausalLM(Protocol):
    """A decoder with a static KV cache addressed by position.

    ``forward(token_ids (T,) int64, start_pos)`` feeds tokens at positions ``start_pos ..
    start_pos+T-1`` and returns float32 logits ``(T, vocab_size)``, one row per input position
    (verification needs all of them). Cache slots ``>= start_pos`` are overwritten, so rolling back
    is calling again with a smaller ``start_pos``; nothing else has to be undone.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_seq_len(self) -> int: ...

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor: ...


@runtime_checkable
class TailRowsLM(CausalLM, Protocol):
    """An optional capability: ``forward_tail(token_ids (T,), start_pos, rows) -> logits (rows,
    V)``, the last ``rows`` rows of ``forward`` (same values, same cache writes) without the other
    rows' lm_head: a prefill and a drafter read one row, a prefill that also verifies the first
    step's proposals reads theirs. ``tail_logits`` uses it where a model has it."""

    def forward_tail(self, token_ids: Tensor, start_pos: int, rows: int) -> Tensor: ...


def tail_logits(lm: CausalLM, token_ids: Tensor, start_pos: int, rows: int) -> Tensor:
    """Logits ``(rows, V)`` of the last ``rows`` of ``token_ids (T,)`` fed at ``start_pos`` (the
    cache takes all T): ``lm.forward_tail`` (``TailRowsLM``) where ``lm`` has it, else
    ``lm.forward(...)[-rows:]``, so any ``CausalLM`` works. Looked up by ``getattr``: an
    ``isinstance`` check against the runtime Protocol took ~10 us a call here (Python 3.11),
    paid on every drafter step."""
    forward_tail = getattr(lm, "forward_tail", None)
    if forward_tail is None:
        return lm.forward(token_ids, start_pos)[-rows:]
    out: Tensor = forward_tail(token_ids, start_pos, rows)  # (rows, V)
    return out


def last_logits(lm: CausalLM, token_ids: Tensor, start_pos: int) -> Tensor:
    """Logits ``(V,)`` after the last of ``token_ids (T,)``: ``tail_logits``' one row."""
    return tail_logits(lm, token_ids, start_pos, 1)[0]


class TokenizerLike(Protocol):
    """What the edges (CLI, mapper construction, benchmarks) need from a tokenizer."""

    name: str

    @property
    def vocab_size(self) -> int: ...  # number of ids the tokenizer can emit

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    @property
    def special_ids(self) -> frozenset[int]: ...

    def encode(self, text: str) -> list[int]: ...  # no BOS added

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...  # raw UTF-8 bytes the token stands for


class DraftLengthPolicy(Protocol):
    """Chooses how many drafter tokens to propose next step."""

    def next_draft_len(self) -> int: ...  # upper bound k for this step

    # after drafted token i; features: (3,) ``draft_len.confidence_features`` of its logits
    def keep_drafting(self, i: int, features: np.ndarray) -> bool: ...

    def update(self, n_drafted: int, n_accepted: int) -> None: ...  # in drafter tokens

    # a new generation starts (the drafter's ``reset``): drop state that belongs to one text
    def new_context(self) -> None: ...
