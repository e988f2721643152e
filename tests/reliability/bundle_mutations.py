"""A small valid bundle and file-system-level mutations of it, for fuzzing the bundle opener.

The seed bundle holds real ODVM / ODNG files, two minimal ONNX graphs carrying the graph metadata
the opener checks (no weights: the opener's checks run before any session, ``check_bundle``), a
tokenizer file in a subfolder and a valid manifest. ``MUTATIONS`` edit a copy; the ``BREAKS``
set always makes the bundle invalid (a symlink, a file changed behind the manifest's back, an
unlisted table, a path out of the folder, ...), so accepting it is an invalid accept. The others
change a file *and* its manifest entry, so the opener may accept the result if it is valid.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from mutations import reseal, small_mapper

from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.manifest import Manifest
from omnidraft_deploy.bundle.sections import FileEntry, GraphInfo
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import to_bytes as ngram_bytes
from omnidraft_deploy.vocab import io as odvm
from omnidraft_deploy.vocab.mapper import VocabMapper

GRAPH_VOCAB = 64


def _graph_bytes(info: GraphInfo | dict, location: str | None = None) -> bytes:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    init = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    if location is not None:  # weights "stored" in another file
        init.ClearField("raw_data")
        init.data_location = onnx.TensorProto.EXTERNAL
        init.external_data.add(key="location", value=location)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [init])
    model = helper.make_model(graph)
    meta = {
        "omnidraft.format_version": "1",
        "omnidraft.graph_info": json.dumps(info if isinstance(info, dict) else info.__dict__),
    }
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    return model.SerializeToString()


VOCABS = {"target": GRAPH_VOCAB}  # the drafter's is the seed map's (set by make_seed)


def _info(role: str) -> GraphInfo:
    preset, tok = {"drafter": ("tiny-llama-68m", "llama2"), "target": ("tiny-llama3-8b", "llama3")}[
        role
    ]
    return GraphInfo(f"{role}.onnx", preset, "llama", tok, VOCABS[role], 64, None, 2, 2, 16, "fp32")


def write_manifest(root: Path, doc: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(doc))


def relist(root: Path, doc: dict, rel: str) -> None:
    """Update ``rel``'s size and sha256 in the manifest document to the file's current bytes."""
    if rel not in doc["files"]:
        raise FileNotFoundError(rel)
    e = file_entry(root, rel, doc["files"][rel]["role"])
    doc["files"][rel].update(sha256=e.sha256, size=e.size)


def _spelled(m: VocabMapper) -> VocabMapper:
    """``m`` with every target id spelled by at least one drafter id (the opener refuses a map
    that leaves a target id unspelled: issue 28)."""
    spell = [m.target_to_draft(t) or [0] for t in range(m.target_vocab_size)]
    offsets = torch.tensor([0, *itertools.accumulate(len(s) for s in spell)])
    flat = torch.tensor([i for s in spell for i in s], dtype=torch.long)
    return VocabMapper(m.draft_to_target, offsets, flat, draft_eos=m.draft_eos,
                       target_eos=m.target_eos, roles=m.roles,
                       placeholder_counts=m.placeholder_counts)  # fmt: skip


def make_seed(root: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    while True:
        mapper = _spelled(small_mapper(rng))
        if mapper.draft_vocab_size >= 2:
            break
    VOCABS["drafter"] = mapper.draft_vocab_size  # drafter ids index the map directly
    cache = NGramCache()
    for _ in range(20):
        cache.update(
            [rng.randrange(mapper.draft_vocab_size) for _ in range(3)],
            rng.randrange(mapper.target_vocab_size),
        )
    root.mkdir(parents=True)
    (root / "target_tokenizer").mkdir()
    files = {
        "vocab_map.bin": (odvm.to_bytes(mapper), "vocab_map"),
        "ngram_cache.bin": (
            ngram_bytes(
                cache,
                draft_vocab_size=mapper.draft_vocab_size,
                target_vocab_size=mapper.target_vocab_size,
            ),
            "ngram_cache",
        ),
        "drafter.onnx": (_graph_bytes(_info("drafter")), "drafter_graph"),
        "target.onnx": (_graph_bytes(_info("target")), "target_graph"),
        "target_tokenizer/tokenizer.json": (b'{"model": "toy"}', "target_tokenizer"),
    }
    entries: dict[str, FileEntry] = {}
    for rel, (data, role) in files.items():
        (root / rel).write_bytes(data)
        entries[rel] = file_entry(root, rel, role)
    graphs = {r: _info(r) for r in ("drafter", "target")}
    m = Manifest(backend="onnx", draft_len=4, mapping_hash=mapper.content_hash(), graphs=graphs,
                 files=entries, extras={"seed": 0})  # fmt: skip
    (root / "manifest.json").write_text(m.to_json())
    return root


def _listed(rng: random.Random, root: Path | None = None) -> str:
    """A listed file; with ``root``, one that is still a plain file (else OSError: skipped)."""
    rel = rng.choice(["vocab_map.bin", "ngram_cache.bin", "drafter.onnx", "target.onnx",
                      "target_tokenizer/tokenizer.json"])  # fmt: skip
    if root is not None and ((root / rel).is_symlink() or not (root / rel).is_file()):
        raise FileNotFoundError(rel)
    return rel


def symlink_file(root: Path, doc: dict, rng: random.Random) -> None:
    rel = _listed(rng, root)
    copy = root.parent / f"{root.name}-outside-{rel.replace('/', '_')}"
    shutil.copyfile(root / rel, copy)  # identical bytes: only the link is wrong
    (root / rel).unlink()
    os.symlink(copy, root / rel)


def symlink_dir(root: Path, doc: dict, rng: random.Random) -> None:
    copy = root.parent / f"{root.name}-outside-tok"
    shutil.copytree(root / "target_tokenizer", copy)
    shutil.rmtree(root / "target_tokenizer")
    os.symlink(copy, root / "target_tokenizer")


def symlink_unlisted(root: Path, doc: dict, rng: random.Random) -> None:
    os.symlink(rng.choice(["/", "/etc/hostname", "../"]), root / "evil")


def fifo(root: Path, doc: dict, rng: random.Random) -> None:
    rel = _listed(rng, root)
    (root / rel).unlink()
    os.mkfifo(root / rel)


def delete(root: Path, doc: dict, rng: random.Random) -> None:
    (root / _listed(rng, root)).unlink()


def dir_for_file(root: Path, doc: dict, rng: random.Random) -> None:
    rel = _listed(rng, root)
    (root / rel).unlink()
    (root / rel).mkdir()


def change_unlisted(root: Path, doc: dict, rng: random.Random) -> None:
    p = root / _listed(rng, root)
    data = bytearray(p.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    p.write_bytes(bytes(data))


def unlist(root: Path, doc: dict, rng: random.Random) -> None:
    rel = rng.choice(["vocab_map.bin", "ngram_cache.bin"])
    if rel not in doc["files"]:
        raise FileNotFoundError(rel)
    if rng.random() < 0.5:
        del doc["files"][rel]
    else:
        doc["files"][rel]["role"] = "extra"


def traversal(root: Path, doc: dict, rng: random.Random) -> None:
    rel = rng.choice(["../outside.bin", "/etc/hostname", "a/../../b", "./x", "a//b"])
    doc["files"][rel] = {"sha256": "0" * 64, "size": 0, "role": "extra"}


def external_data(root: Path, doc: dict, rng: random.Random) -> None:
    role = rng.choice(["drafter", "target"])
    if (root / f"{role}.onnx").is_symlink() or not (root / f"{role}.onnx").is_file():
        raise FileNotFoundError(role)
    where = rng.choice(["../outside.bin", "/etc/hostname", "unlisted.bin"])
    (root / f"{role}.onnx").write_bytes(_graph_bytes(_info(role), location=where))
    relist(root, doc, f"{role}.onnx")


def graph_meta(root: Path, doc: dict, rng: random.Random) -> None:
    role = rng.choice(["drafter", "target"])
    if (root / f"{role}.onnx").is_symlink() or not (root / f"{role}.onnx").is_file():
        raise FileNotFoundError(role)
    key = rng.choice(["vocab_size", "n_layers", "max_seq_len", "head_dim"])
    info = _info(role).__dict__ | {key: rng.choice([1, 3, 128, 10**6])}
    (root / f"{role}.onnx").write_bytes(_graph_bytes(info))
    relist(root, doc, f"{role}.onnx")


def table_bytes(root: Path, doc: dict, rng: random.Random) -> None:
    """Edit the vocabulary map or n-gram cache and its manifest entry (may stay valid)."""
    rel = rng.choice(["vocab_map.bin", "ngram_cache.bin"])
    if (root / rel).is_symlink() or not (root / rel).is_file():
        raise FileNotFoundError(rel)
    data = bytearray((root / rel).read_bytes())
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data))
        data[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, data[at] ^ 1])
    (root / rel).write_bytes(reseal(bytes(data)) if rng.random() < 0.8 else bytes(data))
    relist(root, doc, rel)


def manifest_field(root: Path, doc: dict, rng: random.Random) -> None:
    section = rng.choice(["top", "drafter", "target"])
    obj = doc if section == "top" else doc["graphs"][section]
    key = rng.choice(sorted(obj))
    obj[key] = rng.choice([None, -1, 0, 2**40, 4.5, "4", [], {}, "qnn", "../x", float("nan")])


def extras(root: Path, doc: dict, rng: random.Random) -> None:
    doc["extras"] = rng.choice([{"target_model": "/etc/hostname"}, {"target_model": "org/x"},
                                {"seed": "x"}, {"seed": 10**30}, {"a": [{"b": None}]}])  # fmt: skip


Mutation = Callable[[Path, dict, random.Random], None]
BREAKS: dict[str, Mutation] = {f.__name__: f for f in (
    symlink_file, symlink_dir, symlink_unlisted, fifo, delete, dir_for_file, change_unlisted,
    unlist, traversal, external_data)}  # fmt: skip
KEEPS: dict[str, Mutation] = {
    f.__name__: f for f in (graph_meta, table_bytes, manifest_field, extras)
}
MUTATIONS: dict[str, Mutation] = BREAKS | KEEPS
