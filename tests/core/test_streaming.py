"""``TextStreamer`` writes exactly the decoded continuation, never half a UTF-8 character."""

from __future__ import annotations

import io

import torch

from omnidraft_deploy.streaming import TextStreamer
from omnidraft_deploy.testing import TableTokenizer

PIECES = [b"</s>", b"a", b" b", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"!"]  # e-acute, euro


def test_stream_equals_full_decode_and_holds_split_characters() -> None:
    tok = TableTokenizer("t", PIECES)
    out, stats = io.StringIO(), io.StringIO()
    stream = TextStreamer(tok, out, stats)
    top = torch.ones(3, 1)
    writes = []
    for step in ([1, 3], [4, 2], [5], [6, 7]):  # a, (e-acute split), " b", (euro split), "!"
        stream([], step, torch.zeros(3, 1, dtype=torch.long), top)
        writes.append(out.getvalue())
    assert writes == ["a", "a\u00e9 b", "a\u00e9 b", "a\u00e9 b\u20ac!"]  # no U+FFFD ever written
    stream.finish()
    assert out.getvalue() == tok.decode([1, 3, 4, 2, 5, 6, 7]) + "\n"
    assert (
        stats.getvalue().count("[step") == 4 and "+2 tokens (1 drafted accepted" in stats.getvalue()
    )
