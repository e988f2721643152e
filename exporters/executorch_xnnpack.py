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

import contextlib
import logging
from collections.abc import Iterator
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


PATCHED_EXECUTORCH = "1.5.1"  # the release whose partitioner ``fast_partition_merge`` replaces


def _can_merge_partitions(self: Any, p1: int, p2: int, partitions_by_id: dict[int, Any]) -> bool:
    """ExecuTorch 1.5.1's ``GroupBasedPartitioner._can_merge_partitions`` with its membership
    tests done by set operations: the same answer, from C loops instead of Python ones."""
    from torch.fx.passes.utils.fuser_utils import validate_partition

    combined = partitions_by_id[p1].nodes.keys() | partitions_by_id[p2].nodes.keys()
    users = {user for node in combined for user in node.users} - combined
    if any(not self.dependency_viewer.downstreams_of(u).isdisjoint(combined) for u in users):
        return False  # an outside node both reads from and feeds the merged partition: a cycle
    return bool(validate_partition(list(combined)))


@contextlib.contextmanager
def fast_partition_merge() -> Iterator[bool]:
    """Lower with ``_can_merge_partitions`` in place of ExecuTorch's own (yields whether it is).

    The XNNPACK partitioner tries to merge every pair of its partitions, and for each pair the
    original tests every external user's transitive downstream set one node at a time in Python
    (``any(n in combined for n in downstream)``): the hot loop of a real model's lowering (py-spy,
    SmolLM2-135M 8da8w: 36 % of the lowering in that generator, 48 % in the pair loop). The
    replacement computes the same predicate with ``set.isdisjoint``. Only for the release it was
    read from (``PATCHED_EXECUTORCH``); any other version lowers with its own code. The ``.pte``
    written either way is the same to the byte (``tests/exporters/test_executorch_tiny.py``).
    """
    from importlib.metadata import version

    from executorch.exir.backend.canonical_partitioners import group_partitioner

    cls = group_partitioner.GroupBasedPartitioner
    original = cls._can_merge_partitions
    if version("executorch") != PATCHED_EXECUTORCH:
        yield False
        return
    cls._can_merge_partitions = _can_merge_partitions  # type: ignore[method-assign]
    try:
        yield True
    finally:
        cls._can_merge_partitions = original  # type: ignore[method-assign]


def export_pte(
    model: Transformer,
    path: Path,
    *,
    recipe: QuantRecipe,
    eos_ids: tuple[int, ...],
    bundle_hash: str = "",
    seq_len: int | None = None,
    fast_merge: bool = True,
) -> dict[str, Any]:
    """Write ``path`` (.pte); returns op coverage and ``stages`` (seconds, peak RSS MiB per
    stage). ``model`` is not modified.

    ``seq_len`` None: T dynamic in [1, max_seq_len] (the contract); an int gives a static-T program.
    ``fast_merge``: lower under ``fast_partition_merge`` (the same program, sooner).
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
    merge = fast_partition_merge() if fast_merge else contextlib.nullcontext(False)
    with stage(stages, "lower"), merge as patched:
        edge = to_edge_transform_and_lower(
            ep,
            partitioner=[XnnpackPartitioner()],
            constant_methods=constant_methods(model, eos_ids, bundle_hash),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    coverage = op_coverage(edge) | {"fast_partition_merge": patched}
    log.info("%s: XNNPACK coverage %s", path.name, coverage)
    with stage(stages, "serialize"):
        write_bytes_atomic(path, edge.to_executorch().buffer)
    log.info("%s: stages %s", path.name, stages)
    return coverage | {"stages": stages}
