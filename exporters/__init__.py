"""Exporter recipes (installed as ``omnidraft_deploy.exporters``) and their registry.

An exporter writes one graph for one role into a bundle folder and returns its manifest entry::

    exporter(model, spec, out_dir, *, role, recipe, draft_len, eos_ids, bundle_hash="")
        -> (GraphInfo, extras: dict)      # extras: op coverage, .ort file, ... -> manifest extras

``model`` is the eager fp32 ``Transformer`` and is left unchanged (it is the verification
reference). Each backend's recipe package registers its exporter with ``@register("name")`` when
imported, and this file imports each one explicitly at its bottom (no discovery):

=====================  ===========================================================================
``exporters/xnnpack``  ExecuTorch ``.pte`` lowered to XNNPACK (eager quantisation: ``eager_quant``)
``exporters/onnx``     ONNX + ``.ort``: fused contrib-op graph (``fused``, ``invariant``) or traced
                       (``graph``) with ONNX Runtime's quantisers (``file_quant``)
``exporters/qnn``      static-T QDQ ONNX for the QNN HTP (``qdq`` and its graph passes)
``exporters/quant``    quantisation maths shared by the recipes: grids, SmoothQuant, GPTQ,
                       calibration, the int4 plan; imports no recipe package
=====================  ===========================================================================

Recipes are ``backends.QuantRecipe`` rows; an exporter reads their fields, never their names.
Heavy SDKs are imported inside the functions, so importing this package needs only torch.
``get_exporter`` fails loudly.
"""

from __future__ import annotations

from omnidraft_deploy.exporters.registry import EXPORTERS, Exporter, get_exporter, register

__all__ = ["EXPORTERS", "Exporter", "get_exporter", "register"]

# the recipe packages, each registering its exporter on import
from omnidraft_deploy.exporters import onnx, qnn, xnnpack  # noqa: E402, F401
