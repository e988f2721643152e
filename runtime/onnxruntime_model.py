"""ONNX Runtime wrapper (CPU, or any execution provider such as QNN HTP) for explicit-cache graphs.

The graph contract, host-held caches (bound once by IOBinding; fused graphs write them in place
and their logits straight into the array this class returns) and static-T chunking are
``omnidraft_deploy.graph_contract``'s; this class adapts them to the ``RuntimeModel`` interface
(``forward(token_ids, start_pos)``).

Session options when this class opens the session (``session=None``): ``threads`` intra-op
threads (None: ORT's default, one per physical core), ``spinning`` (None: ORT's threading
defaults; False for sessions that share the cores, ``onnx_host.cpu_session``), and
``huge_pages`` (default on): the session's weights are moved onto transparent huge pages
(``omnidraft_deploy.hugepages``: measured ~10% faster memory-bound decoding, ~1 s more load).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omnidraft_deploy.runtime.base import RuntimeModel

from omnidraft_deploy.graph_contract import ExplicitCacheGraph
from omnidraft_deploy.hugepages import on_huge_pages
from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.onnx_host import cpu_session


class OrtModel(RuntimeModel):
    backend = "onnxruntime"

    def __init__(
        self,
        path: Path,
        info: GraphInfo,
        *,
        session: Any | None = None,
        threads: int | None = None,
        spinning: bool | None = None,
        huge_pages: bool = True,
    ) -> None:
        super().__init__(path, info)
        if session is None:
            make = lambda: cpu_session(self.path, threads=threads, spinning=spinning)  # noqa: E731
            session = on_huge_pages(make) if huge_pages else make()
        self.graph = ExplicitCacheGraph(session, info)

    def _run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
        return self.graph.run(token_ids, input_pos)
