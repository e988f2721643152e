"""Generation from an opened bundle: what ``omnidraft run`` does once ``open_bundle`` has checked it.

A command opens its bundle once (``runtime.bundle.open_bundle``: every check, the graphs loaded)
and passes the ``OpenBundle`` to every step: ``run_bundle`` (speculative decoding, the n-gram
cache grown across sessions in the state folder) and ``target_only`` (the baseline ``run --stats``
compares against, on the very same sessions). ``bundle_decoder`` wires a ``SpeculativeDecoder``
to a bundle (``validate`` uses it too).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omnidraft_deploy.runtime.bundle import SESSION_CACHE, OpenBundle, load_session_cache
from omnidraft_deploy.runtime.profile import ensure_profile

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.host.profile import load_profile
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import to_bytes as ngram_to_bytes
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    Observer,
    SpeculativeDecoder,
    check_prompt,
    generate_target_only,
)
from omnidraft_deploy.speculative.factory import build_decoder, pair_config
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.speculative.stats import DecodeStats


def bundle_decoder(
    bundle: OpenBundle,
    max_new_tokens: int,
    config: DecodeConfig | None = None,
    profile: CostProfile | None = None,
) -> SpeculativeDecoder:
    """Speculative decoder over the bundle's graphs, mapper, n-gram cache and draft length;
    greedy unless ``config`` (mode, temperature, ...) is given. With a measured cost ``profile``
    (``decoding_profile``): cost-aware drafting plus lookup drafts, chosen per step; without, the
    +2/-1 heuristic (``speculative.factory.build_decoder``)."""
    cfg = dataclasses.replace(
        config or DecodeConfig(max_new_tokens=max_new_tokens),
        host_threads=1,  # the graphs run in the runtime's own thread pools (DecodeConfig)
    )
    return build_decoder(
        bundle.target, bundle.drafter, bundle.mapper,
        policy="heuristic" if profile is None else "cost", draft_len=bundle.manifest.draft_len,
        config=cfg, profile=profile, ngram_cache=bundle.ngram_cache,
        lookup=None if profile is None else LookupProposer(),
    )  # fmt: skip


def decoding_profile(bundle: OpenBundle, state: Path | None) -> CostProfile | None:
    """The cost profile that steers drafting: measured once per bundle and machine and cached in
    ``state`` for ONNX graphs on the CPU (``runtime.profile.ensure_profile``); for other graphs
    (ExecuTorch, the simulated HTP: too slow to profile on the way to a first token), whatever
    ``omnidraft profile`` cached, else None (the +2/-1 heuristic)."""
    if state is None:
        return None
    onnx = all(g.file.endswith(".onnx") for g in bundle.manifest.graphs.values())
    if onnx and bundle.provider == "cpu":
        return ensure_profile(bundle, state)
    return load_profile(state)


def run_bundle(
    bundle: OpenBundle,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 48,
    observer: Observer | None = None,
    state: Path | None = None,
    config: DecodeConfig | None = None,
    generator: torch.Generator | None = None,
    ngram_cache: NGramCache | None = None,
) -> tuple[list[int], DecodeStats]:
    """Speculative generation from an opened bundle (greedy unless ``config`` says otherwise; its
    ``max_new_tokens`` wins). The bundle is only read: with a ``state`` folder
    (``omnidraft_deploy.bundle.state``) the n-gram cache grown by earlier sessions is loaded from
    it and the grown one saved back atomically. ``observer`` sees every verification step
    (``request.streaming.TextStreamer`` prints text as it comes). A prompt the target cannot hold
    (longer than its ``max_seq_len``) is refused first, before any graph runs (profiling included).
    ``ngram_cache``: the cache to decode with, already loaded from ``state`` by the caller (a
    served session parses it ahead: ``runtime.session.prepare``); None: loaded here.
    """
    check_prompt(prompt_ids, bundle.mapper.target_vocab_size, bundle.target.max_seq_len)
    if ngram_cache is not None:
        bundle.ngram_cache = ngram_cache
    elif state is not None:
        bundle.ngram_cache = load_session_cache(state, bundle.mapper, bundle.ngram_cache)
    dec = bundle_decoder(bundle, max_new_tokens, config, decoding_profile(bundle, state))
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
    bundle: OpenBundle, prompt_ids: list[int], config: DecodeConfig, *,
    generator: torch.Generator | None = None,
) -> tuple[list[int], DecodeStats]:  # fmt: skip
    """The bundle's target alone (the baseline ``run --stats`` compares against), on the target
    session the bundle already holds: its caches are addressed by position, so decoding from
    position 0 again needs nothing reset (``runtime.base``)."""
    cfg = pair_config(bundle.mapper, dataclasses.replace(config, host_threads=1))
    return generate_target_only(bundle.target, prompt_ids, cfg, generator)
