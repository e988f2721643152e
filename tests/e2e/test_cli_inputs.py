"""Issue 14: the weights are the truth, and nothing of the user's is deleted.

Every input of ``omnidraft-export`` is checked before any export work (``inputs.resolve_export``):
tiny random models of the real architectures carry the real tokenizers (Qwen2 / Llama-3
``tokenizer.json``, the Qwen2 GGUF vocabulary), so the mismatch of the issue's reproducer (Qwen
weights exported under the default preset's Llama-3 tokenizer) is refused in the default run; the
real GGUFs repeat it under ``-m slow``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from omnidraft_deploy.resolve.export_inputs import (
    InputError,
    check_out_dir,
    resolve_export,
    resolve_role,
)


def tiny_hf_folder(
    root: Path, preset: str, tokenizer_json: Path | None, *, vocab_rows: int | None = None,
    model_type: str | None = None,
) -> Path:  # fmt: skip
    """A Hugging Face folder: config.json + random safetensors of ``preset`` (+ tokenizer.json)."""
    from safetensors.torch import save_file

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.reference.model import build_model

    spec = get_preset(preset)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": model_type or spec.family.value, "vocab_size": vocab_rows or spec.vocab_size,
        "hidden_size": spec.dim, "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads,
        "intermediate_size": spec.intermediate_size, "rope_theta": spec.rope_theta,
        "rms_norm_eps": spec.norm_eps, "tie_word_embeddings": spec.tie_embeddings,
        "max_position_embeddings": 512,
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    if vocab_rows is None:
        state = build_model(spec, seed=0, max_seq_len=64).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(root / "model.safetensors"))
    if tokenizer_json is not None:
        (root / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return root


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory: pytest.TempPathFactory, require_asset: Callable) -> Path:
    tok = require_asset("qwen2-tokenizer-json")
    return tiny_hf_folder(tmp_path_factory.mktemp("w") / "tiny-qwen2", "tiny-qwen2-7b", tok)


def _resolve(tmp_path: Path, **kw: object) -> object:
    args: dict[str, object] = dict(target=None, drafter="tiny-llama-68m", model=None,
                                   drafter_model=None, out_dir=tmp_path / "out", force=False,
                                   quantization="fp32")  # fmt: skip
    return resolve_export(**(args | kw))  # type: ignore[arg-type]


def test_qwen_weights_under_llama3_preset_refused(tmp_path: Path, qwen_folder: Path) -> None:
    """Named with a preset of another vocabulary, weights are refused; without --target they
    are their own spec (issue 28, tests/e2e/test_byom.py)."""
    with pytest.raises(InputError) as e:
        _resolve(tmp_path, target="tiny-llama3-8b", model=str(qwen_folder))
    msg = str(e.value)
    assert e.value.flag == "--model"
    assert "qwen2" in msg and "--target tiny-llama3-8b" in msg
    assert not (tmp_path / "out").exists()  # nothing was written
    own = _resolve(tmp_path, model=str(qwen_folder)).target  # type: ignore[attr-defined]
    assert (own.spec.name, own.spec.tokenizer, own.spec.family.value) == (
        "tiny-qwen2",
        "qwen2",
        "qwen2",
    )


def test_qwen_tokenizer_under_qwen_preset_accepted(tmp_path: Path, qwen_folder: Path) -> None:
    r = resolve_role("target", "tiny-qwen2-7b", str(qwen_folder))
    assert r.weights == str(qwen_folder) and r.graph_rows == 152064
    # the folder's own tokenizer.json is used; its ids extend the preset's qwen2 tokenizer
    assert r.tokenizer.vocab_size >= 151646 and r.tokenizer.name == "tiny-qwen2"
    assert r.tokenizer.encode("def fib(n):") == [750, 15801, 1445, 1648]


def test_llama3_tokenizer_in_qwen_weights_refused(tmp_path: Path, require_asset: Callable) -> None:
    folder = tiny_hf_folder(tmp_path / "m", "tiny-qwen2-7b", require_asset("llama3-tokenizer-json"),
                            vocab_rows=152064)  # fmt: skip
    with pytest.raises(InputError, match=r"token \d+ is .* in the weights but .* in qwen2"):
        resolve_role("target", "tiny-qwen2-7b", str(folder))


def test_graph_rows_must_equal_tokenizer_ids(tmp_path: Path, require_asset: Callable) -> None:
    """``>`` is not enough: 160,000 rows for 151,6xx ids is no documented padding."""
    tok = require_asset("qwen2-tokenizer-json")
    folder = tiny_hf_folder(tmp_path / "m", "tiny-qwen2-7b", tok, vocab_rows=160000)
    with pytest.raises(InputError, match="160000 vocabulary rows") as e:
        resolve_role("target", "tiny-qwen2-7b", str(folder))
    assert e.value.flag == "--model"


def test_family_disagreement_refused(tmp_path: Path, require_asset: Callable) -> None:
    tok = require_asset("llama3-tokenizer-json")
    folder = tiny_hf_folder(tmp_path / "m", "tiny-llama3-8b", tok, model_type="qwen2",
                            vocab_rows=128256)  # fmt: skip
    with pytest.raises(InputError, match="is a qwen2 model, but --target tiny-llama3-8b"):
        resolve_role("target", "tiny-llama3-8b", str(folder))


def test_qwen2_gguf_vocabulary_refused_under_llama3(require_asset: Callable) -> None:
    """A real Qwen2 GGUF (the vocabulary-only file llama.cpp ships: header, no tensors)."""
    gguf = require_asset("vocab-qwen2-gguf")
    with pytest.raises(InputError, match="carries its own qwen2 tokenizer") as e:
        resolve_role("target", "tiny-llama3-8b", str(gguf), default_preset=True)
    assert "'qwen2' tokenizer" not in str(e.value) and "llama3" in str(e.value)


def test_missing_weights_fail_fast_naming_model(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        _resolve(tmp_path, target="llama3-8b")
    assert e.value.flag == "--model" and "--target tiny-llama3-8b" in str(e.value)
    with pytest.raises(InputError) as e:
        _resolve(tmp_path, model=str(tmp_path / "nope.gguf"))
    assert e.value.flag == "--model" and "no such file or folder" in str(e.value)
    assert time.perf_counter() - t0 < 5


def test_unknown_preset_names_flag(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        _resolve(tmp_path, drafter="nope")
    assert e.value.flag == "--drafter" and "choose from" in str(e.value)


# --- --out: never delete what is not ours ---------------------------------------------------


def test_out_foreign_folder_refused_and_untouched(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    for force in (False, True):
        with pytest.raises(InputError, match="not an omnidraft bundle") as e:
            check_out_dir(out, force=force)
        assert e.value.flag == "--out"
    assert (out / "precious.txt").read_text() == "keep me"


def test_out_bundle_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "format": "omnidraft-bundle",
                "schema_version": 1,
                "backend": "onnx",
                "draft_len": 4,
                "mapping_hash": "",
                "graphs": {},
                "files": {},
            }
        )  # fmt: skip
    )
    with pytest.raises(InputError, match="--force"):
        check_out_dir(out, force=False)


def test_out_new_or_empty_ok(tmp_path: Path) -> None:
    assert check_out_dir(tmp_path / "new", force=False) is False
    (tmp_path / "empty").mkdir()
    assert check_out_dir(tmp_path / "empty", force=False) is False
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        check_out_dir(tmp_path / "file", force=True)


@pytest.mark.slow
def test_real_qwen_gguf_refused_under_llama3_preset(
    tmp_path: Path, require_asset: Callable
) -> None:
    """The issue's reproducer with the real Qwen2.5-Coder-0.5B GGUF: refused before export."""
    gguf = require_asset("qwen2.5-0.5b-gguf")
    with pytest.raises(InputError, match=r"carries its own qwen2 tokenizer .*\(qwen2.5-0.5b\)"):
        _resolve(tmp_path, target="tiny-llama3-8b", model=str(gguf))
    assert not (tmp_path / "out").exists()
    r = resolve_role("target", "qwen2.5-0.5b", str(gguf))
    assert (r.graph_rows, r.tokenizer.vocab_size) == (151936, 151665)  # [PAD151665..] rows
    assert r.chat_template and "<|im_start|>" in r.chat_template
    d = resolve_role("drafter", "smollm2-135m", str(require_asset("smollm2-135m-gguf")))
    assert d.tokenizer.eos_ids == (2, 0) and d.graph_rows == d.tokenizer.vocab_size == 49152


def test_llama31_rope_scaling_folder_accepted_and_loaded_scaled(
    tmp_path: Path, require_asset: Callable
) -> None:
    """Issue 14: a Llama-3.1/3.2 folder (``rope_type: llama3``) was refused; now it resolves and
    loads with its scaling (parity with transformers: tests/core/test_rope.py)."""
    from omnidraft_deploy.reference.hf_adapter import load_model
    from omnidraft_deploy.reference.rope import RopeScaling

    folder = tiny_hf_folder(tmp_path / "llama31", "tiny-llama3-8b",
                            require_asset("llama3-tokenizer-json"))  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    r = resolve_role("target", "tiny-llama3-8b", str(folder))
    assert r.weights == str(folder)
    model, _ = load_model(folder, max_seq_len=64)
    assert model.args.rope_scaling == RopeScaling(factor=8.0)
