"""Peak host memory of an export stage, from the kernel's counters (what a build machine needs).

``peak_rss_mb()`` is the process-lifetime peak (``getrusage``; it never goes down), so per-stage
figures come from ``PeakRSS``, a context manager that samples the current RSS (``psutil``, or
``/proc/self/statm``) on a background thread every ``interval_s`` and also folds in ``ru_maxrss``
when the stage raised the lifetime peak. Figures are MiB of resident host memory.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size now, in MiB."""
    try:
        import psutil

        return float(psutil.Process().memory_info().rss) / 2**20
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRSS:
    """``with PeakRSS() as m: ...`` then ``m.peak_mb`` (max RSS seen during the block)."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._lifetime_before = 0.0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, current_rss_mb())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self._lifetime_before = peak_rss_mb()
        self.peak_mb = current_rss_mb()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        lifetime = peak_rss_mb()
        if lifetime > self._lifetime_before:  # a spike between samples raised the lifetime peak
            self.peak_mb = max(self.peak_mb, lifetime)
        self.peak_mb = round(self.peak_mb, 1)


@contextmanager
def stage(record: dict[str, Any], name: str) -> Iterator[None]:
    """Record ``name``'s wall seconds and peak host RSS (MiB) into ``record``."""
    t0 = time.perf_counter()
    with PeakRSS() as rss:
        yield
    record[name] = {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mb": rss.peak_mb}
