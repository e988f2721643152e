"""NGramCache: longest match, latest-wins updates, both capacities, LRU/LFU against a reference."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnidraft_deploy.ngram.cache import FILE_OVERHEAD_NBYTES, NGramCache, entry_nbytes
from omnidraft_deploy.ngram.eviction import LFUPolicy, LRUPolicy, make_policy


def test_match_returns_the_longest_cached_ngram_at_start() -> None:
    cache = NGramCache()
    cache.update([1, 2], 10)
    cache.update([1, 2, 3], 11)
    cache.update([1, 2, 3, 4, 5], 12)
    assert cache.match([1, 2, 3, 4], 0) == (11, 3)  # the 5-gram does not fit
    assert cache.match([9, 1, 2, 3, 4, 5], 1) == (12, 5)
    assert cache.match([9, 1, 2, 7], 1) == (10, 2)
    assert cache.match([9, 1, 2, 7], 0) is None
    assert cache.match([1], 0) is None and cache.match([1, 2], 2) is None
    assert cache.max_n == 5 and len(cache) == 3
    assert cache.stats.hits == 3 and cache.stats.misses == 3


def test_latest_target_wins_and_touch_is_not_an_insert() -> None:
    cache = NGramCache()
    cache.update((4, 5), 7)
    cache.update((4, 5), 8)
    assert cache.match([4, 5]) == (8, 2)
    assert cache.items() == [((4, 5), 8, 3)]  # insert + touch + match hit
    assert cache.stats.inserts == 1 and (4, 5) in cache and [4, 5] in cache


@pytest.mark.parametrize("bad", [[], [3], list(range(256)), [1, -2], [1, 2**32]])
def test_update_rejects_bad_ngrams(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="n-gram|draft ids"):
        NGramCache().update(bad, 1)


def test_bad_arguments_are_rejected_loudly() -> None:
    with pytest.raises(ValueError, match="target id"):
        NGramCache().update([1, 2], -1)
    with pytest.raises(ValueError, match="max_entries"):
        NGramCache(max_entries=0)
    with pytest.raises(ValueError, match="max_bytes"):
        NGramCache(max_bytes=FILE_OVERHEAD_NBYTES)
    with pytest.raises(KeyError, match="unknown eviction policy 'mru'; choose from"):
        NGramCache(policy="mru")
    used = LRUPolicy()
    used.add((1, 2))
    with pytest.raises(ValueError, match="fresh"):
        NGramCache(policy=used)
    with pytest.raises(ValueError, match="start"):
        NGramCache().match([1, 2], -1)
    with pytest.raises(ValueError, match="duplicate"):
        NGramCache.from_items([((1, 2), 3, 1), ((1, 2), 4, 1)])


def test_match_is_a_use_for_lru() -> None:
    cache = NGramCache(max_entries=2, policy="lru")
    cache.update([1, 2], 1)
    cache.update([3, 4], 2)
    assert cache.match([1, 2]) == (1, 2)
    cache.update([5, 6], 3)  # evicts (3, 4): (1, 2) was used more recently
    assert [k for k, _, _ in cache.items()] == [(1, 2), (5, 6)]
    assert cache.stats.evictions == 1


def test_lfu_breaks_ties_by_recency() -> None:
    cache = NGramCache(max_entries=3, policy="lfu")
    for i, key in enumerate([(1, 1), (2, 2), (3, 3)]):
        cache.update(key, i)
    cache.match([1, 1])
    cache.match([2, 2])  # (1,1) and (2,2) have 2 uses, (3,3) has 1
    cache.update([4, 4], 4)  # evicts (3, 3), the only 1-use entry
    cache.match([4, 4])  # now (1,1), (2,2), (4,4) all have 2 uses; (1,1) is least recent
    cache.update([5, 5], 5)
    assert [k for k, _, _ in cache.items()] == [(5, 5), (2, 2), (4, 4)]


def test_byte_capacity_evicts_and_skips_entries_that_never_fit() -> None:
    budget = FILE_OVERHEAD_NBYTES + 2 * entry_nbytes(3)
    cache = NGramCache(max_bytes=budget)
    cache.update([1, 2, 3], 1)
    cache.update([4, 5, 6], 2)
    assert cache.nbytes == budget
    cache.update([7, 8, 9, 10], 3)  # needs both slots freed
    assert [k for k, _, _ in cache.items()] == [(7, 8, 9, 10)]
    cache.update(list(range(20)), 4)  # larger than the whole budget: skipped, nothing evicted
    assert len(cache) == 1 and cache.stats.skipped == 1 and cache.stats.evictions == 2


def test_from_items_inverts_items_for_both_policies() -> None:
    for policy in ("lru", "lfu"):
        cache = NGramCache(policy=policy)
        for i, key in enumerate([(1, 2), (2, 3), (3, 4, 5), (1, 2), (9, 9)]):
            cache.update(key, i)
        cache.match([3, 4, 5])
        again = NGramCache.from_items(cache.items(), policy=policy)
        assert again.items() == cache.items() and again.nbytes == cache.nbytes
        for c in (cache, again):
            c.update([7, 7], 0)
            c.match([2, 3])
        assert again.items() == cache.items()


def test_policy_registry_builds_fresh_instances() -> None:
    assert isinstance(make_policy("lru"), LRUPolicy) and isinstance(make_policy("lfu"), LFUPolicy)
    assert make_policy("lfu") is not make_policy("lfu")
    with pytest.raises(KeyError, match="empty"):
        LFUPolicy().victim()


# Reference model: a flat list scanned in full, with an explicit clock.


@dataclass
class _Ref:
    policy: str
    max_entries: int
    max_bytes: int | None
    rows: dict[tuple[int, ...], list[int]] = field(default_factory=dict)  # key -> [target, uses, t]
    clock: int = 0

    def _rank(self, key: tuple[int, ...]) -> tuple[int, ...]:
        target, uses, t = self.rows[key]
        return (t,) if self.policy == "lru" else (uses, t)

    def nbytes(self) -> int:
        return FILE_OVERHEAD_NBYTES + sum(entry_nbytes(len(k)) for k in self.rows)

    def update(self, key: tuple[int, ...], target: int) -> None:
        self.clock += 1
        if key in self.rows:
            self.rows[key] = [target, self.rows[key][1] + 1, self.clock]
            return
        size = entry_nbytes(len(key))
        if self.max_bytes is not None and FILE_OVERHEAD_NBYTES + size > self.max_bytes:
            return
        while self.rows and (
            len(self.rows) >= self.max_entries
            or (self.max_bytes is not None and self.nbytes() + size > self.max_bytes)
        ):
            del self.rows[min(self.rows, key=self._rank)]
        self.rows[key] = [target, 1, self.clock]

    def match(self, seq: list[int], start: int) -> tuple[int, int] | None:
        hits = [k for k in self.rows if list(k) == seq[start : start + len(k)]]
        if not hits:
            return None
        best = max(hits, key=len)
        self.clock += 1
        self.rows[best][1] += 1
        self.rows[best][2] = self.clock
        return self.rows[best][0], len(best)

    def items(self) -> list[tuple[tuple[int, ...], int, int]]:
        return [(k, self.rows[k][0], self.rows[k][1]) for k in sorted(self.rows, key=self._rank)]


_ids = st.lists(st.integers(0, 3), min_size=2, max_size=5)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("update"), _ids, st.integers(0, 9)),
        st.tuples(st.just("match"), st.lists(st.integers(0, 3), max_size=8), st.integers(0, 7)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    policy=st.sampled_from(["lru", "lfu"]),
    max_entries=st.integers(1, 6),
    max_bytes=st.one_of(st.none(), st.integers(45, 140)),
)
def test_matches_reference_model_and_never_exceeds_capacity(
    ops: list[tuple[str, list[int], int]], policy: str, max_entries: int, max_bytes: int | None
) -> None:
    cache = NGramCache(max_entries=max_entries, max_bytes=max_bytes, policy=policy)
    ref = _Ref(policy, max_entries, max_bytes)
    for op, ids, arg in ops:
        if op == "update":
            cache.update(ids, arg)
            ref.update(tuple(ids), arg)
        else:
            assert cache.match(ids, arg) == ref.match(ids, arg)
        assert len(cache) <= max_entries
        assert max_bytes is None or cache.nbytes <= max_bytes
        assert cache.nbytes == ref.nbytes()
        assert cache.items() == ref.items()
