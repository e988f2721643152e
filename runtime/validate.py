"""Parity of exported graphs with eager PyTorch, and whole-bundle validation.

``graph_parity``: logits of a runtime model vs the eager model over prefill, single-token steps
and a rollback (re-feeding from an earlier position). ``validate_bundle``: greedy target-only
decoding through eager PyTorch and through the bundle's runtime, plus speculative decoding through
the bundle, on the shipped prompt set; token-for-token equality per prompt, as a JSON-able report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnidraft_deploy.runtime.bundle import (
    OpenBundle,
    open_bundle,
)
from omnidraft_deploy.runtime.run import bundle_decoder

from omnidraft_deploy.bundle.targets import selected
from omnidraft_deploy.checks.parity import eager_step, parity, step_speed
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.speculative.decoder import (
    generate_target_only,
)


def graph_parity(
    model: CausalLM, eager: Transformer, prompts: list[list[int]], steps: int = 3
) -> dict[str, float]:
    """Max |logit diff| and top-1 agreement of a runtime model vs eager PyTorch.

    The same calls as export-time verification (``omnidraft_deploy.checks.parity``): prefill, ``steps``
    single tokens, a rollback re-feed from an earlier slot and one more step.
    """
    return parity(model.forward, eager_step(eager), prompts, decode_steps=steps)


def _reference(
    bundle: OpenBundle, max_new_tokens: int
) -> tuple[str, list[tuple[str, list[int], list[int]]], int]:
    """(what the reference is, [(task, prompt ids, reference ids)], tokens to compare): the eager
    target's output recorded at export (``expected.json``, read and checked by the open:
    ``runtime.contents``; a bundle without one is refused there)."""
    doc = bundle.expected
    n = min(max_new_tokens, int(doc["max_new_tokens"]))
    rows = [(r["task"], r["prompt_ids"], r["output_ids"][:n]) for r in doc["prompts"]]
    return "expected.json (eager fp32 target, recorded at export)", rows, n


def validate_bundle(
    bundle_dir: str | Path,
    *,
    max_new_tokens: int = 24,
    provider: str | None = None,
    progress: Callable[[Any], Any] | None = None,
    state: Path | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """Greedy, per prompt: runtime target-only == the independent reference (``_reference``),
    and runtime speculative == runtime target-only. Reads the bundle only; every file is hashed
    (with the session folder ``state``, their identities are recorded for later opens).

    ``progress`` wraps the loop; ``target``: which target of a multi-target bundle (one report
    per target: ``validate`` calls this for each).
    """
    bundle = open_bundle(
        bundle_dir, provider=provider, state=state, trust_record=False, target=target
    )
    source, reference, n = _reference(bundle, max_new_tokens)
    dec = bundle_decoder(bundle, n)
    rows = []
    for task, ids, ref in progress(reference) if progress else reference:
        t0 = time.perf_counter()
        rt, _ = generate_target_only(bundle.target, ids, dec.cfg)
        spec, stats = dec.generate(ids)
        rows.append(
            {
                "task": task,
                "eager_eq_runtime": ref == rt,
                "spec_eq_runtime": spec == rt,
                "agreement": sum(a == b for a, b in zip(ref, rt, strict=False)) / max(1, len(ref)),
                "acceptance_rate": stats.acceptance_rate,
                "seconds": time.perf_counter() - t0,
            }
        )
    exact = bundle.manifest.graphs["target"].quantization == "fp32"
    return {
        "bundle": str(bundle_dir),
        "target": selected(bundle.manifest),
        "reference": source,
        "backend": bundle.manifest.backend,
        "provider": bundle.provider,
        "quantization": bundle.manifest.graphs["target"].quantization,
        "drafter_weights": None if bundle.drafter_weights is None else str(bundle.drafter_weights),
        "prompts": len(rows),
        "eager_equal": sum(r["eager_eq_runtime"] for r in rows),
        "speculative_equal": sum(r["spec_eq_runtime"] for r in rows),
        "passed": bool(rows)
        and all(r["spec_eq_runtime"] and (r["eager_eq_runtime"] or not exact) for r in rows),
        "rows": rows,
        "speed": step_speed(  # the target's speed line, as export verification records it
            bundle.target.forward,
            verify_len=bundle.manifest.draft_len + 1,
            max_seq_len=bundle.target.max_seq_len,
        ),
    }
