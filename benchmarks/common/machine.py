"""What every report records about where and when it ran: the machine, the checkout, the date.

``machine()`` is the CPU as ``/proc/cpuinfo`` names it (model and logical CPUs) and the SIMD flags
that decide which integer kernels run (``WATCHED_FLAGS``: VNNI turns ONNX Runtime's u8 x s8 GEMM
exact and faster, AVX-512 widens every kernel). ``revision()`` is the checkout's short hash,
``+dirty`` when tracked files differ from it; ``utc_now()`` the date. ``common.report.run_meta``
puts them, with the command, threads and load average, at the head of every report.

    python -m benchmarks.common.machine   # prints this machine's record as JSON
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common.timer import utc_now
from omnidraft_deploy.host.onnx_host import cpu_flags, cpuinfo

# the flags a reader needs to place a timing: AVX2 only, AVX-512, VNNI (512- or 256-bit), AMX
WATCHED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def simd_flags() -> list[str] | None:
    """Which of ``WATCHED_FLAGS`` this CPU has (None where ``/proc/cpuinfo`` cannot be read)."""
    flags = cpu_flags()
    return None if flags is None else [f for f in WATCHED_FLAGS if f in flags]


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "flags": simd_flags()}


def revision() -> str:
    """The checkout's short commit hash, with ``+dirty`` when tracked files differ from it."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                              cwd=Path(__file__).resolve().parent)  # fmt: skip
        return proc.stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def describe(m: dict[str, Any]) -> str:
    """One line for a report's head: ``AMD EPYC 9R45, 2 CPUs, flags avx2 avx512f avx512_vnni``."""
    flags = m.get("flags")
    if flags is None:
        shown = "not recorded"
    else:
        shown = " ".join(flags) or "none of " + "/".join(WATCHED_FLAGS)
    return f"{m.get('cpu')}, {m.get('cpus')} CPUs, flags {shown}"


if __name__ == "__main__":
    print(json.dumps({"machine": machine(), "revision": revision(), "utc": utc_now()}, indent=1))
