"""Verification after export: reload the written artifact, decode real prompts, compare with eager.

The artifact is reloaded the way a device would (ONNX Runtime for ``.onnx`` / ``.ort`` through
``omnidraft_deploy.onnx_host``, the host code the desktop runtime uses too: cache writes, static-T
chunking; ``executorch.runtime`` for ``.pte``), independently of ``runtime/`` (exporters never
import it), and compared with the eager fp32 model by ``omnidraft_deploy.parity`` (prefill,
single steps, a KV rollback). A result outside the recipe's tolerance raises
``ExportVerificationError``; the returned dict goes into ``GraphInfo.parity``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omnidraft_deploy.exporters.quantize import QuantRecipe
from torch import Tensor

from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.parity import StepFn, eager_step, parity
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)


class ExportVerificationError(RuntimeError):
    """A reloaded artifact disagrees with eager PyTorch beyond its recipe's tolerance."""


def artifact_step(path: Path, info: GraphInfo) -> StepFn:
    """Reload ``path`` the way the device does: ONNX Runtime (CPU) for ``.onnx`` / ``.ort``, fed
    through ``onnx_host`` (host-held caches, static-T chunks), the ExecuTorch runtime for ``.pte``.
    """
    if path.suffix == ".pte":
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(str(path)).load_method("forward")

        def pte_step(token_ids: Tensor, start_pos: int) -> Tensor:
            pos = torch.arange(start_pos, start_pos + len(token_ids))
            return method.execute([token_ids[None], pos])[0][0].float()

        return pte_step
    if path.suffix in (".onnx", ".ort"):
        from omnidraft_deploy.onnx_host import ExplicitCacheGraph, cpu_session

        graph = ExplicitCacheGraph(cpu_session(path), info)

        def onnx_step(token_ids: Tensor, start_pos: int) -> Tensor:
            pos = np.arange(start_pos, start_pos + len(token_ids), dtype=np.int64)
            return torch.from_numpy(graph.run(token_ids.numpy()[None], pos))

        return onnx_step
    raise ValueError(f"{path}: no verifier for {path.suffix!r} artifacts")


def pte_constants(path: Path) -> dict[str, Any]:
    """Values of the ``.pte`` constant methods (get_max_seq_len, get_eos_ids, ...)."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(path))
    return {
        name: program.load_method(name).execute([])
        for name in sorted(program.method_names)
        if name.startswith("get_")
    }


def prompt_ids(tokenizer: str, vocab_size: int, *, n: int = 3, limit: int = 24) -> list[list[int]]:
    """Ids of ``n`` shipped prompts encoded with the real ``tokenizer`` (first ``limit`` tokens).

    Falls back (with a warning) to fixed pseudo-random ids when the tokenizer's pinned asset is
    not cached or the ids do not fit ``vocab_size`` (custom test models).
    """
    from omnidraft_deploy.assets import AssetError
    from omnidraft_deploy.prompts import load_prompts

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
) -> dict[str, float]:
    """Reload ``path``, compare with ``eager`` (fp32), raise if outside ``recipe``'s tolerance."""
    if prompts is None:
        prompts = prompt_ids(info.tokenizer, info.vocab_size)
    result = parity(artifact_step(path, info), eager_step(eager), prompts)
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
    return result
