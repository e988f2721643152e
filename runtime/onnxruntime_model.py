"""ONNX Runtime wrapper (CPU, or any execution provider such as QNN HTP) for explicit-cache graphs.

The graph contract, host-held caches (bound once by IOBinding; fused graphs write them in place
and their logits straight into the array this class returns) and static-T chunking are
``omnidraft_deploy.bundle.graph_contract``'s; this class adapts them to the ``RuntimeModel`` interface
(``forward(token_ids, start_pos)``; ``forward_tail`` runs a graph that takes ``logits_from``
for the last rows only).

Session options when this class opens the session (``session=None``): ``threads`` intra-op
threads (None: ORT's default, one per physical core), ``spinning`` (default
``Spin.IN_CALL``: a drafter and a target take turns on the same cores; a pool left spinning
after its call steals the cores the other session's call needs, a pool that never spins pays a
wake-up per op; ``host.onnx_host.cpu_session`` and docs/results/decoding.md give the measured
decode speeds of the three; None: ORT's threading defaults), and
``huge_pages`` (default on): the session's weights are moved onto transparent huge pages
(``omnidraft_deploy.host.hugepages``: measured ~10% faster memory-bound decoding, ~1 s more load).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omnidraft_deploy.runtime.base import RuntimeModel

from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.host.hugepages import on_huge_pages
from omnidraft_deploy.host.onnx_host import Spin, cpu_session

RUNTIME_SPIN = Spin.IN_CALL  # how the runtime's sessions wait (part of a profile's fingerprint)


class OrtModel(RuntimeModel):
    backend = "onnxruntime"

    def __init__(
        self,
        path: Path,
        info: GraphInfo,
        *,
        session: Any | None = None,
        decode: Path | Any | None = None,
        threads: int | None = None,
        spinning: Spin | None = RUNTIME_SPIN,
        huge_pages: bool = True,
    ) -> None:
        """``decode``: a static-T graph's T = 1 twin (``GraphInfo.decode_file``), a session or a
        path opened like ``path``, for one-token calls (``graph_contract.ExplicitCacheGraph``)."""
        super().__init__(path, info)

        def opened(p: Path) -> Any:
            make = lambda: cpu_session(p, threads=threads, spinning=spinning)  # noqa: E731
            return on_huge_pages(make) if huge_pages else make()

        if session is None:
            session = opened(self.path)
        if isinstance(decode, Path):
            decode = opened(decode)
        self.graph = ExplicitCacheGraph(session, info, decode=decode)

    def _run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
        return self.graph.run(token_ids, input_pos)

    def _run_tail(self, token_ids: np.ndarray, input_pos: np.ndarray, rows: int) -> np.ndarray:
        return self.graph.run(token_ids, input_pos, rows=rows)  # (rows, V)
