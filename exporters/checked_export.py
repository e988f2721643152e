"""``omnidraft-export`` after its inputs were checked: the bundle from ``inputs.ExportInputs``.

``inputs.resolve_export`` has already refused every disagreement between weights, tokenizers,
presets and the output folder. This builds what the bundle carries with the *resolved*
tokenizers (the weights' own, with their special tokens and chat template), records the eager
target's greedy output on the shipped prompts (``expected.json``, the reference ``validate``
checks against) and writes the bundle through ``bundle.export_bundle``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.bundle import (
    ExportConfig,
    PairFiles,
    export_bundle,
    initial_ngram_cache,
)
from tqdm import tqdm

from omnidraft_deploy.bundle.manifest import GraphInfo
from omnidraft_deploy.checks import expected
from omnidraft_deploy.resolve.export_inputs import ExportInputs
from omnidraft_deploy.vocab.bundle_tokenizer import tokenizer_files


def record_target(cfg: ExportConfig, inputs: ExportInputs, graph: Path) -> bytes:
    """``expected.json`` from the eager fp32 target as the written target ``graph`` computes it
    (``verify.reference_for``: after the sink token its metadata names, if any)."""
    from omnidraft_deploy.exporters.verify import reference_for

    from omnidraft_deploy.reference.torch_lm import EagerLM
    from omnidraft_deploy.resolve.load import load_model

    spec = inputs.target.spec
    model = load_model(spec, seed=cfg.seed, max_seq_len=cfg.max_seq_len, weights=cfg.target_model)
    target = EagerLM(reference_for(graph, model))
    tok = inputs.target.tokenizer

    def bar(items: Any) -> Any:
        return tqdm(items, desc="record target-only reference", unit="prompt", leave=False)

    doc = expected.record_expected(target, tok, vocab_limit=tok.vocab_size, progress=bar)
    return expected.to_bytes(doc)


def export_resolved(cfg: ExportConfig, inputs: ExportInputs) -> Path:
    """Write the bundle at ``cfg.out_dir`` from checked inputs; returns its folder."""
    from omnidraft_deploy.vocab.build import build_mapper

    d_tok, t_tok = inputs.drafter.tokenizer, inputs.target.tokenizer
    mapper = build_mapper(d_tok, t_tok)
    pair = PairFiles(d_tok, t_tok, mapper, initial_ngram_cache(mapper, t_tok))  # type: ignore[arg-type]
    files = pair.files()
    for role, tok in (("drafter", d_tok), ("target", t_tok)):
        for name, data in tokenizer_files(tok).items():
            files[f"{role}_tokenizer/{name}"] = (data, f"{role}_tokenizer")

    def recorded(tmp: Path, graphs: dict[str, GraphInfo]) -> dict[str, tuple[bytes, str]]:
        target = record_target(cfg, inputs, tmp / graphs["target"].file)
        return {expected.EXPECTED_FILE: (target, expected.EXPECTED_ROLE)}

    return export_bundle(
        cfg,
        extra_files=files,
        derived_files=recorded,
        mapping_hash=mapper.content_hash(),
        eos_ids={"drafter": d_tok.eos_ids, "target": t_tok.eos_ids},
    )
