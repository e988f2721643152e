"""A target's adapted drafter weights, kept in its state folder (issue 30: one drafter, many targets).

A multi-target bundle ships one drafter graph for every target. ``omnidraft adapt B --target NAME``
trains that drafter on NAME's traffic and writes the result here, never into the bundle::

    <bundle state>/targets/<NAME>/drafter.adapted.safetensors

Opening the bundle for NAME with that state folder swaps these weights into the shared graph's
initializers (``bundle.weight_swap``; ``runtime.adapted``); every other target keeps the shipped
weights, or its own file. Format (safetensors, written atomically):

- tensors: float32, named by the shared drafter graph's initializer names (the graph is exported
  with every parameter an initializer: an unquantised drafter recipe, ``weights_swappable``);
- metadata (all strings): ``omnidraft.format`` = ``drafter_weights``, ``omnidraft.format_version``
  = ``1``; ``drafter_sha256``: the sha256 of the bundle's drafter graph file (the manifest's) the
  weights were bound to; ``target``: the target they were adapted on; ``params``: JSON object
  initializer name -> the eager drafter's parameter name (``adapt`` resumes from the file);
  ``data_sha256``: sha256 over every tensor in name order (name, dtype, shape, bytes), so a bit
  flip in the data is caught, not only a broken header.

``read_drafter_weights`` checks all of it and raises ``BundleError`` naming the file: not
safetensors, another format or version, a file bound to another drafter graph or adapted on another
target, damaged data, or a tensor the graph has no initializer of that shape for (``check_names``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.bundle.files import read_plain
from omnidraft_deploy.bundle.manifest import BundleError
from omnidraft_deploy.optional import require

ADAPTED_DRAFTER = "drafter.adapted.safetensors"
# a single-target bundle's drafter as ``omnidraft distill`` last published it (eager parameter
# names, bound to the published drafter graph's sha256): where the next distill starts from
DISTILLED_DRAFTER = "drafter.distilled.safetensors"
FORMAT = "drafter_weights"
FORMAT_VERSION = "1"
MAX_BYTES = 8 << 30  # a 2B-parameter fp32 drafter
KEYS = ("omnidraft.format", "omnidraft.format_version", "drafter_sha256", "target", "params",
        "data_sha256")  # fmt: skip


@dataclass(frozen=True)
class DrafterWeights:
    tensors: dict[str, Tensor]  # initializer name -> float32 tensor
    params: dict[str, str]  # initializer name -> eager parameter name
    target: str
    drafter_sha256: str


def _safetensors() -> Any:
    """``safetensors.torch`` (the ``hf`` extra), imported when a weight file is read or written."""
    return require("safetensors.torch", extra="hf", purpose="adapted drafter weights")


def data_digest(tensors: Mapping[str, Tensor]) -> str:
    """sha256 over every tensor in name order: name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_drafter_weights(
    path: Path, tensors: Mapping[str, Tensor], *, params: Mapping[str, str], target: str,
    drafter_sha256: str,
) -> Path:  # fmt: skip
    """Write ``tensors`` (initializer name -> tensor, stored float32) to ``path`` atomically."""
    if set(params) != set(tensors):
        raise ValueError(f"params name {sorted(params)} but the tensors are {sorted(tensors)}")
    plain = {n: t.detach().float().contiguous().cpu() for n, t in tensors.items()}
    meta = {"omnidraft.format": FORMAT, "omnidraft.format_version": FORMAT_VERSION,
            "drafter_sha256": drafter_sha256, "target": target,
            "params": json.dumps(dict(sorted(params.items()))), "data_sha256": data_digest(plain)}  # fmt: skip
    write_bytes_atomic(path, _safetensors().save(plain, metadata=meta))
    return path


def _metadata(path: Path, data: bytes) -> dict[str, str]:
    """The header's ``__metadata__``, read before any tensor (safetensors: u64 length + JSON)."""
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if n < 2 or 8 + n > len(data):
        raise BundleError(path, "not a safetensors file (no header); delete it to use the "
                          "bundle's shared drafter")  # fmt: skip
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BundleError(path, f"not a safetensors file (header: {e})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("omnidraft.format") != FORMAT:
        raise BundleError(path, f"not omnidraft adapted drafter weights (no "
                          f"omnidraft.format={FORMAT!r} in its metadata): a foreign file")  # fmt: skip
    if meta.get("omnidraft.format_version") != FORMAT_VERSION:
        raise BundleError(path, f"format_version {meta.get('omnidraft.format_version')!r}; this "
                          f"reader reads {FORMAT_VERSION!r}")  # fmt: skip
    missing = [k for k in KEYS if not isinstance(meta.get(k), str)]
    if missing:
        raise BundleError(path, f"metadata lacks {missing}")
    return meta


def read_drafter_weights(path: Path, *, drafter_sha256: str, target: str) -> DrafterWeights:
    """The weights at ``path``, every check of the module docstring done (``BundleError``)."""
    data = read_plain(path.parent, path.name, max_bytes=MAX_BYTES)
    meta = _metadata(path, data)
    if meta["target"] != target:
        raise BundleError(path, f"adapted on target {meta['target']!r}, not {target!r}: another "
                          "target's weights")  # fmt: skip
    if meta["drafter_sha256"] != drafter_sha256:
        raise BundleError(path, "bound to another drafter graph (drafter_sha256 differs from the "
                          "bundle's): adapt this target again")  # fmt: skip
    from safetensors import SafetensorError

    try:
        tensors = dict(_safetensors().load(data))
        params = json.loads(meta["params"])
    except (SafetensorError, json.JSONDecodeError, RecursionError) as e:
        raise BundleError(path, f"damaged safetensors data ({e})") from None
    if data_digest(tensors) != meta["data_sha256"]:
        raise BundleError(path, "data_sha256 mismatch (corrupted weights)")
    if not isinstance(params, dict) or set(params) != set(tensors):
        raise BundleError(path, "its params metadata does not name exactly its tensors")
    if any(t.dtype != torch.float32 for t in tensors.values()):
        raise BundleError(path, "tensors must be float32")
    return DrafterWeights(tensors, {str(k): str(v) for k, v in params.items()}, target,
                          drafter_sha256)  # fmt: skip


def check_names(path: Path, weights: DrafterWeights, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Every tensor names an initializer of the graph (``shapes``: its float initializers' dims)
    with the same shape; ``BundleError`` naming ``path`` otherwise."""
    for name, t in sorted(weights.tensors.items()):
        if name not in shapes:
            raise BundleError(path, f"tensor {name!r} is no initializer of the drafter graph")
        if tuple(t.shape) != shapes[name]:
            raise BundleError(path, f"tensor {name!r} has shape {tuple(t.shape)}; the drafter "
                              f"graph's is {shapes[name]}")  # fmt: skip
