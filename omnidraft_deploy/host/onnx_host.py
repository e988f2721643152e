"""ONNX Runtime sessions for explicit-cache graphs: CPU, and the QNN HTP (with the names of the
ops it refuses). How a graph is called (names, caches, chunking) is ``omnidraft_deploy.
graph_contract``'s; the export-time verification, the QNN exporter's HTP check and the desktop
runtime all open their sessions here. ONNX Runtime and its QNN plugin are imported lazily.
"""

from __future__ import annotations

import functools
import platform
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Any

from omnidraft_deploy.optional import require


def require_onnxruntime() -> Any:
    return require("onnxruntime", extra="onnx", purpose="the onnx backend")


EXACT_U8S8 = "session.x64quantprecision"  # ORT: u8 x s8 GEMMs without int16 saturation on x64
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})  # /proc/cpuinfo names


def cpuinfo(key: str) -> str | None:
    """The value of ``/proc/cpuinfo``'s first ``key`` line ("" when there is none), None where
    the file cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.startswith(key)), "")  # fmt: skip


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as ``/proc/cpuinfo`` names them, None where it cannot be read."""
    flags = cpuinfo("flags")
    return None if flags is None else frozenset(flags.split())


@functools.cache
def u8s8_saturates() -> bool:
    """Whether ONNX Runtime's u8 x s8 integer GEMM (``MatMulInteger`` with int8 weights: the
    ``w8a8`` graph, ``exporters.onnx.fused.GraphWriter.linear_rows``) saturates on this CPU unless
    the session asks for ``EXACT_U8S8``. It does on x86-64 without VNNI: its AVX2 kernel sums pairs
    of u8 x s8 products in int16 (``vpmaddubsw``), and every output of a 1536-deep product came out
    wrong on an AVX2 EPYC (``reports/w8a8_saturation``). With VNNI (``vpdpbusd`` accumulates in
    int32) and on ARM (``sdot`` / ``udot``) it is exact. A CPU whose flags cannot be read (not
    Linux) counts as saturating: the option costs speed, never exactness."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    flags = cpu_flags()
    return flags is None or not flags & VNNI_FLAGS


class Spin(StrEnum):
    """How a session's pool threads wait for work (``cpu_session``)."""

    ON = "on"  # spin between ops and on after the call returns (ORT's default)
    OFF = "off"  # never spin: a thread sleeps between ops and is woken for the next
    IN_CALL = "in-call"  # spin between ops, stop when the call returns (force_spinning_stop)


def cpu_session(
    path: Path | bytes,
    *,
    threads: int | None = None,
    spinning: Spin | None = None,
    profile: bool = False,
) -> Any:
    """ONNX Runtime session on the CPU execution provider, warnings off; ``path``: the graph file
    or its serialised bytes (an edited graph: ``runtime.adapted``); ``threads``: intra-op
    threads (None: ORT's default, one per physical core). ``spinning`` None: ORT's threading
    defaults; a ``Spin``: one inter-op thread, sequential execution, and that wait.

    Two sessions that take turns on the same cores (a drafter and a target) want ``IN_CALL``:
    with ``ON`` the pool left spinning after one session's call steals the cores the other's
    call needs; with ``OFF`` every op pays a wake-up (``benchmarks/pair_calls.py``,
    docs/results/decoding.md). ``profile``: ORT's per-operator profiler on."""
    ort = require_onnxruntime()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.enable_profiling = profile
    if threads is not None:
        opts.intra_op_num_threads = threads
    if spinning is not None:
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        for pool in ("intra_op", "inter_op"):
            allow = str(int(spinning is not Spin.OFF))
            opts.add_session_config_entry(f"session.{pool}.allow_spinning", allow)
        stop = str(int(spinning is Spin.IN_CALL))
        opts.add_session_config_entry("session.force_spinning_stop", stop)
    if u8s8_saturates():  # int8 weights (w8a8) stay exact on x86 CPUs without VNNI
        opts.add_session_config_entry(EXACT_U8S8, "1")
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


class QnnUnsupportedError(RuntimeError):
    """The HTP backend refused the graph; ``ops`` names the operators it could not take."""

    def __init__(self, path: Path, ops: list[str], detail: str) -> None:
        super().__init__(
            f"{path.name}: QNN HTP cannot run ops {ops or '(unnamed)'}: {detail[:400]}"
        )
        self.ops = ops


def _htp_options(ort: Any, *, fallback: bool, context: Path | None = None) -> Any:
    """SessionOptions on the QNN HTP device; ``context``: also write the EPContext model there."""
    if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
        import onnxruntime_qnn

        ort.register_execution_provider_library(
            "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
        )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if fallback else "1")
    if context is not None:
        opts.add_session_config_entry("ep.context_enable", "1")
        opts.add_session_config_entry("ep.context_file_path", str(context))
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    opts.add_provider_for_devices(devices, {"backend_type": "htp"})
    return opts


def context_path(graph: Path) -> Path:
    """Where the QNN exporter writes ``graph``'s precompiled EPContext model: ``<stem>_ctx.onnx``,
    and beside it ``<stem>_ctx_qnn.bin``, the HTP context binary it names."""
    return graph.with_name(f"{graph.stem}_ctx.onnx")


def cpu_nodes(path: Path) -> list[str]:
    """``"OpType (node name)"`` of every node QNN HTP leaves to the CPU EP.

    ORT's "fallback disabled" error names no node, so the graph is compiled again with fallback
    allowed and an EPContext dump: every node left beside the ``EPContext`` node(s) is one the HTP
    refused. No context file means the HTP took nothing, so every node is listed.
    """
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp) / "ctx.onnx"
        ort.InferenceSession(str(path), _htp_options(ort, fallback=True, context=ctx))
        graph = onnx.load(str(ctx if ctx.is_file() else path), load_external_data=False).graph
    return [f"{n.op_type} ({n.name})" for n in graph.node if n.op_type != "EPContext"]


def htp_session(path: Path, *, context: Path | None = None) -> Any:
    """ORT session on QNN HTP only (CPU fallback disabled); ``context``: write the precompiled
    EPContext model (what a phone loads without recompiling) to that path.

    Raises ``QnnUnsupportedError`` naming the nodes the HTP cannot take (see ``cpu_nodes``); a
    graph the HTP accepts but fails to finalize names no op (the QNN error text is kept).
    """
    try:
        import onnxruntime as ort
        import onnxruntime_qnn  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "the qnn backend needs the QNN execution provider: "
            "pip install 'omnidraft-deploy[qnn]' (onnxruntime-qnn)"
        ) from e
    try:
        return ort.InferenceSession(str(path), _htp_options(ort, fallback=False, context=context))
    except Exception as e:  # ORT's Fail / EPFail have no common public base class
        detail = str(e)
    ops = cpu_nodes(path) if "fallback to CPU EP has been explicitly disabled" in detail else []
    raise QnnUnsupportedError(path, ops, detail)
