"""A target's adapted drafter at run time: one shared drafter graph, per-target weights (issue 30).

``omnidraft adapt B --target NAME`` on a multi-target bundle ends in ``publish_target_weights``:
the adapted eager drafter's parameters are bound to the shared drafter graph's initializers
(``bundle.weight_swap.bind_weights``), checked by running the swapped graph against the eager
drafter, and written to NAME's state folder (``bundle.drafter_weights``: format and checks). The
bundle is never written. ``open_bundle(..., target=NAME, state=<NAME's state folder>)`` then reads
them (``adapted_weights``) and decodes with the shared graph with them swapped in
(``adapted_drafter``: ``swap_initializers``, a protobuf edit, and an ONNX Runtime CPU session from
the edited bytes); the other targets read their own folders, so each keeps the shipped drafter or
its own adaptation. Single-target bundles publish into the bundle instead (``exporters.publish``);
``omnidraft distill`` then keeps the eager weights it published in the new bundle's state folder
(``save_distilled``, bound to the published drafter graph's sha256), so the next run starts from
the drafter the bundle holds (``distilled_weights``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.onnxruntime_model import RUNTIME_SPIN, OrtModel

from omnidraft_deploy.bundle.drafter_weights import (
    ADAPTED_DRAFTER,
    DISTILLED_DRAFTER,
    DrafterWeights,
    check_names,
    read_drafter_weights,
    write_drafter_weights,
)
from omnidraft_deploy.bundle.manifest import BundleError, Manifest
from omnidraft_deploy.bundle.targets import selected
from omnidraft_deploy.bundle.weight_swap import bind_weights, param_aliases, swap_initializers
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.host.onnx_host import cpu_session
from omnidraft_deploy.host.pages_later import collapse_later
from omnidraft_deploy.optional import require
from omnidraft_deploy.reference.model import Transformer

PROBE = 8  # tokens of the publish-time check: swapped graph == eager drafter
TOLERANCE = 1e-3  # max |logit diff| of that check (fp32 graph vs eager: ~1e-5)


def _onnx() -> Any:
    return require("onnx", extra="onnx", purpose="swapping adapted drafter weights")


def check_swappable(manifest: Manifest, source: str | Path) -> None:
    """Refuse a drafter graph whose weights cannot be swapped (a quantised recipe's graph keeps
    no initializer per parameter), before any training."""
    info = manifest.graphs["drafter"]
    if get_recipe(manifest.backend, info.quantization).quantized:
        raise BundleError(source, f"its drafter graph is {info.quantization}: per-target adapted "
                          "weights swap into an unquantised drafter graph only (export with "
                          "--quantization <target recipe>,fp32)")  # fmt: skip


def _graph(root: Path, manifest: Manifest) -> Any:
    return _onnx().load(str(root / manifest.graphs["drafter"].file))


def adapted_weights(root: Path, manifest: Manifest, state: Path | None) -> DrafterWeights | None:
    """The selected target's adapted weights in its state folder ``state`` (checked), or None:
    no folder, no file, or a single-target bundle (whose adaptation lives in the bundle)."""
    if state is None or not manifest.targets or not (state / ADAPTED_DRAFTER).exists():
        return None
    drafter_file = manifest.graphs["drafter"].file
    return read_drafter_weights(state / ADAPTED_DRAFTER, target=selected(manifest),
                                drafter_sha256=manifest.files[drafter_file].sha256)  # fmt: skip


def _swapped(proto: Any, weights: DrafterWeights, source: Path) -> bytes:
    """The shared drafter graph ``proto``'s bytes with ``weights`` in its initializers (names
    checked; ``proto`` itself is left as it is)."""
    shapes = {i.name: tuple(i.dims) for i in proto.graph.initializer if i.data_type == 1}
    check_names(source, weights, shapes)  # data_type 1: FLOAT
    model = swap_initializers(proto, {n: n for n in weights.tensors}, weights.tensors)
    return bytes(model.SerializeToString())


def adapted_drafter(
    root: Path, manifest: Manifest, weights: DrafterWeights, state: Path, *,
    provider: str = "cpu", threads: int | None = None,
) -> OrtModel:  # fmt: skip
    """The shared drafter graph with ``weights`` swapped in, as an ONNX Runtime CPU model."""
    source = state / ADAPTED_DRAFTER
    if provider != "cpu":
        raise ValueError(f"{source}: adapted drafter weights run on the cpu provider only, not "
                         f"{provider!r}; delete the file to run the shared drafter there")  # fmt: skip
    return _session(root, manifest, _swapped(_graph(root, manifest), weights, source), threads)


def _session(root: Path, manifest: Manifest, data: bytes, threads: int | None) -> OrtModel:
    """An ONNX Runtime CPU model of the drafter graph bytes ``data``."""
    info = manifest.graphs["drafter"]
    return collapse_later(lambda: OrtModel(root / info.file, info, session=cpu_session(
        data, threads=threads, spinning=RUNTIME_SPIN)))  # fmt: skip


def publish_target_weights(
    root: Path, manifest: Manifest, state: Path, drafter: Transformer
) -> Path:
    """Write ``drafter``'s weights as the selected target's adapted drafter (module docstring),
    after checking the swapped shared graph against ``drafter`` on a probe; returns the file."""
    info = manifest.graphs["drafter"]
    params = dict(drafter.named_parameters())
    proto = _graph(root, manifest)  # read once: bound here, swapped for the check below
    binding = bind_weights(proto, list(params), param_aliases(drafter))
    tensors = {init: params[name] for name, init in binding.items()}
    weights = DrafterWeights({n: t.detach().float() for n, t in tensors.items()},
                             {init: name for name, init in binding.items()}, selected(manifest),
                             manifest.files[info.file].sha256)  # fmt: skip
    path = state / ADAPTED_DRAFTER
    runtime = _session(root, manifest, _swapped(proto, weights, path), threads=1)
    ids = torch.arange(1, 1 + min(PROBE, info.max_seq_len)) % drafter.args.vocab_size
    with torch.no_grad():
        eager = drafter.eval().forward_train(ids[None])[0]
    diff = float((runtime.forward(ids, 0) - eager).abs().max())
    if diff > TOLERANCE:
        raise RuntimeError(f"{root / info.file}: with the adapted weights swapped in its logits "
                           f"differ from the eager drafter's by {diff:.2e} (> {TOLERANCE})")  # fmt: skip
    return write_drafter_weights(path, weights.tensors, params=weights.params,
                                 target=weights.target, drafter_sha256=weights.drafter_sha256)  # fmt: skip


def resume(drafter: Transformer, weights: DrafterWeights, source: Path) -> Transformer:
    """``drafter`` with the adapted weights copied in (``adapt`` continues from a target's last
    adaptation); a parameter the drafter lacks, or of another shape, is a ``BundleError``."""
    named = dict(drafter.named_parameters())
    with torch.no_grad():
        for init, name in sorted(weights.params.items()):
            t = weights.tensors[init]
            if name not in named or named[name].shape != t.shape:
                raise BundleError(source, f"tensor {init!r} ({name}, {tuple(t.shape)}) fits no "
                                  "parameter of the bundle's drafter preset")  # fmt: skip
            named[name].copy_(t)
    return drafter


def distilled_weights(manifest: Manifest, state: Path) -> DrafterWeights | None:
    """A single-target bundle's last distilled drafter (``save_distilled``), or None: none kept,
    a multi-target bundle, or weights published for another drafter graph (a re-export)."""
    path = state / DISTILLED_DRAFTER
    if manifest.targets or not path.exists():
        return None
    sha = manifest.files[manifest.graphs["drafter"].file].sha256
    try:
        return read_drafter_weights(path, target=selected(manifest), drafter_sha256=sha)
    except BundleError as e:
        if "another drafter graph" not in str(e):
            raise
        return None


def save_distilled(manifest: Manifest, state: Path, drafter: Transformer) -> Path:
    """Keep ``drafter``'s parameters for a single-target bundle whose drafter graph (``manifest``,
    after the publish) was exported from them."""
    params = {n: p.detach().float() for n, p in drafter.named_parameters()}
    sha = manifest.files[manifest.graphs["drafter"].file].sha256
    return write_drafter_weights(state / DISTILLED_DRAFTER, params, params={n: n for n in params},
                                 target=selected(manifest), drafter_sha256=sha)  # fmt: skip
