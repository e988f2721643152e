"""ExecuTorch runtime wrapper for ``.pte`` programs (XNNPACK); the KV cache is program state.

How a program is stepped is ``omnidraft_deploy.bundle.graph_contract``'s (``pte_step``). Metadata comes
from the program's constant methods (get_max_seq_len, get_vocab_size, ...), which
``check_metadata`` compares with the manifest before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omnidraft_deploy.runtime.base import RuntimeModel

from omnidraft_deploy.bundle import graph_contract as gc
from omnidraft_deploy.bundle.manifest import BundleError
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.optional import pte_program

PTE_MAGIC = b"ET"  # flatbuffer file identifier at bytes 4..8 is b"ET" + 2-digit schema version


def load_program(path: Path) -> Any:
    head = path.read_bytes()[:8]
    if len(head) < 8 or head[4:6] != PTE_MAGIC:
        raise BundleError(path, "not an ExecuTorch program (no ET flatbuffer identifier)")
    try:
        return pte_program(path)
    except RuntimeError as e:
        raise BundleError(
            path, f"ExecuTorch refused the program ({e}): truncated or corrupted"
        ) from None


def constant(program: Any, name: str) -> Any:
    value = program.load_method(name).execute([])
    return value[0] if isinstance(value, list | tuple) and len(value) == 1 else value


def check_metadata(program: Any, path: Path, info: GraphInfo) -> None:
    for method, expected in (
        ("get_vocab_size", info.vocab_size),
        ("get_max_seq_len", info.max_seq_len),
        ("get_n_layers", info.n_layers),
    ):
        got = int(constant(program, method))
        if got != expected:
            raise BundleError(path, f"{method}() = {got} but the manifest says {expected}")


class PteModel(RuntimeModel):
    backend = "executorch"

    def __init__(self, path: Path, info: GraphInfo) -> None:
        super().__init__(path, info)
        self.program = load_program(self.path)
        check_metadata(self.program, self.path, info)
        self.method = self.program.load_method(gc.PTE_FORWARD)

    def _run(self, token_ids: np.ndarray, input_pos: np.ndarray) -> np.ndarray:
        return gc.pte_step(self.method, token_ids, input_pos)

    def _run_tail(self, token_ids: np.ndarray, input_pos: np.ndarray, rows: int) -> np.ndarray:
        return gc.pte_step(self.method, token_ids, input_pos, rows)
