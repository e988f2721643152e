"""Property-based fuzzing of the ODNG, ODVM and manifest readers with structure-aware mutations.

Every input must be rejected with the reader's own error naming the source, or accepted and then
pass an oracle written from the format's docstring (``mutations``). Quick run: a few thousand
inputs per format; ``OMNIDRAFT_RELIABILITY=long``: >= 100k per format, counted in reports/fuzz.md.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
from conftest import record, scale
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutations import (
    check_manifest,
    check_odng,
    check_odvm,
    manifest_inputs,
    odng_inputs,
    odvm_inputs,
)

FORMATS: dict[str, tuple[st.SearchStrategy, Callable[[object], str], int]] = {
    "ODNG (ngram/format.py)": (odng_inputs(), check_odng, 2500),  # type: ignore[dict-item]
    "ODVM (vocab/io.py)": (odvm_inputs(), check_odvm, 2000),  # type: ignore[dict-item]
    "manifest.json (manifest.py)": (manifest_inputs(), check_manifest, 2500),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_mutated_input_is_rejected_cleanly_or_valid(name: str) -> None:
    strategy, check, quick = FORMATS[name]
    outcomes: Counter[str] = Counter()
    n = scale(quick, 100_000)
    t0 = time.perf_counter()

    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(strategy)
    def run(data: object) -> None:
        outcomes[check(data)] += 1  # raises AssertionError on a crash or an invalid accept

    run()
    record(name, inputs=sum(outcomes.values()), accepted=outcomes["accepted"],
           rejected=outcomes["rejected"], crashes=0, invalid_accepted=0,
           seconds=time.perf_counter() - t0)  # fmt: skip
    assert outcomes["rejected"] > 0 and outcomes["accepted"] > 0  # both sides were reached
