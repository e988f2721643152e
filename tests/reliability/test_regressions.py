"""One regression test per failure class of issue 10 (crashes, silent accepts, unbounded loads,
reads outside the bundle, the decoder at capacity): each input used to raise a raw exception or be
accepted, and must now be a clear error naming the file and field (or work exactly)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from bundle_mutations import make_seed, relist, write_manifest
from mutations import seed_manifest
from omnidraft_deploy.runtime.bundle import SESSION_CACHE, check_bundle, load_session_cache

from omnidraft_deploy.bundle.folder import read_manifest
from omnidraft_deploy.bundle.manifest import BundleError, Manifest
from omnidraft_deploy.ngram.format import NGramFormatError, from_bytes, load
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import HeuristicDraftLen
from omnidraft_deploy.testing import toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper


def _refused(doc: dict, field: str) -> None:
    with pytest.raises(BundleError) as e:
        Manifest.from_json(json.dumps(doc), source="b/manifest.json")
    assert str(e.value).startswith("b/manifest.json: ") and field in str(e.value), e.value


# --- crash class 1: manifest field types ---------------------------------------------------
@pytest.mark.parametrize("value", ["4", 4.5, None, True, float("nan"), 0, 1e30, 33])
def test_draft_len_of_any_wrong_type_or_range_is_named(value: object) -> None:
    _refused(seed_manifest() | {"draft_len": value}, "draft_len")


def test_vocab_size_as_string_is_named() -> None:
    doc = seed_manifest()
    doc["graphs"]["target"]["vocab_size"] = "128256"
    _refused(doc, "graphs.target.vocab_size")


# --- crash class 2: drafter/target swapped, vocabulary map vs graph sizes --------------------
def test_swapped_graph_infos_are_named() -> None:
    doc = seed_manifest()
    doc["graphs"]["drafter"], doc["graphs"]["target"] = (
        doc["graphs"]["target"],
        doc["graphs"]["drafter"],
    )
    _refused(doc, "graphs.drafter.file")


def test_vocab_map_smaller_than_drafter_graph_is_refused(tmp_path: Path) -> None:
    root = make_seed(tmp_path / "b")
    doc = json.loads((root / "manifest.json").read_text())
    doc["graphs"]["drafter"]["vocab_size"] = 10**6  # the graph's metadata still says 64
    write_manifest(root, doc)
    with pytest.raises(BundleError, match="drafter"):
        check_bundle(root)


# --- crash class 3: graph suffix vs backend; caches sized from manifest fields ---------------
def test_graph_file_that_is_not_the_backends_suffix_is_named() -> None:
    doc = seed_manifest()
    doc["graphs"]["target"]["file"] = "target.bin"
    _refused(doc, "graphs.target.file")


def test_kv_cache_size_from_manifest_fields_is_bounded_before_allocation() -> None:
    doc = seed_manifest()
    doc["graphs"]["target"] |= {"n_layers": 128, "n_kv_heads": 64, "head_dim": 256,
                                "max_seq_len": 131072}  # fmt: skip
    _refused(doc, "KV cache")


# --- crash class 4: deeply nested JSON -------------------------------------------------------
def test_deeply_nested_json_is_refused_without_recursion(tmp_path: Path) -> None:
    text = json.dumps(seed_manifest())[:-1] + ', "extras2": ' + "[" * 200_000 + "]" * 200_000 + "}"
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(BundleError, match="nested deeper"):
        read_manifest(tmp_path)


# --- crash class 5: backend qnn on a CPU bundle -----------------------------------------------
def test_qnn_backend_on_a_cpu_bundle_is_named() -> None:
    _refused(seed_manifest() | {"backend": "qnn"}, "graphs.drafter.quantization")


# --- crash class 6: extras of the wrong type --------------------------------------------------
@pytest.mark.parametrize("extras", [[], "x", None, 3])
def test_extras_not_an_object_is_named(extras: object) -> None:
    _refused(seed_manifest() | {"extras": extras}, "extras")


# --- crash class 7: invalid UTF-8 in --prompt -------------------------------------------------
def test_invalid_utf8_prompt_is_a_clear_cli_error(tmp_path: Path) -> None:
    argv = [
        b"-m",
        b"omnidraft_deploy.cli.main",
        b"run",
        os.fsencode(tmp_path),
        b"--prompt",
        b"ab\xff",
    ]
    done = subprocess.run([os.fsencode(sys.executable), *argv], capture_output=True, timeout=120)
    assert done.returncode == 2 and b"--prompt: not valid UTF-8" in done.stderr, done.stderr


# --- crash class 8: prompt ids outside the vocabulary ------------------------------------------
def _toy(capacity: int = 16) -> tuple[EagerLM, SpeculativeDecoder, DecodeConfig]:
    dt, tt = toy_pair()
    target = EagerLM(build_model(toy_spec(tt.vocab_size, capacity), seed=11, init_std=0.6))
    drafter = EagerLM(build_model(toy_spec(dt.vocab_size, 4 * capacity), seed=12, init_std=0.6))
    cfg = DecodeConfig(max_new_tokens=3 * capacity)
    mapper = VocabMapper.from_tokenizers(dt, tt)
    return (
        target,
        SpeculativeDecoder(target, drafter, mapper, HeuristicDraftLen(3), config=cfg),
        cfg,
    )


@pytest.mark.parametrize("bad", [[-1], [1, 10], [1, 2**40], [True]])
def test_prompt_ids_outside_the_vocabulary_are_refused(bad: list[int]) -> None:
    target, dec, cfg = _toy()
    for run in (lambda: dec.generate(bad), lambda: generate_target_only(target, bad, cfg)):
        with pytest.raises(ValueError, match="outside the target vocabulary"):
            run()


# --- decoder at capacity ------------------------------------------------------------------------
def test_every_prompt_length_up_to_capacity_decodes_exactly_like_target_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    target, dec, cfg = _toy(capacity=8)
    gen = torch.Generator().manual_seed(0)
    for length in range(1, 9):
        prompt = torch.randint(1, 10, (length,), generator=gen).tolist()
        ref, ref_stats = generate_target_only(target, prompt, cfg)
        with caplog.at_level(logging.WARNING):
            out, stats = dec.generate(prompt)
        assert out == ref, f"prompt length {length}"
        assert stats.stopped_by_capacity == ref_stats.stopped_by_capacity
        if len(ref) < cfg.max_new_tokens and 0 not in ref:  # 0 is the toy EOS
            assert stats.stopped_by_capacity and "KV capacity" in caplog.text
    with pytest.raises(ValueError, match="does not fit the target's capacity of 8"):
        dec.generate([1] * 9)


# --- silent accepts ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, -1])
def test_schema_version_zero_or_negative_is_refused(version: int) -> None:
    _refused(seed_manifest() | {"schema_version": version}, "schema_version")


def test_swapped_tokenizer_name_is_refused() -> None:
    doc = seed_manifest()
    doc["graphs"]["target"]["tokenizer"] = "llama2"
    _refused(doc, "graphs.target.tokenizer")


def test_odng_lfu_use_counts_out_of_order_are_refused() -> None:
    body = bytes([2, 1, 2, 3, 2]) + bytes([2, 4, 5, 6, 1])  # counts 2 then 1
    data = b"ODNG" + struct.pack("<HHIIII", 1, 1, 100, 100, 2, len(body)) + body
    data += struct.pack("<I", zlib.crc32(data))
    with pytest.raises(NGramFormatError, match="not the canonical order"):
        from_bytes(data)


# --- unbounded loads ----------------------------------------------------------------------------
def test_ngram_reader_refuses_a_file_over_its_cap_unread(tmp_path: Path) -> None:
    p = tmp_path / "big.bin"
    p.write_bytes(b"ODNG" + bytes(4096))
    with pytest.raises(NGramFormatError, match="over this reader's cap of 1024 B"):
        load(p, max_file_bytes=1024)
    with pytest.raises(NGramFormatError, match="cannot fit"):  # N huge, B tiny: before any loop
        data = b"ODNG" + struct.pack("<HHIIII", 1, 0, 9, 9, 2**32 - 1, 0)
        from_bytes(data + struct.pack("<I", zlib.crc32(data)))


# --- reads outside the bundle, session cache ------------------------------------------------------
def test_symlinked_table_is_refused_even_with_identical_bytes(tmp_path: Path) -> None:
    root = make_seed(tmp_path / "b")
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes((root / "vocab_map.bin").read_bytes())
    (root / "vocab_map.bin").unlink()
    (root / "vocab_map.bin").symlink_to(outside)
    with pytest.raises(BundleError, match="symlink"):
        check_bundle(root)


def test_unlisted_tables_are_refused(tmp_path: Path) -> None:
    root = make_seed(tmp_path / "b")
    doc = json.loads((root / "manifest.json").read_text())
    del doc["files"]["ngram_cache.bin"]
    write_manifest(root, doc)
    with pytest.raises(BundleError, match="'ngram_cache.bin' is not listed"):
        check_bundle(root)


def test_damaged_session_cache_falls_back_to_the_bundles_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = make_seed(tmp_path / "b")
    manifest, mapper, shipped = check_bundle(root)
    state = tmp_path / "state"
    state.mkdir()
    good = (root / "ngram_cache.bin").read_bytes()
    (state / SESSION_CACHE).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # CRC broken
    with caplog.at_level(logging.WARNING):
        assert load_session_cache(state, mapper, shipped) is shipped
    assert "CRC-32 mismatch" in caplog.text and "using the bundle's n-gram cache" in caplog.text
    (state / SESSION_CACHE).unlink()
    (state / SESSION_CACHE).symlink_to(root / "ngram_cache.bin")
    assert load_session_cache(state, mapper, shipped) is shipped  # a link is never followed
    relist(root, json.loads((root / "manifest.json").read_text()), "ngram_cache.bin")


def test_extras_of_any_content_are_informational(tmp_path: Path) -> None:
    root = make_seed(tmp_path / "b")
    doc = json.loads((root / "manifest.json").read_text())
    fifo = tmp_path / "weights"
    os.mkfifo(fifo)  # opening it would block: the check would hang if extras were followed
    doc["extras"] = {"target_model": str(fifo), "seed": "x", "nested": [{"a": None}]}
    write_manifest(root, doc)
    check_bundle(root)


# --- silent accepts: every rule the ODVM docstring states -----------------------------------------
def _odvm(**patch: int) -> bytes:
    """A valid v2 map (V_d 3, V_t 4, one drafter EOS), header / table words patched, resealed."""
    from omnidraft_deploy.vocab import io as odvm

    mapper = VocabMapper(torch.tensor([0, -1, 3]), torch.tensor([0, 1, 1, 1, 2]),
                         torch.tensor([0, 2]), draft_eos=(1,), target_eos=())  # fmt: skip
    data = bytearray(odvm.to_bytes(mapper))
    at = {"version": (4, "<H"), "flags": (6, "<H"), "vd": (8, "<I"), "reserved": (26, "<H"),
          "eos": (32, "<I"), "offset0": (32 + 4 + 4 * 3, "<I")}  # fmt: skip
    for name, value in patch.items():
        struct.pack_into(at[name][1], data, at[name][0], value)
    return bytes(data[:-4]) + struct.pack("<I", zlib.crc32(bytes(data[:-4])))


@pytest.mark.parametrize(
    ("patch", "problem"),
    [({"eos": 3}, "EOS"), ({"offset0": 1}, "offsets"), ({"version": 0}, "version 0"),
     ({"flags": 1}, "flags"), ({"reserved": 1}, "reserved"), ({"vd": 0}, "empty vocabulary")],
)  # fmt: skip
def test_odvm_rules_of_the_docstring_are_enforced(patch: dict[str, int], problem: str) -> None:
    from omnidraft_deploy.vocab import io as odvm

    odvm.from_bytes(_odvm())  # the unpatched map is valid
    with pytest.raises(odvm.VocabMapFormatError, match=problem):
        odvm.from_bytes(_odvm(**patch), source="vocab_map.bin")


def test_odvm_reader_refuses_a_file_over_its_cap_unread(tmp_path: Path) -> None:
    from omnidraft_deploy.vocab import io as odvm

    p = tmp_path / "vocab_map.bin"
    p.write_bytes(_odvm() + bytes(4096))
    with pytest.raises(odvm.VocabMapFormatError, match="over the size cap of 1024 B"):
        odvm.load(p, max_bytes=1024)


# --- crash class 3: a graph file that is not a model ----------------------------------------------
@pytest.mark.parametrize("junk", [b"", b"\x08\xff\xff\xff\xff\x0f", b"not a protobuf" * 99])
def test_graph_file_that_is_not_a_model_is_named(tmp_path: Path, junk: bytes) -> None:
    root = make_seed(tmp_path / "b")
    (root / "drafter.onnx").write_bytes(junk)
    doc = json.loads((root / "manifest.json").read_text())
    relist(root, doc, "drafter.onnx")  # listed with its true hash: only the content is wrong
    write_manifest(root, doc)
    with pytest.raises(BundleError, match="drafter.onnx"):
        check_bundle(root)


# --- a killed export lost the bundle: the two-rename window, stale staging folders -----------------
def test_kill_between_the_two_renames_is_recovered_and_leftovers_are_cleaned(
    tmp_path: Path,
) -> None:
    """The state a kill between ``final -> .old`` and ``staged -> final`` leaves (the fallback
    swap; the kill harness exercises the exchange): the next open restores the bundle, the next
    export deletes the dead writer's staging folder and ``.old``, and neither ever validates."""
    from omnidraft_deploy.bundle.folder import atomic_bundle_dir, verify_bundle

    final = make_seed(tmp_path / "b")
    before = (final / "manifest.json").read_bytes()
    staged = tmp_path / ".b.k1ll3d_x.partial"
    shutil.copytree(final, staged)  # complete, but its writer died before publishing it
    final.rename(tmp_path / ".b.old")
    for leftover in (staged, tmp_path / ".b.old"):
        with pytest.raises(BundleError, match="never a bundle"):
            verify_bundle(leftover)
    assert verify_bundle(final) and (final / "manifest.json").read_bytes() == before
    with atomic_bundle_dir(final, exchange=False) as tmp:  # the next export, fallback swap
        for p in final.iterdir():
            shutil.copytree(p, tmp / p.name) if p.is_dir() else shutil.copyfile(p, tmp / p.name)
    verify_bundle(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
