"""QNN recipe family: eager fp32 ``Transformer`` -> static-T QDQ ``<role>.onnx`` for the QNN HTP.

Stages (``qdq``): prepare (sink tokens, rotated residual stream, GPTQ'd per-channel weights:
``weights``) -> export (static T = draft_len + 1, traced ONNX: ``exporters.onnx.graph``) -> quantize
(QDQ on calibration feeds, ``recipe.activation_bits``-wide activations; graph passes ``fp16``,
``lm_head``, ``mixed``) -> serialize (metadata_props, precompiled HTP context) -> verify on the HTP
simulator. Recipes: the ``qnn`` rows of ``backends.RECIPES``; the SDK is never needed by tests.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.registry import register

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import QuantRecipe
from omnidraft_deploy.catalog.presets import ModelSpec
from omnidraft_deploy.reference.model import Transformer


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
    """Static-T (draft_len + 1) QDQ ``<role>.onnx`` for the QNN HTP (see ``qdq``); the
    drafter also gets its T = 1 twin ``drafter_decode.onnx`` (drafting is one-token calls).

    The target has none: speculative decoding calls it with draft_len + 1 tokens, and a twin
    quantised on its own would not compute the same function, so the runtime's target-only
    output (what speculative output is checked against) must come from the same graph.
    """
    from omnidraft_deploy.exporters.qnn.qdq import export_qnn

    seq_len = draft_len + 1
    info = graph_info(model, spec, file=f"{role}.onnx", quantization=recipe.name, seq_len=seq_len)
    if role == "drafter":
        info = dataclasses.replace(info, decode_file=GraphInfo.decode_name(role))
    extras = export_qnn(model, out_dir / info.file, info=info, recipe=recipe)
    return info, extras
