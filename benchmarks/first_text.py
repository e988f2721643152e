"""Where a served ``omnidraft run``'s time to the first text goes, on the server's side.

    python -m benchmarks.first_text --bundle bundles/q15-kd --requests 3 --threads 2 --name NAME

Opens the bundle as ``omnidraft serve`` does (``open_session(served=True)``, ``warm``, on a fresh
state folder unless ``--state``), then calls ``runtime.session.generate`` ``--requests`` times
with the palindrome request ``benchmarks.run_stats`` sends (``--chat``, ``--stats``, 96 new
tokens), as the server's request handler does. Each request's timeline, in ms from the call: every
step of ``generate`` before the decode loop (chat template, tokenizer, n-gram cache set-up, cost
profile, decoder), every graph call (target / drafter, its T and start position) and the first
text written. The steps are timed by wrapping the functions ``generate`` calls, in the modules it
finds them in; nothing else is changed. Between requests it calls ``session.prepare`` as the
server does after each reply (where the code has it). The client's side (process start, imports, connect) is
``benchmarks.run_stats``'s figure minus this one.

Writes ``reports/local/run_stats/<name>_first_text.{json,md}``; one a page cites is folded into
``reports/run_stats/runs.json`` (``python -m benchmarks.common.runs_index reports/run_stats <json>``).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.run_stats import PALINDROME

Event = tuple[str, float, float]  # what, ms from the request's start, ms it took


class Timeline:
    """The events of the request running now (``start`` begins one)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: list[Event] = []
        self.first_text_ms: float | None = None

    def start(self) -> None:
        self.t0, self.events, self.first_text_ms = time.perf_counter(), [], None

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.first_text_ms is None:  # only what comes before the first text
                    done = time.perf_counter()
                    self.events.append((name(args) if callable(name) else name,
                                        1e3 * (t - self.t0), 1e3 * (done - t)))  # fmt: skip

        return wrapper


class FirstText:
    """``out``: notes when the first text arrives; ``err``: kept (the ``--stats`` lines)."""

    def __init__(self, line: Timeline, first: bool) -> None:
        self.line, self.first, self.text = line, first, []

    def write(self, text: str, /) -> int:
        if self.first and text and self.line.first_text_ms is None:
            self.line.first_text_ms = 1e3 * (time.perf_counter() - self.line.t0)
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        return None


def _patch(line: Timeline, session: Any) -> None:
    """Wrap what ``generate`` calls before and around the decode loop (module docstring)."""
    from omnidraft_deploy.runtime import run as run_mod
    from omnidraft_deploy.runtime import session as session_mod

    from omnidraft_deploy.host import pages_later
    from omnidraft_deploy.speculative import decoder as decoder_mod
    from omnidraft_deploy.vocab import bundle_tokenizer

    for module, name in ((session_mod, "request_cache"), (session_mod, "_fresh_cache"),
                         (run_mod, "load_session_cache"), (run_mod, "decoding_profile"),
                         (run_mod, "bundle_decoder"), (bundle_tokenizer, "render_chat"),
                         (pages_later, "settle"), (decoder_mod, "check_prompt")):  # fmt: skip
        if hasattr(module, name):  # ``_fresh_cache``: its name before ``request_cache``
            setattr(module, name, line.timed(name, getattr(module, name)))
    tok = session.tokenizer
    tok.encode = line.timed("tokenizer.encode", tok.encode)
    for role in ("target", "drafter"):
        model = getattr(session.bundle, role)
        model.forward = line.timed(
            lambda a, r=role: f"{r} call T={int(a[0].shape[0])} at {a[1]}", model.forward
        )


def _request(bundle: Path, max_new: int) -> Any:
    from omnidraft_deploy.request.protocol import RunRequest

    return RunRequest(bundle=str(bundle.resolve()), target=None, provider=None, prompt=PALINDROME,
                      chat=True, mode="greedy", temperature=0.7, top_p=None,
                      max_new_tokens=max_new, seed=0, stats="summary")  # fmt: skip


def measure(a: argparse.Namespace, state: Path) -> dict[str, Any]:
    from omnidraft_deploy.runtime import session as session_mod
    from omnidraft_deploy.runtime.session import generate, open_session, warm

    prepare = getattr(session_mod, "prepare", None)  # absent before the server readied requests

    t0 = time.perf_counter()
    session = open_session(a.bundle, state=state, threads=a.threads, served=True)
    t1 = time.perf_counter()
    warm(session)
    t2 = time.perf_counter()
    line = Timeline()
    _patch(line, session)
    runs = []
    for _ in range(a.requests):
        line.start()
        out = FirstText(line, first=True)
        generate(session, _request(a.bundle, a.max_new_tokens), out, FirstText(line, False))
        total = 1e3 * (time.perf_counter() - line.t0)
        if prepare is not None:
            prepare(session)  # what the server does between connections
        runs.append({"first_text_ms": round(line.first_text_ms or -1, 1),
                     "request_ms": round(total, 1),
                     "events": [(n, round(s, 1), round(d, 1)) for n, s, d in line.events]})  # fmt: skip
    return {"open_s": round(t1 - t0, 2), "warm_s": round(t2 - t1, 2), "requests": runs}


def _markdown(payload: dict[str, Any]) -> str:
    rows = [f"# Time to the first text of a served request, server side: {payload['meta']['bundle']}\n",
            *meta_lines(payload["meta"]),
            f"Opened as `omnidraft serve` opens (open {payload['open_s']} s, warm "
            f"{payload['warm_s']} s), then the palindrome request of `benchmarks.run_stats` "
            "(`--chat --stats`) handed to `generate` as the server does, once per column. "
            "Each row: a step before the first text (start ms from the request, ms it took).\n"]  # fmt: skip
    for i, r in enumerate(payload["requests"], 1):
        rows += [f"## Request {i}: first text at {r['first_text_ms']} ms "
                 f"(whole request {r['request_ms']} ms)\n", "| step | start (ms) | took (ms) |",
                 "|---|---|---|"]  # fmt: skip
        rows += [f"| {n} | {s} | {d} |" for n, s, d in r["events"]]
        rows.append("")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--state", type=Path, help="the state folder (default: a fresh one)")
    p.add_argument("--name", default="palindrome")
    a = p.parse_args(argv)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        found = measure(a, a.state or Path(tmp) / "state")
    meta = {**run_meta(threads=a.threads, argv=argv, load_avg_start=load0),
            "bundle": str(a.bundle), "prompt": PALINDROME, "max_new_tokens": a.max_new_tokens}  # fmt: skip
    payload = {"meta": meta, **found}
    write_report(Path("reports/local/run_stats") / f"{a.name}_first_text", payload, markdown=_markdown)
    print(_markdown(payload))


if __name__ == "__main__":
    main()
