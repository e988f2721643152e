"""Reliability suite settings: quick by default, long with OMNIDRAFT_RELIABILITY=long.

Long mode (``OMNIDRAFT_RELIABILITY=long pytest -m "slow or not slow" tests/reliability``) runs
>= 100k fuzz inputs per format and >= 200 kills, and writes ``reports/fuzz.md`` and
``reports/fuzz.json`` with every count the tests recorded (``record``).
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
    return long if LONG else quick


def record(name: str, **counts: Any) -> None:
    """Add counts to row ``name`` of the report (summed over calls)."""
    row = RESULTS.setdefault(name, {})
    for key, value in counts.items():
        row[key] = row.get(key, 0) + value if isinstance(value, int | float) else value


def _markdown(meta: dict[str, Any]) -> str:
    cols = ["inputs", "accepted", "rejected", "crashes", "invalid_accepted", "kills", "killed_mid_write",
            "bundles_missing", "partial_validated", "junk_after_next_run", "seconds"]  # fmt: skip
    lines = [f"# Reliability run ({meta['mode']})", "", f"`{meta['command']}`", "",
             f"{meta['date']}, {meta['machine']}, load average before/after "
             f"{meta['load_before']} / {meta['load_after']}", "",
             "| target | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]  # fmt: skip
    for name, row in sorted(RESULTS.items()):
        cells = [str(round(row[c], 1) if isinstance(row.get(c), float) else row.get(c, "-"))
                 for c in cols]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session", autouse=True)
def reliability_report() -> Any:
    load_before = os.getloadavg()
    yield
    if not LONG or not RESULTS:
        return
    meta = {
        "mode": "long",
        "command": 'OMNIDRAFT_RELIABILITY=long .venv/bin/pytest -q -m "slow or not slow" '
        "tests/reliability",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_before": " ".join(f"{x:.1f}" for x in load_before),
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "fuzz.json").write_text(json.dumps({"meta": meta, "results": RESULTS}, indent=2))
    (REPORTS / "fuzz.md").write_text(_markdown(meta))
