"""Logit parity of a graph against eager PyTorch: the check behind export verification and
bundle validation (both call ``parity``; pure torch, no backend imports).

Each prompt runs as a prefill, ``decode_steps`` single-token steps (greedy tokens of the reference)
and a rollback: a 2-token chunk re-fed from an earlier position (what a rejected draft does), then
one more step, so a cache written at the wrong slot or not masked on rollback shows up as a logit
difference. Every row's logits are compared: max |diff| and top-1 agreement. ``step_speed``
times the same step function (the speed line of export verification and ``validate``).
"""

from __future__ import annotations

import time
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


Call = tuple[list[int], int, Tensor | None]  # tokens, start, the reference's logits if known


def _chunks(prompt: Sequence[int], ref: StepFn, steps: int) -> list[Call]:
    """(tokens, start, ref logits) calls: prefill, greedy single steps, a 2-token rollback
    re-feed, one step. The reference logits computed to pick the greedy tokens are kept, so the
    (slow) eager reference runs each call once; the last three are left for ``parity`` to run."""
    calls: list[Call] = [(list(prompt), 0, None)]
    for k in range(steps):
        tokens, start, _ = calls[k]
        logits = ref(torch.tensor(tokens), start)
        calls[k] = (tokens, start, logits)
        calls.append(([int(logits[-1].argmax())], start + len(tokens), None))
    first = calls[1][0][0] if steps else 5
    back = len(prompt) + 1  # rollback: overwrite from the second decoded slot
    calls.append(([first, (first + 1) % 7 + 3], back - 1, None))
    calls.append(([5], back + 1, None))
    return calls


def parity(
    artifact: StepFn, ref: StepFn, prompts: Sequence[Sequence[int]], *, decode_steps: int = 3
) -> dict[str, float]:
    """Compare ``artifact`` with ``ref`` over every call of ``_chunks`` for every prompt."""
    worst = rollback = scale = 0.0
    agree = rows = 0
    for prompt in prompts:
        calls = _chunks(prompt, ref, decode_steps)
        for k, (tokens, start, known) in enumerate(calls):
            ids = torch.tensor(tokens, dtype=torch.long)
            a = artifact(ids, start)  # (T, V), called in order: the artifact's cache follows
            b = known if known is not None else ref(ids, start)  # (T, V)
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


def step_speed(
    step: StepFn, *, verify_len: int, max_seq_len: int, context: int = 32, calls: int = 8
) -> dict[str, float]:
    """Speed line of a graph: ``speed_decode_tok_s`` (1-token calls) and ``speed_verify_tok_s``
    / ``speed_verify_call_ms`` (``verify_len``-token calls, a speculative verification), each the
    median of ``calls`` timed calls after a ``context``-token prefill (positions re-used: every
    verify call rolls back to the same slot). A figure for the manifest, never an assertion.
    """
    context = max(1, min(context, max_seq_len - verify_len - calls - 1))
    step(torch.arange(context) % 50 + 3, 0)

    def median_s(t: int, advance: bool) -> float:
        times = []
        for c in range(calls):
            start = context + (c if advance else 0)
            t0 = time.perf_counter()
            step(torch.full((t,), 7, dtype=torch.long), start)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    one, many = median_s(1, True), median_s(verify_len, False)
    return {
        "speed_decode_tok_s": 1.0 / one,
        "speed_verify_tok_s": verify_len / many,
        "speed_verify_call_ms": 1e3 * many,
        "speed_verify_len": float(verify_len),
    }
