"""Streamed output for ``omnidraft run``: text as verification steps commit tokens, plus per-step stats.

A ``TextStreamer`` is a decoder observer (``SpeculativeDecoder.generate(observer=...)``): after each
target call it receives the committed ids (target vocabulary) and the ids that call added. It
re-decodes the whole continuation and writes only the new suffix, holding back a trailing U+FFFD
(a multi-byte character split across tokens is printed once its last byte arrives).
"""

from __future__ import annotations

from typing import Protocol, TextIO

from torch import Tensor


class Decodes(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class TextStreamer:
    def __init__(self, tokenizer: Decodes, out: TextIO, stats: TextIO | None = None) -> None:
        self.tokenizer, self.out, self.stats = tokenizer, out, stats
        self.ids: list[int] = []
        self.printed = ""
        self.steps = 0

    def __call__(
        self, committed: list[int], new_ids: list[int], topk_ids: Tensor, topk_probs: Tensor
    ) -> None:
        self.steps += 1
        self.ids += new_ids
        text = self.tokenizer.decode(self.ids)
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
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.printed):
            self.out.write(text[len(self.printed) :] + "\n")
        self.printed = text
