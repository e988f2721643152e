"""Llama-3.x RoPE scaling (``rope_type: llama3``) against transformers' own implementation.

A tiny random Llama whose scaling covers all three bands (kept, smoothed, slowed) for head_dim 16:
with theta 5e5 the wavelengths are 6.3, 32.4, 167, 862, ... and ``original`` 128 with
low/high_freq_factor 1/4 puts the band edges at 32 and 128. Issue 14 (Llama-3.1/3.2 refused).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnidraft_deploy.reference import rope

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

SCALING = rope.RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=128)  # fmt: skip
TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)  # fmt: skip
THETA = 5e5


def _hf_config() -> object:
    return transformers.LlamaConfig(**TINY, rope_parameters=SCALING.to_config(THETA))


def test_inverse_frequencies_equal_transformers() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    want, _ = ROPE_INIT_FUNCTIONS["llama3"](_hf_config(), "cpu")
    got = rope.inv_frequencies(16, THETA, SCALING)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    plain = rope.inv_frequencies(16, THETA)
    ratio = (plain / got).tolist()
    assert ratio[0] == 1.0 and 1.0 < ratio[1] < 8.0 and ratio[2:] == pytest.approx([8.0] * 6)


def test_scaled_model_matches_transformers_logits(tmp_path: Path) -> None:
    from omnidraft_deploy.reference import hf_adapter

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(_hf_config())
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.eval().save_pretrained(tmp_path)
    ids = torch.randint(0, 320, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids).logits.float()
    ours, _ = hf_adapter.load_model(tmp_path, max_seq_len=64)
    assert ours.args.rope_scaling == SCALING
    with torch.no_grad():
        got = ours(ids, torch.arange(40))
        unscaled = ours.__class__(ours.args.__class__(**{**vars(ours.args), "rope_scaling": None}))
        unscaled.load_state_dict(ours.state_dict(), strict=False)
        plain = unscaled(ids, torch.arange(40))
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
    assert (plain - want).abs().max() > 1e-2  # the scaling matters at these positions


@pytest.mark.parametrize("kind", ["linear", "yarn", "dynamic"])
def test_other_scalings_are_refused_by_name(kind: str) -> None:
    cfg = {"rope_scaling": {"type": kind, "factor": 2.0}, "max_position_embeddings": 64}
    with pytest.raises(ValueError, match=f"rope_type '{kind}' not supported"):
        rope.scaling_from_config(cfg)
    assert rope.scaling_from_config({"rope_parameters": {"rope_type": "default"}}) is None


def test_gguf_rope_freqs_become_the_llama3_numbers() -> None:
    """llama.cpp stores ``inv_freq / inv_freq_scaled`` as ``rope_freqs.weight``."""
    head_dim, theta = 128, 5e5
    real = rope.RopeScaling(factor=32.0)  # Llama-3.2's numbers
    factors = rope.inv_frequencies(head_dim, theta) / rope.inv_frequencies(head_dim, theta, real)
    assert rope.llama3_from_freq_factors(factors.tolist(), head_dim, theta) == real
    bent = factors.clone()
    bent[20] *= 1.01
    with pytest.raises(ValueError, match="not Llama-3 scaling"):
        rope.llama3_from_freq_factors(bent.tolist(), head_dim, theta)
    with pytest.raises(ValueError, match="head_dim 64 needs 32"):
        rope.llama3_from_freq_factors(factors.tolist(), 64, theta)


def _tiny_llama_gguf(path: Path, freq_factors: torch.Tensor) -> None:
    """A random 2-layer Llama GGUF (F32) carrying llama.cpp's ``rope_freqs.weight``."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    vocab, dim, heads, kv, ff = 320, 64, 4, 2, 128
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(1024), w.add_embedding_length(dim), w.add_block_count(2)
    w.add_feed_forward_length(ff), w.add_head_count(heads), w.add_head_count_kv(kv)
    w.add_rope_freq_base(THETA), w.add_layer_norm_rms_eps(1e-5), w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2"), w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_types([1] * vocab), w.add_token_merges([])
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (vocab, dim), "output": (vocab, dim)}
    for i in range(2):
        shapes |= {f"blk.{i}.attn_q": (dim, dim), f"blk.{i}.attn_k": (kv * 16, dim),
                   f"blk.{i}.attn_v": (kv * 16, dim), f"blk.{i}.attn_output": (dim, dim),
                   f"blk.{i}.ffn_gate": (ff, dim), f"blk.{i}.ffn_up": (ff, dim),
                   f"blk.{i}.ffn_down": (dim, ff)}  # fmt: skip
    for name, shape in shapes.items():
        w.add_tensor(f"{name}.weight", (rng.standard_normal(shape) * 0.05).astype(np.float32))
    for name in ["output_norm"] + [f"blk.{i}.{n}_norm" for i in range(2) for n in ("attn", "ffn")]:
        w.add_tensor(f"{name}.weight", np.ones(dim, np.float32))
    w.add_tensor("rope_freqs.weight", freq_factors.numpy().astype(np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def test_gguf_rope_freqs_reach_the_loaded_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' GGUF reader drops ``rope_freqs``; the dequantised folder keeps the scaling."""
    from omnidraft_deploy.reference import hf_adapter

    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "cache"))
    real = rope.RopeScaling(factor=8.0)  # Llama-3.1's numbers; head_dim 16 still has all 3 bands
    divisors = rope.inv_frequencies(16, THETA) / rope.inv_frequencies(16, THETA, real)
    assert divisors[0] == 1.0 and 1.0 < divisors[4] < 8.0 and divisors[-1] == pytest.approx(8.0)
    _tiny_llama_gguf(tmp_path / "tiny.gguf", divisors)
    ours, info = hf_adapter.load_model(tmp_path / "tiny.gguf", max_seq_len=64)
    assert info.dequantised_now and ours.args.rope_scaling == real
    hf = transformers.LlamaForCausalLM.from_pretrained(str(info.weights_dir)).eval()
    ids = torch.randint(0, 320, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, torch.arange(40)), hf(input_ids=ids).logits,
                                   atol=2e-4, rtol=1e-4)  # fmt: skip
