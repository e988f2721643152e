"""How every verb talks to the terminal: quiet by default, errors in one paragraph, Ctrl-C -> 130.

``quiet_console(verbose)`` wraps a verb. Without ``-v``: Python warnings are ignored, third-party
loggers (torch.export, torchao, ONNX Runtime, onnxscript, ExecuTorch, transformers) show errors
only, and anything written straight to the process's file descriptors 1 and 2 by native code
(cpuinfo, ONNX Runtime, XNNPACK) goes to a scratch file instead of the terminal, while
``sys.stdout`` / ``sys.stderr`` (the streamed text, our messages, tqdm progress bars) still reach
the terminal. With ``-v`` nothing is hidden and our own loggers log at INFO.

``run_verb(prog, fn, verbose)`` turns what a verb raises into an exit status: 0 ok, 1 failure,
2 bad input (``InputError``, ``BundleError``, unknown names, missing files, ...), 130 Ctrl-C (one
line, no traceback). Tracebacks appear only with ``--verbose``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import TextIO

NOISY_LOGGERS = ("torch", "torchao", "onnxruntime", "onnxscript", "onnx_ir", "executorch",
                 "transformers", "huggingface_hub", "accelerate", "triton", "urllib3")  # fmt: skip
INPUT_ERRORS = (KeyError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError)


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError
        return None


@contextlib.contextmanager
def _native_to_scratch() -> Iterator[None]:
    """Send fds 1 and 2 to a scratch file; keep ``sys.stdout``/``sys.stderr`` on the terminal."""
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    streams: dict[int, TextIO] = {}
    old = sys.stdout, sys.stderr
    with tempfile.TemporaryFile() as scratch:
        try:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
                if _fileno(stream) == fd:  # else (e.g. pytest's capsys) the stream is not on fd
                    streams[fd] = open(  # noqa: SIM115 - closed in finally
                        saved[fd], "w", encoding=getattr(stream, "encoding", None) or "utf-8",
                        errors="replace", buffering=1, closefd=False,
                    )  # fmt: skip
                os.dup2(scratch.fileno(), fd)
            sys.stdout, sys.stderr = streams.get(1, old[0]), streams.get(2, old[1])
            yield
        finally:
            for s in streams.values():
                s.flush()
            sys.stdout, sys.stderr = old
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            for s in streams.values():
                s.close()


@contextlib.contextmanager
def quiet_console(verbose: bool) -> Iterator[None]:
    """See the module docstring; ``verbose`` shows everything."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        force=True,
    )
    if verbose:
        yield
        return
    previous = {n: logging.getLogger(n).level for n in NOISY_LOGGERS}
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)  # libraries (torch.onnx, ...) reset their own levels
        try:
            with _native_to_scratch():
                # the handler must write to the terminal stream chosen inside the redirect
                logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)
                yield
        finally:
            logging.disable(logging.NOTSET)
            for name, level in previous.items():
                logging.getLogger(name).setLevel(level)


def library_stdout(verbose: bool) -> contextlib.AbstractContextManager[object]:
    """Around a stage whose own stdout is nothing but library chatter (``torch.onnx``'s
    "Translate the graph...", ORT's converter): dropped unless ``verbose``."""
    return contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())


def run_verb(prog: str, fn: Callable[[], int], *, verbose: bool) -> int:
    """Run ``fn`` under ``quiet_console``; map exceptions to one paragraph and an exit status."""
    try:
        with quiet_console(verbose):
            return fn()
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the top of a command: report, never a raw traceback
        return _report(prog, e, verbose)


def error_status(e: BaseException) -> tuple[int, bool]:
    """The exit status of a verb that raised ``e`` (module docstring), and whether it is an
    internal error (its type named, a traceback hint) rather than bad input."""
    from omnidraft_deploy.catalog.assets import AssetError

    if isinstance(e, (*INPUT_ERRORS, AssetError, ImportError)):
        return 2, False
    return 1, True


def error_line(prog: str, e: BaseException, *, verbose: bool) -> tuple[int, str]:
    """(exit status, the one line ``run_verb`` prints for ``e``); ``omnidraft serve`` sends the
    same line to its client."""
    status, internal = error_status(e)
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    text = " ".join(text.split()) or type(e).__name__
    if internal:
        text = f"{type(e).__name__}: {text}"
    hint = "" if verbose else " (run again with --verbose for details)"
    return status, f"{prog}: error: {text}{hint if internal else ''}"


def _report(prog: str, e: BaseException, verbose: bool) -> int:
    if verbose:
        traceback.print_exception(e, file=sys.stderr)
    status, line = error_line(prog, e, verbose=verbose)
    print(line, file=sys.stderr)
    return status
