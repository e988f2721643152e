"""Eviction policies of the n-gram cache: which entry goes when a capacity is reached.

A policy only orders keys (draft-id tuples) and counts their uses; it never sees target ids.
``NGramCache`` tells it about every insert (``add``), use (``touch``) and removal (``remove``) and
asks it for the next ``victim``. ``order`` lists every key with its use count, next victim first.

Persistence: the policy is strategy state, not format, but its state *is* persisted so that a warm
cache keeps its eviction order across sessions. ``omnidraft_deploy.ngram.format`` writes entries in
``order()`` (next victim first) with each entry's use count, and the policy id in the header flags.
Reading re-adds the entries in file order with their counts, which rebuilds the exact same order
for both policies. Nothing else (no clock, no tick counter) is stored; recency is the file order.

Use counts start at 1 on insert, grow by 1 per ``touch`` and saturate at ``MAX_USES`` (u32).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol

Key = tuple[int, ...]  # drafter token ids of one n-gram, n >= 2
MAX_USES = 0xFFFF_FFFF  # use counts are stored as u32; they stop growing there


class EvictionPolicy(Protocol):
    """Orders the keys of a cache for eviction; one instance per cache."""

    name: str  # "lru" | "lfu": the registry name, also mapped to the policy id of the format

    def add(self, key: Key, uses: int = 1) -> None: ...  # new key, most recently used

    def add_many(self, keys: list[Key], uses: list[int]) -> None: ...  # bulk add, empty policy

    def touch(self, key: Key) -> None: ...  # one more use of an existing key

    def remove(self, key: Key) -> None: ...

    def victim(self) -> Key: ...  # next key to evict; KeyError when empty

    def order(self) -> Iterator[tuple[Key, int]]: ...  # (key, uses), next victim first

    def __len__(self) -> int: ...


class LRUPolicy:
    """Least recently used goes first. ``OrderedDict`` from oldest to newest use: all O(1)."""

    name = "lru"

    def __init__(self) -> None:
        self._uses: OrderedDict[Key, int] = OrderedDict()

    def add(self, key: Key, uses: int = 1) -> None:
        if key in self._uses:
            raise KeyError(f"n-gram {key} is already tracked")
        self._uses[key] = _check_uses(uses)

    def add_many(self, keys: list[Key], uses: list[int]) -> None:
        """``add`` of each key in turn, into an empty policy (checked rows: bulk loading)."""
        if self._uses:
            raise ValueError("add_many needs an empty policy")
        self._uses = OrderedDict(zip(keys, uses, strict=True))

    def touch(self, key: Key) -> None:
        self._uses[key] = min(self._uses[key] + 1, MAX_USES)
        self._uses.move_to_end(key)

    def remove(self, key: Key) -> None:
        del self._uses[key]

    def victim(self) -> Key:
        if not self._uses:
            raise KeyError("victim() of an empty policy")
        return next(iter(self._uses))

    def order(self) -> Iterator[tuple[Key, int]]:
        return iter(list(self._uses.items()))

    def __len__(self) -> int:
        return len(self._uses)


class LFUPolicy:
    """Fewest uses goes first; ties go to the least recently used.

    One ``OrderedDict`` bucket per use count, each ordered by the time its keys entered it, which
    is their last use (a touch moves a key to the end of the next bucket), so ties break by
    recency. ``victim`` is the first key of the smallest bucket: all operations O(1) except
    ``remove`` of the last key of the smallest bucket, O(number of distinct counts).
    """

    name = "lfu"

    def __init__(self) -> None:
        self._uses: dict[Key, int] = {}
        self._buckets: dict[int, OrderedDict[Key, None]] = {}
        self._min = 0  # smallest non-empty bucket; 0 when empty

    def add(self, key: Key, uses: int = 1) -> None:
        if key in self._uses:
            raise KeyError(f"n-gram {key} is already tracked")
        uses = _check_uses(uses)
        self._uses[key] = uses
        self._buckets.setdefault(uses, OrderedDict())[key] = None
        self._min = uses if self._min == 0 else min(self._min, uses)

    def add_many(self, keys: list[Key], uses: list[int]) -> None:
        """``add`` of each key in turn, into an empty policy; ``uses`` must be non-decreasing
        (the canonical file order), so each count's keys form one run."""
        if self._uses:
            raise ValueError("add_many needs an empty policy")
        if not all(map(operator.le, uses, itertools.islice(uses, 1, None))):
            raise ValueError("add_many needs use counts in non-decreasing order")
        self._uses = dict(zip(keys, uses, strict=True))
        for count in sorted(set(uses)):  # each count's keys are one run of the sorted list
            lo, hi = bisect.bisect_left(uses, count), bisect.bisect_right(uses, count)
            self._buckets[count] = OrderedDict.fromkeys(keys[lo:hi])
        self._min = uses[0] if uses else 0

    def touch(self, key: Key) -> None:
        uses = self._uses[key]
        if uses == MAX_USES:
            self._buckets[uses].move_to_end(key)
            return
        self._unlink(key, uses)
        self._uses[key] = uses + 1
        self._buckets.setdefault(uses + 1, OrderedDict())[key] = None
        if self._min not in self._buckets:  # key was the last one with the fewest uses
            self._min = uses + 1

    def remove(self, key: Key) -> None:
        self._unlink(key, self._uses.pop(key))
        if self._min not in self._buckets:
            self._min = min(self._buckets, default=0)

    def victim(self) -> Key:
        if not self._uses:
            raise KeyError("victim() of an empty policy")
        return next(iter(self._buckets[self._min]))

    def order(self) -> Iterator[tuple[Key, int]]:
        return iter([(k, c) for c in sorted(self._buckets) for k in self._buckets[c]])

    def __len__(self) -> int:
        return len(self._uses)

    def _unlink(self, key: Key, uses: int) -> None:
        bucket = self._buckets[uses]
        del bucket[key]
        if not bucket:
            del self._buckets[uses]


def _check_uses(uses: int) -> int:
    if not 1 <= uses <= MAX_USES:
        raise ValueError(f"use count {uses} outside [1, {MAX_USES}]")
    return uses


NAME_TO_POLICY: dict[str, type[LRUPolicy] | type[LFUPolicy]] = {"lru": LRUPolicy, "lfu": LFUPolicy}


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by registry name; unknown names raise ``KeyError`` listing the choices."""
    try:
        cls = NAME_TO_POLICY[name]
    except KeyError:
        raise KeyError(
            f"unknown eviction policy {name!r}; choose from {sorted(NAME_TO_POLICY)}"
        ) from None
    return cls()
