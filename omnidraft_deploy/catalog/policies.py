"""The draft-length policies by name (data only, so the CLI parser lists them without numpy).

``speculative.draft_len.POLICIES`` maps each name to its class, and ``make_policy`` builds one;
``tests/core/test_decoder_factory.py`` checks that the two name the same policies.
"""

from __future__ import annotations

from enum import StrEnum


class PolicyName(StrEnum):
    FIXED = "fixed"  # the same draft length every step
    HEURISTIC = "heuristic"  # +2 after a fully accepted draft, -1 otherwise
    PREDICTOR = "predictor"  # stop drafting where an online head predicts a rejection
    COST = "cost"  # draft only while a measured cost profile says it pays


NEEDS_PROFILE = frozenset({PolicyName.COST})  # needs a measured ``CostProfile``
