"""Parity of exported graphs with eager PyTorch, and whole-bundle validation / runs.

``graph_parity``: logits of a runtime model vs the eager model over prefill, single-token steps
and a rollback (re-feeding from an earlier position). ``validate_bundle``: greedy target-only
decoding through eager PyTorch and through the bundle's runtime, plus speculative decoding through
the bundle, on the shipped prompt set; token-for-token equality per prompt, as a JSON-able report.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omnidraft_deploy.runtime.bundle import (
    SESSION_CACHE,
    OpenBundle,
    load_session_cache,
    open_bundle,
)

from omnidraft_deploy.manifest import write_bytes_atomic
from omnidraft_deploy.ngram.format import to_bytes as ngram_to_bytes
from omnidraft_deploy.parity import eager_step, parity
from omnidraft_deploy.presets import get_preset
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.reference.load import load_model
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    Observer,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import HeuristicDraftLen
from omnidraft_deploy.speculative.stats import DecodeStats

__all__ = ["SESSION_CACHE"]  # re-exported: tests and the CLI import it from here


def graph_parity(
    model: CausalLM, eager: Transformer, prompts: list[list[int]], steps: int = 3
) -> dict[str, float]:
    """Max |logit diff| and top-1 agreement of a runtime model vs eager PyTorch.

    The same calls as export-time verification (``omnidraft_deploy.parity``): prefill, ``steps``
    single tokens, a rollback re-feed from an earlier slot and one more step.
    """
    return parity(model.forward, eager_step(eager), prompts, decode_steps=steps)


def _eager_target(bundle: OpenBundle) -> EagerLM:
    info, extras = bundle.manifest.graphs["target"], bundle.manifest.extras
    return EagerLM(
        load_model(
            get_preset(info.preset),
            seed=extras["seed"] if type(extras.get("seed")) is int else 0,  # tiny twins only
            max_seq_len=info.max_seq_len,
            weights=None,  # extras are informational: never a path or hub id to load
        )
    )


def _decoder(bundle: OpenBundle, max_new_tokens: int) -> SpeculativeDecoder:
    """Greedy speculative decoder over the bundle's graphs, mapper, n-gram cache and draft length."""
    cfg = DecodeConfig(
        max_new_tokens=max_new_tokens,
        vocab_limit=bundle.mapper.target_vocab_size,
        eos_ids=bundle.mapper.target_eos,
    )
    return SpeculativeDecoder(
        bundle.target,
        bundle.drafter,
        bundle.mapper,
        HeuristicDraftLen(bundle.manifest.draft_len),
        bundle.ngram_cache,
        config=cfg,
    )


def validate_bundle(
    bundle_dir: str | Path,
    prompts: list[tuple[str, list[int]]],
    *,
    max_new_tokens: int = 24,
    provider: str | None = None,
) -> dict[str, Any]:
    """Greedy equality: eager vs runtime target-only vs runtime speculative, per prompt."""
    bundle = open_bundle(bundle_dir, provider=provider)
    eager = _eager_target(bundle)
    dec = _decoder(bundle, max_new_tokens)
    cfg = dec.cfg
    rows = []
    for task, ids in prompts:
        t0 = time.perf_counter()
        ref, _ = generate_target_only(eager, ids, cfg)
        rt, _ = generate_target_only(bundle.target, ids, cfg)
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
        "backend": bundle.manifest.backend,
        "provider": bundle.provider,
        "quantization": bundle.manifest.graphs["target"].quantization,
        "prompts": len(rows),
        "eager_equal": sum(r["eager_eq_runtime"] for r in rows),
        "speculative_equal": sum(r["spec_eq_runtime"] for r in rows),
        "passed": all(r["spec_eq_runtime"] and (r["eager_eq_runtime"] or not exact) for r in rows),
        "rows": rows,
    }


def run_bundle(
    bundle_dir: str | Path,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 48,
    provider: str | None = None,
    observer: Observer | None = None,
) -> tuple[list[int], DecodeStats]:
    """Speculative greedy generation from a bundle; the grown n-gram cache is saved atomically
    next to the shipped one (``ngram_cache.session.bin``) so the next session starts warmer.
    ``observer`` sees every verification step (``streaming.TextStreamer`` prints text as it comes).
    """
    bundle = open_bundle(bundle_dir, provider=provider)
    session = Path(bundle_dir) / SESSION_CACHE
    bundle.ngram_cache = load_session_cache(bundle.root, bundle.mapper, bundle.ngram_cache)
    dec = _decoder(bundle, max_new_tokens)
    out, stats = dec.generate(prompt_ids, observer=observer)
    write_bytes_atomic(
        session,
        ngram_to_bytes(
            bundle.ngram_cache,
            draft_vocab_size=bundle.mapper.draft_vocab_size,
            target_vocab_size=bundle.mapper.target_vocab_size,
        ),
    )
    return out, stats
