"""A small valid bundle and file-system-level mutations of it, for fuzzing the bundle opener.

The seed bundle holds real ODVM / ODNG files, two minimal ONNX graphs carrying the graph metadata
the opener checks (no weights: the opener's checks run before any session, ``check_bundle``),
both tokenizers (a real ``tokenizers`` file with exactly the map's ids on each side,
``special_tokens.json``, the target's chat template), ``expected.json`` and a valid manifest.
``MUTATIONS`` edit a copy; the ``BREAKS`` set always makes the bundle invalid (a symlink, a file
changed behind the manifest's back, a size the manifest misstates, a quantization label the graph
contradicts, a tokenizer whose ids the map does not cover, an unlisted table, a path out of the
folder, ...), so accepting it is an invalid accept. The others change a file *and* its manifest
entry (or drop a file the opener can do without), so the opener may accept the result if it is
valid (``accepted_is_valid`` then checks what was read, independently of the readers).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import mutations
import torch
from mutations import EXPECTED_PATHS, SPECIAL_PATHS, reseal, small_mapper

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
MAP_SIZES: dict[str, int] = {}  # role -> the seed map's ids on that side (set by make_seed)


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


CHAT_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"


def tokenizer_json(n: int) -> bytes:
    """A real ``tokenizers`` file with exactly ``n`` ids (a word-level vocabulary)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    return str(tok.to_str()).encode()


def tokenizer_files(role: str, n: int, eos: tuple[int, ...]) -> dict[str, tuple[bytes, str]]:
    folder, special = f"{role}_tokenizer", {"name": f"seed-{role}", "bos_id": None,
                                            "eos_ids": list(eos), "vocab_size": n}  # fmt: skip
    files = {f"{folder}/tokenizer.json": (tokenizer_json(n), folder),
             f"{folder}/special_tokens.json": (json.dumps(special).encode(), folder)}  # fmt: skip
    if role == "target":
        files[f"{folder}/chat_template.jinja"] = (CHAT_TEMPLATE.encode(), folder)
    return files


def expected_bytes(vocab: int) -> bytes:
    row = {"task": "t", "text": "w0", "prompt_ids": [0], "output_ids": [vocab - 1, 0],
           "output_text": ""}  # fmt: skip
    doc = {"version": 1, "max_new_tokens": 2, "vocab_limit": vocab, "eos_ids": [],
           "prompts": [row]}  # fmt: skip
    return json.dumps(doc).encode()


