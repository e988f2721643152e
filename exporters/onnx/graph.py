"""Recipe: Transformer -> ONNX with explicit KV-cache I/O (onnx and qnn backends).

Two graph builds, one call contract (``omnidraft_deploy.bundle.graph_contract``):

- fused (``fused=True``, the ``onnx`` backend's default): written node by node from the weights
  by ``exporters.onnx.fused`` (GroupQueryAttention, SkipSimplifiedLayerNormalization,
  MatMulNBits with int8 compute); caches shared in place (``CacheIO.SHARED``). Seconds to write.
- plain ops (the QNN HTP's graph, swappable fp32 drafters, ``int8-dyn``), traced:

Stages of the traced build: prepare (explicit-cache wrapper, no grad) -> export (``torch.export`` with a dynamic or
static T, then ``torch.onnx.export`` of the ExportedProgram) -> quantize (ONNX Runtime dynamic int8
or MatMulNBits int4) -> serialize (metadata_props, atomic rename; external data beyond 2 GB) ->
optionally the ORT mobile format (``.ort``). I/O names and cache layout: see ``exportable``.

Metadata (``metadata_props``): ``omnidraft.graph_info`` = JSON of ``GraphInfo``,
``omnidraft.format_version`` = "1", ``omnidraft.bundle_hash``. Large models: when the fp32 weights
exceed 2 GB (protobuf's limit) they go to ``<name>.onnx.data`` beside the graph (ONNX external
data, listed in the manifest as ``external_weights``); the int8/int4 recipes load the graph whole
and so need the quantised result to fit in 2 GB (true up to ~7B parameters for int4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters.exportable import (
    ExplicitCacheExportable,
    dynamic_shapes_explicit,
    empty_caches,
    example_inputs,
)
from omnidraft_deploy.exporters.onnx.file_quant import quantize_onnx_file
from omnidraft_deploy.exporters.quant.smoothquant import smoothed_on_text

from omnidraft_deploy.bundle.graph_contract import input_names, output_names
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import Backend, QuantRecipe
from omnidraft_deploy.reference.model import ModelArgs, Transformer

log = logging.getLogger(__name__)
FORMAT_VERSION = "1"
TWO_GB = 2**31 - 1
WEIGHTS_LIMIT = TWO_GB - 2**27  # weights one protobuf may hold, with headroom for the graph


def export_onnx(
    model: Transformer,
    path: Path,
    *,
    info: GraphInfo,
    recipe: QuantRecipe | None = None,
    seq_len: int | None = None,
    bundle_hash: str = "",
    swappable: bool = False,
    fused: bool = False,
    invariant: bool = False,
    gguf: Path | None = None,
    outliers: dict[str, Any] | None = None,
) -> Path:
    """Write ``path`` (.onnx); ``seq_len`` None -> dynamic T, int -> static T (NPU).

    ``fused``: the contrib-op graph of ``exporters.onnx.fused`` (dynamic T, fp32/int8/int4 only);
    ``invariant``: with its batch-invariant attention (``exporters.onnx.invariant``); ``gguf``:
    the model's GGUF, whose grids a ``gguf_grid`` recipe keeps (``exporters.onnx.gguf_grid``);
    ``outliers``: the eager model's outlier input channels (``quant.outliers``) that such a
    graph takes out of its gate|up matmuls' int8 activations.

    ``swappable``: skip the exporter's graph optimiser so every parameter stays an initializer named
    after it (``bundle.weight_swap.bind_weights``), and trained weights can be swapped in without
    re-export. ORT's session-time optimisations still fold the transposes, so speed is unchanged.
    """
    import onnx

    model = model.eval().requires_grad_(False)
    if fused:
        return _export_fused(model, path, info=info, recipe=recipe, bundle_hash=bundle_hash,
                             invariant=invariant, gguf=gguf, outliers=outliers)  # fmt: skip
    a = model.args
    ids, pos = example_inputs(model, seq_len or 2)
    caches = empty_caches(model)
    dyn = dynamic_shapes_explicit(a) if seq_len is None else None
    with torch.no_grad():
        ep = torch.export.export(
            ExplicitCacheExportable(model), (ids, pos, *caches), dynamic_shapes=dyn
        )
    big = sum(p.numel() * p.element_size() for p in model.parameters()) > TWO_GB
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        raw = Path(tmp) / "fp32.onnx"
        torch.onnx.export(
            ep,
            (ids, pos, *caches),
            str(raw),
            dynamo=True,
            optimize=not swappable,
            input_names=input_names(a.n_layers),
            output_names=output_names(a.n_layers),
            external_data=big,
        )
        src = raw
        if recipe is not None and recipe.backend is Backend.ONNX and recipe.quantized:
            src = Path(tmp) / "quant.onnx"
            quantize_onnx_file(raw, src, recipe)
        proto = onnx.load(str(src), load_external_data=True)
        set_metadata(proto, info, bundle_hash)
        out = Path(tmp) / "final.onnx"
        onnx.save(
            proto,
            str(out),
            save_as_external_data=big,
            location=f"{path.name}.data" if big else None,
        )
        if big:
            os.replace(Path(tmp) / f"{path.name}.data", path.with_name(f"{path.name}.data"))
        os.replace(out, path)
    return path


def can_fuse(args: ModelArgs, recipe: QuantRecipe | None) -> bool:
    """Whether the fused graph can be written: a ``recipe.fused`` recipe (None: fp32), and
    GroupQueryAttention's CPU kernel needs head_dim % 16 == 0 (every real preset: 64 or 128; some
    test toys have 8)."""
    return (recipe is None or recipe.fused) and args.head_dim % 16 == 0


def can_be_invariant(args: ModelArgs, recipe: QuantRecipe | None) -> bool:
    """Whether the fused graph can be batch-invariant (``exporters.onnx.invariant``): a
    ``recipe.batch_invariant`` recipe and a ``max_seq_len`` in whole attention-span blocks.

    Batch-invariant recipes (``backends``): MatMulNBits at accuracy_level 4 (blockwise int8
    activations, exact integer dot products) and w8a8's MatMulInteger (per-row int8 activations).
    fp32 MatMul (MLAS SGEMM) sums in a different order for 1 row than for T rows, so fp32 graphs
    keep GroupQueryAttention; their verification rows differ by ~1e-5
    (reports/batch_invariance.json)."""
    from omnidraft_deploy.exporters.onnx.invariant import SPAN_BLOCK

    ok = recipe is not None and recipe.batch_invariant
    return ok and args.max_seq_len % SPAN_BLOCK == 0


def _export_fused(
    model: Transformer, path: Path, *, info: GraphInfo, recipe: QuantRecipe | None,
    bundle_hash: str, invariant: bool, gguf: Path | None = None,
    outliers: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    from omnidraft_deploy.exporters.onnx.fused import build_graph, save_model, weight_bytes
    from omnidraft_deploy.exporters.onnx.invariant import SPAN_BLOCK

    name = recipe.name if recipe else "fp32"
    if not can_fuse(model.args, recipe):
        raise ValueError(
            f"{path.name}: no fused graph for {name!r} (recipes with ``fused``) with head_dim "
            f"{model.args.head_dim} (GroupQueryAttention needs a multiple of 16)"
        )
    if invariant and model.args.max_seq_len % SPAN_BLOCK:
        raise ValueError(
            f"{path.name}: batch-invariant attention spans whole blocks of {SPAN_BLOCK} slots; "
            f"max_seq_len {model.args.max_seq_len} is not a multiple of {SPAN_BLOCK}"
        )
    t0 = time.perf_counter()
    plan, grids, split = None, None, None  # before sizing: which matmuls hold 4 bits and which 8
    if recipe is not None and recipe.gguf_grid:
        from omnidraft_deploy.exporters.onnx.gguf_grid import (
            gguf_grids,
            grid_bytes,
            outlier_names,
            share_at_4_bits,
        )

        if gguf is None:
            raise ValueError(f"{path.name}: recipe {name!r} needs the model's GGUF file")
        grids = gguf_grids(model, gguf)
        log.info("%s: GGUF grids of %s: %s", path.name, gguf.name, share_at_4_bits(grids))
        split = outlier_names(outliers or {})
    elif recipe is not None and recipe.smooth:
        model = smoothed_on_text(model, info.tokenizer, info.file)
    elif recipe is not None and recipe.int4_plan:
        from omnidraft_deploy.exporters.quant.int4_plan import plan_on_text

        plan = plan_on_text(model, info.tokenizer, info.file, recipe.group_size, recipe.tolerance)
    size = grid_bytes(grids) if grids else weight_bytes(model, recipe, plan)
    big = size > WEIGHTS_LIMIT  # (a grids graph's few fp32 norms and biases are not counted)
    data_name = f"{path.name}.data"
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        with contextlib.ExitStack() as stack:
            data = stack.enter_context(open(Path(tmp) / data_name, "wb")) if big else None
            with torch.no_grad():
                proto = build_graph(model, recipe, data=data, location=data_name,
                                    invariant=invariant, plan=plan, grids=grids,
                                    outliers=split)  # fmt: skip
        set_metadata(proto, info, bundle_hash)
        t1 = time.perf_counter()
        save_model(proto, out)
        if big:
            os.replace(Path(tmp) / data_name, path.with_name(data_name))
        os.replace(out, path)
    log.info(
        "%s: fused %s graph built in %.1f s, written in %.1f s (%s weights)",
        path.name, name, t1 - t0, time.perf_counter() - t1, "external" if big else "inline",
    )  # fmt: skip
    return path


def set_metadata(proto: Any, info: GraphInfo, bundle_hash: str = "") -> None:
    """Replace the ModelProto's metadata_props with the omnidraft keys (the runtime checks them)."""
    meta = {
        "omnidraft.format_version": FORMAT_VERSION,
        "omnidraft.bundle_hash": bundle_hash,
        "omnidraft.graph_info": json.dumps(dataclasses.asdict(info), sort_keys=True),
    }
    del proto.metadata_props[:]
    for k, v in meta.items():
        proto.metadata_props.add(key=k, value=v)


