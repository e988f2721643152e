"""Logit parity of a graph against eager PyTorch: the check behind export verification and
bundle validation (both call ``parity``; pure torch, no backend imports).

Each prompt runs on the graph as a prefill, ``decode_steps`` single-token steps (the graph's own
greedy tokens) and a rollback: a 2-token chunk re-fed from an earlier position (what a rejected
draft does), then one more step, so a cache written at the wrong slot or not masked on rollback
shows up as a logit difference. The eager reference computes the same rows in two calls (the
decoded sequence at once, then the rollback branch): eager calls were most of an export's
verification time (fp32 Qwen2.5-0.5B: 18 single-threaded eager calls, 7-9 s of ~11 s), and this
makes them 6. Every row's logits are compared: max |diff| and top-1 agreement. ``step_speed``
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


Call = tuple[list[int], int, Tensor]  # tokens, start, the artifact's logits (T, V)


def _artifact_calls(prompt: Sequence[int], artifact: StepFn, steps: int) -> list[Call]:
    """The artifact's calls, in order (its cache follows them): prefill, ``steps`` greedy single
    steps (the artifact's own argmax), a 2-token re-feed one slot after the prompt's end (a
    rejected draft rolled back) and one more step."""
    calls: list[Call] = []
    tokens, start = list(prompt), 0
    for _ in range(steps + 1):
        logits = artifact(torch.tensor(tokens, dtype=torch.long), start)  # (T, V)
        calls.append((tokens, start, logits))
        start, tokens = start + len(tokens), [int(logits[-1].argmax())]
    first = calls[1][0][0] if steps else 5
    back = len(prompt) + 1  # rollback: overwrite from the second decoded slot
    for tokens, start in (([first, (first + 1) % 7 + 3], back - 1), ([5], back + 1)):
        calls.append((tokens, start, artifact(torch.tensor(tokens, dtype=torch.long), start)))
    return calls


def _reference_rows(calls: list[Call], ref: StepFn) -> list[Tensor]:
    """The reference's logits for each call's rows, in two (slow, eager) calls: the decoded
    sequence as one prefill, then the rollback branch (re-feed + step) from its first slot.
    Rows depend only on the tokens before them, so these are the same rows the artifact's
    incremental calls computed (to float rounding)."""
    main, branch = calls[:-2], calls[-2:]
    seq = ref(torch.tensor([t for tokens, _, _ in main for t in tokens], dtype=torch.long), 0)
    rows = [seq[start : start + len(tokens)] for tokens, start, _ in main]
    ids = [t for tokens, _, _ in branch for t in tokens]
    alt = ref(torch.tensor(ids, dtype=torch.long), branch[0][1])  # (3, V)
    return [*rows, alt[: len(branch[0][0])], alt[len(branch[0][0]) :]]


def parity(
    artifact: StepFn, ref: StepFn, prompts: Sequence[Sequence[int]], *, decode_steps: int = 3
) -> dict[str, float]:
    """Compare ``artifact`` with ``ref`` on every row of ``_artifact_calls`` for every prompt:
    max |logit diff| (also over the rollback calls alone) and top-1 agreement."""
    worst = rollback = scale = 0.0
    agree = rows = 0
    for prompt in prompts:
        calls = _artifact_calls(prompt, artifact, decode_steps)
        for k, ((tokens, _, a), b) in enumerate(
            zip(calls, _reference_rows(calls, ref), strict=True)
        ):
            diff = float((a - b).abs().max())  # a, b: (T, V)
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
