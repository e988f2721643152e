"""``omnidraft-export``: the one export path, from checked inputs to a published bundle.

``export_pair(cfg, inputs)`` is what the CLI runs, and what every library caller, test and
benchmark runs: ``inputs`` are the checked inputs of ``inputs.resolve_export`` (the CLI resolves
them first, so a bad flag fails before any torch import); None resolves them here from ``cfg`` the
same way (``--force`` implied). Then, in order:

1. what the bundle carries beside the graphs, from the *resolved* tokenizers (the weights' own,
   with their special tokens and chat template): each role's tokenizer files (written once,
   ``vocab.bundle_tokenizer.tokenizer_files``), the vocabulary map and the seeded n-gram cache;
2. both graphs through ``bundle.export_bundle`` (each model loaded once, by ``reference.load``);
3. ``expected.json``: the eager target's greedy output on the shipped prompts, recorded from the
   target model the export already loaded, as the written target graph computes it (after the
   sink token its metadata names, if any): the reference ``omnidraft validate`` checks against;
4. ``opener`` (the composition root passes the runtime's bundle opener) opens the staged folder
   before it is published, so no export publishes a bundle its opener refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.bundle import ExportConfig, Verify, export_bundle
from tqdm import tqdm

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.checks import expected
from omnidraft_deploy.ngram.cache import DEFAULT_MAX_ENTRIES, MAX_N, NGramCache
from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.resolve.export_inputs import ExportInputs, resolve_export
from omnidraft_deploy.vocab.mapper import VocabMapper
from omnidraft_deploy.vocab.pair import PairVocab

SEED_ENTRIES = 65_536  # merged target tokens in the shipped n-gram cache (initial_ngram_cache)


def resolve_inputs(cfg: ExportConfig) -> ExportInputs:
    """``cfg``'s inputs, checked as the CLI checks its flags (``InputError`` naming the flag)."""
    return resolve_export(
        target=cfg.specs["target"], drafter=cfg.specs["drafter"], model=cfg.target_model,
        drafter_model=cfg.drafter_model, out_dir=Path(cfg.out_dir), force=True,
        quantization=cfg.quantization,
    )  # fmt: skip


def export_pair(
    cfg: ExportConfig, inputs: ExportInputs | None = None, *, verify: Verify | None = None,
    opener: Callable[[Path], Any] | None = None, drafter_from: Path | None = None,
    target_from: Path | None = None,
) -> Path:  # fmt: skip
    """Write the bundle at ``cfg.out_dir`` (module docstring) and return its folder.

    ``verify``: replaces the built-in graph check (``exporters.verify``); ``opener(staged folder)``
    raises to refuse the bundle before it is published (the CLI: the runtime's opener);
    ``drafter_from`` / ``target_from``: a bundle whose drafter / target graph is reused
    (``export_bundle``; ``--target-from``: a new drafter for a target exported once).
    """
    inputs = inputs or resolve_inputs(cfg)
    vocab = PairVocab.of(inputs.target.tokenizer, inputs.drafter.tokenizer)  # the resolved ones
    d_tok, t_tok, mapper = vocab.drafter_tok, vocab.target_tok, vocab.mapper

    def recorded(
        tmp: Path, graphs: dict[str, GraphInfo], target: Transformer
    ) -> dict[str, tuple[bytes, str]]:
        doc = record_target(target, t_tok, tmp / graphs["target"].file, cfg.reference_prompts)
        return {expected.EXPECTED_FILE: (doc, expected.EXPECTED_ROLE)}

    return export_bundle(
        cfg,
        extra_files=pair_files(d_tok, t_tok, mapper),
        derived_files=recorded,
        mapping_hash=mapper.content_hash(),
        eos_ids={"drafter": d_tok.eos_ids, "target": t_tok.eos_ids},
        verify=verify,
        opener=opener,
        drafter_from=drafter_from,
        target_from=target_from,
    )


def pair_files(
    drafter_tok: TokenizerLike, target_tok: TokenizerLike, mapper: VocabMapper
) -> dict[str, tuple[bytes, str]]:
    """Relative path -> (bytes, manifest role): the vocabulary map, the seeded n-gram cache and
    both tokenizers' files (``export_bundle``'s ``extra_files``)."""
    from omnidraft_deploy.ngram.format import to_bytes as ngram_bytes
    from omnidraft_deploy.vocab import io as vocab_io
    from omnidraft_deploy.vocab.bundle_tokenizer import tokenizer_files

    cache = initial_ngram_cache(mapper)
    files = {
        "vocab_map.bin": (vocab_io.to_bytes(mapper), "vocab_map"),
        "ngram_cache.bin": (
            ngram_bytes(cache, draft_vocab_size=mapper.draft_vocab_size,
                        target_vocab_size=mapper.target_vocab_size),
            "ngram_cache",
        ),
    }  # fmt: skip
    for role, tok in (("drafter", drafter_tok), ("target", target_tok)):
        for name, data in tokenizer_files(tok).items():
            files[f"{role}_tokenizer/{name}"] = (data, f"{role}_tokenizer")
    return files


def initial_ngram_cache(mapper: VocabMapper, max_entries: int = SEED_ENTRIES) -> NGramCache:
    """The shipped cache: every target id whose drafter spelling takes n >= 2 drafter ids, by
    merge rank (target id order: a BPE vocabulary numbers its merges in the order its trainer
    found them, most frequent first), up to ``max_entries``, the lowest ids the most protected;
    not ids spelled with the placeholder (bytes the drafter has no token for).

    Without an entry a merged token cannot be proposed at all, and a draft breaks there: seeded
    only with the shipped prompts' tokens (the cache before), distilled SmolLM2 ->
    Qwen2.5-Coder-1.5B drafts reached 2.90 target tokens a call on the first request of 11
    prompts, 3.00 with this seed (``benchmarks/ngram_seed.py``, ``reports/ngram_seed``).
    65,536 ids cover 99.9% of the merged tokens in the target's own chat replies
    (``reports/ngram_seed/coverage.md``). The online cache evicts from the rarest seeds up."""
    spelled: dict[tuple[int, ...], int] = {}
    for t in range(mapper.target_vocab_size):
        ids = tuple(mapper.target_to_draft(t))
        if 2 <= len(ids) <= MAX_N and ids not in spelled and not mapper.placeholder_bytes(t):
            spelled[ids] = t
            if len(spelled) == max_entries:
                break
    rows = [(ids, t, 1) for ids, t in reversed(spelled.items())]  # next victim first
    return NGramCache.from_items(rows, max_entries=max(DEFAULT_MAX_ENTRIES, len(rows)))


def record_target(
    model: Transformer, tok: TokenizerLike, graph: Path, n_prompts: int | None = None
) -> bytes:
    """``expected.json`` from the eager fp32 target ``model`` as the written target ``graph``
    computes it (``verify.reference_for``: after the sink token its metadata names, if any), on
    ``n_prompts`` of the shipped prompts (``ExportConfig.reference_prompts``; None: all)."""
    from omnidraft_deploy.exporters.verify import reference_for

    from omnidraft_deploy.reference.torch_lm import EagerLM

    target = EagerLM(reference_for(graph, model))

    def bar(items: Any) -> Any:
        return tqdm(items, desc="record target-only reference", unit="prompt", leave=False)

    doc = expected.record_expected(target, tok, vocab_limit=tok.vocab_size, progress=bar,
                                   n_prompts=n_prompts)  # fmt: skip
    return expected.to_bytes(doc)
