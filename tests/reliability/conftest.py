"""Reliability suite settings: quick by default, long with OMNIDRAFT_RELIABILITY=long.

Long mode (``OMNIDRAFT_RELIABILITY=long pytest -m "slow or not slow" tests/reliability``) runs
>= 100k fuzz inputs per format and hundreds of kills, and merges every count the tests recorded
(``record``) into ``reports/fuzz/fuzz.json`` / ``reports/fuzz/fuzz.md`` (one row per target, with the
commands that produced it). A long run can be split: ``OMNIDRAFT_FUZZ_SEEDS=a:b`` fuzzes input
seeds a..b-1 only and ``OMNIDRAFT_KILL_SEED`` / ``OMNIDRAFT_KILLS`` pick a kill run's seed and
count; each (target, seeds) part is stored on its own, a rerun of the same part replaces it, and
a row is the sum of its parts.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.render_reports import fuzz_md

LONG = os.environ.get("OMNIDRAFT_RELIABILITY") == "long"
# where a long run merges its parts; ``$OMNIDRAFT_FUZZ_REPORTS`` sends a run's parts elsewhere
REPORTS = Path(os.environ.get("OMNIDRAFT_FUZZ_REPORTS")
               or Path(__file__).resolve().parents[2] / "reports" / "fuzz")  # fmt: skip
RESULTS: dict[str, dict[str, Any]] = {}


def scale(quick: int, long: int) -> int:
    """``quick`` normally; in long mode ``long``, or ``$OMNIDRAFT_FUZZ_N`` for fuzz counts."""
    if not LONG:
        return quick
    override = os.environ.get("OMNIDRAFT_FUZZ_N")
    return int(override) if override and long >= 100_000 else long


def stop_requested() -> bool:
    """Long mode: True once the unix time in ``$OMNIDRAFT_STOP_AT`` or in the file
    ``$OMNIDRAFT_STOP_FILE`` (default ``/tmp/omnidraft-reliability.stop``) has passed: a long
    run then ends early and records the part it finished (its seeds, its kills)."""
    if not LONG:
        return False
    at = os.environ.get("OMNIDRAFT_STOP_AT")
    stop_file = Path(os.environ.get("OMNIDRAFT_STOP_FILE", "/tmp/omnidraft-reliability.stop"))
    if at is None and stop_file.is_file():
        at = stop_file.read_text().strip()
    return at is not None and time.time() > float(at)


def fuzz_seeds(quick: int) -> range:
    """Input seeds of a fuzz run: ``quick`` normally; 100k in long mode, or
    ``$OMNIDRAFT_FUZZ_SEEDS`` (``a:b``), or the first ``$OMNIDRAFT_FUZZ_N``."""
    if not LONG:
        return range(quick)
    seeds = os.environ.get("OMNIDRAFT_FUZZ_SEEDS")
    if seeds:
        a, b = (int(x) for x in seeds.split(":"))
        return range(a, b)
    return range(scale(quick, 100_000))


def kill_seed_and_count(quick: int, long: int) -> tuple[int, int]:
    """(seed, kills) of a kill run: ``$OMNIDRAFT_KILL_SEED`` (0) and ``$OMNIDRAFT_KILLS`` in long
    mode (else ``long``); the quick run uses seed 0 and ``quick`` kills."""
    if not LONG:
        return 0, quick
    kills = os.environ.get("OMNIDRAFT_KILLS")
    return int(os.environ.get("OMNIDRAFT_KILL_SEED", "0")), int(kills) if kills else long


def record(name: str, *, part: str = "all", **counts: Any) -> None:
    """Add counts to part ``part`` of row ``name`` of the report (summed over calls)."""
    row = RESULTS.setdefault(name, {"part": part})
    for key, value in counts.items():
        row[key] = row.get(key, 0) + value if isinstance(value, int | float) else value


def _sum_parts(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for part in parts.values():
        for key, value in part.items():
            if key == "run":
                row["run"] = ",".join(x for x in (str(row.get("run", "")), str(value)) if x)
            elif isinstance(value, int | float):
                row[key] = row.get(key, 0) + value
    return row


def merge(old: dict[str, Any], new: dict[str, dict[str, Any]], run: dict[str, Any]) -> dict:
    """``old`` report + this run's rows: a part replaces the stored part of the same name."""
    runs = [*old["runs"], run]
    parts = {name: dict(p) for name, p in old.get("parts", {}).items()}
    for name, row in new.items():
        part = {k: v for k, v in row.items() if k != "part"} | {"run": len(runs) - 1}
        parts.setdefault(name, {})[row["part"]] = part
    results = {name: _sum_parts(p) for name, p in parts.items()}
    return {"runs": runs, "parts": parts, "results": results}


@pytest.fixture(scope="session", autouse=True)
def reliability_report(request: pytest.FixtureRequest) -> Any:
    """Long mode: merge this session's parts into reports/fuzz/fuzz.json (``merge``) and rewrite
    reports/fuzz/fuzz.md from all rows (``benchmarks.render_reports.fuzz_md``, as ``make reports``
    does)."""
    load_before = os.getloadavg()
    yield
    if not LONG or not RESULTS:
        return
    args = " ".join(request.config.invocation_params.args)
    keys = ("OMNIDRAFT_FUZZ_N", "OMNIDRAFT_FUZZ_SEEDS", "OMNIDRAFT_KILL_SEED", "OMNIDRAFT_KILLS")
    env = "".join(f"{k}={os.environ[k]} " for k in keys if os.environ.get(k))
    command = f"OMNIDRAFT_RELIABILITY=long {env}.venv/bin/pytest {args}"
    if stop_requested():
        command += " (stopped early at its stop time)"  # see the row's kills / seeds
    run = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_before": " ".join(f"{x:.1f}" for x in load_before),
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    path = REPORTS / "fuzz.json"
    REPORTS.mkdir(parents=True, exist_ok=True)
    lock = os.open(REPORTS, os.O_RDONLY)  # parts may finish at the same time
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = json.loads(path.read_text()) if path.is_file() else {"runs": [], "parts": {}}
        merged = merge(old, RESULTS, run)
        path.write_text(json.dumps(merged, indent=2) + "\n")
        (REPORTS / "fuzz.md").write_text(fuzz_md(merged, path))  # the one fuzz.md writer
    finally:
        os.close(lock)
