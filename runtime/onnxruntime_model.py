"""ONNX Runtime wrapper (CPU, or any execution provider such as QNN HTP) for explicit-cache graphs.

The host keeps the caches (numpy, the exporter's ``cache_{i}`` layout) and writes the returned
``cache_out_{i}`` entries (this chunk's k/v) at the chunk's positions after every call. Static-shape
graphs (``GraphInfo.seq_len`` set, NPU) are fed in chunks of exactly T tokens: a short chunk is
padded with copies of its last token at the following positions; padded rows come last, so causal
masking keeps them out of the real rows, and their entries are never written back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omnidraft_deploy.runtime.base import RuntimeModel

from omnidraft_deploy.manifest import GraphInfo


def require_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(
            "the onnx backend needs ONNX Runtime: pip install 'omnidraft-deploy[onnx]'"
        ) from e
    return onnxruntime


class OrtModel(RuntimeModel):
    backend = "onnxruntime"

    def __init__(self, path: Path, info: GraphInfo, *, session: Any | None = None) -> None:
        super().__init__(path, info)
        ort = require_onnxruntime()
        if session is None:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.session = session
        shape = (1, info.n_kv_heads, info.max_seq_len, info.head_dim)
        self.caches = [np.zeros(shape, np.float32) for _ in range(2 * info.n_layers)]
        self._outputs = [o.name for o in session.get_outputs()]
        self._real_rows = 0

    def _call(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        feeds = {"token_ids": ids, "input_pos": pos}
        feeds.update({f"cache_{i}": c for i, c in enumerate(self.caches)})
        logits, *new = self.session.run(self._outputs, feeds)
        n = self._real_rows
        for cache, entries in zip(self.caches, new, strict=True):
            cache[:, :, pos[:n], :] = entries[:, :, :n, :]  # host-side cache write
        return logits[0]

    def _run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
        t_static = self.info.seq_len
        if t_static is None:
            self._real_rows = token_ids.shape[1]
            return self._call(token_ids, input_pos)
        rows = []
        for s in range(0, token_ids.shape[1], t_static):
            ids, pos = token_ids[:, s : s + t_static], input_pos[s : s + t_static]
            n = self._real_rows = ids.shape[1]
            if n < t_static:
                pad = t_static - n
                ids = np.concatenate([ids, np.repeat(ids[:, -1:], pad, axis=1)], axis=1)
                extra = np.minimum(pos[-1] + 1 + np.arange(pad), self.max_seq_len - 1)
                pos = np.concatenate([pos, extra]).astype(np.int64)
            rows.append(self._call(ids, pos)[:n])
        return np.concatenate(rows, axis=0)
