"""Model-free proposals in the target vocabulary: suffix lookup over the text seen so far.

Like llama.cpp's lookup decoding and ONNX Runtime GenAI's n-gram speculation (prompt lookup):
find the most recent earlier place where the last ``n`` committed target ids occurred (longest
``n`` first, ``max_ngram`` down to ``min_ngram``) and propose the ids that followed it. The text
searched is the session's history (earlier prompts and outputs, when kept), the prompt and the
generated text. A lookup proposal is deterministic given the context: in ``exact`` mode its
proposal distribution is one-hot (``q = 1`` on the proposed id), so rejection sampling stays exact.

Memory is bounded: the token buffer holds at most ``max_tokens`` ids; when it is full the oldest
half is dropped and the index rebuilt (amortised O(1) per token). The index maps each n-gram to the
position just after its latest occurrence; one entry per (position, n), so at most
``max_tokens * (max_ngram - min_ngram + 1)`` entries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LookupConfig:
    # 1: a single matching id is enough to propose. The policy decides whether a proposal pays
    # (``HybridProposer`` keeps an acceptance estimate per matched length), and once verifying one
    # more token costs little, unigram matches pay (``benchmarks/lookup_sim.py`` on the 24
    # real-pair outputs of Qwen2.5-0.5B: on code 1.20 target tokens per step with min 1, 1.09
    # with min 2; math 1.50 / 1.34).
    min_ngram: int = 1
    max_ngram: int = 4
    max_tokens: int = 8192  # bound on the buffer (history + current text)
    keep_history: bool = True  # carry earlier prompts / outputs into the next generation

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, "
                             f"{self.max_ngram}")  # fmt: skip
        if self.max_tokens < 4 * self.max_ngram:
            raise ValueError(f"max_tokens {self.max_tokens} is too small for n-grams of "
                             f"{self.max_ngram}")  # fmt: skip


class LookupProposer:
    """Suffix lookup over a bounded token buffer (module docstring)."""

    def __init__(self, config: LookupConfig = LookupConfig()) -> None:
        self.cfg = config
        self._buf: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self._buf)

    @property
    def index_size(self) -> int:
        return len(self._index)

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a generation: keep (or drop) the history, then append the prompt."""
        if not self.cfg.keep_history:
            self._buf, self._index = [], {}
        self.extend(prompt_ids)

    def clear(self) -> None:
        self._buf, self._index = [], {}

    def extend(self, ids: list[int]) -> None:
        """Append committed target ids, indexing each n-gram that now has a follower."""
        for t in ids:
            if len(self._buf) >= self.cfg.max_tokens:
                self._shrink()
            self._buf.append(int(t))
            self._index_end(len(self._buf) - 1)

    def _index_end(self, p: int) -> None:
        """Index the n-grams ending just before position ``p`` (their follower is ``buf[p]``)."""
        lo, hi = self.cfg.min_ngram, self.cfg.max_ngram
        for n in range(lo, min(hi, p) + 1):
            self._index[tuple(self._buf[p - n : p])] = p

    def _shrink(self) -> None:
        drop = len(self._buf) // 2
        self._buf = self._buf[drop:]
        self._index = {}
        for p in range(1, len(self._buf)):
            self._index_end(p)

    def propose(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` target ids continuing the buffer's suffix, and the matched n-gram length
        (0: no match). Continuations may run into the current text (repetitive output)."""
        if k < 1:
            return [], 0
        buf = self._buf
        for n in range(min(self.cfg.max_ngram, len(buf)), self.cfg.min_ngram - 1, -1):
            pos = self._index.get(tuple(buf[-n:]))
            if pos is not None and pos < len(buf):
                return buf[pos : pos + k], n
        return [], 0
