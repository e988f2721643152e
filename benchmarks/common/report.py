"""The report writer: JSON is the source; Markdown and PNG are rendered from it.

``write_report(stem, payload, markdown=..., plot=...)`` writes ``<stem>.json`` first, reads it
back, and renders ``<stem>.md`` (and the plot's PNGs) from what was written, so a table never
shows a number its JSON lacks. Every write is atomic (``bundle.atomic``). ``run_meta`` is what
every report records about its run: the command (as ``python -m benchmarks.<name> ...``), the git
revision, the date, the machine (``common.machine``: CPU model, logical CPUs, the SIMD flags that
pick the kernels), the threads and the load average at the start and end of the run;
``meta_lines`` states them at the head of the Markdown.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common.machine import describe, machine, revision
from benchmarks.common.timer import utc_now
from omnidraft_deploy.bundle.atomic import write_bytes_atomic, write_text_atomic

Markdown = Callable[[dict[str, Any]], str]
Plot = Callable[[dict[str, Any], Path], object]


def command(argv: Sequence[str] | None = None) -> str:
    """How this run was invoked: ``python -m benchmarks.<script> <args>`` (``argv``: the args)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    script = spec.name if spec is not None else Path(sys.argv[0]).stem
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", "-m", script, *args])


def run_meta(*, threads: int | None, argv: Sequence[str] | None = None,
             load_avg_start: Sequence[float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Command, revision, machine, threads, and the load average now (``load_avg_end``) and at
    the run's start (``load_avg_start``: pass what was read then; default now)."""
    now = os.getloadavg()
    return {"command": command(argv), "revision": revision(), "machine": machine(),
            "threads": threads, "load_avg_start": list(load_avg_start or now),
            "load_avg_end": list(now), "utc_end": utc_now()}  # fmt: skip


def _load(v: Any) -> str:
    return " ".join(f"{x:.2f}" for x in v) if isinstance(v, list | tuple) else str(v)


def meta_lines(meta: dict[str, Any]) -> list[str]:
    """The Markdown head every report carries: command, revision, machine, threads, load."""
    m = meta.get("machine") or {}
    return [f"- command: `{meta.get('command')}`",
            f"- revision: {meta.get('revision')}; machine: {describe(m)}; "
            f"threads: {meta.get('threads')}",
            f"- load average (1, 5, 15 min): {_load(meta.get('load_avg_start'))} at the start, "
            f"{_load(meta.get('load_avg_end'))} at the end ({meta.get('utc_end')} UTC)", ""]  # fmt: skip


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """A matplotlib figure as PNG, written atomically, the figure closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return path


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_report(stem: Path, payload: dict[str, Any], *, markdown: Markdown | None = None,
                 plot: Plot | None = None) -> Path:  # fmt: skip
    """``<stem>.json`` (``payload``), then ``<stem>.md`` and the plot rendered from the JSON as
    written; returns the JSON's path. ``plot(data, <stem>.png)`` may write more PNGs beside."""
    src = stem.with_name(stem.name + ".json")
    write_text_atomic(src, json.dumps(payload, indent=1, default=str) + "\n")
    data = json.loads(src.read_text("utf-8"))
    if markdown is not None:
        write_text_atomic(stem.with_name(stem.name + ".md"), markdown(data))
    if plot is not None:
        plot(data, stem.with_name(stem.name + ".png"))
    return src
