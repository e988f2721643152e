"""Exporter recipes (installed as ``omnidraft_deploy.exporters``) and their registry.

An exporter writes one graph for one role into a bundle folder and returns its manifest entry::

    exporter(model, spec, out_dir, *, role, recipe, draft_len, eos_ids, bundle_hash="")
        -> (GraphInfo, extras: dict)      # extras: op coverage, .ort file, ... -> manifest extras

``model`` is the eager fp32 ``Transformer`` and is left unchanged (it is the verification
reference). Backends register with ``@register("name")``; heavy SDKs are imported inside the
function, so importing this package needs only torch. A new backend module registers itself when
imported (one import line at the bottom of this file). ``get_exporter`` fails loudly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.quantize import QuantRecipe

from omnidraft_deploy.bundle.manifest import GraphInfo
from omnidraft_deploy.catalog.presets import ModelSpec
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)

Exporter = Callable[..., tuple[GraphInfo, dict[str, Any]]]
EXPORTERS: dict[str, Exporter] = {}


def register(name: str) -> Callable[[Exporter], Exporter]:
    """Decorator: ``@register("xnnpack")`` adds the function to ``EXPORTERS`` (no silent override)."""

    def deco(fn: Exporter) -> Exporter:
        if name in EXPORTERS and EXPORTERS[name] is not fn:
            raise ValueError(f"exporter {name!r} registered twice")
        EXPORTERS[name] = fn
        return fn

    return deco


def get_exporter(name: str) -> Exporter:
    """The exporter registered as ``name``; KeyError listing the valid names otherwise."""
    try:
        return EXPORTERS[name]
    except KeyError:
        raise KeyError(f"unknown exporter {name!r}; choose from {sorted(EXPORTERS)}") from None


@register("xnnpack")
def export_xnnpack(
    model: Transformer,
    spec: ModelSpec,
    out_dir: Path,
    *,
    role: str,
    recipe: QuantRecipe,
    draft_len: int,
    eos_ids: tuple[int, ...],
    bundle_hash: str = "",
) -> tuple[GraphInfo, dict[str, Any]]:
    """ExecuTorch ``<role>.pte`` lowered to XNNPACK, T dynamic; extras: op coverage, stages."""
    from omnidraft_deploy.exporters.executorch_xnnpack import export_pte

    info = graph_info(model, spec, file=f"{role}.pte", quantization=recipe.name, seq_len=None)
    if recipe.smooth:  # int8 per-token activations: outlier channels into the weights
        from omnidraft_deploy.exporters.smoothquant import smoothed_on_text

        model = smoothed_on_text(model, info.tokenizer, info.file)
    extras: dict[str, Any] = {}
    bits = None
    if recipe.int4_plan:  # which 8da4w linears keep 8 bits, measured in XNNPACK's numerics
        from omnidraft_deploy.exporters.int4_plan import module_bits, plan_on_text

        t0 = time.perf_counter()
        plan = plan_on_text(model, info.tokenizer, info.file, recipe.group_size,
                            recipe.tolerance, recipe.backend)  # fmt: skip
        extras["int4_plan"] = {"seconds": round(time.perf_counter() - t0, 2)}
        if plan is not None:
            bits = module_bits(model, plan)
            extras["int4_plan"] |= {
                "int4": sum(b == 4 for b in plan.values()),
                "matmuls": len(plan),
            }
    coverage = export_pte(model, out_dir / info.file, recipe=recipe, eos_ids=eos_ids,
                          bundle_hash=bundle_hash, bits=bits)  # fmt: skip
    return info, extras | {"stages": coverage.pop("stages"), "op_coverage": coverage}


@register("onnx")
def export_onnx_graph(
    model: Transformer,
    spec: ModelSpec,
    out_dir: Path,
    *,
    role: str,
    recipe: QuantRecipe,
    draft_len: int,
    eos_ids: tuple[int, ...],
    bundle_hash: str = "",
    invariant: bool | None = None,
) -> tuple[GraphInfo, dict[str, Any]]:
    """``<role>.onnx`` (T dynamic, explicit caches) plus ``<role>.ort`` (ORT mobile format).

    An fp32 drafter keeps one initializer per parameter (``swappable``), so weights trained on the
    device (``training_graph``) are swapped into it without re-export; every other fp32 / int8 /
    int4 graph is the fused contrib-op graph (``exporters.onnx_fused``). ``invariant`` (None: the
    default rule, ``can_be_invariant``, for the target only) writes the target's attention in the
    batch-invariant form (``exporters.onnx_invariant``), so a verification call's rows are bitwise
    the rows of 1-token calls and greedy speculative output is target-only output.
    """
    from omnidraft_deploy.exporters.onnx import (
        can_be_invariant,
        can_fuse,
        convert_to_ort,
        export_onnx,
        ort_format_blocker,
    )

    info = graph_info(model, spec, file=f"{role}.onnx", quantization=recipe.name, seq_len=None)
    swappable = role == "drafter" and recipe.name == "fp32"
    fused = not swappable and can_fuse(model.args, recipe.name)
    if invariant is None:
        invariant = fused and role == "target" and can_be_invariant(model.args, recipe.name)
    path = export_onnx(
        model,
        out_dir / info.file,
        info=info,
        recipe=recipe,
        bundle_hash=bundle_hash,
        swappable=swappable,
        fused=fused,
        invariant=invariant,
    )
    extras: dict[str, Any] = {
        "weights_swappable": swappable, "fused": fused, "batch_invariant": invariant,
    }  # fmt: skip
    if (why := ort_format_blocker(path)) is not None:  # e.g. fp32 0.5B+: quantise for mobile
        log.warning("%s: skipping the .ort file: %s", path.name, why)
        return info, extras | {"ort_mobile_file": None, "ort_mobile_skipped": why}
    ort_file = convert_to_ort(path)
    return info, extras | {
        "ort_mobile_file": ort_file.name,
        "ort_mobile_bytes": ort_file.stat().st_size,
    }


@register("qnn")
def export_qnn_graph(
    model: Transformer,
    spec: ModelSpec,
    out_dir: Path,
    *,
    role: str,
    recipe: QuantRecipe,
    draft_len: int,
    eos_ids: tuple[int, ...],
    bundle_hash: str = "",
) -> tuple[GraphInfo, dict[str, Any]]:
    """Static-T (draft_len + 1) QDQ ``<role>.onnx`` for the QNN HTP (see ``exporters.qnn``); the
    drafter also gets its T = 1 twin ``drafter_decode.onnx`` (drafting is one-token calls).

    The target has none: speculative decoding calls it with draft_len + 1 tokens, and a twin
    quantised on its own would not compute the same function, so the runtime's target-only
    output (what speculative output is checked against) must come from the same graph.
    """
    import dataclasses

    from omnidraft_deploy.exporters.qnn import export_qnn

    seq_len = draft_len + 1
    info = graph_info(model, spec, file=f"{role}.onnx", quantization=recipe.name, seq_len=seq_len)
    if role == "drafter":
        info = dataclasses.replace(info, decode_file=GraphInfo.decode_name(role))
    extras = export_qnn(model, out_dir / info.file, info=info, recipe=recipe)
    return info, extras
