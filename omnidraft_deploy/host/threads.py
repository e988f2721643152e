"""Torch intra-op threads for the computations the product runs itself: one per free core.

Pretraining (``distill.pretrain``), distillation (``distill.offline``, ``distill.online``) and
calibration (``exporters.quant.calibration``) run torch ops on this machine's cores. Torch's pool
starts with one thread per physical core, and its threads meet after every op. When another
process takes one of two cores, the thread that shares its core runs only in the scheduler's time
slices and every op waits for it: the toy target's pretraining step went from 13 it/s to 0.16-0.4
it/s in issue 28 (measured before / after: ``benchmarks/torch_threads.py``, reports/torch_threads/).

``FreeCoreThreads`` gives torch one thread per core that other processes leave free, at least 1
and at most what torch had on entry, and restores torch's setting on exit. It measures that share
itself: the busy time of the usable CPUs in ``/proc/stat`` minus this process's own CPU time, over
the time since its last look. ``adjust()`` looks again once ``recheck_s`` has passed (call it
once per step), so a busy process that starts or ends mid-run is followed. Off Linux (no
``/proc/stat``) torch's setting is kept. ``OMNIDRAFT_TORCH_THREADS=N`` fixes the count instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType

import torch

THREADS_ENV = "OMNIDRAFT_TORCH_THREADS"
FIRST_LOOK_S = 0.1  # the share other processes take, sampled once on entry (we sleep meanwhile)
MIN_WINDOW_S = 0.05  # shorter windows keep the last count


def _usable_cpus() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


def cpu_busy_s(cpus: set[int]) -> float | None:
    """Seconds the CPUs ``cpus`` spent busy since boot (``/proc/stat``: every field but idle,
    iowait and the guest fields, which user already holds), or None off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    jiffies = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            jiffies += sum(ticks) - ticks[3] - ticks[4]
    return jiffies / os.sysconf("SC_CLK_TCK")


def fixed_threads() -> int | None:
    """``OMNIDRAFT_TORCH_THREADS`` as a positive int, or None (unset: free cores)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive number of threads")
    return int(raw)


class FreeCoreThreads:
    """``with FreeCoreThreads() as threads:`` torch runs one thread per free core inside the
    block (``adjust()`` once per step looks again every ``recheck_s`` s); restored on exit.

    One instance may be entered again and again (a learner's updates between decodes): only
    the first entry samples for ``FIRST_LOOK_S``; later ones count the time since the last look
    (this process's own work in between, decoding included, is not counted as others')."""

    def __init__(self, *, recheck_s: float = 2.0) -> None:
        self.recheck_s = recheck_s
        self.cpus = _usable_cpus()
        self.threads = 0  # set on entry
        self._before = 0
        self._fixed: int | None = None
        self._last: tuple[float, float, float] | None = None  # (wall, cpus busy, own cpu) s

    def __enter__(self) -> FreeCoreThreads:
        self._before = torch.get_num_threads()
        self._fixed = fixed_threads()
        if self._fixed is not None:
            self._set(self._fixed)
            return self
        if self._last is None:
            self._last = self._look()
            if self._last is None:  # off Linux: torch's own setting
                self.threads = self._before
                return self
            time.sleep(FIRST_LOOK_S)
        self._recount()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        torch.set_num_threads(self._before)

    def adjust(self) -> int:
        """The thread count, counted again when ``recheck_s`` has passed since the last count."""
        if self._last is not None and time.monotonic() - self._last[0] >= self.recheck_s:
            self._recount()
        return self.threads

    def mark(self) -> None:
        """Start a window now: ``others_cores()`` then reads the share taken since (benchmarks
        record how quiet the machine was)."""
        self._last = self._look()

    def others_cores(self) -> float | None:
        """Cores' worth of CPU time other processes used since the last look (0 .. len(cpus));
        None when there is no last look or it is under ``MIN_WINDOW_S`` old (jiffies of 10 ms
        are too coarse for it; the last look stays the start)."""
        now, last = self._look(), self._last
        if now is None or last is None or now[0] - last[0] < MIN_WINDOW_S:
            return None
        self._last = now
        return max(0.0, (now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])

    def _recount(self) -> None:
        others = self.others_cores()
        if others is not None:  # a core at least half used by others is taken
            free = len(self.cpus) - int(others + 0.5)
            self.threads = max(1, min(self._before, free))
        self._set(self.threads or self._before)

    def _look(self) -> tuple[float, float, float] | None:
        busy = cpu_busy_s(self.cpus)
        return None if busy is None else (time.monotonic(), busy, time.process_time())

    def _set(self, n: int) -> None:
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        self.threads = n
