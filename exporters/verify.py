"""Verification after export: reload the written artifact, decode real prompts, compare with eager.

The artifact is reloaded the way a device would (ONNX Runtime for ``.onnx`` / ``.ort`` through
``omnidraft_deploy.bundle.graph_contract``, the host code the desktop runtime uses too: cache binding,
static-T chunking; ``executorch.runtime`` for ``.pte``), independently of ``runtime/`` (exporters never
import it), and compared with the eager fp32 model by ``omnidraft_deploy.checks.parity`` (prefill,
single steps, a KV rollback). A result outside the recipe's tolerance raises
``ExportVerificationError``; the returned dict goes into ``GraphInfo.parity``. An ONNX graph that
takes ``logits_from`` (``graph_contract.LOGITS_FROM``) must also give, in a call for its tail, the
full call's rows bit for bit (``check_tail_rows``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from omnidraft_deploy.bundle import graph_contract as gc
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import QuantRecipe
from omnidraft_deploy.checks.parity import StepFn, eager_step, parity, step_speed
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.speculative.decoder import torch_threads

log = logging.getLogger(__name__)


# The eager reference runs single-threaded: on a busy 2-core machine two torch threads made a
# (1, 24, 576) linear 18x slower (49 ms vs 2.7 ms), and eager calls were 90 % of verification.
EAGER_THREADS = 1
ONNX_SUFFIXES = (".onnx", ".ort")  # graphs ONNX Runtime reloads (``graph_contract``)


class ExportVerificationError(RuntimeError):
    """A reloaded artifact disagrees with eager PyTorch beyond its recipe's tolerance."""


def artifact_step(path: Path, info: GraphInfo) -> StepFn:
    """Reload ``path`` the way the device does, through ``omnidraft_deploy.bundle.graph_contract``:
    ONNX Runtime (CPU) for ``.onnx`` / ``.ort`` (host-held caches bound by IOBinding, static-T
    chunks), the ExecuTorch runtime for ``.pte``.
    """
    if path.suffix == ".pte":
        from omnidraft_deploy.optional import pte_program

        method = pte_program(path).load_method(gc.PTE_FORWARD)

        def pte_step(token_ids: Tensor, start_pos: int) -> Tensor:
            pos = gc.contiguous_positions(start_pos, len(token_ids))
            return torch.from_numpy(gc.pte_step(method, token_ids.numpy()[None], pos))

        return pte_step
    if path.suffix in ONNX_SUFFIXES:
        return _graph_step(_onnx_graph(path, info))
    raise ValueError(f"{path}: no verifier for {path.suffix!r} artifacts")


def _onnx_graph(path: Path, info: GraphInfo) -> gc.ExplicitCacheGraph:
    from omnidraft_deploy.host.onnx_host import cpu_session

    return gc.ExplicitCacheGraph(cpu_session(path), info)


def _graph_step(graph: gc.ExplicitCacheGraph) -> StepFn:
    def onnx_step(token_ids: Tensor, start_pos: int) -> Tensor:
        pos = gc.contiguous_positions(start_pos, len(token_ids))
        return torch.from_numpy(graph.run(token_ids.numpy()[None], pos))

    return onnx_step


def check_tail_rows(graph: gc.ExplicitCacheGraph, prompt: Sequence[int], name: str) -> None:
    """A graph that takes ``logits_from`` (``tail_alone``): a call of ``prompt`` that asks for its
    last row, and one that asks for its last three (a prefill that verifies proposals), must give
    the full call's rows bit for bit (the rows are cut before the lm_head, whose rows are each
    their own arithmetic, per-row activation scales included); else ``ExportVerificationError``.
    Nothing to check for a graph without the input."""
    if not graph.tail_alone:
        return
    ids, pos = np.array([list(prompt)], np.int64), gc.contiguous_positions(0, len(prompt))
    full = graph.run(ids, pos)  # (T, V)
    for rows in sorted({1, min(3, len(prompt))}):
        alone = graph.run(ids, pos, rows=rows)  # same slots rewritten with the same entries
        if not np.array_equal(full[-rows:], alone):
            diff = float(np.abs(full[-rows:] - alone).max())
            raise ExportVerificationError(
                f"{name}: a call for the last {rows} row(s) (logits_from = T - {rows}) gives rows "
                f"that differ from the full call's (max |diff| {diff:.3g}); the runtime's prefill "
                "and drafter read those rows, so the graph is refused"
            )


