"""Issue 28: bring your own model. ``omnidraft-export --model X`` with no ``--target`` (and
``--drafter-model Y`` with no ``--drafter``) exports the weights as they are: architecture, size,
context, tokenizer, special tokens and chat template come from the files, and the manifest names
the model by its own name and size, with no path of the exporting machine.

Tiny random models of the real architectures carry the real tokenizers (``tiny_weights``): a GGUF
and a Hugging Face folder for each of llama (Llama-2 SentencePiece), qwen2 and Llama-3. Three
exports cover the six: each pairs one kind's GGUF (target) with another kind's folder (drafter);
every source resolves to its own spec in the default run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_weights import VOCAB_GGUF, tiny_gguf, tiny_hf_folder

from omnidraft_deploy.resolve.export_inputs import InputError, resolve_export

KINDS = ("llama2", "qwen2", "llama3")
FAMILY = {"llama2": "llama", "qwen2": "qwen2", "llama3": "llama"}
ROWS = {"llama2": 32000, "qwen2": 151936, "llama3": 128256}  # GGUF rows: the vocab GGUF's table
# (target GGUF, drafter folder); the default run exports one pair (~4 min on 2 loaded cores, most
# of it the one-time GGUF dequantisation and the target-only reference), -m slow the other two
PAIRS = [("llama2", "qwen2"),
         pytest.param("qwen2", "llama3", marks=pytest.mark.slow),
         pytest.param("llama3", "llama2", marks=pytest.mark.slow)]  # fmt: skip


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory, require_asset: Callable) -> dict[str, Path]:
    """``"<kind>-gguf"`` / ``"<kind>-hf"`` -> a tiny model of that kind, as a user would have it."""
    for kind in KINDS:
        require_asset(VOCAB_GGUF[kind])
    root = tmp_path_factory.mktemp("own")
    out = {}
    for i, kind in enumerate(KINDS):
        out[f"{kind}-gguf"] = tiny_gguf(root / f"tiny-{kind}-q.gguf", kind,
                                        name=f"Tiny {kind.title()} Chat", seed=i)  # fmt: skip
        out[f"{kind}-hf"] = tiny_hf_folder(root / f"Tiny-{kind}-HF", kind, seed=10 + i)
    return out


def _resolve(tmp_path: Path, **kw: object) -> object:
    args: dict[str, object] = dict(target=None, drafter=None, model=None, drafter_model=None,
                                   out_dir=tmp_path / "out", force=False, quantization="fp32")  # fmt: skip
    return resolve_export(**(args | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["gguf", "hf"])
def test_weights_alone_resolve_to_their_own_spec(
    kind: str, form: str, weights: dict[str, Path], tmp_path: Path
) -> None:
    inputs = _resolve(tmp_path, model=str(weights[f"{kind}-{form}"]))
    t = inputs.target  # type: ignore[attr-defined]
    assert t.spec.source.value == "weights" and t.spec.family.value == FAMILY[kind]
    assert t.spec.tokenizer == kind and (t.spec.dim, t.spec.n_layers, t.spec.n_kv_heads) == (
        64,
        2,
        2,
    )
    assert t.spec.name == (f"Tiny-{kind.title()}-Chat" if form == "gguf" else f"Tiny-{kind}-HF")
    assert t.context == 512 and t.chat_template
    assert t.graph_rows == (ROWS[kind] if form == "gguf" else t.tokenizer.vocab_size)
    assert t.spec.qkv_bias is (kind == "qwen2") and t.spec.tie_embeddings is (kind == "qwen2")
    assert inputs.drafter.spec.name == "tiny-llama-68m"  # type: ignore[attr-defined]


def test_weights_with_an_unregistered_tokenizer_are_refused_naming_the_flag(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "odd"
    folder.mkdir()
    for f in weights["qwen2-hf"].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["model"]["vocab"] = {k: (v + 1) % 151643 for k, v in doc["model"]["vocab"].items()}
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="none of the registered tokenizers") as e:
        _resolve(tmp_path, drafter_model=str(folder))
    assert e.value.flag == "--drafter-model"


@pytest.mark.parametrize(("target", "drafter"), PAIRS)
def test_export_from_weights_alone(
    target: str, drafter: str, weights: dict[str, Path], tmp_path: Path
) -> None:
    """The issue's command on tiny files: no --target, no --drafter; the bundle opens (the
    export's opener) and its manifest names both models by their own names, with no path."""
    from omnidraft_deploy.runtime.bundle import open_bundle

    from omnidraft_deploy.cli.main import export_main

    out = tmp_path / "b"
    argv = ["--model", str(weights[f"{target}-gguf"]), "--drafter-model",
            str(weights[f"{drafter}-hf"]), "--backend", "onnx", "--out", str(out), "--no-verify"]  # fmt: skip
    assert export_main(argv) == 0
    text = (out / "manifest.json").read_text()
    assert str(tmp_path) not in text and '"/' not in text  # no absolute path anywhere
    manifest = json.loads(text)
    graphs, extras = manifest["graphs"], manifest["extras"]
    assert graphs["target"]["preset"] == f"Tiny-{target.title()}-Chat"
    assert graphs["drafter"]["preset"] == f"Tiny-{drafter}-HF"
    assert (graphs["target"]["family"], graphs["drafter"]["family"]) == (
        FAMILY[target],
        FAMILY[drafter],
    )
    assert graphs["target"]["max_seq_len"] == 512  # the models' own context (tiny: 512)
    t, d = extras["target_model"], extras["drafter_model"]
    assert (t["name"], t["size"], t["architecture"]) == (
        f"Tiny {target.title()} Chat",
        "1M",
        FAMILY[target],
    )
    assert t["file"] == f"tiny-{target}-q.gguf" and len(t["sha256"]) == 64
    assert (d["name"], d["file"], d["architecture"]) == (f"Tiny-{drafter}-HF",) * 2 + (
        FAMILY[drafter],
    )
    assert d["size"].endswith("M") and len(d["sha256"]) == 64
    for role in ("target", "drafter"):
        assert f"{role}_tokenizer/chat_template.jinja" in manifest["files"]
    bundle = open_bundle(out)
    assert (
        bundle.mapper.target_vocab_size
        == json.loads((out / "target_tokenizer/special_tokens.json").read_text())["vocab_size"]
    )


