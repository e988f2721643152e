"""``host.pages_later``: the session is returned at once; its pages are collapsed in the background."""

from __future__ import annotations

import sys
import threading

import pytest

from omnidraft_deploy.host import pages_later
from omnidraft_deploy.host.hugepages import MAPS, Region


def test_collapse_later_returns_what_make_built_and_collapses_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done, seen = threading.Event(), []

    def collapse(regions: set[Region]) -> tuple[int, int]:
        seen.append(regions)
        done.set()
        return 0, 0

    monkeypatch.setattr(pages_later, "collapse", collapse)
    built = pages_later.collapse_later(lambda: bytearray(8 << 20))  # 8 MiB of anonymous memory
    assert len(built) == 8 << 20
    if sys.platform.startswith("linux") and MAPS.is_file():
        assert done.wait(10) and isinstance(seen[0], set)
    else:
        assert not done.is_set()


@pytest.mark.skipif(not (sys.platform.startswith("linux") and MAPS.is_file()), reason="Linux only")
def test_settle_waits_for_the_background_collapse(monkeypatch: pytest.MonkeyPatch) -> None:
    release, finished = threading.Event(), threading.Event()

    def collapse(regions: set[Region]) -> tuple[int, int]:
        release.wait(10)
        finished.set()
        return 0, 0

    monkeypatch.setattr(pages_later, "collapse", collapse)
    pages_later.collapse_later(lambda: bytearray(8 << 20))
    pages_later.settle(timeout_s=0.2)
    assert not finished.is_set()  # still moving: settle gave up at its timeout
    release.set()
    pages_later.settle()
    assert finished.is_set()
