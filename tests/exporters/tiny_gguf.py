"""A tiny Qwen2-shaped model written as a GGUF of K-quant blocks (as Q4_K_M stores them), for the
``gguf4`` exporters' tests; callers skip when the ``gguf`` package is missing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from omnidraft_deploy.exporters.quant.gguf_grid import LINEARS, READERS

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer, build_model

# byte widths of a K-quant super-block (256 weights) and where its fp16 scales sit
K_QUANTS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}
SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=320, dim=256, n_heads=4,
                           n_kv_heads=2, intermediate_size=512, n_layers=2,
                           tie_embeddings=False)  # fmt: skip
PROMPTS = [[5, 9, 100, 3, 44, 17, 250], [7, 8]]


def k_blocks(kind: str, rows: int, cols: int, seed: int, d: float = 0.004) -> np.ndarray:
    """Random K-quant rows ``(rows, cols / 256 * width)``: codes and 6/8-bit scales random, the
    fp16 super-block scales small (the ``gguf`` package cannot quantise K-quants)."""
    width, halves = K_QUANTS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // 256, width), dtype=np.uint8)
    for off in halves:
        scale = rng.uniform(0.2 * d, d, (len(raw), 1)).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8)
    return raw.reshape(rows, -1)


def write_tiny_gguf(path: Path, max_seq_len: int = 32) -> Transformer:
    """A GGUF of ``SPEC``'s tensors: Q4_K linears, a Q6_K ``ffn_down`` / ``attn_v`` in layer 1 and a
    Q6_K output (as Q4_K_M stores them), a Q4_K embedding; and the eager model it dequantises to."""
    import gguf
    from gguf import GGMLQuantizationType as T

    model = build_model(SPEC, seed=6, max_seq_len=max_seq_len)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    state = model.state_dict()
    seed = 10

    def put(key: str, eager: str, kind: str) -> None:
        nonlocal seed
        n, k = state[eager].shape
        raw = k_blocks(kind, n, k, seed := seed + 1)
        writer.add_tensor(key, raw, raw_dtype=T[kind])
        state[eager] = torch.from_numpy(READERS[kind](raw).dequantize())

    for i in range(SPEC.n_layers):
        for part, where in LINEARS.items():
            six = i == 1 and part in ("attn_v", "ffn_down")
            put(
                f"blk.{i}.{part}.weight",
                f"model.layers.{i}.{where}.weight",
                "Q6_K" if six else "Q4_K",
            )
    put("token_embd.weight", "model.embed_tokens.weight", "Q4_K")
    put("output.weight", "lm_head.weight", "Q6_K")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.load_state_dict(state)
    return model
