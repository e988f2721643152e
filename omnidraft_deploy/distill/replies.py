"""The teacher's replies, one JSON line each, appended as they finish (``omnidraft distill``).

``<target state folder>/distill.replies.jsonl`` holds one ``Reply`` a line. ``append_reply`` writes
a whole line, flushes and fsyncs it before the next request starts, so a kill loses at most the
reply in flight. ``load_replies`` reads the file back; a last line without its newline (a writer
killed mid-line) is cut off the file, so the next append starts on a fresh line. Any other line
that is not a reply is an error naming the file and line: the file is the user's work, never
silently dropped.

A record: ``key`` (``request_key``: the request's task and text and the reply settings), ``task``,
``text``, ``teacher`` (who answered: the bundle's target graph by its sha256, or llama.cpp),
``prompt`` and ``reply`` (target ids; the reply stops before the first end-of-turn id), and, for a
teacher that gives them, ``topk_ids`` / ``topk_probs``: the target's top-k at each reply token
(``len(reply)`` rows of ``k``). Replies without them (``benchmarks/kd_drafter``'s older files, a
llama.cpp teacher) train on the reply token alone (probability 1).

``heldout`` splits the replies by a hash of their key (stable as the file grows), at least one
held out once there are two.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPLIES = "distill.replies.jsonl"
HELDOUT_FRAC = 0.1


@dataclass(frozen=True)
class Reply:
    key: str
    task: str
    text: str
    teacher: str
    prompt: list[int]
    reply: list[int]
    topk_ids: list[list[int]] = field(default_factory=list)  # (len(reply), k) or empty
    topk_probs: list[list[float]] = field(default_factory=list)


def request_key(task: str, text: str, max_new_tokens: int, chat: bool) -> str:
    """Who asked what, with which reply settings: 16 hex digits of a sha256."""
    raw = json.dumps([task, text, max_new_tokens, chat], ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def append_reply(path: Path, reply: Reply) -> None:
    """Append ``reply`` as one line, on disk (fsync) before this returns."""
    line = json.dumps(asdict(reply), ensure_ascii=False, separators=(",", ":")) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _ints(v: object) -> bool:
    return isinstance(v, list) and all(type(x) is int for x in v)


def _reply(path: Path, n: int, line: str) -> Reply:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}:{n}: not a JSON reply record ({e}); move the file away to "
                         "start again") from None  # fmt: skip
    need = ("key", "task", "text", "teacher", "prompt", "reply")
    if not isinstance(row, dict) or any(k not in row for k in need):
        raise ValueError(f"{path}:{n}: a reply record needs {', '.join(need)}")
    reply = Reply(**{k: row[k] for k in (*need, "topk_ids", "topk_probs") if k in row})
    k_rows = reply.topk_ids
    if not (_ints(reply.prompt) and _ints(reply.reply) and all(map(_ints, k_rows))):
        raise ValueError(f"{path}:{n}: prompt, reply and topk_ids must hold integer ids")
    if k_rows and (len(k_rows) != len(reply.reply) or len(reply.topk_probs) != len(k_rows)):
        raise ValueError(f"{path}:{n}: {len(k_rows)} top-k rows for {len(reply.reply)} reply ids")
    return reply


def load_replies(path: Path) -> list[Reply]:
    """The replies of ``path`` (none if it does not exist); a torn last line is cut off the file
    (module docstring)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data):  # a writer killed mid-line: keep every finished line
        with open(path, "r+b") as f:
            f.truncate(len(whole))
            os.fsync(f.fileno())
    try:
        lines = whole.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 at byte {e.start}; move the file away to start "
                         "again") from None  # fmt: skip
    return [_reply(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]


def _bucket(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32


def heldout(
    replies: Sequence[Reply], frac: float = HELDOUT_FRAC
) -> tuple[list[Reply], list[Reply]]:
    """(train, held-out) by a hash of each key; with two or more replies at least one is held
    out (the lowest hash)."""
    held = [r for r in replies if _bucket(r.key) < frac]
    if not held and len(replies) >= 2:
        held = [min(replies, key=lambda r: _bucket(r.key))]
    keys = {r.key for r in held}
    return [r for r in replies if r.key not in keys], held
