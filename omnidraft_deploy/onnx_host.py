"""Host side of explicit-cache ONNX graphs, shared by ``exporters`` and ``runtime``.

Graph contract (``exporters.exportable.ExplicitCacheExportable``): inputs ``token_ids (1, T)``
int64, ``input_pos (T,)`` int64 and ``cache_{i} (1, KV, max_seq_len, D)`` float32 (k and v of every
layer); outputs ``logits (1, T, V)`` and ``cache_out_{i} (1, KV, T, D)``: only this chunk's new
entries, which the host writes at the chunk's positions after every call. Rollback is calling again
from an earlier position: stale entries past it are masked by position and then overwritten.

Static-T graphs (``GraphInfo.seq_len`` set: NPU) are fed in chunks of exactly T tokens. A short chunk
is padded with copies of its last token at the following positions; padded rows come last, so causal
masking keeps them out of the real rows, and their entries are never written back.

The export-time verification (``exporters.verify``), the QNN exporter's HTP check and the desktop
runtime (``runtime.onnxruntime_model``, ``runtime.qnn_model``) all step graphs through this module,
so what was verified at export is what runs. ONNX Runtime and its QNN plugin are imported lazily.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.optional import require


class ExplicitCacheGraph:
    """One ONNX session plus its host-held KV caches (numpy), stepped by position."""

    def __init__(self, session: Any, info: GraphInfo) -> None:
        self.session, self.info = session, info
        shape = (1, info.n_kv_heads, info.max_seq_len, info.head_dim)
        self.caches = [np.zeros(shape, np.float32) for _ in range(2 * info.n_layers)]
        self._outputs = [o.name for o in session.get_outputs()]

    def _call(self, ids: np.ndarray, pos: np.ndarray, n_real: int) -> np.ndarray:
        feeds = {"token_ids": ids, "input_pos": pos}
        feeds.update({f"cache_{i}": c for i, c in enumerate(self.caches)})
        logits, *new = self.session.run(self._outputs, feeds)
        for cache, entries in zip(self.caches, new, strict=True):
            cache[:, :, pos[:n_real], :] = entries[:, :, :n_real, :]  # host-side cache write
        return np.asarray(logits[0])

    def run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
        """``token_ids (1, T)`` at ``input_pos (T,)`` -> logits ``(T, V)``; caches updated."""
        t_static = self.info.seq_len
        if t_static is None:
            return self._call(token_ids, input_pos, token_ids.shape[1])
        rows = []
        for s in range(0, token_ids.shape[1], t_static):
            ids, pos = token_ids[:, s : s + t_static], input_pos[s : s + t_static]
            n = ids.shape[1]
            if n < t_static:
                pad = t_static - n
                ids = np.concatenate([ids, np.repeat(ids[:, -1:], pad, axis=1)], axis=1)
                extra = np.minimum(pos[-1] + 1 + np.arange(pad), self.info.max_seq_len - 1)
                pos = np.concatenate([pos, extra]).astype(np.int64)
            rows.append(self._call(ids, pos, n)[:n])
        return np.concatenate(rows, axis=0)


def require_onnxruntime() -> Any:
    return require("onnxruntime", extra="onnx", purpose="the onnx backend")


def cpu_session(path: Path) -> Any:
    """ONNX Runtime session on the CPU execution provider, warnings off."""
    ort = require_onnxruntime()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


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
