"""Transparent huge pages under an ONNX Runtime session's weights (Linux; a no-op elsewhere).

1-token decoding is memory-bound: every call streams every weight once (Qwen2.5-Coder-0.5B int8:
~0.5 GB a token). On 4 KiB pages that stream costs a TLB miss every 4 KiB; on 2 MiB pages it
does not. ORT allocates its prepacked weights with plain ``malloc``, which this kernel's THP mode
(``madvise``) leaves on 4 KiB pages, and it has no option to ask for more. So ``on_huge_pages``
notes the process's anonymous mappings, lets ``make`` build the session, and asks the kernel to
move what appeared or grew onto huge pages: ``madvise(MADV_HUGEPAGE)`` (later faults there get
huge pages) and ``madvise(MADV_COLLAPSE)`` (Linux >= 6.1: copies the present pages into huge
pages now; contents unchanged). What matters is the grown ``[heap]`` (where glibc serves large
blocks once its mmap threshold has risen, presumably ORT's prepacked weights): collapsing only
the new mmap'd regions gained nothing. Measured here (2 cores, int8 Qwen2.5-Coder-0.5B through ``OrtModel``,
2 threads, 23 greedy tokens after a 64-token prompt, 3 runs each, processes alternating): 36.8-39.4
tok/s without, 39.3-40.9 with (+4-8%; glibc's ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, which a
library cannot set for its own process, gave ~10%), for 3.5-4 s more session load (1.6 GB
collapsed). A kernel or platform that refuses costs only that time: the session is returned as
built, the refusal logged at debug level.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
HUGE_PAGE = 1 << 21
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <asm-generic/mman-common.h>
MAPS = Path("/proc/self/maps")

Region = tuple[int, int]  # [start, end) byte addresses


def anonymous_regions(maps: str, *, min_bytes: int = HUGE_PAGE) -> set[Region]:
    """Private writable anonymous mappings (``[heap]`` included) of a ``/proc/<pid>/maps`` text
    that span at least ``min_bytes``."""
    out = set()
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p":
            continue
        if fields[4] != "0" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # file-backed, stack, vdso ...
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if hi - lo >= min_bytes:
            out.add((lo, hi))
    return out


def huge_aligned(region: Region) -> Region | None:
    """The largest 2 MiB-aligned span inside ``region`` (None if it holds none)."""
    lo = -(-region[0] // HUGE_PAGE) * HUGE_PAGE
    hi = region[1] // HUGE_PAGE * HUGE_PAGE
    return (lo, hi) if hi > lo else None


def collapse(regions: set[Region]) -> tuple[int, int]:
    """``(bytes moved onto huge pages, bytes the kernel refused)`` for ``regions``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = refused = 0
    for span in filter(None, map(huge_aligned, regions)):
        size = span[1] - span[0]
        libc.madvise(span[0], size, MADV_HUGEPAGE)
        if libc.madvise(span[0], size, MADV_COLLAPSE) == 0:
            done += size
        else:
            refused += size
    return done, refused


def on_huge_pages(make: Callable[[], T]) -> T:
    """``make()`` (which builds a session), with the anonymous memory it allocated moved onto
    huge pages where the kernel allows (module docstring)."""
    if not sys.platform.startswith("linux") or not MAPS.is_file():
        return make()
    before = anonymous_regions(MAPS.read_text())
    built = make()
    done, refused = collapse(anonymous_regions(MAPS.read_text()) - before)
    log.debug("huge pages: %d MiB collapsed, %d MiB refused", done >> 20, refused >> 20)
    return built
