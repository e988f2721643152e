"""Trained weights into an exported drafter graph, without re-export (ONNX initializer swap).

The drafter's inference ONNX is exported with ``optimize=False`` when its recipe is unquantised
(``exporters.onnx``: ``weights_swappable``), so every parameter stays an initializer named after it
(the exporter's optimiser otherwise folds weight transposes and deduplicates equal tensors under
``val_*`` names). ``bind_weights`` maps parameter names to initializer names once;
``swap_initializers`` writes new weights into those initializers (a protobuf edit, no tracing) and
the caller opens a fresh ``InferenceSession`` from the result. Users: the on-device train step
(``exporters.training_graph``) and the per-target adapted drafter of a multi-target bundle
(``bundle.drafter_weights``, ``runtime.adapted``). Not used: ``SessionOptions.add_initializer``
overrides are silently ignored by ORT's session-time constant folding (seen with ORT 1.32: logits
off by 0.6) unless ``ConstantFolding`` is disabled. ``onnx`` is imported by the caller (the
``onnx`` extra); this module only edits the protobuf it is given.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor


def param_aliases(model: Any) -> dict[str, list[str]]:
    """Parameter name -> every name it has in ``model`` (tied weights: the embedding is also
    ``lm_head.weight``, and the exported graph keeps one initializer under one of the names)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {names[0]: names for names in by_id.values()}


def bind_weights(
    onnx_model: Any, param_names: list[str], aliases: dict[str, list[str]] | None = None
) -> dict[str, str]:
    """Parameter name -> initializer name in an inference graph exported with ``optimize=False``.

    ``aliases`` (``param_aliases(model)``): the other names of tied parameters, tried in turn.
    """
    inits = [i.name for i in onnx_model.graph.initializer]
    binding: dict[str, str] = {}
    for name in param_names:
        hits: list[str] = []
        for alias in (aliases or {}).get(name, [name]):
            hits = [i for i in inits if i == alias or i.endswith("." + alias)]
            if hits:
                break
        if len(hits) != 1:
            raise ValueError(
                f"parameter {name!r} matches initializers {hits} in the inference "
                "graph; export it with torch.onnx.export(..., optimize=False)"
            )
        binding[name] = hits[0]
    return binding


def swap_initializers(onnx_model: Any, binding: dict[str, str], params: dict[str, Tensor]) -> Any:
    """Copy of ``onnx_model`` with each bound initializer replaced by ``params[name]`` (by name).

    Shapes and dtypes must match. The result is serialised (``SerializeToString`` or
    ``onnx.save`` with external data) and opened as a fresh session with full optimisations.
    """
    from onnx import numpy_helper  # noqa: PLC0415

    model = type(onnx_model)()
    model.CopyFrom(onnx_model)
    by_name = {init.name: init for init in model.graph.initializer}
    for name, init_name in binding.items():
        old = by_name[init_name]
        new = params[name].detach().float().contiguous().numpy()
        if tuple(old.dims) != new.shape:
            raise ValueError(
                f"{name}: shape {new.shape} != initializer {init_name} {tuple(old.dims)}"
            )
        old.CopyFrom(numpy_helper.from_array(new, init_name))
    return model
