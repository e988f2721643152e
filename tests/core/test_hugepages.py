"""``omnidraft_deploy.host.hugepages``: which mappings it picks, alignment, and that it never changes
what the wrapped factory returns (no speed assertions: speed is measured in benchmarks)."""

from __future__ import annotations

import numpy as np

from omnidraft_deploy.host import hugepages as hp

MAPS = """\
55d0a0000000-55d0a0400000 r--p 00000000 08:01 123   /usr/bin/python3
55d0a1000000-55d0b1000000 rw-p 00000000 00:00 0     [heap]
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
7f0000800000-7f0000801000 rw-p 00000000 00:00 0
7f1000000000-7f1000800000 rw-p 00000000 08:01 456   /data/model.onnx.data
7f2000000000-7f2000800000 rw-s 00000000 00:05 789
7f3000000000-7f3000800000 r--p 00000000 00:00 0
7ffc00000000-7ffc00800000 rw-p 00000000 00:00 0     [stack]
"""


def test_anonymous_regions_keeps_private_writable_anonymous_and_heap() -> None:
    assert hp.anonymous_regions(MAPS) == {
        (0x55D0A1000000, 0x55D0B1000000),  # [heap]
        (0x7F0000000000, 0x7F0000800000),  # anonymous rw-p, 8 MiB
    }  # not: a 4 KiB one, file-backed, shared, read-only, the stack


def test_huge_aligned_spans() -> None:
    huge = hp.HUGE_PAGE
    assert hp.huge_aligned((huge + 4096, 4 * huge - 4096)) == (2 * huge, 3 * huge)
    assert hp.huge_aligned((huge + 4096, 2 * huge + 4096)) is None


def test_on_huge_pages_returns_what_make_built() -> None:
    calls = []

    def make() -> np.ndarray:
        calls.append(1)
        return np.arange(4 << 20, dtype=np.float32)  # 16 MiB: a new anonymous mapping

    out = hp.on_huge_pages(make)
    assert calls == [1]
    assert out[12345] == 12345 and out[-1] == (4 << 20) - 1  # contents survive a collapse
