"""Property-based fuzzing of the ODNG, ODVM, manifest readers and the bundle opener with
structure-aware mutations.

Every input must be rejected with the reader's own error naming the source, or accepted and then
pass an oracle written from the format's docstring (``mutations``). Default run, per format: 300
inputs drawn by hypothesis (shrunk on failure) and 2,000 from seeds 0..1,999 (``RandomPick``), 300
bundles. ``OMNIDRAFT_RELIABILITY=long``: seeds 0..99,999 per format (``OMNIDRAFT_FUZZ_SEEDS=a:b``
runs a part), counted in reports/fuzz.md; a failure names its seed, which replays it alone.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import stat
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG, fuzz_seeds, record, stop_requested
from hypothesis import HealthCheck, given, settings
from mutations import (
    Pick,
    RandomPick,
    as_strategy,
    check_expected,
    check_manifest,
    check_odng,
    check_odvm,
    check_special,
    expected_input,
    manifest_input,
    odng_input,
    odvm_input,
    special_input,
)

FORMATS: dict[str, tuple[Callable[[Pick], Any], Callable[[Any], str]]] = {
    "ODNG (ngram/format.py)": (odng_input, check_odng),
    "ODVM (vocab/io.py)": (odvm_input, check_odvm),
    "manifest.json (manifest.py)": (manifest_input, check_manifest),
    "special_tokens.json (bundle_tokenizer.py)": (special_input, check_special),
    "expected.json (checks/expected.py)": (expected_input, check_expected),
}
QUICK_HYPOTHESIS = 300  # default run, per format: hypothesis-driven inputs (shrinking) ...
QUICK_SEEDED = 2000  # ... then seeds 0..1999 (the first inputs of the long run)
QUICK_BUNDLES = 300
FILE_OF = {  # bundle mutation -> the file it edits (per-file input counts in the report)
    "special_value": "special_tokens.json", "unlist_special": "special_tokens.json",
    "expected_value": "expected.json", "tokenizer_bytes": "tokenizer.json",
    "tokenizer_mismatch": "tokenizer.json", "template_bytes": "chat_template.jinja",
    "table_bytes": "vocab_map.bin / ngram_cache.bin", "graph_meta": "graph .onnx",
    "external_data": "graph .onnx", "size_claim": "manifest.json", "quant_label": "manifest.json",
    "manifest_field": "manifest.json", "extras": "manifest.json", "unlist": "manifest.json",
    "unlist_required": "manifest.json", "traversal": "manifest.json",
    "symlink_file": "file system", "symlink_dir": "file system", "symlink_unlisted": "file system",
    "fifo": "file system", "delete": "file system", "dir_for_file": "file system",
    "change_unlisted": "file system",
}  # fmt: skip


def fuzz(
    name: str,
    generate: Callable[[Pick], Any],
    check: Callable[[Any], str],
    *,
    hypothesis_n: int,
    seeded_n: int,
    extra: Counter[str] | None = None,
) -> None:
    """Run ``check`` on generated inputs and record the counts: ``hypothesis_n`` drawn by
    hypothesis (default run only), then the seeded ones (``fuzz_seeds``); ``extra``: more
    counts the checks kept (recorded with them)."""
    outcomes: Counter[str] = Counter()
    t0 = time.perf_counter()
    seeds = fuzz_seeds(seeded_n)
    if not LONG and hypothesis_n:

        @settings(max_examples=hypothesis_n, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(as_strategy(generate))
        def run(data: object) -> None:
            outcomes[check(data)] += 1  # raises AssertionError on a crash or an invalid accept

        run()
    done = seeds.start
    for seed in seeds:
        if seed % 500 == 0 and stop_requested():
            break
        try:
            outcomes[check(generate(RandomPick(seed)))] += 1
        except AssertionError as e:
            raise AssertionError(f"{name}, input seed {seed}: {e}") from e
        done = seed + 1
    record(name, part=f"seeds {seeds.start}-{done - 1}" if LONG else "quick",
           inputs=sum(outcomes.values()), accepted=outcomes["accepted"],
           rejected=outcomes["rejected"], crashes=0, invalid_accepted=0,
           seconds=time.perf_counter() - t0, **(extra or {}))  # fmt: skip
    if sum(outcomes.values()) >= 100:
        assert outcomes["rejected"] > 0 and outcomes["accepted"] > 0  # both sides were reached


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_mutated_input_is_rejected_cleanly_or_valid(name: str) -> None:
    generate, check = FORMATS[name]
    fuzz(name, generate, check, hypothesis_n=QUICK_HYPOTHESIS, seeded_n=QUICK_SEEDED)


def test_bundle_opener_refuses_every_broken_bundle(tmp_path: Path) -> None:
    """File-system-level mutations of a valid bundle (``bundle_mutations``): every mutation in
    ``BREAKS`` must be refused with a ``BundleError``; no mutation may raise anything else; an
    accepted bundle passes ``accepted_is_valid``; and the bundle is opened the way ``validate``
    opens it (every file hashed) and the way ``run`` does (``--state``: without a hash record,
    and with the record of the bundle before its mutation), which must agree (issue 47)."""
    from bundle_mutations import BREAKS, MUTATIONS, make_seed

    base = tmp_path
    if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK):  # memory: no disk waits
        base = Path(tempfile.mkdtemp(prefix="omnidraft-fuzz-", dir="/dev/shm"))
    try:
        _fuzz_bundles(base, make_seed(base / "seed"), BREAKS, MUTATIONS)
    finally:
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


class Openers:
    """The three ways a command opens a bundle: ``validate`` (every file hashed), ``run`` with a
    fresh ``--state`` (no hash record) and ``run`` with the record of the unmutated bundle."""

    def __init__(self, base: Path, work: Path) -> None:
        from omnidraft_deploy.bundle.folder import verify_bundle
        from omnidraft_deploy.bundle.hash_record import RECORD_FILE

        self.work, self.fresh, self.recorded = work, base / "state-fresh", base / "state-recorded"
        old = time.time() - 3600  # exported a while ago: past the record's racy window
        for p in work.rglob("*"):
            os.utime(p, (old, old))
        self.recorded.mkdir()
        verify_bundle(work, state=self.recorded)
        self.record = (self.recorded / RECORD_FILE).read_bytes()
        assert len(json.loads(self.record)["files"]) == len(list(p for p in work.rglob("*")
                                                                 if p.is_file())) - 1  # fmt: skip
        self.record_file = RECORD_FILE

    def outcomes(self) -> dict[str, str]:
        """Opener -> "accepted" or "rejected: <problem>"; AssertionError on any other error."""
        from omnidraft_deploy.runtime.bundle import check_bundle

        from omnidraft_deploy.bundle.manifest import BundleError

        shutil.rmtree(self.fresh, ignore_errors=True)
        self.fresh.mkdir()
        (self.recorded / self.record_file).write_bytes(self.record)
        ways = {"validate": {"trust_record": False}, "run": {"state": self.fresh},
                "run, hash record": {"state": self.recorded}}  # fmt: skip
        out = {}
        for way, kwargs in ways.items():
            try:
                check_bundle(self.work, **kwargs)  # type: ignore[arg-type]
                out[way] = "accepted"
            except BundleError as e:
                assert e.problem, e
                out[way] = f"rejected: {e.problem}"
            except Exception as e:  # noqa: BLE001 - any other exception is a crash
                raise AssertionError(f"{way}: crash: {type(e).__name__}: {e}") from e
        return out


def _restore(base: Path, work: Path, kinds: dict[Path, int], data: dict[Path, bytes]) -> None:
    """Put ``work`` back to the seed's bytes (cheaper than a fresh copy of the folder)."""
    for p in base.glob("work-outside-*"):
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in sorted(work.rglob("*"), reverse=True):  # not the seed's kind: a link, a FIFO
        if kinds.get(p.relative_to(work)) != stat.S_IFMT(p.lstat().st_mode):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for rel, kind in sorted(kinds.items()):
        q = work / rel
        if kind == stat.S_IFDIR:
            q.mkdir(exist_ok=True)
        elif not q.exists() or q.read_bytes() != data[rel]:
            q.write_bytes(data[rel])


