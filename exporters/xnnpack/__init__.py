"""XNNPACK recipe family: eager fp32 ``Transformer`` -> ExecuTorch ``<role>.pte`` lowered to XNNPACK.

Stages, in order: prepare (SmoothQuant where ``recipe.smooth``; the int4 plan where
``recipe.int4_plan``: which 8da4w linears keep 8 bits, measured in XNNPACK's numerics) ->
quantize (``eager_quant.quantize_eager``: the recipe's linear schemes, int8 embedding rows) ->
export (``torch.export``, T dynamic) -> lower (``to_edge_transform_and_lower`` with the XNNPACK
partitioner) -> serialize (``.pte`` with its metadata as constant methods), all in ``lower``;
verification is the bundle writer's (``exporters.verify``). Recipes: the ``xnnpack`` rows of
``backends.RECIPES``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.registry import register

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import QuantRecipe
from omnidraft_deploy.catalog.presets import ModelSpec
from omnidraft_deploy.reference.model import Transformer


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
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    info = graph_info(model, spec, file=f"{role}.pte", quantization=recipe.name, seq_len=None)
    if recipe.smooth:  # int8 per-token activations: outlier channels into the weights
        from omnidraft_deploy.exporters.quant.smoothquant import smoothed_on_text

        model = smoothed_on_text(model, info.tokenizer, info.file)
    extras: dict[str, Any] = {}
    bits = None
    if recipe.int4_plan:  # which 8da4w linears keep 8 bits, measured in XNNPACK's numerics
        from omnidraft_deploy.exporters.quant.int4_plan import module_bits, plan_on_text

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
    gguf, outliers = None, None
    if recipe.gguf_grid:  # the quantised model is built from the GGUF's own blocks
        from omnidraft_deploy.exporters.quant.gguf_grid import gguf_file
        from omnidraft_deploy.exporters.xnnpack.spill import spill_weights

        gguf = gguf_file(spec)
        outliers, extras["outliers"] = _outliers(model, info)
        # nothing before verification reads the eager weights again: file-backed until then
        extras["spilled_bytes"] = spill_weights(model, out_dir)
    coverage = export_pte(model, out_dir / info.file, recipe=recipe, eos_ids=eos_ids,
                          bundle_hash=bundle_hash, bits=bits, gguf=gguf, outliers=outliers)  # fmt: skip
    if "gguf_grid" in coverage:
        extras["gguf_grid"] = coverage.pop("gguf_grid")
    return info, extras | {"stages": coverage.pop("stages"), "op_coverage": coverage}


def _outliers(model: Transformer, info: GraphInfo) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gate / up inputs' outlier channels on held-out calibration text, and the figures for
    the export report (``quant.outliers.calibrated_outliers``)."""
    from omnidraft_deploy.exporters.quant.outliers import calibrated_outliers

    return calibrated_outliers(model, info.tokenizer, info.vocab_size)
