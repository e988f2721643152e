"""The fast GGUF header reader (``vocab.gguf_meta``) against the ``gguf`` package's reader, its
errors on damaged files, and its per-process memo (re-read when the file changes)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from omnidraft_deploy.vocab.gguf_meta import read_gguf_header


def test_reads_what_the_gguf_package_reads(require_asset: Callable[[str], Path]) -> None:
    gguf = pytest.importorskip("gguf")
    path = require_asset("vocab-llama-spm-gguf")
    ours = read_gguf_header(path)
    ref = gguf.GGUFReader(str(path))
    assert set(ours.fields) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "general.architecture"):
        assert ours.fields[key] == ref.fields[key].contents(), key
    assert ours.tensors == {t.name: tuple(int(d) for d in t.shape) for t in ref.tensors}
    assert ours.path == path


def test_damaged_headers_name_the_file(require_asset: Callable[[str], Path],
                                       tmp_path: Path) -> None:  # fmt: skip
    data = require_asset("vocab-llama-spm-gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:200_000])  # inside the token table
    with pytest.raises(ValueError, match=r"cut\.gguf: GGUF header truncated"):
        read_gguf_header(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGML" + data[4:4096])
    with pytest.raises(ValueError, match=r"other\.gguf: not a GGUF file"):
        read_gguf_header(other)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_header(empty)


def test_a_changed_file_is_read_again(require_asset: Callable[[str], Path],
                                      tmp_path: Path) -> None:  # fmt: skip
    path = tmp_path / "v.gguf"
    shutil.copyfile(require_asset("vocab-llama-spm-gguf"), path)
    first = read_gguf_header(path)
    assert read_gguf_header(path).fields is first.fields  # memoised
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated"):
        read_gguf_header(path)