def reference_for(path: Path, eager: Transformer) -> Transformer:
    """The eager function ``path`` computes: ``eager`` itself, or for a graph conditioned on a sink
    token (QNN, ``reference.sink``; named in its metadata) ``eager`` with that sink."""
    if path.suffix != ".onnx":
        return eager
    from omnidraft_deploy.bundle.onnx_meta import read_onnx_meta
    from omnidraft_deploy.reference.sink import SINK_KEY, parse_sink, sinked

    meta = read_onnx_meta(path).metadata  # the weights not parsed (2-3 s for a 1 GB graph)
    return sinked(eager, parse_sink(meta[SINK_KEY])) if SINK_KEY in meta else eager


def pte_constants(path: Path) -> dict[str, Any]:
    """Values of the ``.pte`` constant methods (get_max_seq_len, get_eos_ids, ...)."""
    from omnidraft_deploy.optional import pte_program

    return gc.pte_constants(pte_program(path))


def prompt_ids(tokenizer: str, vocab_size: int, *, n: int = 3, limit: int = 24) -> list[list[int]]:
    """Ids of ``n`` shipped prompts encoded with the real ``tokenizer`` (first ``limit`` tokens).

    Falls back (with a warning) to fixed pseudo-random ids when the tokenizer's pinned asset is
    not cached or the ids do not fit ``vocab_size`` (custom test models).
    """
    from omnidraft_deploy.catalog.assets import AssetError
    from omnidraft_deploy.catalog.prompts import load_prompts

    try:
        from omnidraft_deploy.vocab.tokenizers import load_tokenizer

        tok = load_tokenizer(tokenizer)
        texts = load_prompts()
        ids = [tok.encode(p.text)[:limit] for p in texts[:: max(1, len(texts) // n)][:n]]
        if all(ids) and max(max(x) for x in ids) < vocab_size:
            return ids
    except (AssetError, ImportError, KeyError) as e:
        log.warning("verification prompts: tokenizer %s unavailable (%s)", tokenizer, e)
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(1, vocab_size, (limit,), generator=gen).tolist() for _ in range(n)]


def verify_artifact(
    path: Path,
    info: GraphInfo,
    eager: Transformer,
    recipe: QuantRecipe,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    verify_len: int = 5,
) -> dict[str, float]:
    """Reload ``path``, compare with ``eager`` (fp32), raise if outside ``recipe``'s tolerance.

    The result also holds a speed line (``speed_*`` keys, ``parity.step_speed``): tokens/s of
    1-token decode and of a ``verify_len``-token verify call on the reloaded artifact.
    """
    if prompts is None:
        prompts = prompt_ids(info.tokenizer, info.vocab_size)
    graph = _onnx_graph(path, info) if path.suffix in ONNX_SUFFIXES else None
    step = artifact_step(path, info) if graph is None else _graph_step(graph)
    with torch_threads(EAGER_THREADS):
        result = parity(step, eager_step(reference_for(path, eager)), prompts)
    result |= {"tolerance": recipe.tolerance, "min_top1": recipe.min_top1}
    if (
        result["max_abs_logit_diff"] > recipe.tolerance
        or result["top1_agreement"] < recipe.min_top1
    ):
        raise ExportVerificationError(
            f"{path.name}: parity {result} outside the {recipe.name} recipe's tolerance "
            f"(max |diff| <= {recipe.tolerance}, top-1 >= {recipe.min_top1})"
        )
    log.info("%s parity: %s", path.name, result)
    if graph is not None:
        check_tail_rows(graph, prompts[0], path.name)
    speed = step_speed(step, verify_len=verify_len, max_seq_len=info.max_seq_len)
    log.info("%s speed: %s", path.name, speed)
    return result | speed
