"""The wire format between ``omnidraft run`` and ``omnidraft serve``: pure functions, stdlib only.

Newline-delimited JSON over a Unix domain socket, one request per connection. Every message is a
JSON object with ``"v": VERSION`` and a ``"type"``; a line longer than ``MAX_LINE`` bytes, a
non-object, an unknown version, type or key, a missing key, a value of the wrong type or out of
range is a ``ProtocolError`` naming the problem. Nothing is ever unpickled.

Client -> server (one line)::

    {"v": 1, "type": "ping"}
    {"v": 1, "type": "run", "bundle": "/abs/path", "target": null, "provider": null,
     "prompt": "...", "chat": false, "mode": "greedy", "temperature": 0.7, "top_p": null,
     "max_new_tokens": 48, "seed": 0, "stats": null}

Server -> client (lines, until the connection closes)::

    {"v": 1, "type": "pong", "bundle": "/abs/path", "target": null, "pid": 123}
    {"v": 1, "type": "out", "text": "..."}          stdout text, as the in-process run writes it
    {"v": 1, "type": "err", "text": "..."}          stderr text (``--stats`` lines)
    {"v": 1, "type": "done", "exit": 0}
    {"v": 1, "type": "error", "message": "omnidraft run: error: ...", "exit": 2}
    {"v": 1, "type": "refused", "message": "..."}   not this server's bundle: run in-process
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

VERSION = 1
MAX_LINE = 4 << 20  # bytes of one message: a prompt of a few MB at most
MODES = ("greedy", "exact", "omnidraft")
STATS = (None, "summary", "steps")
INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts

Check = Callable[[Any], str | None]  # None when the value is valid, else what is wrong


class Writer(Protocol):
    """Where text goes: ``sys.stdout`` / ``sys.stderr``, or a server's message stream."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...


class ProtocolError(ValueError):
    """A message that breaks the format (module docstring)."""


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _opt_text(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else "a string or null"


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return None if ok and INT_RANGE[0] <= value <= INT_RANGE[1] else "an integer in 64 bits"


def _float(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return None if ok and math.isfinite(value) else "a finite number"


def _opt_float(value: Any) -> str | None:
    return None if value is None else _float(value)


def _one_of(choices: tuple[Any, ...]) -> Check:
    return lambda value: None if value in choices else f"one of {list(choices)}"


SCHEMAS: dict[str, dict[str, Check]] = {
    "ping": {},
    "run": {
        "bundle": _text,
        "target": _opt_text,
        "provider": _opt_text,
        "prompt": _text,
        "chat": _flag,
        "mode": _one_of(MODES),
        "temperature": _float,
        "top_p": _opt_float,
        "max_new_tokens": _int,
        "seed": _int,
        "stats": _one_of(STATS),
    },  # fmt: skip
    "pong": {"bundle": _text, "target": _opt_text, "pid": _int},
    "out": {"text": _text},
    "err": {"text": _text},
    "done": {"exit": _int},
    "error": {"message": _text, "exit": _int},
    "refused": {"message": _text},
}
REQUESTS = ("ping", "run")


@dataclass(frozen=True)
class RunRequest:
    """What ``omnidraft run`` asks of a server: its flags, the prompt text already read."""

    bundle: str  # the bundle folder, resolved
    target: str | None
    provider: str | None
    prompt: str
    chat: bool
    mode: str
    temperature: float
    top_p: float | None
    max_new_tokens: int
    seed: int
    stats: str | None  # None, "summary" or "steps"


def encode(kind: str, **fields: Any) -> bytes:
    """One message as a line of bytes; refused (``ProtocolError``) unless it is valid."""
    message = {"v": VERSION, "type": kind, **fields}
    line = json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"
    check(message, allowed=tuple(SCHEMAS), size=len(line))
    return line


def encode_request(request: RunRequest) -> bytes:
    return encode("run", **asdict(request))


def decode(line: bytes, *, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A received line as a checked message whose type is one of ``allowed``."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"message of {len(line)} bytes; at most {MAX_LINE}")
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ProtocolError(f"not a line of UTF-8 JSON ({e})") from None
    check(message, allowed=allowed, size=len(line))
    return dict(message)


def check(message: Any, *, allowed: tuple[str, ...], size: int = 0) -> None:
    """``message`` against its type's schema (module docstring)."""
    if size > MAX_LINE:
        raise ProtocolError(f"message of {size} bytes; at most {MAX_LINE}")
    if not isinstance(message, dict):
        raise ProtocolError("a message is a JSON object")
    if message.get("v") != VERSION:
        raise ProtocolError(f"protocol version {message.get('v')!r}; this side speaks {VERSION}")
    kind = message.get("type")
    if kind not in allowed:
        raise ProtocolError(f"message type {kind!r}; expected one of {list(allowed)}")
    schema = SCHEMAS[kind]
    unknown = sorted(set(message) - set(schema) - {"v", "type"})
    if unknown:
        raise ProtocolError(f"{kind}: unknown key(s) {unknown}")
    for key, valid in schema.items():
        if key not in message:
            raise ProtocolError(f"{kind}: missing key {key!r}")
        wrong = valid(message[key])
        if wrong is not None:
            raise ProtocolError(f"{kind}: {key} must be {wrong}, got {message[key]!r:.60}")


def run_request(message: dict[str, Any]) -> RunRequest:
    """A checked ``run`` message as a ``RunRequest``."""
    fields = {k: v for k, v in message.items() if k not in ("v", "type")}
    fields["temperature"] = float(fields["temperature"])
    if fields["top_p"] is not None:
        fields["top_p"] = float(fields["top_p"])
    return RunRequest(**fields)