def make_seed(root: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    while True:
        mapper = _spelled(small_mapper(rng))
        if mapper.draft_vocab_size >= 2:
            break
    VOCABS["drafter"] = mapper.draft_vocab_size  # drafter ids index the map directly
    MAP_SIZES.update(drafter=mapper.draft_vocab_size, target=mapper.target_vocab_size)
    cache = NGramCache()
    for _ in range(20):
        cache.update(
            [rng.randrange(mapper.draft_vocab_size) for _ in range(3)],
            rng.randrange(mapper.target_vocab_size),
        )
    root.mkdir(parents=True)
    (root / "target_tokenizer").mkdir()
    (root / "drafter_tokenizer").mkdir()
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
        **tokenizer_files("target", mapper.target_vocab_size, mapper.target_eos),
        **tokenizer_files("drafter", mapper.draft_vocab_size, mapper.draft_eos),
        "expected.json": (expected_bytes(mapper.target_vocab_size), "expected"),
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


TOKENIZER_FILES = ["target_tokenizer/tokenizer.json", "target_tokenizer/special_tokens.json",
                   "target_tokenizer/chat_template.jinja", "drafter_tokenizer/tokenizer.json",
                   "drafter_tokenizer/special_tokens.json"]  # fmt: skip
LISTED = ["vocab_map.bin", "ngram_cache.bin", "drafter.onnx", "target.onnx", "expected.json",
          *TOKENIZER_FILES]  # fmt: skip


def _listed(rng: random.Random, root: Path, doc: dict) -> str:
    """A file the manifest ``doc`` still lists that is still a plain file (else OSError: the
    edit is skipped; an earlier edit may have unlisted it, and an unlisted file is never read)."""
    rel = rng.choice(LISTED)
    if rel not in doc["files"] or (root / rel).is_symlink() or not (root / rel).is_file():
        raise FileNotFoundError(rel)
    return rel


def symlink_file(root: Path, doc: dict, rng: random.Random) -> None:
    rel = _listed(rng, root, doc)
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
    rel = _listed(rng, root, doc)
    (root / rel).unlink()
    os.mkfifo(root / rel)


def delete(root: Path, doc: dict, rng: random.Random) -> None:
    (root / _listed(rng, root, doc)).unlink()


def dir_for_file(root: Path, doc: dict, rng: random.Random) -> None:
    rel = _listed(rng, root, doc)
    (root / rel).unlink()
    (root / rel).mkdir()


def change_unlisted(root: Path, doc: dict, rng: random.Random) -> None:
    p = root / _listed(rng, root, doc)
    data = bytearray(p.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    p.write_bytes(bytes(data))


def _unlist_one(doc: dict, rel: str, rng: random.Random) -> None:
    """``rel`` dropped from the manifest's files, or listed under another role (half each)."""
    if rel not in doc["files"]:
        raise FileNotFoundError(rel)
    if rng.random() < 0.5:
        del doc["files"][rel]
    else:
        doc["files"][rel]["role"] = "extra"


def unlist(root: Path, doc: dict, rng: random.Random) -> None:
    _unlist_one(doc, rng.choice(["vocab_map.bin", "ngram_cache.bin"]), rng)


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


def json_edit(text: str, rng: random.Random, paths: list[tuple]) -> str:
    """``mutations.json_edit`` driven by ``rng``."""
    return mutations.json_edit(text, mutations.RandomPick(rng.randrange(2**32)), paths)


def _edit_listed(root: Path, doc: dict, rel: str, edit: Callable[[bytes], bytes]) -> None:
    if rel not in doc["files"] or (root / rel).is_symlink() or not (root / rel).is_file():
        raise FileNotFoundError(rel)
    (root / rel).write_bytes(edit((root / rel).read_bytes()))
    relist(root, doc, rel)


def special_value(root: Path, doc: dict, rng: random.Random) -> None:
    rel = f"{rng.choice(['drafter', 'target'])}_tokenizer/special_tokens.json"
    _edit_listed(root, doc, rel, lambda b: json_edit(b.decode(), rng, SPECIAL_PATHS).encode())


def expected_value(root: Path, doc: dict, rng: random.Random) -> None:
    _edit_listed(root, doc, "expected.json",
                 lambda b: json_edit(b.decode(), rng, EXPECTED_PATHS).encode())  # fmt: skip


def tokenizer_bytes(root: Path, doc: dict, rng: random.Random) -> None:
    """A tokenizer file's bytes edited (flipped, cut, a JSON token replaced), relisted."""
    rel = f"{rng.choice(['drafter', 'target'])}_tokenizer/tokenizer.json"

    def edit(data: bytes) -> bytes:
        op, at = rng.choice(["flip", "trunc", "token", "deep"]), rng.randrange(len(data))
        if op == "flip":
            return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
        if op == "trunc":
            return data[:at]
        if op == "deep":
            return b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        return data.replace(b'"WordLevel"', rng.choice([b'"BPE"', b'"Unigram"', b"1e999", b"[]"]))

    _edit_listed(root, doc, rel, edit)


def template_bytes(root: Path, doc: dict, rng: random.Random) -> None:
    """The chat template replaced (non-UTF-8, over the cap, a template that would hang or raise:
    a template runs only for ``run --chat``, in its sandbox), relisted."""
    data = rng.choice([b"\xff\xfe{{ x }}", b"x" * ((1 << 20) + 1), b"{% for %}", b"",
                       b"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                       b"{% endfor %}", b"{{ range(10**9)|list }}"])  # fmt: skip
    _edit_listed(root, doc, "target_tokenizer/chat_template.jinja", lambda _: data)


def unlist_special(root: Path, doc: dict, rng: random.Random) -> None:
    """Drop a ``special_tokens.json`` from the manifest (an older bundle's shape): the map must
    then be held against the tokenizer file itself."""
    rel = f"{rng.choice(['drafter', 'target'])}_tokenizer/special_tokens.json"
    if rel not in doc["files"]:
        raise FileNotFoundError(rel)
    del doc["files"][rel]


def size_claim(root: Path, doc: dict, rng: random.Random) -> None:
    """The manifest states another size for an unchanged file (issue 47: trusted from a hash
    record, ``run`` once accepted what ``validate`` refused)."""
    entry = doc["files"][rng.choice(LISTED)]
    size = entry["size"]
    entry["size"] = rng.choice([size + 1, size + 1000, max(0, size - 1) if size else 7, 0 if size
                                else 1])  # fmt: skip


def quant_label(root: Path, doc: dict, rng: random.Random) -> None:
    """The manifest relabels an fp32 graph (``validate`` holds only fp32 to equality)."""
    from omnidraft_deploy.catalog.backends import recipe_names

    role = rng.choice(["drafter", "target"])
    labels = [n for n in recipe_names("onnx") if n != "fp32"]
    doc["graphs"][role]["quantization"] = rng.choice([*labels, "int8w", "qdq-u8"])


def tokenizer_mismatch(root: Path, doc: dict, rng: random.Random) -> None:
    """A tokenizer whose id count is not the map's, relisted, its ``special_tokens.json`` unlisted
    or not (the map then covers a slice of the tokenizer's ids, or more than it has)."""
    role = rng.choice(["drafter", "target"])
    n = MAP_SIZES[role]
    size = n + rng.choice([-1, 1, 500]) if n > 1 else n + 1
    _edit_listed(root, doc, f"{role}_tokenizer/tokenizer.json", lambda _: tokenizer_json(size))
    if rng.random() < 0.5:
        doc["files"].pop(f"{role}_tokenizer/special_tokens.json", None)


def unlist_required(root: Path, doc: dict, rng: random.Random) -> None:
    """A file the opener needs dropped from the manifest or listed under another role."""
    rel = rng.choice(["expected.json", "target_tokenizer/tokenizer.json",
                      "drafter_tokenizer/tokenizer.json"])  # fmt: skip
    _unlist_one(doc, rel, rng)


Mutation = Callable[[Path, dict, random.Random], None]
BREAKS: dict[str, Mutation] = {f.__name__: f for f in (
    symlink_file, symlink_dir, symlink_unlisted, fifo, delete, dir_for_file, change_unlisted,
    unlist, traversal, external_data, size_claim, quant_label, tokenizer_mismatch,
    unlist_required)}  # fmt: skip
KEEPS: dict[str, Mutation] = {f.__name__: f for f in (
    graph_meta, table_bytes, manifest_field, extras, special_value, expected_value,
    tokenizer_bytes, template_bytes, unlist_special)}  # fmt: skip
# breaks of one listed file that a later edit relisting or unlisting it (``table_bytes``,
# ``unlist_special``, ...) can legitimately repair: an unlisted file is never read
REPAIRABLE = {"change_unlisted", "size_claim", "delete", "fifo", "dir_for_file"}
MUTATIONS: dict[str, Mutation] = BREAKS | KEEPS


def _no_constant(name: str) -> None:
    raise AssertionError(f"accepted a JSON file holding {name}")


def _strict(text: str) -> object:
    return json.loads(text, parse_constant=_no_constant)


def _exact_ids(value: object, n: int, where: str) -> None:
    assert type(value) is list, f"accepted {where} = {value!r:.40}"
    assert all(type(i) is int and 0 <= i < n for i in value), f"accepted {where} = {value!r:.40}"


def accepted_is_valid(root: Path, doc: dict) -> None:
    """Oracle for an accepted bundle, independent of the readers (issue 47): every listed size is
    the file's; each graph's own metadata carries the manifest's quantization label; each
    tokenizer file has the map's ids on its side; every listed ``special_tokens.json`` and
    ``expected.json`` has exact JSON types (no float, bool or string id) within those ids."""
    import onnx

    for rel, entry in doc["files"].items():
        assert (root / rel).stat().st_size == entry["size"], f"accepted a wrong size for {rel}"
    for role, g in doc["graphs"].items():
        meta = {p.key: p.value for p in onnx.load(str(root / g["file"])).metadata_props}
        label = json.loads(meta["omnidraft.graph_info"])["quantization"]
        assert label == g["quantization"], f"accepted {role} labelled {g['quantization']}"
    for role, n in MAP_SIZES.items():
        folder = f"{role}_tokenizer"
        vocab = _strict((root / folder / "tokenizer.json").read_text())["model"]["vocab"]  # type: ignore[index]
        assert len(vocab) == n, f"accepted a {len(vocab)}-id {role} tokenizer for a {n}-id map"
        if f"{folder}/special_tokens.json" in doc["files"]:
            sp = _strict((root / folder / "special_tokens.json").read_text())
            keys = {"name", "bos_id", "eos_ids"}  # + "vocab_size" since issue 28: optional
            assert isinstance(sp, dict) and keys <= set(sp) <= keys | {"vocab_size"}, sp
            assert type(sp["name"]) is str and sp["name"] and sp.get("vocab_size", n) == n, sp
            assert type(sp.get("vocab_size", n)) is int, sp
            _exact_ids(sp["eos_ids"] + ([] if sp["bos_id"] is None else [sp["bos_id"]]), n,
                       f"{role} special ids")  # fmt: skip
    exp = _strict((root / "expected.json").read_text())
    assert isinstance(exp, dict) and exp["version"] == 1 and type(exp["max_new_tokens"]) is int
    n = MAP_SIZES["target"]
    for row in exp["prompts"]:
        _exact_ids(row["prompt_ids"], n, "prompt_ids")
        _exact_ids(row["output_ids"], n, "output_ids")
        assert row["prompt_ids"] and len(row["output_ids"]) <= exp["max_new_tokens"]
