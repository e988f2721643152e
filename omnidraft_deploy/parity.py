"""Logit parity of a graph against eager PyTorch: the check behind export verification and
bundle validation (both call ``parity``; pure torch, no backend imports).

Each prompt runs as a prefill, ``decode_steps`` single-token steps (greedy tokens of the reference)
and a rollback: a 2-token chunk re-fed from an earlier position (what a rejected draft does), then
one more step, so a cache written at the wrong slot or not masked on rollback shows up as a logit
difference. Every row's logits are compared: max |diff| and top-1 agreement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from omnidraft_deploy.reference.model import Transformer

# token_ids (T,) int64 at positions start_pos .. start_pos+T-1 -> logits (T, V) float32
StepFn = Callable[[Tensor, int], Tensor]


def eager_step(model: Transformer) -> StepFn:
    """The fp32 reference: the model's own stateful forward (KV cache in its buffers)."""
    model.eval()

    def step(token_ids: Tensor, start_pos: int) -> Tensor:
        pos = torch.arange(start_pos, start_pos + len(token_ids))
        with torch.no_grad():
            return model(token_ids[None], pos)[0].float()

    return step


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