ORT_FORMAT_LIMIT = TWO_GB  # the .ort flatbuffer holds its weights inline and cannot exceed 2 GB


def ort_format_blocker(onnx_path: Path) -> str | None:
    """Why ``onnx_path`` cannot become a ``.ort`` file, or None (ORT's converter segfaults on
    graphs with external weights past 2 GB, e.g. Qwen2.5-0.5B in fp32, instead of failing)."""
    data = onnx_path.with_name(onnx_path.name + ".data")
    size = onnx_path.stat().st_size + (data.stat().st_size if data.is_file() else 0)
    if size > ORT_FORMAT_LIMIT:
        return f"{size / 2**30:.2f} GiB of graph and weights: the ORT format is limited to 2 GiB"
    return None


def convert_to_ort(onnx_path: Path) -> Path:
    """ORT mobile format next to the .onnx (``.ort``), for onnxruntime-mobile builds."""
    if (why := ort_format_blocker(onnx_path)) is not None:
        raise ValueError(f"{onnx_path.name}: no ORT format file: {why}")
    import onnxruntime as ort

    # What onnxruntime.tools.convert_onnx_models_to_ort does for the Fixed style, minus its
    # required-operators config (a second full read of the file, which we delete anyway): one
    # session at level "all" without the x86-only NCHWc layouts, saved in the ORT format.
    ort_path = onnx_path.with_suffix(".ort")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(ort_path)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.save_model_format", "ORT")
    opts.add_session_config_entry("session.qdqisint8allowed", "0")
    ort.InferenceSession(
        str(onnx_path), opts, providers=["CPUExecutionProvider"],
        disabled_optimizers=["NchwcTransformer"],
    )  # fmt: skip
    if not ort_path.is_file():
        raise FileNotFoundError(f"{ort_path}: ORT format conversion produced no file")
    return ort_path
