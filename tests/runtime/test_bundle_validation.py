"""Export the tiny Llama-3 target + Llama-2 drafter for every backend, reload, validate, break.

One module-scoped export per backend (max_seq_len 64 keeps it quick); then: greedy equality
eager == runtime == speculative through the runtime, and every kind of bad bundle is refused
before any model runs, with a message naming the file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omnidraft_deploy.bundle.folder import read_manifest
from omnidraft_deploy.bundle.manifest import BundleError

pytest.importorskip("onnxruntime")
BACKENDS = ["onnx", "xnnpack", "qnn"]


def _export(backend: str, out: Path) -> Path:
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair

    quant = {"onnx": "fp32", "xnnpack": "fp32", "qnn": "qdq-a16w8"}[backend]
    cfg = ExportConfig(
        target="tiny-llama3-8b",
        drafter="tiny-llama-68m",
        backend=backend,
        quantization=quant,
        out_dir=out,
        max_seq_len=64,
        draft_len=3,
    )
    return export_pair(cfg)


@pytest.fixture(scope="module", params=BACKENDS)
def bundle(request, tmp_path_factory) -> Path:
    if request.param == "xnnpack":
        pytest.importorskip("executorch")
    if request.param == "qnn":
        pytest.importorskip("onnxruntime_qnn")
    return _export(request.param, tmp_path_factory.mktemp(request.param) / "bundle")


def _prompts(bundle: Path) -> list[tuple[str, list[int]]]:
    from omnidraft_deploy.catalog.prompts import load_prompts
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    tok = load_tokenizer(read_manifest(bundle).graphs["target"].tokenizer)
    return [(p.task, tok.encode(p.text)[:24]) for p in load_prompts()[::3]]


def test_export_records_parity_and_validates(bundle: Path) -> None:
    from omnidraft_deploy.runtime.validate import validate_bundle

    manifest = read_manifest(bundle)
    for info in manifest.graphs.values():
        assert info.parity["max_abs_logit_diff"] <= info.parity["tolerance"]
    provider = "qnn" if manifest.backend == "qnn" else "cpu"
    report = validate_bundle(bundle, max_new_tokens=8, provider=provider)
    assert report["speculative_equal"] == report["prompts"]  # lossless through the runtime
    if manifest.graphs["target"].quantization == "fp32":
        assert report["eager_equal"] == report["prompts"]
    assert report["passed"]


def test_session_cache_is_saved_and_reloaded(bundle: Path, tmp_path: Path) -> None:
    from omnidraft_deploy.runtime.bundle import SESSION_CACHE, open_bundle
    from omnidraft_deploy.runtime.run import run_bundle

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    ids = _prompts(copy)[0][1]
    provider = "qnn" if read_manifest(copy).backend == "qnn" else "cpu"
    state = tmp_path / "state"  # session files never go into the bundle (issue 14)
    first, _ = run_bundle(open_bundle(copy, provider=provider), ids, max_new_tokens=6, state=state)
    assert (state / SESSION_CACHE).is_file() and not (copy / SESSION_CACHE).exists()
    second, _ = run_bundle(open_bundle(copy, provider=provider), ids, max_new_tokens=6, state=state)
    assert first == second


def test_cli_run_streams_text_and_step_stats(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnidraft_deploy.cli.main import main
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = read_manifest(copy)
    provider = "qnn" if manifest.backend == "qnn" else "cpu"
    prompt = "def add(a, b):"
    args = ["run", str(copy), "--prompt", prompt, "--max-new-tokens", "6", "--stats", "steps"]
    args += ["--state", str(tmp_path / "state")]
    assert main([*args, "--provider", provider]) == 0
    text, err = capsys.readouterr()  # stats go to stderr, the text alone to stdout
    stats = json.loads(err.strip().splitlines()[-1])
    assert text.startswith(prompt) and stats["n_generated"] == 6
    assert err.count("[step ") == stats["target_calls"]  # the first step is the prefill call
    tok = load_tokenizer(manifest.graphs["target"].tokenizer)
    assert len(tok.encode(text[len(prompt) :].rstrip("\n"))) > 0


def _broken(bundle: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / how
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    graph = copy / manifest["graphs"]["target"]["file"]
    if how == "missing":
        graph.unlink()
    elif how == "corrupted":
        data = bytearray(graph.read_bytes())
        data[len(data) // 2] ^= 0xFF
        graph.write_bytes(bytes(data))
    elif how == "truncated":
        graph.write_bytes(graph.read_bytes()[:1000])
    elif how == "newer_schema":
        manifest["schema_version"] = 99
        (copy / "manifest.json").write_text(json.dumps(manifest))
    elif how == "foreign_graph":  # a foreign file with a matching manifest entry
        import hashlib

        data = b"PK\x03\x04 definitely not a model" * 10
        graph.write_bytes(data)
        entry = manifest["files"][graph.name]
        entry.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        (copy / "manifest.json").write_text(json.dumps(manifest))
    elif how == "vocab_mismatch":
        manifest["graphs"]["target"]["vocab_size"] = 1000
        (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize(
    "how", ["missing", "corrupted", "truncated", "newer_schema", "foreign_graph", "vocab_mismatch"]
)
def test_bad_bundles_are_refused_naming_the_file(bundle: Path, tmp_path: Path, how: str) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle

    broken = _broken(bundle, tmp_path, how)
    with pytest.raises(BundleError) as err:
        open_bundle(broken)
    named = {"newer_schema": "manifest.json", "vocab_mismatch": "vocab_map.bin"}.get(how, "target.")
    assert named in str(err.value), str(err.value)


def test_qnn_bundle_ships_and_loads_the_htp_context(bundle: Path) -> None:
    """A qnn bundle carries each graph's precompiled EPContext model (what a phone loads without
    compiling); the runtime loads it and computes what compiling the QDQ graph computes."""
    import torch
    from omnidraft_deploy.runtime.bundle import load_model
    from omnidraft_deploy.runtime.qnn_model import qnn_model

    manifest = read_manifest(bundle)
    if manifest.backend != "qnn":
        pytest.skip("QNN bundles only")
    roles = {name: entry.role for name, entry in manifest.files.items()}
    for stem in ("drafter", "target", "drafter_decode"):
        assert roles[f"{stem}_ctx.onnx"] == roles[f"{stem}_ctx_qnn.bin"] == "htp_context"
    # the drafter's T = 1 twin: listed, verified at export, and what one-token calls run on
    assert manifest.graphs["drafter"].decode_file == "drafter_decode.onnx"
    assert roles["drafter_decode.onnx"] == "drafter_graph"
    assert manifest.graphs["target"].decode_file is None  # speculative == target-only: one graph
    decode = manifest.extras["drafter"]["qnn"]["decode"]
    assert decode["parity"]["top1_agreement"] >= 0.9 and decode["htp_cpu_nodes"] == []
    drafter = load_model(bundle, "drafter")
    assert drafter.path.name == "drafter_ctx.onnx" and drafter.graph.decode is not None
    loaded = load_model(bundle, "target")
    assert loaded.path.name == "target_ctx.onnx"
    info = manifest.graphs["target"]
    compiled = qnn_model(bundle / info.file, info)
    ids = torch.tensor(_prompts(bundle)[0][1][:8])
    torch.testing.assert_close(loaded.forward(ids, 0), compiled.forward(ids, 0), rtol=0, atol=0)
