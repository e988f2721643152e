"""The eager reference's large weights moved to a memory-mapped file while a graph is lowered.

An export holds the eager fp32 model for verification and ``expected.json`` (the bundle writer's
reference), but the quantise / ``torch.export`` / lowering stages never read its weights (a
``gguf_grid`` recipe builds its quantised model from the GGUF's blocks). ``spill_weights`` writes
each parameter of at least ``min_bytes`` to one file (``torch.save``) and points the parameter at a
memory map of it (``torch.load(mmap=True)``): the same values bit for bit, but file-backed pages
that are read back from disk when verification touches them, and that the kernel may drop again
under memory pressure, instead of anonymous memory held through the whole export. For the
Qwen2.5-1.5B that is 7.1 GB out of the lowering's working set. The file is unlinked at once (the
mapping keeps it alive until the model is freed), so nothing is left behind on disk.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)
MIN_BYTES = 1 << 20  # parameters smaller than this (norms, biases) stay in memory


def spill_weights(model: nn.Module, folder: Path, min_bytes: int = MIN_BYTES) -> int:
    """Point ``model``'s large parameters at a memory-mapped copy in ``folder``; returns bytes.

    Tied parameters stay tied (each tensor is written once). ``folder`` must be on a disk with room
    for them (the bundle's staging folder is); the file is unlinked before this returns.
    """
    params = {id(p): p for p in model.parameters() if p.numel() * p.element_size() >= min_bytes}
    if not params:
        return 0
    fd, name = tempfile.mkstemp(prefix=".spill-", suffix=".pt", dir=folder)
    os.close(fd)
    path = Path(name)
    try:
        torch.save({str(k): p.detach() for k, p in params.items()}, path)
        mapped = torch.load(path, mmap=True, weights_only=True)
    finally:
        path.unlink(missing_ok=True)
    total = 0
    with torch.no_grad():
        for k, p in params.items():
            p.data = mapped[str(k)]
            total += p.numel() * p.element_size()
    gc.collect()
    log.info("spilled %.1f MB of eager weights to a memory map", total / 1e6)
    return total
