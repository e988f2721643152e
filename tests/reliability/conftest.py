"""Reliability suite settings: quick by default, long with OMNIDRAFT_RELIABILITY=long.

Long mode (``OMNIDRAFT_RELIABILITY=long pytest -m "slow or not slow" tests/reliability``) runs
>= 100k fuzz inputs per format and hundreds of kills, and merges every count the tests recorded
(``record``) into ``reports/fuzz.json`` / ``reports/fuzz.md`` (one row per target, with the
command that produced it).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest

LONG = os.environ.get("OMNIDRAFT_RELIABILITY") == "long"
REPORTS = Path(__file__).resolve().parents[2] / "reports"
RESULTS: dict[str, dict[str, Any]] = {}


def scale(quick: int, long: int) -> int:
    """``quick`` normally; in long mode ``long``, or ``$OMNIDRAFT_FUZZ_N`` for fuzz counts."""
    if not LONG:
        return quick
    override = os.environ.get("OMNIDRAFT_FUZZ_N")
    return int(override) if override and long >= 100_000 else long


def record(name: str, **counts: Any) -> None:
    """Add counts to row ``name`` of the report (summed over calls)."""
    row = RESULTS.setdefault(name, {})
    for key, value in counts.items():
        row[key] = row.get(key, 0) + value if isinstance(value, int | float) else value


def _markdown(merged: dict[str, Any]) -> str:
    cols = ["inputs", "accepted", "rejected", "crashes", "invalid_accepted", "kills",
            "killed_mid_write", "bundles_missing", "partial_validated", "junk_after_next_run",
            "seconds", "run"]  # fmt: skip
    lines = ["# Reliability: fuzzing and SIGKILL runs (long mode)", "",
             "| target | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]  # fmt: skip
    for name, row in sorted(merged["results"].items()):
        cells = [str(round(row[c], 1) if isinstance(row.get(c), float) else row.get(c, "-"))
                 for c in cols]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Runs (the `run` column):", ""]
    for i, r in enumerate(merged["runs"]):
        lines.append(f"{i}. `{r['command']}` ({r['date']}, {r['machine']}, load average "
                     f"{r['load_before']} before, {r['load_after']} after)")  # fmt: skip
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session", autouse=True)
def reliability_report(request: pytest.FixtureRequest) -> Any:
    """Long mode: merge this session's rows into reports/fuzz.json (rows of the same name are
    replaced) and rewrite reports/fuzz.md from all rows."""
    load_before = os.getloadavg()
    yield
    if not LONG or not RESULTS:
        return
    args = " ".join(request.config.invocation_params.args)
    n = os.environ.get("OMNIDRAFT_FUZZ_N")
    env = f"OMNIDRAFT_RELIABILITY=long {f'OMNIDRAFT_FUZZ_N={n} ' if n else ''}"
    command = f"{env}.venv/bin/pytest {args}"
    run = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_before": " ".join(f"{x:.1f}" for x in load_before),
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    path = REPORTS / "fuzz.json"
    old = json.loads(path.read_text()) if path.is_file() else {"runs": [], "results": {}}
    for row in RESULTS.values():
        row["run"] = len(old["runs"])
    merged = {"runs": [*old["runs"], run], "results": {**old["results"], **RESULTS}}
    REPORTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")
    (REPORTS / "fuzz.md").write_text(_markdown(merged))
