"""Parity of exported graphs with eager PyTorch, and whole-bundle validation / runs.

``graph_parity``: logits of a runtime model vs the eager model over prefill, single-token steps
and a rollback (re-feeding from an earlier position). ``validate_bundle``: greedy target-only
decoding through eager PyTorch and through the bundle's runtime, plus speculative decoding through
the bundle, on the shipped prompt set; token-for-token equality per prompt, as a JSON-able report.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import (
    SESSION_CACHE,
    OpenBundle,
    load_session_cache,
    open_bundle,
)

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.bundle.files import read_listed
from omnidraft_deploy.bundle.manifest import MANIFEST_NAME, BundleError
from omnidraft_deploy.checks.expected import EXPECTED_FILE, EXPECTED_ROLE
from omnidraft_deploy.checks.expected import from_bytes as expected_from_bytes
from omnidraft_deploy.checks.parity import eager_step, parity, step_speed
from omnidraft_deploy.host.profile import load_profile
from omnidraft_deploy.ngram.format import to_bytes as ngram_to_bytes
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    Observer,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen, HeuristicDraftLen
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.speculative.stats import DecodeStats

__all__ = ["SESSION_CACHE"]  # re-exported: tests and the CLI import it from here
MAX_EXPECTED_BYTES = 16 << 20


def graph_parity(
    model: CausalLM, eager: Transformer, prompts: list[list[int]], steps: int = 3
) -> dict[str, float]:
    """Max |logit diff| and top-1 agreement of a runtime model vs eager PyTorch.

    The same calls as export-time verification (``omnidraft_deploy.checks.parity``): prefill, ``steps``
    single tokens, a rollback re-feed from an earlier slot and one more step.
    """
    return parity(model.forward, eager_step(eager), prompts, decode_steps=steps)


def _decoder(
    bundle: OpenBundle,
    max_new_tokens: int,
    config: DecodeConfig | None = None,
    profile: CostProfile | None = None,
) -> SpeculativeDecoder:
    """Speculative decoder over the bundle's graphs, mapper, n-gram cache and draft length;
    greedy unless ``config`` (mode, temperature, ...) is given. With a measured cost ``profile``
    (``omnidraft profile``): cost-aware drafting plus lookup drafts, chosen per step."""
    cfg = dataclasses.replace(
        config or DecodeConfig(max_new_tokens=max_new_tokens),
        vocab_limit=bundle.mapper.target_vocab_size,
        eos_ids=bundle.mapper.target_eos,
    )
    if profile is not None:
        return SpeculativeDecoder(
            bundle.target, bundle.drafter, bundle.mapper,
            CostAwareDraftLen(profile, 2 * bundle.manifest.draft_len), bundle.ngram_cache,
            config=cfg, lookup=LookupProposer(), profile=profile,
        )  # fmt: skip
    return SpeculativeDecoder(
        bundle.target,
        bundle.drafter,
        bundle.mapper,
        HeuristicDraftLen(bundle.manifest.draft_len),
        bundle.ngram_cache,
        config=cfg,
    )


def _reference(
    bundle: OpenBundle, max_new_tokens: int
) -> tuple[str, list[tuple[str, list[int], list[int]]], int]:
    """(what the reference is, [(task, prompt ids, reference ids)], tokens to compare): the eager
    target's output recorded at export (``expected.json``; every export writes it). A bundle
    without one is refused: no path in the manifest is ever loaded."""
    files = bundle.manifest.files
    if EXPECTED_FILE not in files:
        raise BundleError(bundle.root / MANIFEST_NAME, f"no {EXPECTED_FILE} to validate against: "
                          "export the bundle again")  # fmt: skip
    raw = read_listed(bundle.root, EXPECTED_FILE, files, role=EXPECTED_ROLE,
                      max_bytes=MAX_EXPECTED_BYTES)  # fmt: skip
    doc = expected_from_bytes(raw, str(bundle.root / EXPECTED_FILE))
    n = min(max_new_tokens, int(doc["max_new_tokens"]))
    rows = [(r["task"], r["prompt_ids"], r["output_ids"][:n]) for r in doc["prompts"]]
    return "expected.json (eager fp32 target, recorded at export)", rows, n


def validate_bundle(
    bundle_dir: str | Path,
    *,
    max_new_tokens: int = 24,
    provider: str | None = None,
    progress: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Greedy, per prompt: runtime target-only == the independent reference (``_reference``),
    and runtime speculative == runtime target-only. Reads the bundle only; writes nothing.

    ``progress`` wraps the loop.
    """
    bundle = open_bundle(bundle_dir, provider=provider)
    source, reference, n = _reference(bundle, max_new_tokens)
    dec = _decoder(bundle, n)
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
        "reference": source,
        "backend": bundle.manifest.backend,
        "provider": bundle.provider,
        "quantization": bundle.manifest.graphs["target"].quantization,
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


def run_bundle(
    bundle_dir: str | Path,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 48,
    provider: str | None = None,
    observer: Observer | None = None,
    state: Path | None = None,
    config: DecodeConfig | None = None,
    generator: torch.Generator | None = None,
) -> tuple[list[int], DecodeStats]:
    """Speculative generation from a bundle (greedy unless ``config`` says otherwise; its
    ``max_new_tokens`` wins). The bundle is only read: with a ``state`` folder
    (``omnidraft_deploy.bundle.state``) the n-gram cache grown by earlier sessions is loaded from it and
    the grown one saved back atomically. ``observer`` sees every verification step
    (``streaming.TextStreamer`` prints text as it comes).
    """
    bundle = open_bundle(bundle_dir, provider=provider)
    if state is not None:
        bundle.ngram_cache = load_session_cache(state, bundle.mapper, bundle.ngram_cache)
    dec = _decoder(bundle, max_new_tokens, config, load_profile(state) if state else None)
    out, stats = dec.generate(prompt_ids, observer=observer, generator=generator)
    if state is not None:
        write_bytes_atomic(
            state / SESSION_CACHE,
            ngram_to_bytes(
                bundle.ngram_cache,
                draft_vocab_size=bundle.mapper.draft_vocab_size,
                target_vocab_size=bundle.mapper.target_vocab_size,
            ),
        )
    return out, stats


def target_only(
    bundle_dir: str | Path, prompt_ids: list[int], config: DecodeConfig, *,
    provider: str | None = None, generator: torch.Generator | None = None,
) -> tuple[list[int], DecodeStats]:  # fmt: skip
    """The bundle's target alone (the baseline ``run --stats`` compares against)."""
    bundle = open_bundle(bundle_dir, provider=provider)
    cfg = dataclasses.replace(config, vocab_limit=bundle.mapper.target_vocab_size,
                              eos_ids=bundle.mapper.target_eos)  # fmt: skip
    return generate_target_only(bundle.target, prompt_ids, cfg, generator)