@pytest.mark.parametrize(
    ("contexts", "requested", "slots", "said"),
    [((32768, 8192), None, 4096, "capped at 4096"), ((512, 8192), None, 512, "context 512;"),
     ((32768, 8192), 6000, 6000, "as asked"), ((2048, 2048), 4096, 4096, "beyond the models'")],
)  # fmt: skip
def test_default_context_is_the_models_capped_by_a_budget(
    contexts: tuple[int, int], requested: int | None, slots: int, said: str, tmp_path: Path
) -> None:
    """Qwen2.5-Coder-1.5B (32,768 positions) + SmolLM2-135M (8,192): 4,096 slots, 404 MiB."""
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.context import choose_max_seq_len
    from omnidraft_deploy.resolve.export_inputs import ExportInputs, RoleInputs

    pairs = zip(("target", "drafter"), ("qwen2.5-1.5b", "smollm2-135m"), contexts, strict=True)
    roles = [RoleInputs(r, get_preset(p), None, None, 1, 1, None, c)  # type: ignore[arg-type]
             for r, p, c in pairs]  # fmt: skip
    inputs = ExportInputs(*roles, out_dir=tmp_path, replaces_bundle=False)
    got, note = choose_max_seq_len(inputs, requested)
    assert got == slots and said in note and f"x {slots} slots" in note
    if slots == 4096:
        assert "101.0 KiB per slot" in note and "= 404 MiB" in note
