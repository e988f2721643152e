"""``omnidraft run`` through a resident ``omnidraft serve``: the client side, stdlib only.

``run`` calls ``run_remote`` before it imports anything heavy (no torch, numpy, ONNX Runtime or
transformers on this path, so a served run starts in a fraction of a second). No server at the
socket (no file, or a file left by a dead server), or a server holding another bundle or target
(it answers ``refused``): ``run_remote`` returns None and ``run`` decodes in-process as before.
Otherwise the server's ``out`` / ``err`` messages are written to stdout / stderr as they arrive
and its exit status is returned. The wire format is ``request.protocol``'s.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from omnidraft_deploy.request.protocol import (
    MAX_LINE,
    ProtocolError,
    RunRequest,
    Writer,
    decode,
    encode,
    encode_request,
)

SOCKET_NAME = "serve.sock"  # in the bundle's (target's) state folder
CONNECT_TIMEOUT_S = 2.0
REPLIES = ("out", "err", "done", "error", "refused")


class ServerGone(ConnectionError):
    """The server closed the connection before it said the request was done."""


def socket_path(state: Path, override: str | None = None) -> Path:
    """``--socket``, else ``serve.sock`` in the state folder."""
    return Path(override) if override else state / SOCKET_NAME


def connect(path: Path) -> socket.socket | None:
    """A connection to a live server at ``path``, or None (no socket, or nobody listening)."""
    if len(os.fsencode(path)) >= 108:  # sun_path: no server can be bound at such a path
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError, TimeoutError):
        sock.close()
        return None
    sock.settimeout(None)  # a generation takes as long as it takes
    return sock


def read_lines(sock: socket.socket) -> Any:
    """The lines the peer sends (without the newline), each at most ``MAX_LINE`` bytes."""
    reader = sock.makefile("rb")
    while True:
        line = reader.readline(MAX_LINE + 1)
        if not line:
            return
        if not line.endswith(b"\n"):
            raise ProtocolError(f"message longer than {MAX_LINE} bytes or cut short")
        yield line


def ping(path: Path) -> dict[str, Any] | None:
    """The ``pong`` of a live server at ``path`` (its bundle, target, pid), or None."""
    sock = connect(path)
    if sock is None:
        return None
    with sock:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.sendall(encode("ping"))
            for line in read_lines(sock):
                return decode(line, allowed=("pong", "error"))
        except (OSError, ProtocolError):
            return {"type": "unknown"}  # something answers there, but not as a server does
    return {"type": "unknown"}


def run_remote(path: Path, request: RunRequest, out: Writer, err: Writer) -> int | None:
    """``request`` served by the server at ``path``: its exit status, or None when no server
    there serves it (module docstring; a refusal is noted on ``err``)."""
    sock = connect(path)
    if sock is None:
        return None
    with sock:
        try:
            sock.sendall(encode_request(request))
        except (BrokenPipeError, ConnectionResetError):
            return None  # the server went away between connect and send: nothing was run
        for line in read_lines(sock):
            message = decode(line, allowed=REPLIES)
            kind = message["type"]
            if kind in ("out", "err"):
                stream = out if kind == "out" else err
                stream.write(message["text"])
                stream.flush()
            elif kind == "refused":
                err.write(f"note: the server at {path} does not serve this: {message['message']};"
                          " running in-process\n")  # fmt: skip
                return None
            elif kind == "error":
                out.flush()
                err.write(message["message"] + "\n")
                return int(message["exit"])
            else:
                return int(message["exit"])
    raise ServerGone(f"the server at {path} closed the connection before the end of the reply")
