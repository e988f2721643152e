"""ONNX Runtime wrapper (CPU, or any execution provider such as QNN HTP) for explicit-cache graphs.

The graph contract, host-held caches (bound once by IOBinding; fused graphs write them in place)
and static-T chunking are ``omnidraft_deploy.graph_contract``'s; this class adapts them to the
``RuntimeModel`` interface (``forward(token_ids, start_pos)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omnidraft_deploy.runtime.base import RuntimeModel

from omnidraft_deploy.graph_contract import ExplicitCacheGraph
from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.onnx_host import cpu_session


class OrtModel(RuntimeModel):
    backend = "onnxruntime"

    def __init__(
        self, path: Path, info: GraphInfo, *, session: Any | None = None, threads: int | None = None
    ) -> None:
        super().__init__(path, info)
        self.graph = ExplicitCacheGraph(session or cpu_session(self.path, threads=threads), info)

    def _run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
        return self.graph.run(token_ids, input_pos)
