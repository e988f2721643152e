"""Real-weight loading: parity with transformers' own Llama/Qwen2 (tiny, in-process) and real GGUFs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from omnidraft_deploy.catalog.presets import Family  # noqa: E402
from omnidraft_deploy.reference import hf_adapter  # noqa: E402
from omnidraft_deploy.reference.model import Transformer  # noqa: E402

TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip


def _hf_tiny(kind: str, folder: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**TINY, rope_theta=5e5, rms_norm_eps=1e-5)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**TINY, rope_theta=1e6, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # HF zero-inits biases and ones-inits norms: make every weight matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval().save_pretrained(folder)
    return model


def _hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()  # (1, T, V)


def _ours_incremental(model: Transformer, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    rows = [model(ids[:, :prefill], torch.arange(prefill))]
    for p in range(prefill, ids.shape[1]):
        rows.append(model(ids[:, p : p + 1], torch.tensor([p])))
    return torch.cat(rows, dim=1)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_parity_with_transformers(kind: str, tmp_path: Path) -> None:
    hf = _hf_tiny(kind, tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(1))
    ours, info = hf_adapter.load_model(tmp_path, max_seq_len=64)
    assert info.family is (Family.QWEN2 if kind == "qwen2" else Family.LLAMA)
    assert ours.args.qkv_bias == (kind == "qwen2") and ours.args.n_kv_heads == 2
    assert ours.args.rope_theta == (1e6 if kind == "qwen2" else 5e5)
    if kind == "qwen2":  # tied: one tensor
        assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    want = _hf_logits(hf, ids)
    with torch.no_grad():
        full = ours(ids, torch.arange(ids.shape[1]))
        torch.testing.assert_close(full, want, atol=1e-4, rtol=0)
        ours.reset_cache()
        torch.testing.assert_close(_ours_incremental(ours, ids, 7), want, atol=1e-4, rtol=0)
        torch.testing.assert_close(ours.forward_train(ids), want, atol=1e-4, rtol=0)


def test_bf16_load_is_close(tmp_path: Path) -> None:
    hf = _hf_tiny("llama", tmp_path)
    ours, info = hf_adapter.load_model(tmp_path, dtype=torch.bfloat16, max_seq_len=32)
    assert info.dtype is torch.bfloat16
    assert {t.dtype for t in [*ours.parameters(), *ours.buffers()]} == {torch.bfloat16}
    ids = torch.arange(1, 17).view(1, 16)
    with torch.no_grad():
        got = ours(ids, torch.arange(16)).float()
    assert (got - _hf_logits(hf, ids)).abs().max() < 0.1


def test_config_conversion_rejects_what_the_model_cannot_run() -> None:
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100}  # fmt: skip
    fam, args = hf_adapter.args_from_config({**base, "rope_theta": 5e5})  # transformers 4 layout
    assert fam is Family.LLAMA and args.rope_theta == 5e5 and args.n_kv_heads == 4
    with pytest.raises(ValueError, match="rope_type 'llama3'"):
        hf_adapter.args_from_config({**base, "rope_parameters": {"rope_type": "llama3"}})
    with pytest.raises(ValueError, match="model_type 'gemma'"):
        hf_adapter.args_from_config({**base, "model_type": "gemma"})
    with pytest.raises(ValueError, match="head_dim 32"):
        hf_adapter.args_from_config({**base, "head_dim": 32})


def test_bad_sources_fail_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf_adapter.load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a hub id"):
        hf_adapter.load_model(tmp_path / "missing" / "x" / "y")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="No hub is reachable offline"):
        hf_adapter.load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ValueError, match="random-init"):
        hf_adapter.load_preset_weights("tiny-llama-68m")


def _greedy(model: Transformer, ids: list[int], n: int) -> list[int]:
    out: list[int] = []
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), torch.arange(len(ids)))
        for i in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits = model(torch.tensor([[out[-1]]]), torch.tensor([len(ids) + i]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "tok_name"), [("smollm2-135m", "smollm2"),
                                                  ("qwen2.5-0.5b", "qwen2")])  # fmt: skip
def test_real_gguf_parity_and_greedy_text(
    preset: str, tok_name: str, require_asset: Callable[[str], Path]
) -> None:
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    require_asset(get_preset(preset).gguf_asset or "")
    ours, info = hf_adapter.load_preset_weights(preset, max_seq_len=128)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(info.weights_dir)).eval()
    tok = load_tokenizer(tok_name)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt)
    with torch.no_grad():
        want = _hf_logits(hf, torch.tensor([ids]))
        got = ours(torch.tensor([ids]), torch.arange(len(ids)))
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    ours.reset_cache()
    text = tok.decode(_greedy(ours, ids, 8))
    assert "Paris" in text, text
