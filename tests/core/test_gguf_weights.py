"""GGUF -> HF weights (``reference.gguf_weights``) against the references: the ``gguf`` package's
reader + dequantize for every weight type the real models use, and transformers' own GGUF loader
(the former conversion path) for whole models: tiny ones here, the real ones in the slow test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from omnidraft_deploy.reference import gguf_weights  # noqa: E402
from omnidraft_deploy.vocab.gguf_meta import read_gguf_header  # noqa: E402

Q = gguf.GGMLQuantizationType
# SmolLM2-135M: Q4_1, Q8_0, F32; Qwen2.5-Coder-0.5B: Q5_0, Q8_0, Q4_K, Q6_K, F32; F16/BF16: others
QUANTISED = (Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.BF16)  # the gguf package quantises these in numpy
RAW = (Q.Q4_K, Q.Q6_K)  # these it only dequantises: random blocks stand in
VOCAB, DIM, LAYERS, HEADS, KV_HEADS, FFN = 320, 64, 2, 4, 2, 128


def _blocks(rng: np.random.Generator, qtype: Any, rows: int, cols: int) -> np.ndarray:
    if qtype in RAW:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
        return raw  # some fp16 scales are inf/nan: compared with NaNs equal
    return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)


@pytest.mark.parametrize("alignment", [32, 64])
def test_every_weight_type_as_the_gguf_reader_dequantises_it(tmp_path: Path,
                                                             alignment: int) -> None:  # fmt: skip
    rng = np.random.default_rng(alignment)
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal(7).astype(np.float16))
    for i, qtype in enumerate((*QUANTISED, *RAW)):
        rows = 3 + i  # odd sizes move the offsets off the block grid
        w.add_tensor(qtype.name, _blocks(rng, qtype, rows, 512), raw_dtype=qtype)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    h = read_gguf_header(path)
    ref = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert set(h.layout) == set(ref)
    for name, t in ref.items():
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        got = gguf_weights.tensor_array(h, name)
        assert got.dtype == np.float32 and got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want, err_msg=name)  # NaN == NaN here


def _tiny_gguf(path: Path, arch: str, *, tied: bool, qtype: Any) -> Path:
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}"), w.add_context_length(256), w.add_embedding_length(DIM)
    w.add_block_count(LAYERS), w.add_feed_forward_length(FFN), w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS), w.add_rope_freq_base(1e6), w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB), w.add_bos_token_id(1), w.add_eos_token_id(2)
    kv = KV_HEADS * DIM // HEADS
    shapes = {"token_embd": (VOCAB, DIM)} | ({} if tied else {"output": (VOCAB, DIM)})
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_q": (DIM, DIM), f"blk.{i}.attn_k": (kv, DIM),
                   f"blk.{i}.attn_v": (kv, DIM), f"blk.{i}.attn_output": (DIM, DIM),
                   f"blk.{i}.ffn_gate": (FFN, DIM), f"blk.{i}.ffn_up": (FFN, DIM),
                   f"blk.{i}.ffn_down": (DIM, FFN)}  # fmt: skip
    for name, (rows, cols) in shapes.items():
        w.add_tensor(f"{name}.weight", _blocks(rng, qtype, rows, cols), raw_dtype=qtype)
    norms = [f"blk.{i}.{n}_norm" for i in range(LAYERS) for n in ("attn", "ffn")]
    vectors = ["output_norm", *norms]
    if arch == "qwen2":
        vectors += [f"blk.{i}.attn_{p}" for i in range(LAYERS) for p in "qkv"]
    for name in vectors:
        n = kv if name.endswith(("attn_k", "attn_v")) else DIM
        suffix = "bias" if "_norm" not in name else "weight"
        w.add_tensor(f"{name}.{suffix}", (1 + rng.standard_normal(n) * 0.1).astype(np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def _transformers_state(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """What the former conversion saved: transformers' model from the GGUF, its state, config."""
    import torch

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state, hf.config.to_dict()


def _assert_same_model(path: Path) -> None:
    h = read_gguf_header(path)
    want, want_cfg = _transformers_state(path)
    got = gguf_weights.hf_state_dict(h)
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    cfg = gguf_weights.hf_config(h)
    assert {k: want_cfg.get(k) for k in cfg if k != "architectures"} == {
        k: v for k, v in cfg.items() if k != "architectures"
    }


@pytest.mark.parametrize(("arch", "tied", "qtype"), [("llama", False, Q.Q4_1),
                                                     ("qwen2", True, Q.Q5_0)])  # fmt: skip
def test_tiny_models_equal_what_transformers_loads(tmp_path: Path, arch: str, tied: bool,
                                                   qtype: Any) -> None:  # fmt: skip
    """Names, llama's q/k rows permuted back, the tied head, config fields: value for value."""
    _assert_same_model(_tiny_gguf(tmp_path / f"{arch}.gguf", arch, tied=tied, qtype=qtype))


def test_the_cached_folder_loads_in_transformers_and_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from omnidraft_deploy.reference import hf_adapter

    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "cache"))
    path = _tiny_gguf(tmp_path / "m.gguf", "llama", tied=True, qtype=Q.Q8_0)
    ours, info = hf_adapter.load_model(path, max_seq_len=64)
    assert info.dequantised_now and not hf_adapter.load_model(path)[1].dequantised_now
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(info.weights_dir)).eval()
    ids = torch.arange(3, 40).view(1, -1)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, torch.arange(ids.shape[1])), hf(input_ids=ids).logits,
                                   atol=1e-4, rtol=0)  # fmt: skip


def test_bad_files_are_named(tmp_path: Path) -> None:
    path = _tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=True, qtype=Q.Q8_0)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"cut\.gguf: tensor .* runs past the end"):
        gguf_weights.hf_state_dict(read_gguf_header(cut))
    other = tmp_path / "gemma.gguf"
    w = gguf.GGUFWriter(str(other), "gemma")
    w.add_tensor("blk.0.attn_post_norm.weight", np.ones(4, np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match=r"gemma\.gguf: GGUF architecture 'gemma' not supported"):
        gguf_weights.hf_config(read_gguf_header(other))
    with pytest.raises(ValueError, match=r"attn_post_norm.weight has no place in a gemma model"):
        gguf_weights.hf_name(read_gguf_header(other), "blk.0.attn_post_norm.weight")


@pytest.mark.slow
@pytest.mark.parametrize("asset", ["smollm2-135m-gguf", "qwen2.5-0.5b-gguf"])
def test_real_ggufs_equal_what_transformers_loads(
    asset: str, require_asset: Callable[[str], Path]
) -> None:
    """SmolLM2-135M (Q4_1, Q8_0; llama: q/k permuted) and Qwen2.5-Coder-0.5B (Q5_0, Q8_0, Q4_K,
    Q6_K; untied head): every tensor bit-identical to transformers' (0.5B: ~6 GB at the peak)."""
    folder = require_asset(asset)
    _assert_same_model(next(folder.glob("*.gguf")) if folder.is_dir() else folder)
