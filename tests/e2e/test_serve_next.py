"""What a served request no longer does on its way to the first text (issue 26), on the tiny CLI
bundle: the n-gram cache is parsed ahead (``runtime.session.prepare``, at warm-up and by the server
after each reply) and taken only while the state file is the one parsed; the server runs its
``after`` hook between connections and survives its failure; a chat template is compiled once.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from omnidraft_deploy.ngram.format import from_bytes as ngram_from_bytes
from omnidraft_deploy.ngram.format import to_bytes
from omnidraft_deploy.request.protocol import RunRequest

pytest.importorskip("onnxruntime")


def _session(cli_bundle: Path, tmp_path: Path) -> Any:
    from omnidraft_deploy.runtime.session import open_session

    copy = tmp_path / "b"
    shutil.copytree(cli_bundle, copy)
    return open_session(copy, state=tmp_path / "state", served=True)


def _write_cache(session: Any, draft_ids: tuple[int, ...], target_id: int) -> None:
    """A session cache in the state folder (written as ``run`` writes it: a new file renamed
    over the old): the shipped entries plus ``draft_ids -> target_id``."""
    from omnidraft_deploy.runtime.bundle import SESSION_CACHE

    from omnidraft_deploy.bundle.atomic import write_bytes_atomic
    from omnidraft_deploy.ngram.cache import NGramCache

    m = session.bundle.mapper
    cache = NGramCache.from_items(ngram_from_bytes(session.shipped)[0].items())
    cache.update(draft_ids, target_id)
    session.state.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(session.state / SESSION_CACHE, to_bytes(
        cache, draft_vocab_size=m.draft_vocab_size, target_vocab_size=m.target_vocab_size))  # fmt: skip


def _pairs(cache: Any) -> set[tuple[tuple[int, ...], int]]:
    return {(k, t) for k, t, _ in cache.items()}


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a request could parse an n-gram cache fails the test."""
    from omnidraft_deploy.runtime import run, session

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("an n-gram cache was parsed on the request's path")

    for module, name in ((session, "ngram_from_bytes"), (session, "load_session_cache"),
                         (run, "load_session_cache")):  # fmt: skip
        monkeypatch.setattr(module, name, refuse)


def test_a_prepared_cache_serves_one_request_while_the_state_file_is_unchanged(
    cli_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnidraft_deploy.runtime.session import prepare, request_cache

    session = _session(cli_bundle, tmp_path)
    shipped = session.bundle.ngram_cache.items()
    prepare(session)
    assert len(session.bundle.ngram_cache) == 0  # the last request's cache is let go here
    ready = session.prepared[1]
    with monkeypatch.context() as m:
        _no_parsing(m)
        cache = request_cache(session)
    assert cache is ready and cache.items() == shipped and session.prepared is None
    assert request_cache(session) is not cache  # used once: the next one is parsed afresh

    prepare(session)  # no state file yet: the shipped cache, keyed None
    _write_cache(session, (1, 2), 3)  # a grown cache appears after the prepare: parsed now
    got = request_cache(session)
    assert ((1, 2), 3) in _pairs(got)
    prepare(session)
    assert ((1, 2), 3) in _pairs(session.prepared[1])
    _write_cache(session, (4, 5), 6)  # the file replaced after the prepare: the stale one is left
    assert ((4, 5), 6) in _pairs(request_cache(session))


def test_a_served_request_parses_no_cache_before_its_text(
    cli_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from omnidraft_deploy.runtime.session import generate, prepare, warm

    session = _session(cli_bundle, tmp_path)
    warm(session)  # prepares the first request's cache
    request = RunRequest(bundle=str(session.bundle.root), target=None, provider=None,
                         prompt="def fib(n):", chat=False, mode="greedy", temperature=0.7,
                         top_p=None, max_new_tokens=4, seed=0, stats=None)  # fmt: skip
    for _ in range(2):  # the second reads the state file the first wrote, parsed by ``prepare``
        out = io.StringIO()
        with monkeypatch.context() as m:
            _no_parsing(m)
            generate(session, request, out, io.StringIO())
        assert out.getvalue().startswith("def fib(n):") and len(out.getvalue()) > 11
        prepare(session)  # what the server does after the reply
        assert session.prepared is not None and session.prepared[0] is not None


def test_the_server_readies_the_next_request_between_connections(tmp_path: Path) -> None:
    from omnidraft_deploy.cli.serve import Served, bind, serve

    path = tmp_path / "s.sock"
    calls: list[int] = []

    def after() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("the first one fails")  # logged; the server goes on

    def client() -> None:
        for _ in range(2):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(30)
                sock.connect(str(path))
                sock.sendall(b'{"v": 1, "type": "ping"}\n')
                assert b'"pong"' in sock.makefile("rb").readline()
        deadline = time.monotonic() + 30
        while len(calls) < 2 and time.monotonic() < deadline:  # the second hook runs after the
            time.sleep(0.01)  # second connection closed
        os.kill(os.getpid(), signal.SIGTERM)

    listener = bind(path)
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    stopped = serve(listener, path, Served("/b", None, "cpu"), lambda r, o, e: None,
                    refusal=lambda: None, error_line=lambda e: (1, str(e)), after=after)  # fmt: skip
    thread.join(30)
    assert stopped == "SIGTERM" and calls == [0, 1] and not path.exists()


def test_a_chat_template_renders_in_one_kept_worker_and_errors_stay_value_errors() -> None:
    """A served session renders every request's prompt: the sandboxed worker that answered
    stays for the next render (compiled once there); a failure is a ``ValueError`` naming the
    template and the worker is replaced."""
    from omnidraft_deploy.vocab import chat_sandbox
    from omnidraft_deploy.vocab.bundle_tokenizer import render_chat

    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    assert render_chat(template, "a") == "<user>a<assistant>"
    worker = chat_sandbox._WORKER[0]
    assert render_chat(template, "b") == "<user>b<assistant>"
    assert [worker] == chat_sandbox._WORKER and worker.proc.poll() is None
    with pytest.raises(ValueError, match="t/chat_template.jinja: .*does not render"):
        render_chat("{% for %}", "a", source="t/chat_template.jinja")
    assert worker.proc.poll() is not None and not chat_sandbox._WORKER  # killed, not kept
    with pytest.raises(ValueError, match="no system turns"):
        render_chat("{{ raise_exception('no system turns') }}", "a")


def test_a_signal_while_readying_the_next_request_stops_the_server(tmp_path: Path) -> None:
    """SIGTERM that lands inside the ``after`` hook (a 65,536-entry cache takes ~0.3 s to write
    and parse) stops the server; it was once swallowed as a failed hook, and the server hung."""
    from omnidraft_deploy.cli.serve import Served, bind, serve

    path = tmp_path / "s.sock"

    def after() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises inside the hook
        time.sleep(5)  # not reached when the signal stops it

    def client() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(str(path))
            sock.sendall(b'{"v": 1, "type": "ping"}\n')
            sock.makefile("rb").readline()

    listener = bind(path)
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    t0 = time.monotonic()
    stopped = serve(listener, path, Served("/b", None, "cpu"), lambda r, o, e: None,
                    refusal=lambda: None, error_line=lambda e: (1, str(e)), after=after)  # fmt: skip
    thread.join(30)
    assert stopped == "SIGTERM" and time.monotonic() - t0 < 5 and not path.exists()
