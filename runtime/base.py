"""``RuntimeModel``: one ABC level for exported graphs behind the ``CausalLM`` protocol.

Each subclass only implements ``_run(token_ids (1,T) int64, input_pos (T,) int64) -> logits
(T, V) float32``, and may override ``_run_tail`` where its graph can score the last rows alone
(``forward_tail``: a prefill, the drafter, a prefill that verifies the first proposals). The base
class checks bounds, keeps the call count and records which tokens the cache holds
(``cached``, ``speculative.kv_reuse``: a prompt that begins with them is not prefilled again). KV
caches are static and addressed by position, so rollback is calling again at an earlier
``start_pos``: nothing to undo.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.speculative.kv_reuse import CachedTokens


class RuntimeModel(ABC):
    backend = "abstract"

    def __init__(self, path: Path, info: GraphInfo) -> None:
        self.path, self.info = Path(path), info
        self.n_calls = 0
        self.cached = CachedTokens()  # the ids at the cache's positions, for prefix reuse

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.info.max_seq_len

    def _feed(self, token_ids: Tensor, start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """``(1, T)`` ids and ``(T,)`` positions of a call, bounds checked and counted."""
        t = int(token_ids.shape[0])
        if t < 1 or start_pos < 0 or start_pos + t > self.max_seq_len:
            raise ValueError(
                f"{self.path.name}: tokens {start_pos}..{start_pos + t} outside "
                f"[0, {self.max_seq_len})"
            )
        self.n_calls += 1
        ids = token_ids.to(torch.long).numpy().reshape(1, t)
        self.cached.keep(start_pos)  # a call that fails leaves its positions unknown
        return ids, np.arange(start_pos, start_pos + t, dtype=np.int64)

    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        ids, pos = self._feed(token_ids, start_pos)
        logits = self._run(ids, pos)
        self.cached.fed(ids[0].tolist(), start_pos)
        return _tensor(logits)

    def forward_tail(self, token_ids: Tensor, start_pos: int, rows: int) -> Tensor:
        """``forward(...)[-rows:]`` ``(rows, V)``, the last positions' logits, alone where the
        graph can (``_run_tail``); the cache is updated for every token as by ``forward``."""
        ids, pos = self._feed(token_ids, start_pos)
        logits = self._run_tail(ids, pos, rows)
        self.cached.fed(ids[0].tolist(), start_pos)
        return _tensor(logits)

    @abstractmethod
    def _run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray: ...

    def _run_tail(self, token_ids: np.ndarray, input_pos: np.ndarray, rows: int) -> np.ndarray:
        """The last ``rows`` rows of the logits; here cut from every row (``_run``)."""
        return self._run(token_ids, input_pos)[-rows:]


def _tensor(logits: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
