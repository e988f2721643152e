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
import dataclasses
import gc
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from omnidraft_deploy.exporters.exportable import (
    StatefulExportable,
    dynamic_shapes_stateful,
    example_inputs,
)
from omnidraft_deploy.exporters.memory import current_rss_mb, stage
from omnidraft_deploy.exporters.xnnpack.eager_quant import quantize_eager

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.catalog.backends import QuantRecipe
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
    "get_forward_inputs",
)


def require_executorch() -> None:
    require("executorch", extra="executorch", purpose="the xnnpack backend")


def constant_methods(
    model: Transformer, eos_ids: tuple[int, ...], bundle_hash: str, forward_inputs: int = 2
) -> dict[str, Any]:
    """The ``.pte`` metadata methods (values the runtime and Android read before decoding);
    ``forward_inputs``: 4 when ``forward`` takes ``cache_slots`` and ``logit_rows``
    (``graph_contract``)."""
    a = model.args
    return {
        "get_max_seq_len": a.max_seq_len,
        "get_vocab_size": a.vocab_size,
        "get_n_layers": a.n_layers,
        "get_eos_ids": list(eos_ids) or [-1],  # ExecuTorch rejects an empty list constant
        "get_format_version": FORMAT_VERSION,
        "get_bundle_hash": bundle_hash or "-",  # and an empty string
        "get_forward_inputs": forward_inputs,
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


def program_ops(pte: bytes, method: str = "forward") -> dict[str, int]:
    """Instructions of ``method`` in a serialized ``.pte`` by kernel (``aten::mean.out``,
    ``llama::update_cache.out``, ...; ``DelegateCall`` for each XNNPACK subgraph call): what one
    call runs outside the delegate, as the runtime sees it (the edge graph's ``op_coverage``
    counts nodes before ExecuTorch's own passes, e.g. the re-inplacing of ``update_cache``)."""
    from collections import Counter

    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    plan = next((p for p in program.execution_plan if p.name == method), None)
    if plan is None:
        raise ValueError(f"no method {method!r} in the program")
    names = [o.name + (f".{o.overload}" if o.overload else "") for o in plan.operators]
    counts: Counter[str] = Counter()
    for chain in plan.chains:
        for ins in chain.instructions:
            args = ins.instr_args
            index = getattr(args, "op_index", None)
            counts[names[index] if index is not None else type(args).__name__] += 1
    return dict(counts.most_common())


def matmul_bits(ep: Any) -> dict[str, int]:
    """``aten.linear`` nodes of the exported program by the width of their weight: 4 / 8 (the
    weight a torchao ``dequantize_affine`` of an int4 / int8 grid) or 32 (a float weight, e.g. an
    ``Int4GroupLinear``'s constant table, or an fp32 recipe's linears)."""
    counts = {"linear_4bit": 0, "linear_8bit": 0, "linear_fp32": 0}
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
            continue
        weight = node.args[1]
        bits = 32
        if str(getattr(weight, "target", "")) == "torchao.dequantize_affine.default":
            bits = 4 if weight.args[5] == -8 else 8
        counts[f"linear_{bits}bit" if bits < 32 else "linear_fp32"] += 1
    return counts


PATCHED_EXECUTORCH = "1.5.1"  # the release whose lowering ``fast_lowering`` speeds up


def _can_merge_partitions(self: Any, p1: int, p2: int, partitions_by_id: dict[int, Any]) -> bool:
    """ExecuTorch 1.5.1's ``GroupBasedPartitioner._can_merge_partitions`` with its membership
    tests done by set operations: the same answer, from C loops instead of Python ones."""
    from torch.fx.passes.utils.fuser_utils import validate_partition

    combined = partitions_by_id[p1].nodes.keys() | partitions_by_id[p2].nodes.keys()
    users = {user for node in combined for user in node.users} - combined
    if any(not self.dependency_viewer.downstreams_of(u).isdisjoint(combined) for u in users):
        return False  # an outside node both reads from and feeds the merged partition: a cycle
    return bool(validate_partition(list(combined)))


def _legalize_in_place(gm: Any) -> Any:
    """``torch.fx.passes.tools_common.legalize_graph`` without its ``recompile``: torch's own sort
    runs on a stand-in (``SimpleNamespace(graph=...)``), and ``gm``'s nodes are moved into the
    order of the sorted copy (matched by name), so the graph is never replaced and its Python
    code is not regenerated per partition. Falls back to the original if the names do not match.
    """
    from torch.fx.passes import tools_common

    graph = gm.graph
    holder = SimpleNamespace(graph=graph)
    tools_common.legalize_graph(holder)  # type: ignore[arg-type]
    by_name = {node.name: node for node in graph.nodes}
    order = [by_name.get(node.name) for node in holder.graph.nodes]
    if len(order) != len(by_name) or None in order:
        return tools_common.legalize_graph(gm)
    prev = graph._root
    for node in order:
        if prev.next is not node:
            prev.append(node)
        prev = node
    return gm


def _constant_data_check() -> Any:
    """``config_partitioner.is_constant_data`` answered from one set of names per graph
    signature: ExecuTorch 1.5.1 asks torch's ``is_param`` / ``is_buffer`` /
    ``is_lifted_tensor_constant`` for each node of each candidate partition, and each of those
    rebuilds a dict over every program input (quadratic in the program's inputs). The same answer: a node is constant data when its name is the input name
    of a parameter, a buffer or a lifted constant of the signature."""
    seen: dict[int, tuple[Any, int, frozenset[str]]] = {}

    def is_constant_data(ep: Any, node: Any) -> bool:
        sig = ep.graph_signature
        hit = seen.get(id(ep))
        if hit is None or hit[0] is not sig or hit[1] != len(sig.input_specs):
            names = frozenset(sig.inputs_to_parameters) | frozenset(sig.inputs_to_buffers)
            names |= frozenset(sig.inputs_to_lifted_tensor_constants)
            hit = seen[id(ep)] = (sig, len(sig.input_specs), names)
        return node.name in hit[2]

    return is_constant_data


@contextlib.contextmanager
def fast_lowering() -> Iterator[bool]:
    """Lower with three of ExecuTorch 1.5.1's quadratic steps done in linear-time Python (yields
    whether they are; any other release lowers with its own code). The third is
    ``_constant_data_check``.

    py-spy on SmolLM2-135M's lowering (8da4w, 532 s): (1) the XNNPACK partitioner tries to merge
    every pair of its partitions, and for each pair tests every external user's transitive
    downstream set one node at a time (``any(n in combined for n in downstream)``): 48 % of the
    lowering. ``_can_merge_partitions`` computes the same predicate with ``set.isdisjoint``.
    (2) Cutting each of the ~480 partitions out of the graph re-sorts the whole graph into a new
    one and recompiles its Python code (``legalize_graph``). ``_legalize_in_place`` gives the
    nodes the same order in place, and the graph is recompiled once, after the last partition.
    The ``.pte`` is the same to the byte (``tests/exporters/test_executorch_tiny.py``).
    """
    from importlib.metadata import version

    if version("executorch") != PATCHED_EXECUTORCH:
        yield False
        return
    from executorch.exir import lowered_backend_module
    from executorch.exir.backend import backend_api
    from executorch.exir.backend.canonical_partitioners import config_partitioner, group_partitioner

    cls = group_partitioner.GroupBasedPartitioner
    constant_data = config_partitioner.is_constant_data
    merge, legalize = cls._can_merge_partitions, lowered_backend_module.legalize_graph
    create = backend_api._create_partitions_in_graph_module

    def create_then_recompile(gm: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return create(gm, *args, **kwargs)
        finally:
            gm.recompile()

    cls._can_merge_partitions = _can_merge_partitions  # type: ignore[method-assign]
    lowered_backend_module.legalize_graph = _legalize_in_place
    backend_api._create_partitions_in_graph_module = create_then_recompile
    config_partitioner.is_constant_data = _constant_data_check()
    try:
        yield True
    finally:
        config_partitioner.is_constant_data = constant_data
        cls._can_merge_partitions = merge  # type: ignore[method-assign]
        lowered_backend_module.legalize_graph = legalize
        backend_api._create_partitions_in_graph_module = create


def export_pte(
    model: Transformer,
    path: Path,
    *,
    recipe: QuantRecipe,
    eos_ids: tuple[int, ...],
    bundle_hash: str = "",
    seq_len: int | None = None,
    fast: bool = True,
    bits: Mapping[str, int] | None = None,
    gguf: Path | None = None,
    outliers: Mapping[str, torch.Tensor] | None = None,
    attention: str | None = "prefix",
) -> dict[str, Any]:
    """Write ``path`` (.pte); returns op coverage and ``stages`` (seconds, peak RSS MiB per
    stage, and the RSS left once the stage's garbage is freed). ``model`` is not modified.

    ``seq_len`` None: T dynamic in [1, max_seq_len] (the contract); an int gives a static-T program.
    ``fast``: lower under ``fast_lowering`` (the same program, sooner).
    ``bits``: an 8da4w recipe's plan (module path -> 4 or 8, ``quantize.quantize_eager``).
    ``gguf``: a ``gguf_grid`` recipe's GGUF, whose blocks the quantised model is built from
    (``gguf_quant``); its 4-bit share goes into the result as ``gguf_grid``; ``outliers`` its
    linears' input channels kept out of the int8 activations (``outliers.OutlierSplitLinear``).
    ``attention``: the stateful attention (``llm_attention``: the cache updated in place by
    ExecuTorch's ``llama::update_cache``; ``"prefix"`` and ``"span"`` batch invariant,
    ``"custom_sdpa"`` not),
    or None for the reference model's own (functional cache writes, portable kernels).
    Each stage drops what the next no longer needs (the quantised eager model once exported, the
    exported program once lowered), so the peak is one stage's, not their sum.
    """
    require_executorch()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    stages: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    model = model.eval().requires_grad_(False)
    with stage(
        stages, "quantize"
    ):  # a copy (a shell sharing the small parameters: gguf) unless fp32
        if gguf is not None:
            from omnidraft_deploy.exporters.xnnpack.gguf_quant import gguf_quantized

            quantized, share = gguf_quantized(model, gguf, dict(outliers or {}),
                                              four_bit=recipe.weight_bits == 4)
            facts["gguf_grid"] = dataclasses.asdict(share)
        else:
            quantized = quantize_eager(model, recipe, bits)
        if attention is not None:
            from omnidraft_deploy.exporters.xnnpack.gguf_quant import shell
            from omnidraft_deploy.exporters.xnnpack.llm_attention import use_llm_attention

            if quantized is model:  # fp32: the eager model stays the reference
                quantized = shell(model)
            use_llm_attention(quantized, attention)
            facts["attention"] = attention
        if recipe.act_groups:
            from omnidraft_deploy.exporters.xnnpack.act_groups import group_activations

            facts["act_groups"] = group_activations(quantized, dict(recipe.act_groups))
    _settled(stages, "quantize")
    from omnidraft_deploy.exporters.xnnpack.llm_attention import takes_cache_slots

    slots = takes_cache_slots(attention)
    ids, pos = example_inputs(model.args, seq_len or 2)
    inputs = (ids, pos, torch.arange(len(pos)), torch.zeros_like(pos)) if slots else (ids, pos)
    dyn: Any = dynamic_shapes_stateful(model.args, bounded=attention is None, cache_slots=slots)
    if seq_len:  # T static; the spans, when inputs, stay dynamic
        dyn = (None, None, *dyn[2:]) if slots else None
    with stage(stages, "torch_export"), torch.no_grad():
        ep = torch.export.export(StatefulExportable(quantized), inputs, dynamic_shapes=dyn)
    del quantized  # the exported program holds what it needs
    facts["matmul_bits"] = matmul_bits(ep)
    _settled(stages, "torch_export")
    lowering = fast_lowering() if fast else contextlib.nullcontext(False)
    with stage(stages, "lower"), lowering as patched:
        edge = to_edge_transform_and_lower(
            ep,
            partitioner=[XnnpackPartitioner()],
            constant_methods=constant_methods(model, eos_ids, bundle_hash, len(inputs)),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    del ep  # its constants live on in the delegates' blobs
    _settled(stages, "lower")
    coverage = op_coverage(edge) | {"fast_lowering": patched}
    log.info("%s: XNNPACK coverage %s", path.name, coverage)
    with stage(stages, "serialize"):
        program = edge.to_executorch()
        del edge
        write_bytes_atomic(path, program.buffer)
        del program
    _settled(stages, "serialize")
    log.info("%s: stages %s", path.name, stages)
    return coverage | facts | {"stages": stages}


def _settled(stages: dict[str, Any], name: str) -> None:
    """Record the RSS once ``name``'s garbage is collected (what the next stage starts from)."""
    gc.collect()
    stages[name]["rss_after_mb"] = round(current_rss_mb(), 1)
