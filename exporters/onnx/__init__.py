"""ONNX recipe family: eager fp32 ``Transformer`` -> ``<role>.onnx`` (T dynamic) + ``<role>.ort``.

Which graph a recipe gets is read from its fields (``backends.QuantRecipe``):

- an unquantised drafter (``not recipe.quantized``) keeps one initializer per parameter
  (``swappable``): weights trained on the device (``training_graph``) swap in without re-export;
- a recipe with ``fused`` (and head_dim % 16 == 0) is the fused contrib-op graph (``fused``),
  batch-invariant for the target when ``batch_invariant`` (``invariant``);
- anything else is traced (``graph``) and quantised by ONNX Runtime's tools (``file_quant``).

Stages: prepare (SmoothQuant / int4 plan, in ``graph``) -> quantize -> export -> serialize
(metadata_props) -> the ORT mobile format (``.ort``, skipped past 2 GiB); verification is the
bundle writer's. Recipes: the ``onnx`` rows of ``backends.RECIPES``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.quant.gguf_grid import gguf_file
from omnidraft_deploy.exporters.registry import register

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import QuantRecipe
from omnidraft_deploy.catalog.presets import ModelSpec
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)


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
    ort_mobile: bool = True,
) -> tuple[GraphInfo, dict[str, Any]]:
    """``<role>.onnx`` (T dynamic, explicit caches) plus ``<role>.ort`` (ORT mobile format;
    ``ort_mobile`` False: not written, ``omnidraft-export --no-ort``).

    Graph kinds: the package docstring. ``invariant`` (None: the default rule, ``can_be_invariant``,
    for the target only) writes the target's attention in the batch-invariant form
    (``exporters.onnx.invariant``), so a verification call's rows are bitwise the rows of 1-token
    calls and greedy speculative output is target-only output.
    """
    from omnidraft_deploy.exporters.onnx.graph import (
        can_be_invariant,
        can_fuse,
        convert_to_ort,
        export_onnx,
        ort_format_blocker,
    )

    info = graph_info(model, spec, file=f"{role}.onnx", quantization=recipe.name, seq_len=None)
    swappable = role == "drafter" and not recipe.quantized
    fused = not swappable and can_fuse(model.args, recipe)
    if invariant is None:
        invariant = fused and role == "target" and can_be_invariant(model.args, recipe)
    outliers: dict[str, Any] = {}
    figures: dict[str, Any] = {}  # for the export report
    if recipe.gguf_grid:  # gate|up's inputs meet int8 blocks of 32 (onnx.gguf_grid._split)
        from omnidraft_deploy.exporters.quant.outliers import calibrated_outliers

        outliers, figures = calibrated_outliers(model, info.tokenizer, info.vocab_size,
                                                kinds=("gate_proj",))  # fmt: skip
    path = export_onnx(
        model,
        out_dir / info.file,
        info=info,
        recipe=recipe,
        bundle_hash=bundle_hash,
        swappable=swappable,
        fused=fused,
        invariant=invariant,
        gguf=gguf_file(spec) if recipe.gguf_grid else None,
        outliers=outliers,
    )
    extras: dict[str, Any] = {
        "weights_swappable": swappable, "fused": fused, "batch_invariant": invariant,
    }  # fmt: skip
    if figures:
        extras["outliers"] = figures
    # the ORT format refuses some graphs (e.g. fp32 0.5B+ past 2 GiB: quantise for mobile)
    why = ort_format_blocker(path) if ort_mobile else "not asked for (--no-ort)"
    if why is not None:
        log.log(logging.WARNING if ort_mobile else logging.INFO, "%s: no .ort file: %s",
                path.name, why)  # fmt: skip
        return info, extras | {"ort_mobile_file": None, "ort_mobile_skipped": why}
    ort_file = convert_to_ort(path)
    return info, extras | {
        "ort_mobile_file": ort_file.name,
        "ort_mobile_bytes": ort_file.stat().st_size,
    }
