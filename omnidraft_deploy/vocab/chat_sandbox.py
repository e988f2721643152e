"""A bundle's chat template, rendered in a child process with limits on time, memory and output.

A chat template is code from the bundle (Jinja). Jinja's ``ImmutableSandboxedEnvironment`` keeps
it from reaching Python objects, but not from looping for hours (nested ``range(100000)`` loops),
allocating gigabytes (a string doubled in a loop) or writing megabytes, and its own errors are of
many types (``OverflowError`` for ``range(10**9)``, ``RecursionError`` for deep nesting). So a
template renders here in a worker process, ``python -I`` running this very file (stdlib and
``jinja2`` only), which:

- caps its address space at ``MEMORY_BYTES`` (``RLIMIT_AS``) before it reads any template;
- renders in Jinja's immutable sandbox, stopping once a render's output passes its byte limit;
- answers each request with one JSON line, the renders or the error (any exception).

The parent waits at most ``TIMEOUT_S`` for an answer of at most the byte limit, else kills the
worker. Any failure is one ``ChatTemplateError`` (a ``ValueError``) naming the template's file.
A worker that answered cleanly stays for the next render (``omnidraft serve`` renders every
request's prompt; the template is compiled once per worker); ``prestart`` starts one ahead,
while a bundle opens. Wire format: request ``{"template": str, "texts": [str], "limit": int}``,
answer ``{"ok": [str]}`` or ``{"error": str}``, one line each, UTF-8.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

TIMEOUT_S = 5.0  # one render (Qwen2.5's template: ~20 ms to compile, < 1 ms to render)
START_TIMEOUT_S = 30.0  # the worker's interpreter and jinja2 import (~0.2 s; more when loaded)
MEMORY_BYTES = 1 << 30  # the worker's address space
BASE_OUTPUT_BYTES = 256 << 10  # a render's output limit: this + 4 x the user text's bytes
READY = "ready"


class ChatTemplateError(ValueError):
    """The chat template (``source``: its file) could not render; ``str()`` names the file."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: the chat template does not render ({problem})")
        self.source, self.problem = source, problem


def output_limit(texts: list[str]) -> int:
    """Bytes a render of ``texts`` may write: the template's own text plus room for the user's."""
    return BASE_OUTPUT_BYTES + 4 * max(
        (len(t.encode("utf-8", "replace")) for t in texts), default=0
    )


class _Worker:
    """One worker process and its pipes (module docstring)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - our interpreter running this file
            [sys.executable, "-I", os.path.abspath(__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.ready = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def read_line(self, deadline: float, limit: int) -> bytes:
        """One answer line, or ``TimeoutError`` / ``OverflowError`` / ``EOFError``."""
        assert self.proc.stdout is not None
        fd, data = self.proc.stdout.fileno(), bytearray()
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            data += chunk
            if len(data) > limit:
                raise OverflowError
        return bytes(data)

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        if not self.ready:
            if self.read_line(time.monotonic() + START_TIMEOUT_S, 64).strip() != READY.encode():
                raise EOFError
            self.ready = True
        self.proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        # JSON escapes (ASCII output) take at most 6 bytes per byte rendered
        line_limit = 6 * request["limit"] * max(1, len(request["texts"])) + 4096
        answer = self.read_line(time.monotonic() + timeout, line_limit)
        doc = json.loads(answer)
        if not isinstance(doc, dict):
            raise EOFError
        return doc


_LOCK = threading.Lock()
_WORKER: list[_Worker] = []  # at most one, kept between renders


def _stop_workers() -> None:
    with _LOCK:
        while _WORKER:
            _WORKER.pop().kill()


atexit.register(_stop_workers)


def prestart() -> None:
    """Start a worker now (its interpreter and jinja2 load while the caller does other work)."""
    with _LOCK:
        if not _WORKER:
            _WORKER.append(_Worker())


def _ask(request: dict[str, Any], timeout: float) -> tuple[_Worker, dict[str, Any] | str]:
    """(the worker, its answer or what went wrong); the caller holds ``_LOCK``."""
    worker = _WORKER.pop() if _WORKER else _Worker()
    try:
        return worker, worker.ask(request, timeout)
    except TimeoutError:
        return worker, f"no answer within {timeout:g} s"
    except OverflowError:
        return worker, "output over the limit"
    except (EOFError, OSError, ValueError):  # died (memory limit), a broken pipe, a broken line
        return worker, "the renderer died (memory limit?)"


def render(
    template: str, texts: list[str], *, source: str, timeout: float | None = None
) -> list[str]:
    """``template`` rendered once per user text (module docstring), within ``timeout`` seconds
    (default ``TIMEOUT_S``); ``ChatTemplateError`` naming ``source`` on any failure."""
    request = {"template": template, "texts": texts, "limit": output_limit(texts)}
    with _LOCK:
        worker, doc = _ask(request, TIMEOUT_S if timeout is None else timeout)
        ok = doc.get("ok") if isinstance(doc, dict) else None
        if isinstance(ok, list) and len(ok) == len(texts) and all(isinstance(t, str) for t in ok):
            _WORKER.append(worker)  # answered cleanly: kept for the next render
            return ok
        worker.kill()
    problem = doc if isinstance(doc, str) else str(doc.get("error", "no renders returned"))
    raise ChatTemplateError(source, problem[:500])


# ---------------------------------------------------------------- the worker (python -I this file)
def _compile(template: str, cache: dict[str, Any]) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if template not in cache:

        def raise_exception(message: str) -> None:
            raise ValueError(f"the template raised: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        cache.clear()  # one template per bundle: keep the last only
        cache[template] = env.from_string(template)
    return cache[template]


def _render_one(compiled: Any, text: str, limit: int) -> str:
    parts, size = [], 0
    for chunk in compiled.generate(messages=[{"role": "user", "content": text}],
                                   add_generation_prompt=True, bos_token="", eos_token=""):  # fmt: skip
        size += len(chunk.encode("utf-8", "replace"))
        if size > limit:
            raise ValueError(f"output over {limit} bytes")
        parts.append(chunk)
    return "".join(parts)


def _serve(stdin: Any, stdout: Any) -> None:
    cache: dict[str, Any] = {}
    stdout.write(READY + "\n")
    stdout.flush()
    for line in stdin:
        try:
            req = json.loads(line)
            compiled = _compile(req["template"], cache)
            answer: dict[str, Any] = {
                "ok": [_render_one(compiled, t, req["limit"]) for t in req["texts"]]
            }
        except BaseException as e:  # noqa: BLE001 - the template's own failure, reported
            answer = {"error": f"{type(e).__name__}: {e}"[:500]}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


if __name__ == "__main__":
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _serve(sys.stdin, sys.stdout)
