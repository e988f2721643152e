"""Body of the export verb: tokenizers + vocabulary map + n-gram cache + graphs, as one bundle.

``cli.py`` parses; this takes a config, imports the heavy backends lazily and calls the libraries.
Verification after export (reload + parity with eager PyTorch) is ``exporters.verify``, run by
``export_bundle`` for every graph before the bundle is renamed into place.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omnidraft_deploy.presets import get_preset
from omnidraft_deploy.prompts import load_prompts

log = logging.getLogger(__name__)


def initial_ngram_cache(mapper: Any, target_tok: Any) -> Any:
    """Seed the shipped cache with the prompt set's multi-drafter-token target tokens."""
    from omnidraft_deploy.ngram.cache import NGramCache

    cache = NGramCache()
    for p in load_prompts():
        for t in target_tok.encode(p.text):
            spelling = mapper.target_to_draft(t)
            if len(spelling) >= 2:
                cache.update(spelling, t)
    return cache


def export(cfg: Any) -> Path:
    """``omnidraft-export``: tokenizers + mapper + cache + both graphs, verified, as one bundle."""
    from omnidraft_deploy.exporters.bundle import export_bundle
    from omnidraft_deploy.ngram.format import to_bytes as ngram_bytes
    from omnidraft_deploy.pipeline import build_mapper
    from omnidraft_deploy.vocab import io as vocab_io
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    t_tok = load_tokenizer(get_preset(cfg.target).tokenizer)
    d_tok = load_tokenizer(get_preset(cfg.drafter).tokenizer)
    mapper = build_mapper(d_tok, t_tok)
    cache = initial_ngram_cache(mapper, t_tok)
    files: dict[str, tuple[bytes, str]] = {
        "vocab_map.bin": (vocab_io.to_bytes(mapper), "vocab_map"),
        "ngram_cache.bin": (
            ngram_bytes(
                cache,
                draft_vocab_size=mapper.draft_vocab_size,
                target_vocab_size=mapper.target_vocab_size,
            ),
            "ngram_cache",
        ),
    }
    for role, tok in (("drafter", d_tok), ("target", t_tok)):
        for name, data in tok.files().items():
            files[f"{role}_tokenizer/{name}"] = (data, f"{role}_tokenizer")
    return export_bundle(
        cfg,
        extra_files=files,
        mapping_hash=mapper.content_hash(),
        eos_ids={"drafter": d_tok.eos_ids, "target": t_tok.eos_ids},
    )
