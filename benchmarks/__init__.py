"""Benchmarks: scripts that measure the product, run from the repository root as modules.

    .venv/bin/python -m benchmarks.real_pair_bundle run --bundle bundles/q15 ...
    .venv/bin/python -m benchmarks.ngram_load --sizes 250000

Each script is one experiment (its flags, its report folder ``reports/<benchmark>/``). What they
share lives in ``benchmarks.common``: the pair and decoder factory (``pair``: models, tokenizers
and mapper from the library's one loader, ``SpeculativeDecoder`` wired in one place), the
round-robin timer (``timer``: methods interleaved per prompt, torch threads set explicitly, load
average recorded), the report writer (``report``: JSON as the source, Markdown and PNG rendered
from it, every report naming its command, git revision, machine and load) and the peer engines
timed beside ours (``peers``: transformers, ONNX Runtime GenAI, llama.cpp), and a drafter's
evaluation per task (``evaluate``). ``render_reports`` re-renders every report from its JSON
(``make reports``). Nothing under ``omnidraft_deploy`` imports this package, and no library module
serves only a benchmark (``tests/core/test_layering.py``).
"""
