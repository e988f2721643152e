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

Weights that are file-backed already (a model loaded from cached safetensors: ``safe_open`` maps
the file) are skipped: copying them cost the 1.5B export 2 minutes for nothing
(``reports/xnnpack_gguf4``). Which pages are file-backed is read from ``/proc/self/maps``; where
that cannot be read, every large weight is spilled.
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
    large = [p for p in model.parameters() if p.numel() * p.element_size() >= min_bytes]
    mapped_files = file_mappings()
    params = {id(p): p for p in large if not _inside(p, mapped_files)}
    if len(params) < len(large):
        log.info("spill: %d of %d large weights are file-backed already", len(large) - len(params),
                 len(large))  # fmt: skip
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


def file_mappings() -> list[tuple[int, int]]:
    """``(start, end)`` of this process's memory mappings of regular files (``/proc/self/maps``
    lines with a path that is not a pseudo-file such as ``[heap]``); empty where unreadable."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    spans = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and int(parts[4]) != 0:  # inode: a file
            lo, hi = parts[0].split("-")
            spans.append((int(lo, 16), int(hi, 16)))
    return spans


def _inside(p: torch.Tensor, spans: list[tuple[int, int]]) -> bool:
    start = p.data_ptr()
    end = start + p.numel() * p.element_size()
    return any(lo <= start and end <= hi for lo, hi in spans)
