"""Which tokens a model's KV cache holds, so a prompt that begins with them is not prefilled again.

Every ``CausalLM`` here keeps a static cache addressed by position: a call at ``start`` writes the
keys and values of its tokens at ``start, start+1, ...`` from what the cache holds before
``start``. So the entry at position ``p`` is valid for a text exactly when the tokens fed at
``0..p`` are that text's first ``p + 1`` tokens, and nothing else has to be known about how they
got there (one prefill, a verify call whose later proposals were rejected, an earlier request's
reply). ``CachedTokens`` records those tokens, one per position, as the model is called; the
decoders start a prompt's prefill after the longest prefix it shares with them (at most all
but its last token, whose logits the first step reads). That is what makes a served session
(``omnidraft serve``) prefill the chat template's system turn once, and a chat's earlier turns
not at all; llama.cpp's server does the same (``cache_prompt``).

Correctness needs only that the cache is causal and position-addressed, which the graph
contract guarantees; the reused entries are bit-identical to a fresh prefill's wherever the
graph is row-invariant (``batch_invariant`` in the manifest; the w8a8 and 4-bit targets are).
A caller that wants a colder start says how much to keep (``keep``): a benchmark that gives
every configuration the same warm system turn, a baseline run that must start where another
did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


class CachedTokens:
    """The token ids whose keys and values sit at positions ``0..len-1`` of one model's cache."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def fed(self, ids: Sequence[int], start: int) -> None:
        """A call wrote ``ids`` at ``start..``: they replace whatever lay from ``start`` on. A
        call that starts past the recorded tokens leaves a gap of unknown entries before it, so
        nothing from the gap on can be vouched for and only the tokens before it are kept."""
        if start > len(self.ids):
            return  # positions len..start-1 unknown: the record stops before them
        del self.ids[start:]
        self.ids.extend(int(t) for t in ids)

    def keep(self, n: int) -> None:
        """Forget every position from ``n`` on (their entries stay, unused, until overwritten)."""
        del self.ids[max(0, n) :]

    def reusable(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` need no prefill: the prefix it shares with the
        cache, short of its last token (the first step reads that token's logits)."""
        return max(0, min(common_prefix(self.ids, prompt), len(prompt) - 1))


def cached_tokens(lm: Any) -> CachedTokens | None:
    """``lm``'s record of its cache, or None for a model that keeps none (it is prefilled from
    position 0 every time, as before this module)."""
    record = getattr(lm, "cached", None)
    return record if isinstance(record, CachedTokens) else None


def reusable(lm: Any, prompt: Sequence[int]) -> int:
    """Leading tokens of ``prompt`` already in ``lm``'s cache (0 where ``lm`` keeps no record)."""
    record = cached_tokens(lm)
    return 0 if record is None else record.reusable(prompt)


def keep(lm: Any, n: int) -> None:
    """Let ``lm`` reuse at most its first ``n`` cached tokens from now on (no-op without a
    record)."""
    record = cached_tokens(lm)
    if record is not None:
        record.keep(n)
