"""Verification after export: reload the written artifact, decode real prompts, compare with eager.

The artifact is reloaded the way a device would, through the reference runtime (``runtime/``:
ONNX Runtime for ``.onnx`` / ``.ort``, the ExecuTorch runtime for ``.pte``), so export-time parity
and bundle validation exercise the same host code (cache writes, static-T chunking). Each prompt runs as a prefill, ``decode_steps`` single-token steps (greedy tokens
of the eager model) and a rollback: a 2-token chunk re-fed from an earlier position (what a
rejected draft does), then one more step, so a cache written at the wrong slot or not masked on
rollback shows up as a logit difference. Every row's logits are compared with the eager
PyTorch model's (fp32, stateful cache): max |diff| and top-1 agreement; a result outside the
recipe's tolerance raises ``ExportVerificationError``. The returned dict goes into
``GraphInfo.parity``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters.quantize import QuantRecipe
from torch import Tensor

from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)
# token_ids (T,) int64 at positions start_pos .. start_pos+T-1 -> logits (T, V) float32
StepFn = Callable[[Tensor, int], Tensor]


class ExportVerificationError(RuntimeError):
    """A reloaded artifact disagrees with eager PyTorch beyond its recipe's tolerance."""


def eager_step(model: Transformer) -> StepFn:
    """The fp32 reference: the model's own stateful forward (KV cache in its buffers)."""
    model.eval()

    def step(token_ids: Tensor, start_pos: int) -> Tensor:
        pos = torch.arange(start_pos, start_pos + len(token_ids))
        with torch.no_grad():
            return model(token_ids[None], pos)[0].float()

    return step


def artifact_step(path: Path, info: GraphInfo) -> StepFn:
    """Reload ``path`` through the desktop runtime the bundle will run on (``runtime/``).

    ``.onnx`` / ``.ort``: ONNX Runtime CPU (static-T graphs are fed in padded T-token chunks, as on
    the NPU); ``.pte``: the ExecuTorch runtime, with its constant-method metadata checked.
    """
    if path.suffix == ".pte":
        from omnidraft_deploy.runtime.executorch_model import PteModel

        return PteModel(path, info).forward
    if path.suffix in (".onnx", ".ort"):
        from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

        return OrtModel(path, info).forward
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


def _chunks(prompt: Sequence[int], ref: StepFn, steps: int) -> list[tuple[list[int], int]]:
    """(tokens, start) calls: prefill, greedy single steps, a 2-token rollback re-feed, one step."""
    calls = [(list(prompt), 0)]
    for _ in range(steps):
        tokens, start = calls[-1]
        nxt = int(ref(torch.tensor(tokens), start)[-1].argmax())
        calls.append(([nxt], start + len(tokens)))
    back = len(prompt) + 1  # rollback: overwrite from the second decoded slot
    calls.append(([calls[1][0][0], (calls[1][0][0] + 1) % 7 + 3], back - 1))
    calls.append(([5], back + 1))
    return calls


def parity(
    artifact: StepFn, ref: StepFn, prompts: Sequence[Sequence[int]], *, decode_steps: int = 3
) -> dict[str, float]:
    """Compare ``artifact`` with ``ref`` over every call of ``_chunks`` for every prompt."""
    worst = rollback = scale = 0.0
    agree = rows = 0
    for prompt in prompts:
        calls = _chunks(prompt, ref, decode_steps)
        for k, (tokens, start) in enumerate(calls):
            ids = torch.tensor(tokens, dtype=torch.long)
            a, b = artifact(ids, start), ref(ids, start)  # (T, V) each
            diff = float((a - b).abs().max())
            worst = max(worst, diff)
            if k >= len(calls) - 2:
                rollback = max(rollback, diff)
            scale = max(scale, float(b.abs().max()))
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            rows += len(tokens)
    return {
        "max_abs_logit_diff": worst,
        "rollback_max_abs_diff": rollback,
        "top1_agreement": agree / max(rows, 1),
        "max_abs_logit": scale,
        "prompts": float(len(prompts)),
        "rows": float(rows),
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
