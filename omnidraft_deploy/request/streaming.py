"""Streamed output for ``omnidraft run``: text as verification steps commit tokens, plus per-step stats.

A ``TextStreamer`` is a decoder observer (``SpeculativeDecoder.generate(observer=...)``): after each
target call it receives the committed ids (target vocabulary) and the ids that call added. It
re-decodes the continuation and writes only the new suffix, holding back a trailing U+FFFD (a
multi-byte character split across tokens is printed once its last byte arrives).

Continuations are decoded *in context* (``decode_continuation``): SentencePiece decoders drop the
space of a leading "▁" (the dummy prefix), so decoding the new ids alone turns "Answer:" + "▁8"
into "Answer:8". Decoding the last context tokens together with the new ids and cutting the
context's own text off keeps the join space.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from torch import Tensor

from omnidraft_deploy.request.protocol import Writer

ANCHOR = 4  # context tokens decoded with a continuation


class Decodes(Protocol):
    def decode(self, ids: list[int]) -> str: ...


def decode_continuation(tokenizer: Decodes, context_ids: list[int], new_ids: list[int]) -> str:
    """The text ``new_ids`` add after ``context_ids`` (join spaces kept, see module docstring)."""
    anchor = list(context_ids[-ANCHOR:])
    head = tokenizer.decode(anchor)
    full = tokenizer.decode([*anchor, *new_ids])
    if anchor and full.startswith(head) and not head.endswith("\ufffd"):
        return full[len(head) :]
    return tokenizer.decode(list(new_ids))  # the context ends inside a character: no anchor


class TextStreamer:
    def __init__(self, tokenizer: Decodes, out: Writer, stats: Writer | None = None) -> None:
        self.tokenizer, self.out, self.stats = tokenizer, out, stats
        self.wants_topk = stats is not None  # only the step stats read the top-k probabilities
        self.context: list[int] | None = None  # the prompt, from the first step
        self.ids: list[int] = []
        self.printed = ""
        self.steps = 0

    def _text(self) -> str:
        return decode_continuation(self.tokenizer, self.context or [], self.ids)

    def __call__(
        self, committed: list[int], new_ids: list[int], topk_ids: Tensor, topk_probs: Tensor
    ) -> None:
        self.steps += 1
        if self.context is None:
            self.context = list(committed)
        self.ids += new_ids
        text = self._text()
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        if text.startswith(self.printed) and len(text) > len(self.printed):
            self.out.write(text[len(self.printed) :])
            self.out.flush()
            self.printed = text
        if self.stats is not None:
            self.stats.write(
                f"[step {self.steps}] +{len(new_ids)} tokens ({len(new_ids) - 1} drafted accepted,"
                f" p(top-1) {float(topk_probs[-1, 0]):.2f})\n"
            )

    def finish(self) -> None:
        """Write whatever is still held back (a genuinely invalid byte sequence at the end)."""
        text = self._text()
        if text.startswith(self.printed):
            self.out.write(text[len(self.printed) :] + "\n")
        self.printed = text


def print_stats(stats: Any, base: Any, *, identical: bool | None, err: Writer) -> None:
    """``run --stats`` on ``err``: one line for people, then the JSON line (scripts read it);
    ``stats`` / ``base``: the speculative and the target-only ``DecodeStats``."""
    summary = {k: round(v, 4) for k, v in stats.summary().items()}
    summary["target_only_wall_s"] = round(base.wall_s, 4)
    summary["speedup_vs_target_only"] = round(base.wall_s / max(stats.wall_s, 1e-9), 3)
    same = (
        "" if identical is None else f", identical to target-only: {'yes' if identical else 'NO'}"
    )
    if identical is not None:
        summary["identical_to_target_only"] = identical
    print(f"speculative {stats.n_generated} tokens in {stats.wall_s:.2f} s "
          f"({stats.tokens_per_s:.1f} tok/s, acceptance {stats.acceptance_rate:.2f}, "
          f"{stats.tokens_per_target_call:.2f} tokens per target call); target-only "
          f"{base.wall_s:.2f} s ({base.tokens_per_s:.1f} tok/s): speedup "
          f"{summary['speedup_vs_target_only']:.2f}x{same}", file=err)  # fmt: skip
    print(json.dumps(summary), file=err)
