"""A llama / qwen2 GGUF as Hugging Face parts: ``config.json`` fields and fp32 weights by HF name.

What ``transformers``' own GGUF loader produces (``from_pretrained(dir, gguf_file=...)``, the
former path of ``hf_adapter.gguf_to_hf_folder``), value for value, without building a model:

- each tensor is dequantised by the ``gguf`` package's numpy ``gguf.quants.dequantize`` (the
  function transformers calls) from a memory map of the file, at the offsets our fast header
  reader (``vocab.gguf_meta``) found: ``gguf.GGUFReader`` spends 5-18 s building numpy views of
  the tokenizer tables, and transformers reads the file twice (config, then tensors);
- llama.cpp stores a llama-architecture model's q/k rows permuted for its RoPE layout: they are
  permuted back (transformers' ``LlamaTensorProcessor``); qwen2's are stored as they are;
- the head is tied to the embedding when the file has no ``output.weight``;
- ``rope_freqs.weight`` (Llama-3.x scaling factors) is no weight: ``hf_adapter`` reads it.

Qwen2.5-Coder-0.5B (Q5_0 / Q8_0 / Q4_K / Q6_K / F32): about 12 s here instead of 61 s; SmolLM2-
135M (Q4_1 / Q8_0 / F32): about 3 s instead of 36 s. ``tests/core/test_gguf_weights.py`` checks
the result against transformers' tensor for tensor.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from omnidraft_deploy import optional
from omnidraft_deploy.vocab.gguf_meta import GGUFHeader

ARCHITECTURES = ("llama", "qwen2")
_HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_CONFIG = {  # <arch>.<key> -> HF config field (transformers' GGUF_CONFIG_MAPPING for these two)
    "context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
}  # fmt: skip
_TOKEN_IDS = {"bos": "bos_token_id", "eos": "eos_token_id", "unknown": "unk_token_id",
              "padding": "pad_token_id"}  # fmt: skip
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}  # fmt: skip
_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
          "ffn_norm": "post_attention_layernorm"}  # fmt: skip
NOT_WEIGHTS = frozenset({"rope_freqs.weight"})


def _gguf() -> Any:
    return optional.require("gguf", extra="hf", purpose="dequantising GGUF weights")


def _architecture(h: GGUFHeader) -> str:
    if h.architecture not in ARCHITECTURES:
        raise ValueError(f"{h.path}: GGUF architecture {h.architecture!r} not supported "
                         f"({', '.join(ARCHITECTURES)})")  # fmt: skip
    return h.architecture


def hf_config(h: GGUFHeader) -> dict[str, Any]:
    """The ``config.json`` fields transformers derives from this GGUF's metadata (rope_theta in
    transformers 5's ``rope_parameters``; a Llama-3.x scaling is added by ``hf_adapter``)."""
    arch = _architecture(h)
    cfg: dict[str, Any] = {"architectures": [_HF_CLASS[arch]], "model_type": arch}
    cfg |= {hf: h.arch_field(key) for key, hf in _CONFIG.items() if h.arch_field(key) is not None}
    if arch == "llama" and h.arch_field("rope.dimension_count") is not None:
        cfg["head_dim"] = h.arch_field("rope.dimension_count")
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in h.fields:
        cfg["vocab_size"] = len(h.fields["tokenizer.ggml.tokens"])
    theta = h.arch_field("rope.freq_base")
    if theta is not None:
        cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    for key, hf in _TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}_token_id" in h.fields:
            cfg[hf] = h.fields[f"tokenizer.ggml.{key}_token_id"]
    cfg["tie_word_embeddings"] = "output.weight" not in h.tensors
    return cfg | {"dtype": "float32"}


def tensor_array(h: GGUFHeader, name: str) -> np.ndarray:
    """Tensor ``name`` dequantised to fp32, shaped as numpy / PyTorch see it (GGUF dims reversed).

    Raises ``ValueError`` naming the file for an unknown tensor type or data past the file's end."""
    gguf = _gguf()
    kind, offset = h.layout[name]
    try:
        qtype = gguf.GGMLQuantizationType(kind)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ValueError(f"{h.path}: tensor {name} has unknown ggml type {kind}") from None
    shape = tuple(reversed(h.tensors[name]))
    if shape[-1] % block:
        raise ValueError(f"{h.path}: tensor {name}: row of {shape[-1]} not in blocks of {block}")
    row_bytes = shape[-1] // block * type_size
    n_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
    if offset + n_bytes > h.path.stat().st_size:
        raise ValueError(f"{h.path}: tensor {name} runs past the end of the file (truncated?)")
    raw = np.memmap(h.path, dtype=np.uint8, mode="r", offset=offset, shape=(n_bytes,))
    try:
        out = gguf.quants.dequantize(raw.reshape(*shape[:-1], row_bytes), qtype)
    except NotImplementedError as e:
        raise ValueError(f"{h.path}: tensor {name}: {e}") from None
    if out.dtype != np.float32:  # the integer types come back as they are stored
        raise ValueError(f"{h.path}: tensor {name} of type {qtype.name} is not a float weight")
    return np.require(out, np.float32, ["C", "W", "O"])  # our own copy, off the memory map


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (transformers' ``_reverse_permute_weights``)."""
    rows = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:])
    return np.ascontiguousarray(rows.swapaxes(2, 1).reshape(w.shape))


def hf_name(h: GGUFHeader, name: str) -> str:
    """The HF parameter name of GGUF tensor ``name``; ``ValueError`` for one we cannot place."""
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if not m or m.group(2) not in _BLOCK:
        raise ValueError(f"{h.path}: tensor {name} has no place in a {h.architecture} model")
    return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"


def hf_state_dict(h: GGUFHeader) -> dict[str, np.ndarray]:
    """Every weight of the GGUF, fp32, by HF name; a tied head is left out (one tensor)."""
    arch = _architecture(h)
    heads = int(h.arch_field("attention.head_count"))
    kv_heads = int(h.arch_field("attention.head_count_kv") or heads)
    out: dict[str, np.ndarray] = {}
    for name in h.tensors:
        if name in NOT_WEIGHTS:
            continue
        key, w = hf_name(h, name), tensor_array(h, name)
        if arch == "llama" and ".attn_q." in name:
            w = _unpermute(w, heads)
        elif arch == "llama" and ".attn_k." in name:
            w = _unpermute(w, kv_heads)
        out[key] = w
    return out
