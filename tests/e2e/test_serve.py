"""``omnidraft serve`` + ``omnidraft run`` through it, on the tiny CLI bundle (``cli_bundle``).

A server is started as a user starts it (a subprocess of the ``omnidraft`` script) and the tests
check what the verb promises: a served run prints what an in-process run prints and opens no
bundle itself, its client imports none of the heavy libraries, errors come back as ``run`` would
print them, a malformed request gets an error and the server goes on, a server of another bundle
refuses (the client then runs in-process), a second server on a live socket is refused, a stale
socket file is ignored by ``run`` and replaced by ``serve``, the socket is 0600, and SIGTERM
removes it. Every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnidraft_deploy.cli.client import ServerGone, run_remote
from omnidraft_deploy.cli.main import main
from omnidraft_deploy.request.protocol import MAX_LINE, ProtocolError, RunRequest, encode

pytest.importorskip("onnxruntime")
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 240.0
RUN = ["--prompt", "def fib(n):", "--max-new-tokens", "6"]


class Server:
    def __init__(self, bundle: Path, state: Path, *extra: str) -> None:
        self.socket = state / "serve.sock"
        self.proc = subprocess.Popen(
            [str(BIN / "omnidraft"), "serve", str(bundle), "--state", str(state), "-v", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.ready = self._wait_ready()

    def _wait_ready(self) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = self.proc.stdout.readline()
                if line.startswith("serving "):
                    return line
                if not line and self.proc.poll() is not None:
                    break
        self.stop()
        raise AssertionError(f"the server did not start (exit {self.proc.returncode})")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture(scope="module")
def served(cli_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(cli_bundle, tmp_path_factory.mktemp("served"))
    yield server
    assert server.stop() == 0


def _raw(path: Path, payload: bytes) -> list[dict[str, object]]:
    """Send ``payload`` on a fresh connection; the JSON lines the server answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)  # the server may answer and hang up before reading it all
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["run", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _no_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """A served run must not open the bundle in the client: opening fails the test."""
    from omnidraft_deploy.runtime import session

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the client opened the bundle: the server did not serve")

    monkeypatch.setattr(session, "open_session", refuse)


def test_served_run_prints_what_an_in_process_run_prints(
    served: Server, cli_bundle: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    assert served.socket.is_socket() and stat.S_IMODE(served.socket.stat().st_mode) == 0o600
    args = [str(cli_bundle), *RUN, "--state", str(served.socket.parent), "--stats"]
    local = _run(capsys, *args, "--no-server")
    with monkeypatch.context() as m:
        _no_open(m)
        remote = _run(capsys, *args)
    assert remote[0] == local[0] == 0
    assert remote[1] == local[1] and remote[1].startswith("def fib(n):")
    stats = [json.loads(err.splitlines()[-1]) for _, _, err in (local, remote)]
    assert stats[0].keys() == stats[1].keys()
    assert stats[1]["identical_to_target_only"] is True
    assert stats[0]["n_generated"] == stats[1]["n_generated"]


def test_served_sampling_matches_in_process(
    served: Server, cli_bundle: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    args = [str(cli_bundle), *RUN, "--state", str(served.socket.parent), "--mode", "exact",
            "--temperature", "0.9", "--top-p", "0.95", "--seed", "7", "--stats", "steps"]  # fmt: skip
    local = _run(capsys, *args, "--no-server")
    with monkeypatch.context() as m:
        _no_open(m)
        remote = _run(capsys, *args)
    assert remote[:2] == local[:2]
    assert "[step 1]" in remote[2] and "identical" not in remote[2].splitlines()[-1]


def test_the_client_imports_no_heavy_library(served: Server, cli_bundle: Path) -> None:
    code = ("import sys; from omnidraft_deploy.cli.main import main; "
            f"rc = main(['run', {str(cli_bundle)!r}, '--max-new-tokens', '3', '--state', "
            f"{str(served.socket.parent)!r}]); "
            "print(sorted(m for m in ('torch', 'numpy', 'onnxruntime', 'transformers') "
            "if m in sys.modules), rc, file=sys.stderr)")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stderr.splitlines()[-1] == "[] 0", r.stderr
    assert r.stdout.startswith("Question:")  # the default prompt, then the served text


def test_errors_come_back_as_run_prints_them(
    served: Server, cli_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = " ".join(["word"] * 200)  # the tiny target holds 48 tokens
    args = [str(cli_bundle), "--prompt", long, "--state", str(served.socket.parent)]
    local, remote = _run(capsys, *args, "--no-server"), _run(capsys, *args)
    assert remote == local and local[0] == 2 and "omnidraft run: error:" in local[2]
    args = [str(cli_bundle), "--chat", "--state", str(served.socket.parent)]
    local, remote = _run(capsys, *args, "--no-server"), _run(capsys, *args)
    assert remote == local and local[0] == 2 and "chat template" in local[2]


def test_a_malformed_request_gets_an_error_and_the_server_goes_on(served: Server) -> None:
    good = {"v": 1, "type": "ping"}
    bad = [b"not json\n", b"[1, 2]\n", json.dumps({**good, "v": 2}).encode() + b"\n",
           json.dumps({**good, "extra": 1}).encode() + b"\n",
           json.dumps({"v": 1, "type": "run", "bundle": "/x"}).encode() + b"\n",
           b"\xff\xfe\n", b"x" * (MAX_LINE + 10) + b"\n"]  # fmt: skip
    for payload in bad:
        (reply,) = _raw(served.socket, payload)
        assert reply["type"] == "error" and reply["exit"] == 2
        assert str(reply["message"]).startswith("omnidraft serve: bad request:")
    (pong,) = _raw(served.socket, json.dumps(good).encode() + b"\n")
    assert pong["type"] == "pong" and pong["pid"] == served.proc.pid


def test_wrong_types_and_ranges_are_refused() -> None:
    from omnidraft_deploy.request.protocol import ProtocolError, decode, encode

    base = {"v": 1, "type": "run", "bundle": "/b", "target": None, "provider": None,
            "prompt": "p", "chat": False, "mode": "greedy", "temperature": 0.7, "top_p": None,
            "max_new_tokens": 4, "seed": 0, "stats": None}  # fmt: skip
    assert decode(json.dumps(base).encode(), allowed=("run",))["prompt"] == "p"
    for key, value in [("max_new_tokens", "4"), ("max_new_tokens", True), ("chat", 1),
                       ("seed", 1 << 70), ("temperature", "hot"), ("mode", "fast"),
                       ("stats", "all"), ("prompt", None), ("target", 3)]:  # fmt: skip
        with pytest.raises(ProtocolError, match=key):
            decode(json.dumps({**base, key: value}).encode(), allowed=("run",))
    with pytest.raises(ProtocolError, match="NaN|finite|JSON"):
        decode(json.dumps({**base, "temperature": float("nan")}).encode(), allowed=("run",))
    with pytest.raises(ProtocolError, match="message type"):
        decode(json.dumps(base).encode(), allowed=("ping",))
    with pytest.raises(ProtocolError):
        encode("out", text=3)


def test_another_bundle_is_not_served_by_this_server(
    served: Server, cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(cli_bundle, copy)  # same manifest, same --state: the same socket
    status, out, err = _run(capsys, str(copy), *RUN, "--state", str(served.socket.parent))
    assert status == 0 and out.startswith("def fib(n):")
    assert f"does not serve this: it holds {cli_bundle.resolve()}" in err
    assert "running in-process" in err


def test_a_second_server_on_a_live_socket_is_refused(served: Server, cli_bundle: Path) -> None:
    r = subprocess.run([str(BIN / "omnidraft"), "serve", str(cli_bundle), "--state",
                        str(served.socket.parent)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "a server already answers there" in r.stderr
    assert served.socket.is_socket() and served.proc.poll() is None


def test_stale_socket_is_ignored_then_replaced_and_sigterm_removes_it(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(state / "serve.sock"))
    stale.close()  # a dead server's file: nobody listens
    status, out, _ = _run(capsys, str(cli_bundle), *RUN, "--state", str(state))
    assert status == 0 and out.startswith("def fib(n):")
    server = Server(cli_bundle, state)
    try:
        assert f"on {state / 'serve.sock'}" in server.ready
        assert stat.S_IMODE(os.stat(server.socket).st_mode) == 0o600
        (pong,) = _raw(server.socket, b'{"v": 1, "type": "ping"}\n')
        assert pong["bundle"] == str(cli_bundle.resolve())
    finally:
        assert server.stop() == 0
    assert not server.socket.exists()


def test_a_served_session_notes_changed_bundle_files(cli_bundle: Path, tmp_path: Path) -> None:
    from omnidraft_deploy.runtime.session import changed, open_session

    copy = tmp_path / "b"
    shutil.copytree(cli_bundle, copy)
    session = open_session(copy, state=tmp_path / "state", served=True)
    assert changed(session) == []
    st = (copy / "expected.json").stat()
    os.utime(copy / "expected.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert changed(session) == ["expected.json"]
    (tmp_path / "state" / "drafter.adapted.safetensors").write_bytes(b"adapt wrote it")
    assert changed(session)[1:] == [f"{tmp_path / 'state'}/drafter.adapted.safetensors"]


def _one_shot_peer(path: Path, replies: list[bytes]) -> threading.Thread:
    """A listener at ``path`` that reads one request line, sends ``replies`` and hangs up (the
    client's side of the wire, without a bundle: a server that dies mid-reply, or refuses)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def answer() -> None:
        with listener, listener.accept()[0] as conn:
            conn.makefile("rb").readline()
            for reply in replies:
                conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def _request() -> RunRequest:
    return RunRequest(bundle="/b", target=None, provider=None, prompt="p", chat=False,
                      mode="greedy", temperature=0.7, top_p=None, max_new_tokens=4, seed=0,
                      stats=None)  # fmt: skip


def test_the_client_says_when_the_server_dies_or_refuses(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    thread = _one_shot_peer(tmp_path / "a.sock", [encode("out", text="par")])
    with pytest.raises(ServerGone, match="closed the connection"):
        run_remote(tmp_path / "a.sock", _request(), out, err)
    thread.join(10)
    assert out.getvalue() == "par"
    thread = _one_shot_peer(tmp_path / "b.sock", [encode("refused", message="it holds /c")])
    assert run_remote(tmp_path / "b.sock", _request(), out, err) is None
    thread.join(10)
    assert "it holds /c; running in-process" in err.getvalue()
    thread = _one_shot_peer(tmp_path / "c.sock", [b'{"v": 1, "type": "done", "exit": "0"}\n'])
    with pytest.raises(ProtocolError, match="exit must be an integer"):
        run_remote(tmp_path / "c.sock", _request(), out, err)
    thread.join(10)
    assert run_remote(tmp_path / "nobody.sock", _request(), out, err) is None
