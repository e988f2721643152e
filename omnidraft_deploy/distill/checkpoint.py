"""Adaptation checkpoints: the adapted drafter's weights between sessions, crash-safe.

``save_checkpoint(path, state)`` writes a safetensors file (no pickle) through
``atomic.write_bytes_atomic`` (locked temp file, fsync, rename; temp files of killed writers are
deleted by the next save), so ``path`` always holds the previous checkpoint or the new one, whole.
``load_checkpoint(path, like=model_state)`` refuses a file over ``max_bytes`` or one whose tensor
names, shapes or dtypes differ from the model's, naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import Tensor

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.optional import require

MAX_BYTES = 4 << 30


class CheckpointError(ValueError):
    """A checkpoint file is missing, damaged or for another model."""


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Tensor]) -> None:
    """Write ``state`` (name -> tensor) as safetensors, atomically."""
    st = require("safetensors.torch", extra="hf", purpose="adaptation checkpoints")
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    write_bytes_atomic(path, st.save(tensors))


def load_checkpoint(
    path: str | os.PathLike[str], *, like: dict[str, Tensor], max_bytes: int = MAX_BYTES
) -> dict[str, Tensor]:
    """The tensors of ``path``, which must match ``like`` in names, shapes and dtypes."""
    st = require("safetensors.torch", extra="hf", purpose="adaptation checkpoints")
    p = Path(path)
    if not p.is_file() or p.is_symlink():
        raise CheckpointError(f"{p}: missing (or not a plain file)")
    if p.stat().st_size > max_bytes:
        raise CheckpointError(f"{p}: {p.stat().st_size} B is over the cap of {max_bytes} B")
    try:
        state: dict[str, Tensor] = st.load(p.read_bytes())
    except Exception as e:  # safetensors raises SafetensorError / others for damaged bytes
        raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None
    if set(state) != set(like):
        raise CheckpointError(f"{p}: tensor names differ from the model's")
    for name, ref in like.items():
        if state[name].shape != ref.shape or state[name].dtype != ref.dtype:
            raise CheckpointError(f"{p}: {name} is {tuple(state[name].shape)} {state[name].dtype}")
    return state
