"""One drafter for many targets (issue 30): one bundle, three tiny twins of three vocabularies.

The bundle (``tests/conftest.py`` ``multi_bundle``) is exported once through ``omnidraft-export --target A,B,C`` (as a user types it) and
checked as a user would: ``omnidraft validate`` decodes every target speculatively and
target-only against its recorded reference; ``run`` needs ``--target`` and lists the targets when
it is missing or unknown; the drafter graph is stored once and the export reports the bytes it
saved; a damaged file of one target refuses the bundle naming that file; single-target bundles
(schema 1) open as before; targets of one vocabulary share one map file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

TARGETS = ("tiny-llama3-8b", "tiny-qwen2-7b", "tiny-vicuna-7b")  # conftest's MULTI_TARGETS


@pytest.fixture(scope="module")
def multi(multi_bundle: Path) -> Path:
    """The session's multi-target bundle (``tests/conftest.py``), exported once."""
    return multi_bundle


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _linked_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=os.link)  # cheap: the graphs are hard links
    return dst


def test_every_target_decodes_exactly_as_its_target_alone(multi: Path, tmp_path: Path) -> None:
    from omnidraft_deploy.cli.main import main

    state = tmp_path / "state"
    assert main(["validate", str(multi), "--max-new-tokens", "8", "--state", str(state)]) == 0
    for name in TARGETS:  # one report per target, each in the target's own session folder
        report = json.loads((state / "targets" / name / "validation.json").read_text())
        assert report["target"] == name and report["passed"]
        n = report["prompts"]
        assert n >= 10 and report["speculative_equal"] == n and report["eager_equal"] == n


def test_the_drafter_is_stored_once_and_the_bytes_saved_are_reported(
    multi: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = _manifest(multi)
    assert m["schema_version"] == 2 and set(m["graphs"]) == {"drafter"}
    assert sorted(m["targets"]) == sorted(TARGETS)
    drafter_graphs = [r for r, e in m["files"].items() if e["role"] == "drafter_graph"]
    assert drafter_graphs == ["drafter.onnx"]
    assert not [r for r in m["files"] if r.startswith("targets/") and "drafter" in r]
    assert not (multi / ".separate").exists()  # the separate bundles are gone
    sharing = m["extras"]["sharing"]
    listed = sum(e["size"] for e in m["files"].values())
    assert sharing["bundle_bytes"] == listed
    assert sharing["separate_bytes"] == sum(sharing["separate_bundle_bytes"].values())
    assert sharing["saved_bytes"] == sharing["separate_bytes"] - listed
    drafter = m["files"]["drafter.onnx"]["size"] + m["files"]["drafter.ort"]["size"]
    assert sharing["saved_bytes"] >= 2 * drafter > 0  # two drafter copies not shipped
    assert sharing["vocab_maps"] == 3  # three vocabularies, three maps


def test_run_needs_a_target_and_lists_them(
    multi: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnidraft_deploy.cli.main import main

    base = ["run", str(multi), "--max-new-tokens", "4", "--state", str(tmp_path)]
    for extra in ([], ["--target", "tiny-qwen2.5-14b"]):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert all(name in err for name in TARGETS), err
    assert main([*base, "--target", "tiny-vicuna-7b", "--prompt", "def fib(n):"]) == 0
    assert capsys.readouterr().out.startswith("def fib(n):")


def test_a_damaged_file_of_one_target_is_refused_naming_it(multi: Path, tmp_path: Path) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle

    from omnidraft_deploy.bundle.manifest import BundleError

    copy = _linked_copy(multi, tmp_path / "copy")
    rel = "targets/tiny-qwen2-7b/ngram_cache.bin"
    data = bytearray((copy / rel).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / rel).unlink()  # a hard link: replace the file, never write through it
    (copy / rel).write_bytes(bytes(data))
    with pytest.raises(BundleError, match="ngram_cache.bin: sha256 mismatch") as e:
        open_bundle(copy, target="tiny-qwen2-7b")
    assert e.value.path == str(copy / rel)


def test_single_target_bundles_open_unchanged(
    cli_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle of today's single-target export: schema 1, no ``targets``, opened without
    ``--target`` as before, and with ``--target`` naming its one target."""
    from omnidraft_deploy.runtime.bundle import open_bundle

    from omnidraft_deploy.bundle.targets import target_names
    from omnidraft_deploy.cli.main import main

    m = _manifest(cli_bundle)
    assert m["schema_version"] == 1 and "targets" not in m and set(m["graphs"]) == {
        "drafter", "target"
    }  # fmt: skip
    opened = open_bundle(cli_bundle)
    assert target_names(opened.manifest) == ["tiny-llama3-8b"]
    base = ["run", str(cli_bundle), "--max-new-tokens", "2", "--state", str(tmp_path)]
    assert main([*base, "--target", "tiny-llama3-8b"]) == 0
    assert main([*base, "--target", "tiny-qwen2-7b"]) == 2
    assert "its targets: tiny-llama3-8b" in capsys.readouterr().err


def test_targets_of_one_vocabulary_share_one_map(cli_bundle: Path, tmp_path: Path) -> None:
    """Two targets of one vocabulary (here the same target twice, under two names): one map."""
    from omnidraft_deploy.exporters.multi import assemble
    from omnidraft_deploy.runtime.bundle import check_every_target

    from omnidraft_deploy.bundle.folder import read_manifest

    out = tmp_path / "two"
    out.mkdir()
    manifest = assemble(out, {"a": cli_bundle, "b": cli_bundle}, draft_len=3)
    (out / "manifest.json").write_text(manifest.to_json())
    assert manifest.targets["a"].vocab_map == manifest.targets["b"].vocab_map
    assert [r for r, e in manifest.files.items() if e.role == "vocab_map"] == [
        manifest.targets["a"].vocab_map
    ]
    assert check_every_target(out) == ["a", "b"]
    assert read_manifest(out).extras["sharing"]["vocab_maps"] == 1


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m.update(schema_version=1), "schema 2 field"),
        (lambda m: m["targets"].pop("tiny-qwen2-7b") and m["targets"].pop("tiny-vicuna-7b"),
         "2 to 64 targets"),
        (lambda m: m["graphs"].update(target=m["targets"]["tiny-qwen2-7b"]["graph"]),
         "graphs holds the drafter only"),
        (lambda m: m["targets"]["tiny-qwen2-7b"].update(expected="expected.json"),
         "is not listed as expected"),
        (lambda m: m["targets"]["tiny-qwen2-7b"]["graph"].update(
            file="targets/tiny-vicuna-7b/target.onnx"), "targets/tiny-qwen2-7b/target.onnx"),
    ],
)  # fmt: skip
def test_the_multi_target_schema_is_checked(multi: Path, change: object, problem: str) -> None:
    from omnidraft_deploy.bundle.manifest import BundleError, Manifest

    m = _manifest(multi)
    change(m)  # type: ignore[operator]
    with pytest.raises(BundleError, match=problem):
        Manifest.from_json(json.dumps(m))
