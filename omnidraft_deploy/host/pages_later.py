"""Huge pages off the critical path: ``hugepages.on_huge_pages`` with the collapse in the background.

``on_huge_pages`` collapses a new session's weights before returning it: ~1 s per GB that every
``omnidraft run`` waited for before its first token (~5 s on a 2.9 GB bundle). ``collapse_later``
notes the process's anonymous mappings, builds the session, and hands the collapse of what grew to
a daemon thread, so decoding starts at once and gets faster as the pages move
(``MADV_COLLAPSE`` copies live pages; their contents never change, so the session may run
meanwhile; ``settle`` waits for them, as ``omnidraft serve`` does before it serves, and ``run
--stats`` before it times the speculative decode against target-only: otherwise the first decode
pays for the move and target-only, run after it, gets settled pages). ``omnidraft profile`` and
the benchmarks keep the synchronous ``on_huge_pages``: they measure sessions whose pages have
settled.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from omnidraft_deploy.host.hugepages import MAPS, Region, anonymous_regions, collapse

log = logging.getLogger(__name__)
T = TypeVar("T")
THREAD_NAME = "huge-pages"


def _collapse(regions: set[Region]) -> None:
    done, refused = collapse(regions)
    log.debug(
        "huge pages (background): %d MiB collapsed, %d MiB refused", done >> 20, refused >> 20
    )


def collapse_later(make: Callable[[], T]) -> T:
    """``make()`` (which builds a session), returned as soon as it is built; the anonymous memory
    it allocated is moved onto huge pages by a daemon thread (module docstring)."""
    if not sys.platform.startswith("linux") or not MAPS.is_file():
        return make()
    before = anonymous_regions(MAPS.read_text())
    built = make()
    grown = anonymous_regions(MAPS.read_text()) - before
    threading.Thread(target=_collapse, args=(grown,), name=THREAD_NAME, daemon=True).start()
    return built


def settle(timeout_s: float | None = None) -> None:
    """Wait until every background collapse started by ``collapse_later`` has finished."""
    for thread in threading.enumerate():
        if thread.name == THREAD_NAME:
            thread.join(timeout_s)
