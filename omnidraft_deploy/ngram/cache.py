"""Online n-gram cache: drafter-token sequences (n >= 2) that merge into one target token.

Token spaces: keys are **drafter** ids, values are **target** ids; nothing here knows a tokenizer.
A target token such as ``' flake'`` may have no single drafter token; the drafter spells it
``' f' 'la' 'ke'``. Each time the target emits a token whose drafter spelling has n >= 2 tokens,
the caller runs ``update(spelling, target_id)``. While drafting, the caller walks the drafter's
tokens and asks ``match(draft_ids, j)`` for the longest cached n-gram starting at ``j``; the merged
proposal probability is the product of the n draft probabilities (computed by the caller).
See OmniDraft (arXiv:2507.02659), section on the n-gram cache.

Data structure: one ``dict`` keyed by the id tuple, plus an index of the distinct lengths present
(longest first). ``match`` tries those lengths from the longest down: at most ``max_n - 1`` dict
lookups, each hashing an n-tuple, so O(max_n) lookups with no trie nodes to keep.

Semantics:
    * ``update`` inserts, or touches an existing key (one use). The same draft sequence seen with a
      different target id keeps the **latest** target id (tokenizations are deterministic, so a
      change means the mapping changed and the old value is stale).
    * ``match`` counts as one use of the returned entry for the eviction policy.
    * Both capacities hold after every call: ``len(cache) <= max_entries`` and
      ``nbytes <= max_bytes``; the policy's victims are evicted until the new entry fits. An entry
      that cannot fit even into an empty cache is skipped (counted in ``stats.skipped``).
    * Deterministic: the same call sequence gives the same state, victims and bytes.

Byte accounting (``nbytes``, the quantity ``max_bytes`` bounds), exact and value-independent::

    nbytes = FILE_OVERHEAD_NBYTES (28: file header 24 + CRC 4)
             + sum over entries of entry_nbytes(n) = 9 + 4 * n   (u8 n, n x u32 id, u32 target,
                                                                   u32 use count)

It is the size of a flat fixed-width array of entries, what a device needs to hold the cache; the
varint file of ``ngram.format`` is never larger while ids and use counts stay below 2**28.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from omnidraft_deploy.ngram.eviction import EvictionPolicy, Key, make_policy

MAX_N = 255  # n is stored as a u8
MAX_ID = 0xFFFF_FFFF  # ids are u32
ENTRY_FIXED_NBYTES = 9  # u8 n + u32 target id + u32 use count
FILE_OVERHEAD_NBYTES = 28  # format header (24 B) + trailing CRC-32 (4 B)
DEFAULT_MAX_ENTRIES = 8192


def entry_nbytes(n: int) -> int:
    """Accounted bytes of one n-gram entry (see the module docstring)."""
    return ENTRY_FIXED_NBYTES + 4 * n


@dataclass(frozen=True)
class CacheStats:
    hits: int  # match() calls that returned an n-gram
    misses: int  # match() calls that returned None
    inserts: int  # new entries (touches of existing entries are not inserts)
    evictions: int
    skipped: int  # n-grams too large for max_bytes even in an empty cache


class NGramCache:
    """Bounded map ``drafter-id n-gram (n >= 2) -> target id`` with LRU or LFU eviction."""

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int | None = None,
        policy: EvictionPolicy | str = "lru",
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        smallest = FILE_OVERHEAD_NBYTES + entry_nbytes(2)
        if max_bytes is not None and max_bytes < smallest:
            raise ValueError(f"max_bytes must be >= {smallest} (one bigram), got {max_bytes}")
        self._policy = make_policy(policy) if isinstance(policy, str) else policy
        if len(self._policy):
            raise ValueError("policy must be a fresh instance (it already tracks keys)")
        self._max_entries, self._max_bytes = max_entries, max_bytes
        self._targets: dict[Key, int] = {}
        self._len_counts: dict[int, int] = {}  # n -> number of cached n-grams of that length
        self._lengths: tuple[int, ...] = ()  # distinct cached n, longest first
        self._nbytes = FILE_OVERHEAD_NBYTES
        self._hits = self._misses = self._inserts = self._evictions = self._skipped = 0

    @classmethod
    def from_items(
        cls,
        items: Iterable[tuple[Sequence[int], int, int]],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int | None = None,
        policy: EvictionPolicy | str = "lru",
    ) -> NGramCache:
        """Rebuild a cache from ``(draft_ids, target_id, uses)`` rows, next victim first.

        This is the inverse of ``items()``: the eviction order and use counts come back exactly.
        Rows beyond a capacity evict the earliest rows, as they would have been evicted next.
        """
        cache = cls(max_entries=max_entries, max_bytes=max_bytes, policy=policy)
        for draft_ids, target_id, uses in items:
            key = _key(draft_ids, int(target_id))
            if key in cache._targets:
                raise ValueError(f"duplicate n-gram {key}")
            cache._insert(key, int(target_id), uses)
        return cache

    @classmethod
    def from_checked_rows(
        cls,
        keys: list[Key],
        target_ids: list[int],
        uses: list[int],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int | None = None,
        policy: str = "lru",
    ) -> NGramCache:
        """``from_items`` for rows a reader has already checked, in linear time (bulk loading).

        Preconditions (``ngram.format`` enforces them): keys distinct tuples of 2..255 ids, ids
        and counts in range, and for LFU the use counts non-decreasing (the canonical order, where
        the next victim is always the earliest row). Same state and stats as ``from_items``: the
        rows that could never fit are skipped, then the longest suffix that fits both capacities
        is kept (what inserting row by row with eviction leaves).
        """
        cache = cls(max_entries=max_entries, max_bytes=max_bytes, policy=policy)
        budget = max_bytes
        start = max(0, len(keys) - max_entries)
        if budget is not None:
            sizes = [entry_nbytes(len(k)) for k in keys]
            fits = [FILE_OVERHEAD_NBYTES + s <= budget for s in sizes]
            cache._skipped = len(fits) - sum(fits)
            keys = list(itertools.compress(keys, fits))
            target_ids = list(itertools.compress(target_ids, fits))
            uses = list(itertools.compress(uses, fits))
            sizes = list(itertools.compress(sizes, fits))
            start = max(0, len(keys) - max_entries)
            total = FILE_OVERHEAD_NBYTES + sum(sizes[start:])
            while total > budget:  # longest suffix within the byte budget
                total -= sizes[start]
                start += 1
        cache._inserts, cache._evictions = len(keys), start
        keys, target_ids, uses = keys[start:], target_ids[start:], uses[start:]
        cache._targets = dict(zip(keys, target_ids, strict=True))
        if len(cache._targets) != len(keys):
            raise ValueError("duplicate n-grams among the rows")
        cache._policy.add_many(keys, uses)
        n_ids = sum(map(len, keys))
        cache._nbytes = FILE_OVERHEAD_NBYTES + ENTRY_FIXED_NBYTES * len(keys) + 4 * n_ids
        cache._len_counts = dict(collections.Counter(map(len, keys)))
        cache._lengths = tuple(sorted(cache._len_counts, reverse=True))
        return cache

    def update(self, draft_ids: Sequence[int], target_id: int) -> None:
        """Insert ``draft_ids -> target_id`` or touch it (latest target id wins).

        ``draft_ids``: the drafter spelling of ``target_id``, 2 <= n <= 255 ids in [0, 2**32).
        """
        target_id = int(target_id)
        key = _key(draft_ids, target_id)
        if key in self._targets:
            self._targets[key] = target_id
            self._policy.touch(key)
        else:
            self._insert(key, target_id, 1)

    def match(self, draft_ids: Sequence[int], start: int = 0) -> tuple[int, int] | None:
        """``(target_id, n)`` of the longest cached n-gram equal to ``draft_ids[start:start+n]``.

        ``draft_ids``: drafter ids (Python or NumPy ints; not tensors). A hit counts as one use.
        """
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        room = len(draft_ids) - start
        for n in self._lengths:
            if n > room:
                continue
            key = tuple(draft_ids[start : start + n])
            target_id = self._targets.get(key)
            if target_id is not None:
                self._policy.touch(key)
                self._hits += 1
                return target_id, n
        self._misses += 1
        return None

    def items(self) -> list[tuple[Key, int, int]]:
        """Every entry as ``(draft_ids, target_id, uses)``, next victim first (serialization)."""
        return [(key, self._targets[key], uses) for key, uses in self._policy.order()]

    def __len__(self) -> int:
        return len(self._targets)

    def __contains__(self, draft_ids: object) -> bool:
        return isinstance(draft_ids, tuple | list) and tuple(draft_ids) in self._targets

    @property
    def nbytes(self) -> int:
        """Accounted size in bytes (module docstring); ``<= max_bytes`` at all times."""
        return self._nbytes

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def max_bytes(self) -> int | None:
        return self._max_bytes

    @property
    def policy(self) -> str:
        return self._policy.name

    @property
    def max_n(self) -> int:
        """Length of the longest cached n-gram; 0 when empty."""
        return self._lengths[0] if self._lengths else 0

    @property
    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._inserts, self._evictions, self._skipped)

    def _insert(self, key: Key, target_id: int, uses: int) -> None:
        size = entry_nbytes(len(key))
        budget = self._max_bytes
        if budget is not None and FILE_OVERHEAD_NBYTES + size > budget:
            self._skipped += 1
            return
        while self._targets and (
            len(self._targets) >= self._max_entries
            or (budget is not None and self._nbytes + size > budget)
        ):
            self._evict()
        self._policy.add(key, uses)
        self._targets[key] = target_id
        self._nbytes += size
        self._inserts += 1
        self._count_length(len(key), +1)

    def _evict(self) -> None:
        key = self._policy.victim()
        self._policy.remove(key)
        del self._targets[key]
        self._nbytes -= entry_nbytes(len(key))
        self._evictions += 1
        self._count_length(len(key), -1)

    def _count_length(self, n: int, delta: int) -> None:
        count = self._len_counts.get(n, 0) + delta
        if count:
            self._len_counts[n] = count
        else:
            del self._len_counts[n]
        if count in (0, 1):  # a length appeared or vanished
            self._lengths = tuple(sorted(self._len_counts, reverse=True))


def _key(draft_ids: Sequence[int], target_id: int) -> Key:
    key = tuple(map(int, draft_ids))
    if not 2 <= len(key) <= MAX_N:
        raise ValueError(f"an n-gram needs 2 <= n <= {MAX_N} draft ids, got n={len(key)}: {key}")
    if min(key) < 0 or max(key) > MAX_ID:
        raise ValueError(f"draft ids must be in [0, {MAX_ID}], got {key}")
    if not 0 <= target_id <= MAX_ID:
        raise ValueError(f"target id must be in [0, {MAX_ID}], got {target_id}")
    return key
