"""Property-based fuzzing of the ODNG, ODVM and manifest readers with structure-aware mutations.

Every input must be rejected with the reader's own error naming the source, or accepted and then
pass an oracle written from the format's docstring (``mutations``). Quick run: a few thousand
inputs per format; ``OMNIDRAFT_RELIABILITY=long``: >= 100k per format, counted in reports/fuzz.md.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

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
    "ODNG (ngram/format.py)": (odng_inputs(), check_odng, 1000),  # type: ignore[dict-item]
    "ODVM (vocab/io.py)": (odvm_inputs(), check_odvm, 1000),  # type: ignore[dict-item]
    "manifest.json (manifest.py)": (manifest_inputs(), check_manifest, 1000),  # type: ignore[dict-item]
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


def test_bundle_opener_refuses_every_broken_bundle(tmp_path: Path) -> None:
    """File-system-level mutations of a valid bundle (``bundle_mutations``): every mutation in
    ``BREAKS`` must be refused with a ``BundleError``; no mutation may raise anything else."""
    from bundle_mutations import BREAKS, MUTATIONS, make_seed
    from omnidraft_deploy.runtime.bundle import check_bundle

    from omnidraft_deploy.manifest import BundleError

    seed = make_seed(tmp_path / "seed")
    check_bundle(seed)  # the seed itself is valid
    doc0 = json.loads((seed / "manifest.json").read_text())
    outcomes: Counter[str] = Counter()
    n = scale(300, 100_000)
    t0 = time.perf_counter()

    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=2),
           st.integers(0, 2**32))  # fmt: skip
    def run(names: list[str], salt: int) -> None:
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        for p in tmp_path.glob("work-outside-*"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        shutil.copytree(seed, work)
        doc, rng = copy.deepcopy(doc0), random.Random(salt)
        applied = []
        for name in names:
            try:
                MUTATIONS[name](work, doc, rng)
                applied.append(name)
            except (OSError, KeyError, TypeError):  # two edits can clash (file deleted, then
                # linked; a section replaced, then edited): skip the second
                pass
        names = applied
        (work / "manifest.json").write_text(json.dumps(doc))
        try:
            check_bundle(work)
            outcome = "accepted"
        except BundleError as e:
            assert e.problem, e
            outcome = "rejected"
        except Exception as e:  # noqa: BLE001 - any other exception is a crash
            raise AssertionError(f"crash after {names}: {type(e).__name__}: {e}") from e
        breaks = [  # a later edit that relists a file legitimately repairs change_unlisted
            x for i, x in enumerate(names)
            if x in BREAKS and not (x == "change_unlisted" and set(names[i + 1 :]) - set(BREAKS))
        ]  # fmt: skip
        assert not (breaks and outcome == "accepted"), f"accepted a bundle broken by {breaks}"
        outcomes[outcome] += 1

    run()
    record("bundle opener (runtime/bundle.py)", inputs=sum(outcomes.values()),
           accepted=outcomes["accepted"], rejected=outcomes["rejected"], crashes=0,
           invalid_accepted=0, seconds=time.perf_counter() - t0)  # fmt: skip
    assert outcomes["rejected"] > 0 and outcomes["accepted"] > 0
