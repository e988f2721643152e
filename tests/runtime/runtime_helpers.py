"""Tiny in-process models (no assets) and their graphs, written with the project's exporters."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.presets import Family, ModelSpec, Role, Source
from omnidraft_deploy.reference.model import Transformer, build_model

MAX_SEQ_LEN = 32


def tiny_spec(vocab: int, n_kv_heads: int = 4) -> ModelSpec:
    """2 layers, dim 32, 4 query heads (n_kv_heads 2: GQA), max_seq_len 32."""
    return ModelSpec(
        "toy",
        Role.TARGET,
        Family.LLAMA,
        "toy",
        vocab,
        32,
        2,
        4,
        n_kv_heads,
        64,
        max_seq_len=MAX_SEQ_LEN,
        source=Source.RANDOM,
    )


def tiny_model(vocab: int = 64, seed: int = 0, n_kv_heads: int = 4) -> Transformer:
    return build_model(tiny_spec(vocab, n_kv_heads), seed=seed, init_std=0.2)


def info_for(model: Transformer, file: str, seq_len: int | None = None) -> GraphInfo:
    from omnidraft_deploy.exporters.exportable import graph_info

    spec = tiny_spec(model.args.vocab_size, model.args.n_kv_heads)
    return graph_info(model, spec, file=file, quantization="fp32", seq_len=seq_len)


def write_onnx(model: Transformer, path: Path, seq_len: int | None = None) -> GraphInfo:
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    info = info_for(model, path.name, seq_len)
    export_onnx(model, path, info=info, seq_len=seq_len)
    return info


_CACHE: dict[tuple[int, int, int, int | None], tuple[Path, GraphInfo]] = {}


def cached_onnx(
    tmp_root: Path, vocab: int, seed: int, n_kv_heads: int, seq_len: int | None
) -> tuple[Path, GraphInfo]:
    """One export per (vocab, seed, n_kv_heads, seq_len) for the whole session (exports dominate
    the runtime tests' time). ``tmp_root`` must outlive the test: a session or module folder of
    ``tmp_path_factory``, never a test's ``tmp_path`` (removed when the test passes)."""
    key = (vocab, seed, n_kv_heads, seq_len)
    if key not in _CACHE:
        path = tmp_root / f"v{vocab}_s{seed}_kv{n_kv_heads}_t{seq_len}.onnx"
        _CACHE[key] = path, write_onnx(tiny_model(vocab, seed, n_kv_heads), path, seq_len)
    return _CACHE[key]
