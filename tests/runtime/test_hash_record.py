"""Fast re-open (``bundle.hash_record``): a file is hashed once per identity, never trusted blindly.

Each test copies the session's tiny CLI bundle and ages its files past the racy window (as a bundle
exported a while ago is), then counts the files ``verify_bundle`` hashes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from omnidraft_deploy.bundle import folder
from omnidraft_deploy.bundle.folder import read_manifest, verify_bundle
from omnidraft_deploy.bundle.hash_record import RECORD_FILE
from omnidraft_deploy.bundle.manifest import BundleError


@pytest.fixture
def copy(cli_bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "b"
    shutil.copytree(cli_bundle, out)
    old = time.time() - 60
    for p in out.rglob("*"):
        os.utime(p, (old, old))
    return out


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The relative paths ``verify_bundle`` hashes, in order."""
    seen: list[str] = []
    real: Callable[..., os.stat_result] = folder.verify_listed

    def counting(root: Path, rel: str, entry: object) -> os.stat_result:
        seen.append(rel)
        return real(root, rel, entry)

    monkeypatch.setattr(folder, "verify_listed", counting)
    return seen


def test_unchanged_files_are_hashed_once(copy: Path, tmp_path: Path, hashed: list[str]) -> None:
    listed = sorted(read_manifest(copy).files)
    verify_bundle(copy, state=tmp_path)
    assert sorted(hashed) == listed and (tmp_path / RECORD_FILE).is_file()
    hashed.clear()
    verify_bundle(copy, state=tmp_path)
    assert hashed == []
    verify_bundle(copy, state=tmp_path, trust_record=False)  # validate / OMNIDRAFT_VERIFY_HASHES
    assert sorted(hashed) == listed
    hashed.clear()
    verify_bundle(copy)  # no state folder: every file, every time
    assert sorted(hashed) == listed


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_file_corrupted_after_a_recorded_open_is_rejected(
    copy: Path, tmp_path: Path, hashed: list[str], keep_mtime: bool
) -> None:
    verify_bundle(copy, state=tmp_path)
    graph = copy / "target.onnx"
    st = graph.stat()
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 1  # same size, one bit
    graph.write_bytes(bytes(data))
    if keep_mtime:  # mtime put back: the ctime (which no user call sets) still moved
        os.utime(graph, ns=(st.st_atime_ns, st.st_mtime_ns))
    hashed.clear()
    with pytest.raises(BundleError, match=r"target\.onnx: sha256 mismatch"):
        verify_bundle(copy, state=tmp_path)
    assert hashed[-1] == "target.onnx"


def test_a_truncated_file_is_rejected_naming_it(copy: Path, tmp_path: Path) -> None:
    verify_bundle(copy, state=tmp_path)
    graph = copy / "drafter.onnx"
    graph.write_bytes(graph.read_bytes()[:-1])
    with pytest.raises(BundleError, match=r"drafter\.onnx: size"):
        verify_bundle(copy, state=tmp_path)


@pytest.mark.parametrize(
    "how", ["garbage", "not-utf8", "duplicate-keys", "other-bundle", "other-version", "bad-entry",
            "forged-sha256", "symlink"],
)  # fmt: skip
def test_a_corrupt_or_foreign_record_is_ignored(
    copy: Path, tmp_path: Path, hashed: list[str], how: str
) -> None:
    listed = sorted(read_manifest(copy).files)
    verify_bundle(copy, state=tmp_path)
    record = tmp_path / RECORD_FILE
    doc = json.loads(record.read_text())
    text = record.read_text()
    if how == "garbage":
        text = "{not json"
    elif how == "not-utf8":
        record.write_bytes(b"\xff\xfe" + text.encode())
    elif how == "duplicate-keys":
        text = text.replace('"version": 1', '"version": 1, "version": 1')
    elif how == "other-bundle":
        doc["bundle"] = str(tmp_path / "elsewhere")
    elif how == "other-version":
        doc["version"] = 2
    elif how == "bad-entry":
        doc["files"]["target.onnx"]["size"] = True  # a bool is not an int
    elif how == "forged-sha256":  # identities right, hashes not the manifest's: re-hash them all
        for entry in doc["files"].values():
            entry["sha256"] = "0" * 64
    elif how == "symlink":
        (tmp_path / "real.json").write_text(text)
        record.unlink()
        record.symlink_to(tmp_path / "real.json")
    if how in ("other-bundle", "other-version", "bad-entry", "forged-sha256"):
        text = json.dumps(doc)
    if how not in ("not-utf8", "symlink"):
        record.write_text(text)
    hashed.clear()
    verify_bundle(copy, state=tmp_path)
    assert sorted(hashed) == listed


def test_a_file_changed_within_the_racy_window_is_not_recorded(
    copy: Path, tmp_path: Path, hashed: list[str]
) -> None:
    os.utime(copy / "vocab_map.bin")  # changed just now: a same-tick write could hide
    verify_bundle(copy, state=tmp_path)
    hashed.clear()
    verify_bundle(copy, state=tmp_path)
    assert hashed == ["vocab_map.bin"]
