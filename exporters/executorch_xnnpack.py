"""Recipe: Transformer -> ExecuTorch ``.pte`` lowered to XNNPACK (phone CPU).

Stages (each timed, with its peak RSS, into the returned ``stages``): prepare (stateful wrapper:
KV cache as mutable buffers, no grad) -> quantize (a deep copy,
``quantize.quantize_eager``: 8da4w / 8da8w / int8w linears, optional int8 embedding) -> export
(``torch.export``, T dynamic in [1, max_seq_len]) -> lower (``to_edge_transform_and_lower`` with
``XnnpackPartitioner``) -> serialize (atomic rename). Verification (reload through
``executorch.runtime.Runtime``, compare with eager) is ``exporters.verify``; ``bundle`` runs it.

Metadata rides inside the program as constant methods: get_max_seq_len, get_vocab_size,
get_n_layers, get_eos_ids (list), get_format_version, get_bundle_hash (string).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters.exportable import (
    StatefulExportable,
    dynamic_shapes_stateful,
    example_inputs,
)
from omnidraft_deploy.exporters.memory import stage
from omnidraft_deploy.exporters.quantize import QuantRecipe, quantize_eager

from omnidraft_deploy.manifest import write_bytes_atomic
from omnidraft_deploy.optional import require
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
CONSTANT_METHODS = (
    "get_max_seq_len",
    "get_vocab_size",
    "get_n_layers",
    "get_eos_ids",
    "get_format_version",
    "get_bundle_hash",
)


def require_executorch() -> None:
    require("executorch", extra="executorch", purpose="the xnnpack backend")


def constant_methods(
    model: Transformer, eos_ids: tuple[int, ...], bundle_hash: str
) -> dict[str, Any]:
    """The ``.pte`` metadata methods (values the runtime and Android read before decoding)."""
    a = model.args
    return {
        "get_max_seq_len": a.max_seq_len,
        "get_vocab_size": a.vocab_size,
        "get_n_layers": a.n_layers,
        "get_eos_ids": list(eos_ids) or [-1],  # ExecuTorch rejects an empty list constant
        "get_format_version": FORMAT_VERSION,
        "get_bundle_hash": bundle_hash or "-",  # and an empty string
    }


def op_coverage(edge_program: Any) -> dict[str, Any]:
    """Nodes delegated to XNNPACK vs left to the portable runtime (per operator, non-delegated)."""
    from executorch.devtools.backend_debug import get_delegation_info

    gm = edge_program.exported_program().graph_module
    info = get_delegation_info(gm)
    left = {
        op: b.non_delegated
        for op, b in sorted(info.delegation_by_operator.items())
        if b.non_delegated and op not in ("getitem", "sym_size")
    }
    return {
        "delegated_subgraphs": info.num_delegated_subgraphs,
        "delegated_nodes": info.num_delegated_nodes,
        "non_delegated_nodes": info.num_non_delegated_nodes,
        "non_delegated_ops": left,
    }


def export_pte(
    model: Transformer,
    path: Path,
    *,
    recipe: QuantRecipe,
    eos_ids: tuple[int, ...],
    bundle_hash: str = "",
    seq_len: int | None = None,
) -> dict[str, Any]:
    """Write ``path`` (.pte); returns op coverage and ``stages`` (seconds, peak RSS MiB per
    stage). ``model`` is not modified.

    ``seq_len`` None: T dynamic in [1, max_seq_len] (the contract); an int gives a static-T program.
    """
    require_executorch()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    stages: dict[str, Any] = {}
    model = model.eval().requires_grad_(False)
    with stage(stages, "quantize"):  # a copy unless fp32
        quantized = quantize_eager(model, recipe)
    ids, pos = example_inputs(model.args, seq_len or 2)
    dyn = None if seq_len else dynamic_shapes_stateful(model.args)
    with stage(stages, "torch_export"), torch.no_grad():
        ep = torch.export.export(StatefulExportable(quantized), (ids, pos), dynamic_shapes=dyn)
    with stage(stages, "lower"):
        edge = to_edge_transform_and_lower(
            ep,
            partitioner=[XnnpackPartitioner()],
            constant_methods=constant_methods(model, eos_ids, bundle_hash),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    coverage = op_coverage(edge)
    log.info("%s: XNNPACK coverage %s", path.name, coverage)
    with stage(stages, "serialize"):
        write_bytes_atomic(path, edge.to_executorch().buffer)
    log.info("%s: stages %s", path.name, stages)
    return coverage | {"stages": stages}
