"""The cost profile of a bundle on this machine: measured on the sessions that decode, cached.

``omnidraft profile BUNDLE`` measures it on demand; ``run`` calls ``ensure_profile`` so that every
user gets cost-aware drafting without knowing that verb: the first run on a machine measures it
(~20 s, progress on stderr) and caches it in the bundle's state folder with a fingerprint of the
bundle and the machine; later runs load it, and a different bundle, CPU, core count, ONNX Runtime
version or provider re-measures.

The per-call latencies come from ``omnidraft_deploy.host.profile.measure``. The host overhead of a step
(``CostProfile.overhead_ms``) is measured where it is paid: a short real decode of the bundle's
own graphs, mapper and tokenizer (``measure_host_overhead``), wall time minus the time inside the
target and drafter calls, so the figure the cost model charges is the one the loop pays.

The target's latencies deep into a prompt are timed at a second KV length, 3/4 of
``max_seq_len`` (``host.profile.default_far_context``) capped at ``FAR_SLOTS``; the cost model
extends the slope between the two lengths linearly (``CostProfile.target_at``). Uncapped, a
4,096-slot bundle (the default context since issue 28) timed its calls after a 3,072-token prefill:
the first ``run`` of ``make demo`` spent 213 s of its 250 s measuring (cProfile, a 2-core
machine at load ~3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnidraft_deploy.runtime.bundle import OpenBundle, open_bundle

from omnidraft_deploy.bundle.targets import parts
from omnidraft_deploy.host.onnx_host import cpuinfo
from omnidraft_deploy.host.profile import (
    Progress,
    default_far_context,
    load_profile,
    measure,
    save_profile,
)
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer

log = logging.getLogger(__name__)

# a prompt the in-loop measurement decodes (code: drafts are accepted part of the time, so the
# steps it times carry proposals of every length the fixed policy makes)
_HOST_PROMPT = "def is_palindrome(text: str) -> bool:\n    cleaned = [c.lower() for c in text"
HOST_STEPS_TOKENS = 24  # new tokens per in-loop repetition
FAR_SLOTS = 512  # the longest KV length the profile times the target at (module docstring)
# where the near figures are timed: a chat request's decode runs at positions ~80-200 (prompt +
# reply), and at 64 the profile charged the 1.5B pair's calls 10-20% less than the same calls
# cost there (reports/inloop_calls: drafter 11.8 ms at 64 vs 13.8 ms at ~131)
PROFILE_CONTEXT = 128


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def fingerprint(bundle: OpenBundle) -> str:
    """What a profile was measured on: the bundle's graphs (their sha256 in the manifest), the
    provider, the machine (CPU model, logical CPUs, ONNX Runtime and torch versions) and how the
    runtime's sessions wait between ops (``onnxruntime_model.RUNTIME_SPIN``), and the context the
    near figures are timed at (``PROFILE_CONTEXT``: a profile cached at another one is re-measured)."""
    import onnxruntime
    import torch
    from omnidraft_deploy.runtime.onnxruntime_model import RUNTIME_SPIN

    graphs = {r: bundle.manifest.files[g.file].sha256 for r, g in bundle.manifest.graphs.items()}
    key = {"graphs": graphs, "provider": bundle.provider, "cpu": cpu_model(),
           "cpus": os.cpu_count(), "ort": onnxruntime.__version__, "torch": torch.__version__,
           "spin": str(RUNTIME_SPIN), "context": PROFILE_CONTEXT}  # fmt: skip
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def measure_host_overhead(bundle: OpenBundle, *, reps: int = 3, draft_len: int = 4) -> float:
    """Median host ms per speculative step in a real greedy decode of the bundle (module
    docstring): wall time minus target and drafter calls, over every step (the first is the
    prefill)."""
    tok = load_bundle_tokenizer(bundle.root, "target", bundle.manifest.files,
                                folder=parts(bundle.manifest).tokenizer)  # fmt: skip
    cap = min(bundle.target.max_seq_len, bundle.drafter.max_seq_len)
    prompt = tok.encode(_HOST_PROMPT)[: cap // 2]
    new = max(1, min(HOST_STEPS_TOKENS, cap - len(prompt) - 2 * draft_len - 2))
    cfg = DecodeConfig(max_new_tokens=new, host_threads=1)
    per_step = []
    for _ in range(reps):
        dec = build_decoder(bundle.target, bundle.drafter, bundle.mapper, policy="fixed",
                            draft_len=draft_len, config=cfg, stop_at_eos=False)  # fmt: skip
        _, stats = dec.generate(prompt)
        steps = max(1, stats.target_calls)  # the first step is the prefill call
        per_step.append(1e3 * stats.overhead_s / steps)
    return statistics.median(per_step)


def measure_bundle(bundle: OpenBundle, *, k_max: int = 8, reps: int = 7,
                   others: dict[str, CausalLM] | None = None,
                   progress: Progress = lambda r: r,
                   stat: Callable[[list[float]], float] = statistics.median,
                   ) -> dict[str, CostProfile]:  # fmt: skip
    """Call latencies (``profile.measure``, each summarised by ``stat``) + the in-loop host
    overhead, stamped with the bundle's ``fingerprint``: ``"drafter"`` (the bundle's own), ``""``
    (no drafter: lookup) and one per graph of ``others`` (more drafters timed against the same
    target calls)."""
    cap = min(bundle.target.max_seq_len, bundle.drafter.max_seq_len)
    k_max = max(1, min(k_max, cap // 4 - 1))  # small test bundles: every call must fit
    context = min(PROFILE_CONTEXT, cap // 4)
    far = min(default_far_context(bundle.target, context, k_max), FAR_SLOTS)
    profs = measure(bundle.target, {"drafter": bundle.drafter, **(others or {})}, k_max=k_max,
                    reps=reps, context=context, far_context=far, progress=progress,
                    stat=stat)  # fmt: skip
    host, stamp = measure_host_overhead(bundle), fingerprint(bundle)
    return {
        n: dataclasses.replace(p, overhead_ms=host, fingerprint=stamp) for n, p in profs.items()
    }


def ensure_profile(bundle: OpenBundle, state: Path, *,
                   progress: Progress = lambda r: r,
                   notify: Callable[[str], Any] = log.warning) -> CostProfile:  # fmt: skip
    """The cached profile when it was measured on this bundle and machine; else measure it now
    (``notify`` says so: it takes ~20 s once) and cache it in ``state``."""
    try:
        cached = load_profile(state)
    except ValueError as e:  # a damaged cache is re-measured, never trusted
        notify(f"{e}; measuring again")
        cached = None
    if cached is not None and cached.fingerprint == fingerprint(bundle):
        return cached
    why = "first run on this machine" if cached is None else "bundle or machine changed"
    notify(f"measuring this bundle's cost profile ({why}; once, ~20 s) -> {state}")
    prof = measure_bundle(bundle, reps=5, progress=progress)["drafter"]
    save_profile(prof, state)
    return prof


def profile_bundle(bundle_dir: Path, state: Path, *, k_max: int = 8, reps: int = 7,
                   threads: int | None = None, progress: Progress = lambda r: r,
                   target: str | None = None) -> Path:  # fmt: skip
    """Measure a bundle's target + drafter graphs as ``run`` opens them and save the profile to
    ``state``; the bundle is verified once (every file hashed, the record in ``state``
    refreshed); ``threads``: ONNX Runtime intra-op threads (None: the runtime's default)."""
    bundle = open_bundle(bundle_dir, state=state, trust_record=False, threads=threads,
                         target=target)  # fmt: skip
    ext = {Path(g.file).suffix for g in bundle.manifest.graphs.values()}
    if ext != {".onnx"}:
        raise ValueError(f"{bundle_dir}: profile runs ONNX graphs (onnx backend) only")
    prof = measure_bundle(bundle, k_max=k_max, reps=reps, progress=progress)["drafter"]
    return save_profile(prof, state)
