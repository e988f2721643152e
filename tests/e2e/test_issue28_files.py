"""Issue 28, safety and honesty of files: one regression test per case the issue found.

- ``--force`` replaced a folder holding a copied ``manifest.json`` and a user's ``notes.txt``
  (and any extra file put into a real bundle): now refused, naming the file, nothing touched;
- a vocabulary map smaller than the target tokenizer opened, then refused every real prompt; a map
  whose target tokens have no drafter spelling opened, then failed blaming ``drafter.onnx``: both
  refused at open, naming ``vocab_map.bin``;
- a manifest without ``schema_version`` or ``created_by`` took defaults: refused;
- ``encode("abc\\ud800def")`` raised the tokenizers library's ``TypeError``: a clear ``ValueError``;
- a prompt longer than the context is refused by ``omnidraft run`` before any graph runs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.manifest import BundleError, Manifest
from omnidraft_deploy.cli.main import export_main, main
from omnidraft_deploy.vocab import io as vocab_io
from omnidraft_deploy.vocab.mapper import VocabMapper

pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIDRAFT_STATE", str(tmp_path / "state"))


def _export_force(out: Path) -> int:
    return export_main(["--backend", "onnx", "--out", str(out), "--force", "--no-verify"])


def test_force_refuses_a_copied_manifest_beside_notes(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    shutil.copyfile(cli_bundle / "manifest.json", out / "manifest.json")
    (out / "notes.txt").write_text("keep me")
    assert _export_force(out) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "notes.txt" in err and "does not list" in err
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt"]


def test_force_refuses_a_bundle_holding_an_extra_file(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b"
    shutil.copytree(cli_bundle, out)
    (out / "target_tokenizer" / "my-notes.md").write_text("mine")
    assert _export_force(out) == 2
    assert "target_tokenizer/my-notes.md" in capsys.readouterr().err
    assert (out / "target_tokenizer" / "my-notes.md").read_text() == "mine"


def _with_map(bundle: Path, out: Path, mapper: VocabMapper) -> Path:
    """A copy of ``bundle`` holding ``mapper`` as its (relisted, rehashed) vocabulary map."""
    shutil.copytree(bundle, out)
    (out / "vocab_map.bin").write_bytes(vocab_io.to_bytes(mapper))
    doc = json.loads((out / "manifest.json").read_text())
    entry = file_entry(out, "vocab_map.bin", "vocab_map")
    doc["files"]["vocab_map.bin"].update(sha256=entry.sha256, size=entry.size)
    doc["mapping_hash"] = mapper.content_hash()
    (out / "manifest.json").write_text(json.dumps(doc))
    return out


def _cut(m: VocabMapper, n: int) -> VocabMapper:
    """``m`` with only its first ``n`` target ids (a map built for a smaller tokenizer)."""
    offsets = m.target_to_draft_offsets[: n + 1]
    d2t = torch.where(m.draft_to_target < n, m.draft_to_target, -1)
    return VocabMapper(d2t, offsets, m.target_to_draft_flat[: int(offsets[-1])],
                       draft_eos=m.draft_eos, target_eos=tuple(t for t in m.target_eos if t < n),
                       roles=tuple(r for r in m.roles if r[2] < n))  # fmt: skip


def _unspelled(m: VocabMapper) -> VocabMapper:
    """``m`` with every target id's drafter spelling empty."""
    empty = torch.zeros(m.target_vocab_size + 1, dtype=torch.int64)
    return VocabMapper(m.draft_to_target, empty, torch.zeros(0, dtype=torch.int64),
                       draft_eos=m.draft_eos, target_eos=m.target_eos, roles=m.roles)  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "message"),
    [(lambda m: _cut(m, 1000), "target side has 1000 ids but the bundle's target tokenizer"),
     (_unspelled, "have no drafter spelling")],
)  # fmt: skip
def test_opener_checks_the_map_against_the_tokenizers(
    cli_bundle: Path, tmp_path: Path, edit: object, message: str
) -> None:
    from omnidraft_deploy.runtime.bundle import check_bundle

    mapper = vocab_io.load(cli_bundle / "vocab_map.bin")
    bad = _with_map(cli_bundle, tmp_path / "b", edit(mapper))  # type: ignore[operator]
    with pytest.raises(BundleError, match=message) as e:
        check_bundle(bad)
    assert e.value.path == str(bad / "vocab_map.bin")


@pytest.mark.parametrize("field", ["schema_version", "created_by"])
def test_manifest_without_schema_version_or_created_by_is_refused(
    cli_bundle: Path, field: str
) -> None:
    doc = json.loads((cli_bundle / "manifest.json").read_text())
    del doc[field]
    with pytest.raises(BundleError, match=f"field {field}: missing") as e:
        Manifest.from_json(json.dumps(doc), source="b/manifest.json")
    assert str(e.value).startswith("b/manifest.json: ")


@pytest.mark.parametrize("name", ["llama2", "llama3", "qwen2"])
def test_lone_surrogate_is_a_clear_value_error(name: str) -> None:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    with pytest.raises(ValueError, match=r"lone surrogate '\\ud800' at character 3"):
        load_tokenizer(name).encode("abc\ud800def")


def test_run_refuses_a_prompt_longer_than_the_context_before_any_graph_runs(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cli_bundle`` holds 48 KV slots; nothing is profiled or grown for the refused prompt."""
    state = tmp_path / "s"
    assert main(["run", str(cli_bundle), "--prompt", "word " * 80, "--state", str(state)]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"a prompt of \d\d+ tokens does not fit the target's capacity of 48 tokens", err
    )
    assert not (state / "cost_profile.json").exists()
    assert not (state / "ngram_cache.session.bin").exists()
