"""Tiny random models of the real architectures, carrying the real tokenizers, as a user's files:
a ``.gguf`` (the tokenizer tables, special ids and chat template copied from llama.cpp's vocabulary
GGUFs, F32 tensors named as llama.cpp names them) or a Hugging Face folder (``config.json``,
``model.safetensors``, ``tokenizer.json`` / ``tokenizer.model``, ``tokenizer_config.json``).

Kinds: ``llama2`` (Llama-2 SentencePiece, 32,000 ids), ``qwen2`` (Qwen2 BPE, Qwen2 block with
q/k/v bias, tied embeddings) and ``llama3`` (Llama-3 BPE, 128,256 ids): 64 wide, 2 layers, GQA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from omnidraft_deploy.catalog.assets import asset_path
from omnidraft_deploy.vocab.gguf_meta import read_gguf_header

DIM, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 128, 512
VOCAB_GGUF = {"llama2": "vocab-llama-spm-gguf", "qwen2": "vocab-qwen2-gguf",
              "llama3": "vocab-llama-bpe-gguf"}  # fmt: skip
ARCH = {"llama2": "llama", "qwen2": "qwen2", "llama3": "llama"}
THETA = {"llama2": 1e4, "qwen2": 1e6, "llama3": 5e5}
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def _tensors(kind: str, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """HF-named random weights (``model.layers.0.self_attn.q_proj.weight``, ...)."""
    rng = np.random.default_rng(seed)
    kv = KV_HEADS * (DIM // HEADS)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    out = {"model.embed_tokens.weight": w(vocab, DIM), "model.norm.weight": np.ones(DIM, "f4")}
    if kind != "qwen2":  # Qwen2's small models tie the head to the embedding
        out["lm_head.weight"] = w(vocab, DIM)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": w(DIM, DIM), p + "self_attn.k_proj.weight": w(kv, DIM),
                p + "self_attn.v_proj.weight": w(kv, DIM), p + "self_attn.o_proj.weight": w(DIM, DIM),
                p + "mlp.gate_proj.weight": w(FFN, DIM), p + "mlp.up_proj.weight": w(FFN, DIM),
                p + "mlp.down_proj.weight": w(DIM, FFN),
                p + "input_layernorm.weight": np.ones(DIM, "f4"),
                p + "post_attention_layernorm.weight": np.ones(DIM, "f4")}  # fmt: skip
        if kind == "qwen2":
            out |= {p + "self_attn.q_proj.bias": w(DIM), p + "self_attn.k_proj.bias": w(kv),
                    p + "self_attn.v_proj.bias": w(kv)}  # fmt: skip
    return out


_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}  # fmt: skip


def _gguf_name(hf: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
    if hf in fixed:
        return fixed[hf]
    _, _, i, *rest = hf.split(".")
    module, kind = ".".join(rest[:-1]), rest[-1]
    return f"blk.{i}.{_GGUF_NAMES[module]}.{kind}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for llama-architecture GGUFs (transformers undoes it on load)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def tiny_gguf(path: Path, kind: str, *, name: str, size_label: str = "1M", seed: int = 0) -> Path:
    """A tiny ``kind`` GGUF at ``path`` with the real tokenizer (module docstring)."""
    import gguf

    vocab_src = read_gguf_header(asset_path(VOCAB_GGUF[kind])).fields
    n = len(vocab_src["tokenizer.ggml.tokens"])
    w = gguf.GGUFWriter(str(path), ARCH[kind])
    w.add_name(name), w.add_size_label(size_label), w.add_context_length(CONTEXT)
    w.add_embedding_length(DIM), w.add_block_count(LAYERS), w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS), w.add_head_count_kv(KV_HEADS), w.add_rope_freq_base(THETA[kind])
    w.add_layer_norm_rms_eps(1e-6), w.add_vocab_size(n)
    _copy_tokenizer(w, vocab_src)
    for hf, t in _tensors(kind, n, seed).items():
        if ARCH[kind] == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            t = _permute(t, HEADS if "q_proj" in hf else KV_HEADS)
        w.add_tensor(_gguf_name(hf), t)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def _copy_tokenizer(w: Any, f: dict[str, Any]) -> None:
    w.add_tokenizer_model(f["tokenizer.ggml.model"])
    w.add_tokenizer_pre(f.get("tokenizer.ggml.pre", "default"))
    w.add_token_list(f["tokenizer.ggml.tokens"]), w.add_token_types(f["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.scores" in f:
        w.add_token_scores(f["tokenizer.ggml.scores"])
    if "tokenizer.ggml.merges" in f:
        w.add_token_merges(f["tokenizer.ggml.merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("unknown", w.add_unk_token_id)):  # fmt: skip
        if f"tokenizer.ggml.{key}_token_id" in f:
            add(f[f"tokenizer.ggml.{key}_token_id"])
    if "tokenizer.ggml.add_bos_token" in f:
        w.add_add_bos_token(f["tokenizer.ggml.add_bos_token"])
    w.add_chat_template(f.get("tokenizer.chat_template") or TEMPLATE)


def tiny_hf_folder(root: Path, kind: str, *, seed: int = 0) -> Path:
    """A tiny ``kind`` Hugging Face folder at ``root`` with the real tokenizer."""
    from safetensors.numpy import save_file

    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(kind)
    n = tok.vocab_size
    config = {
        "architectures": ["Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM"],
        "model_type": ARCH[kind], "vocab_size": n, "hidden_size": DIM,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "intermediate_size": FFN, "rope_theta": THETA[kind], "rms_norm_eps": 1e-6,
        "tie_word_embeddings": kind == "qwen2", "max_position_embeddings": CONTEXT,
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    save_file(_tensors(kind, n, seed), str(root / "model.safetensors"))
    for file, data in tok.files().items():
        if file != "tokenizer-no-dummy-prefix.model":
            (root / file).write_bytes(data)
    tok_cfg: dict[str, Any] = {"chat_template": TEMPLATE, "add_bos_token": tok.bos_id is not None}
    if tok.bos_id is not None:
        tok_cfg["bos_token"] = tok.id_to_piece(tok.bos_id)
    if tok.eos_ids:
        tok_cfg["eos_token"] = tok.id_to_piece(tok.eos_ids[0])
    (root / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return root