def _fuzz_bundles(base: Path, seed: Path, breaks: Any, mutations: Any) -> None:
    from bundle_mutations import REPAIRABLE, accepted_is_valid
    from omnidraft_deploy.runtime.bundle import check_bundle

    check_bundle(seed)  # the seed itself is valid
    doc0 = json.loads((seed / "manifest.json").read_text())
    work = base / "work"
    shutil.copytree(seed, work)
    kinds = {p.relative_to(seed): stat.S_IFMT(p.lstat().st_mode) for p in seed.rglob("*")}
    data = {rel: (seed / rel).read_bytes() for rel, k in kinds.items() if k == stat.S_IFREG}
    openers = Openers(base, work)

    def restore() -> None:
        _restore(base, work, kinds, data)

    def case(pick: Pick) -> tuple[list[str], int]:
        return [pick.choice(sorted(mutations)) for _ in range(pick.int(1, 2))], pick.int(0, 2**32)

    touched: Counter[str] = Counter()  # inputs that changed each bundle file (``FILE_OF``)

    def one(names_and_salt: tuple[list[str], int]) -> str:
        names, salt = names_and_salt
        restore()
        doc, rng = copy.deepcopy(doc0), random.Random(salt)
        applied = []
        for name in names:
            try:
                mutations[name](work, doc, rng)
                applied.append(name)
            except (OSError, KeyError, TypeError, IndexError, ValueError, RecursionError):
                # two edits can clash (a file deleted, then linked; a section replaced, then
                # edited; a JSON file cut, then edited as JSON): skip the second
                pass
        (work / "manifest.json").write_text(json.dumps(doc))
        touched.update({f"file {FILE_OF[name]}" for name in applied})
        ways = openers.outcomes()
        outcome = ways["validate"].split(":")[0]
        assert len(set(ways.values())) == 1, f"the openers disagree after {applied}: {ways}"
        broken = [  # a later edit that relists a file legitimately repairs a repairable break
            x for i, x in enumerate(applied)
            if x in breaks and not (x in REPAIRABLE and set(applied[i + 1 :]) - set(breaks))
        ]  # fmt: skip
        assert not (broken and outcome == "accepted"), f"accepted a bundle broken by {broken}"
        if outcome == "accepted":
            accepted_is_valid(work, doc)
        return outcome

    fuzz(
        "bundle opener (runtime/bundle.py)",
        case,
        one,
        hypothesis_n=0,
        seeded_n=QUICK_BUNDLES,
        extra=touched,
    )
