"""``omnidraft serve``: the socket side of a resident bundle (the bundle itself is the caller's).

``bind`` makes the listening Unix domain socket: refused while a live server answers at that
path, a socket file left by a dead server removed first, created with mode 0600 (a umask around
``bind``: no window in which another user could connect). ``serve`` answers one connection at a
time: it reads one request line (``request.protocol``), answers a ``ping`` with what it holds, checks
that a ``run`` is for the bundle folder (resolved) and target it holds (else ``refused``: the
client runs in-process), then calls ``handle`` with two writers that turn the text written to
them into ``out`` / ``err`` messages, and ends with ``done`` or, when ``handle`` raised, the
``error`` line ``run`` would have printed. A malformed request gets an ``error`` and the server
goes on; a client that hangs up mid-stream ends its request only. After each connection is
closed, ``after`` readies the next request (work kept off its way to the first text; a failure
there is logged, and the request then does that work itself). SIGTERM and SIGINT stop the loop;
the socket file is removed on the way out (if it is still the one bound).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from omnidraft_deploy.cli.client import ping, read_lines
from omnidraft_deploy.request.protocol import (
    REQUESTS,
    ProtocolError,
    RunRequest,
    Writer,
    decode,
    encode,
    run_request,
)

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 10.0  # a client that connects and says nothing is dropped after this
PROG = "omnidraft run"


@dataclass(frozen=True)
class Served:
    """What a server holds: the bundle folder (resolved), its target and provider."""

    bundle: str
    target: str | None
    provider: str


Handler = Callable[[RunRequest, Writer, Writer], None]
Refusal = Callable[[], str | None]  # why no request can be served now (None: they can)
ErrorLine = Callable[[BaseException], tuple[int, str]]  # (exit status, ``run``'s error line)
After = Callable[[], None]  # readies the next request, between connections


class Stop(Exception):
    """SIGTERM / SIGINT: the server stops between requests or ends the one running."""


class ClientGone(ConnectionError):
    """The client hung up: its request ends, the server goes on."""


class MessageWriter:
    """A text stream whose every write is one ``kind`` message on ``conn``."""

    def __init__(self, conn: socket.socket, kind: str) -> None:
        self.conn, self.kind = conn, kind

    def write(self, text: str, /) -> int:
        if text:
            try:
                self.conn.sendall(encode(self.kind, text=text))
            except OSError as e:
                raise ClientGone(str(e)) from None
        return len(text)

    def flush(self) -> None:
        return None


def check_free(path: Path) -> None:
    """Refuse (``ValueError``) when a live server answers at ``path``."""
    answer = ping(path)
    if answer is not None:
        held = (
            f" (bundle {answer.get('bundle')}, pid {answer.get('pid')})" if "pid" in answer else ""
        )
        raise ValueError(f"--socket {path}: a server already answers there{held}; stop it first")


def bind(path: Path) -> socket.socket:
    """The listening socket at ``path`` (module docstring)."""
    check_free(path)
    if len(os.fsencode(path)) >= 108:
        raise ValueError(f"--socket {path}: longer than a Unix socket path may be (107 bytes)")
    if path.is_socket():
        path.unlink()  # left by a dead server: nobody answered
    elif path.exists() or path.is_symlink():
        raise ValueError(f"--socket {path}: exists and is not a socket; remove it or pick another")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    saved = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def serve(listener: socket.socket, path: Path, served: Served, handle: Handler, *,
          refusal: Refusal, error_line: ErrorLine, after: After = lambda: None) -> str:  # fmt: skip
    """Answer connections until a signal; returns its name. The socket file is removed."""
    inode = os.stat(path).st_ino
    try:
        with _stop_on_signals():
            while True:
                conn, _ = listener.accept()
                with conn:
                    _answer(conn, served, handle, refusal=refusal, error_line=error_line)
                _ready_next(after)
    except Stop as e:
        return str(e)
    finally:
        listener.close()
        if path.is_socket() and os.stat(path).st_ino == inode:
            path.unlink()


def _ready_next(after: After) -> None:
    try:
        after()
    except Stop:  # SIGTERM / SIGINT while readying (writing a large cache): stop, as asked
        raise
    except Exception as e:  # noqa: BLE001 - the next request does this work itself, and reports
        log.info("readying the next request failed: %s", e)


def _request(conn: socket.socket) -> dict[str, Any] | None:
    """The connection's one request line, checked (an ``error`` sent back when it is not)."""
    conn.settimeout(READ_TIMEOUT_S)
    try:
        for line in read_lines(conn):
            conn.settimeout(None)
            return decode(line, allowed=REQUESTS)
        return None  # hung up without a request
    except (ProtocolError, TimeoutError) as e:
        log.info("bad request: %s", e)
        conn.sendall(encode("error", message=f"omnidraft serve: bad request: {e}", exit=2))
        return None


def _answer(conn: socket.socket, served: Served, handle: Handler, *, refusal: Refusal,
            error_line: ErrorLine) -> None:  # fmt: skip
    try:
        message = _request(conn)
        if message is None:
            return
        if message["type"] == "ping":
            conn.sendall(encode("pong", bundle=served.bundle, target=served.target,
                                pid=os.getpid()))  # fmt: skip
            return
        request = run_request(message)
        why = _mismatch(request, served) or refusal()
        if why is not None:
            log.info("refused: %s", why)
            conn.sendall(encode("refused", message=why))
            return
        log.info("request: %d prompt characters, %s, %d new tokens", len(request.prompt),
                 request.mode, request.max_new_tokens)  # fmt: skip
        conn.sendall(_run(conn, request, handle, error_line))
    except (ClientGone, BrokenPipeError, ConnectionResetError) as e:
        log.info("client gone: %s", e)


def _run(conn: socket.socket, request: RunRequest, handle: Handler, error_line: ErrorLine,
         ) -> bytes:  # fmt: skip
    """``handle`` the request; the closing message (``done``, or ``error`` when it raised)."""
    try:
        handle(request, MessageWriter(conn, "out"), MessageWriter(conn, "err"))
    except (Stop, ClientGone):
        raise
    except Exception as e:  # noqa: BLE001 - any failure of a request goes back to its client
        status, line = error_line(e)
        log.info("request failed: %s", line)
        return encode("error", message=line, exit=status)
    return encode("done", exit=0)


def _mismatch(request: RunRequest, served: Served) -> str | None:
    """Why this server cannot serve ``request`` (another bundle, target or provider), or None."""
    if request.bundle != served.bundle:
        return f"it holds {served.bundle}, not {request.bundle}"
    if request.target != served.target:
        return f"it holds target {served.target!r}, not {request.target!r}"
    if request.provider not in (None, served.provider):
        return f"it runs on {served.provider}, not {request.provider}"
    return None
