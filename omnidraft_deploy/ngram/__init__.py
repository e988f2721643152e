"""Online n-gram cache (drafter n-grams -> target ids), its eviction policies and binary format."""

from __future__ import annotations

from omnidraft_deploy.ngram.cache import CacheStats, NGramCache, entry_nbytes
from omnidraft_deploy.ngram.eviction import EvictionPolicy, LFUPolicy, LRUPolicy, make_policy
from omnidraft_deploy.ngram.format import NGramFormatError, NGramHeader

__all__ = [
    "CacheStats",
    "EvictionPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "NGramCache",
    "NGramFormatError",
    "NGramHeader",
    "entry_nbytes",
    "make_policy",
]
