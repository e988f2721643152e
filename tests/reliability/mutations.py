"""Structure-aware mutations of the binary formats and the manifest, with independent oracles.

Each format has a hypothesis strategy that starts from a valid encoding and applies 1-3 edits that
know the structure (header fields, entries, varints, JSON paths), then sometimes recomputes the
CRC so that the edit reaches the checks behind it. ``check_*`` runs the reader on one input and
returns its outcome: ``"rejected"`` (the reader's own error, naming the source), ``"accepted"``
(and then the independent oracle held) or raises ``AssertionError`` for a crash (any other
exception) or an invalid input accepted. The oracles are written from the docstrings, not from the
readers: ODNG: an accepted file re-encodes to the very same bytes (exactly one encoding) and the
entry-by-entry reader agrees with the fast one; ODVM: every stated table rule holds and the tables
round-trip; manifest: every field has its documented type and range.

Each generator is written once against ``Pick`` (an int in a range, an element, a coin) and runs
two ways: under hypothesis (``as_strategy``: the default run, with shrinking) and from a seeded
``random.Random`` (``RandomPick``: the long run, ~30x faster per input than hypothesis's engine,
and any failing input is replayed from its seed alone).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from hypothesis import strategies as st

from omnidraft_deploy.bundle.manifest import BundleError, Manifest
from omnidraft_deploy.ngram import format as odng
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.vocab import io as odvm
from omnidraft_deploy.vocab.mapper import VocabMapper

T = TypeVar("T")


class Pick(Protocol):
    """The three choices a generator makes."""

    def int(self, lo: int, hi: int) -> int: ...  # lo <= x <= hi
    def choice(self, seq: Sequence[T]) -> T: ...
    def bool(self) -> bool: ...


class RandomPick:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def bool(self) -> bool:
        return self.rng.random() < 0.5


class DrawPick:
    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, seq: Sequence[T]) -> T:
        return self.draw(st.sampled_from(seq))

    def bool(self) -> bool:
        return self.draw(st.booleans())


def as_strategy(generate: Callable[[Pick], T]) -> st.SearchStrategy[T]:
    """``generate`` as a hypothesis strategy (every choice is a hypothesis draw)."""
    return st.composite(lambda draw: generate(DrawPick(draw)))()


U32_EDGES = [0, 1, 2, 127, 128, 255, 256, 1000, 2**16, 2**31 - 1, 2**31, 2**32 - 1]


def reseal(data: bytes) -> bytes:
    return data[:-4] + struct.pack("<I", zlib.crc32(data[:-4])) if len(data) >= 4 else data


def _varint(value: int, pad: int = 0) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    if pad:  # non-canonical: continuation bytes carrying zeros
        out += bytes([value | 0x80] + [0x80] * (pad - 1) + [0x00])
    else:
        out.append(value)
    return bytes(out)


# ---------------------------------------------------------------- ODNG
Row = tuple[tuple[int, ...], int, int]


def odng_encode(rows: list[Row], policy: int, vd: int, vt: int, pads: dict[int, int]) -> bytes:
    """Encode rows as ODNG with the header computed from them; ``pads``: entry -> extra bytes."""
    body = bytearray()
    for i, (key, target, uses) in enumerate(rows):
        body.append(len(key) & 0xFF)
        for j, v in enumerate((*key, target, uses)):
            body += _varint(v, pads.get(i, 0) if j == 0 else 0)
    head = b"ODNG" + struct.pack("<HHIIII", 1, policy, vd, vt, len(rows), len(body))
    data = head + bytes(body)
    return data + struct.pack("<I", zlib.crc32(data))


def odng_rows(pick: Pick) -> tuple[list[Row], int, int, int]:
    """A valid cache's rows (content from a picked seed: cheap to generate), canonical order."""
    rng = random.Random(pick.int(0, 2**32))
    vd, vt = pick.choice([(300, 500), (32000, 128256), (2, 3)])
    rows: dict[tuple[int, ...], tuple[int, int]] = {}
    for _ in range(pick.int(0, 12)):
        n = rng.choice([2, 2, 3, 4, 7, 130])
        rows[tuple(rng.randrange(vd) for _ in range(n))] = (rng.randrange(vt), rng.randint(1, 300))
    out = [(k, t, u) for k, (t, u) in rows.items()]
    policy = pick.choice([0, 1])
    if policy == 1:
        out.sort(key=lambda r: r[2])
    return out, policy, vd, vt


def odng_input(pick: Pick) -> bytes:
    rows, policy, vd, vt = odng_rows(pick)
    pads: dict[int, int] = {}
    for _ in range(pick.int(0, 3)):
        op = pick.choice(["swap", "uses0", "dup", "id", "n", "pad", "policy", "none"])
        i = pick.int(0, max(0, len(rows) - 1))
        if not rows:
            break
        key, target, uses = rows[i]
        if op == "swap" and len(rows) > 1:
            j = pick.int(0, len(rows) - 1)
            rows[i], rows[j] = rows[j], rows[i]
        elif op == "uses0":
            rows[i] = (key, target, 0)
        elif op == "dup":
            rows.insert(i, rows[i])
        elif op == "id":
            rows[i] = ((*key[:-1], pick.choice([vd, vd + 1, 2**32 - 1])), target, uses)
        elif op == "n":
            rows[i] = (key[:1], target, uses)
        elif op == "pad":
            pads[i] = pick.int(1, 4)
        elif op == "policy":
            policy = pick.choice([policy ^ 1, 2, 0x10 | (policy & 1)])
    data = bytearray(odng_encode(rows, policy, vd, vt, pads))
    for _ in range(pick.int(0, 2)):
        data = _byte_edit(pick, data, header=24)
    return reseal(bytes(data)) if pick.bool() else bytes(data)


def _byte_edit(pick: Pick, data: bytearray, *, header: int) -> bytearray:
    op = pick.choice(["field", "flip", "trunc", "extend", "insert"])
    if op == "field" and len(data) >= header:
        at = pick.choice(range(4, header - 3, 2))
        width = 2 if at < 8 else 4
        value = pick.choice(U32_EDGES) & (0xFFFF if width == 2 else 0xFFFFFFFF)
        data[at : at + width] = value.to_bytes(width, "little")
    elif op == "flip" and data:
        at = pick.int(0, len(data) - 1)
        data[at] ^= 1 << pick.int(0, 7)
    elif op == "trunc":
        del data[pick.int(0, len(data)) :]
    elif op == "extend":
        data += bytes(pick.int(1, 9))
    elif op == "insert":
        at = pick.int(0, len(data))
        data[at:at] = bytes([pick.choice([0x00, 0x80, 0xFF, 0x02])])
    return data


def check_odng(data: bytes) -> str:
    try:
        cache, header = odng.from_bytes(data, source="<fuzz>")
    except odng.NGramFormatError as e:
        assert str(e).startswith("<fuzz>: ") and e.problem, e
        return "rejected"
    except Exception as e:  # noqa: BLE001 - the point: any other exception is a crash
        raise AssertionError(f"crash: {type(e).__name__}: {e}") from e
    again = odng.to_bytes(
        cache, draft_vocab_size=header.draft_vocab_size, target_vocab_size=header.target_vocab_size
    )
    assert again == data, "accepted a non-canonical ODNG file (two encodings of one cache)"
    slow = odng._read_entries(data, header, "<fuzz>")
    assert [(k, t, u) for k, t, u in slow] == cache.items(), "fast and slow readers disagree"
    return "accepted"


# ---------------------------------------------------------------- ODVM
def small_mapper(rng: random.Random) -> VocabMapper:
    vd, vt = rng.randint(1, 40), rng.randint(1, 40)
    d2t = [rng.choice([-1, rng.randrange(vt)]) for _ in range(vd)]
    spell = [[rng.randrange(vd) for _ in range(rng.randint(0, 3))] for _ in range(vt)]
    offsets = np.cumsum([0] + [len(s) for s in spell])
    flat = [i for s in spell for i in s]
    roles = []
    if rng.random() < 0.5:
        roles.append((1, rng.randrange(vd), rng.choice([-1, rng.randrange(vt)])))
    placeholders: dict[int, int] = {}
    if rng.random() < 0.3:
        roles.append((5, rng.randrange(vd), -1))
        placeholders = {t: rng.randint(1, 4) for t in sorted(rng.sample(range(vt), min(2, vt)))}
    return VocabMapper(
        torch.tensor(d2t), torch.tensor(offsets), torch.tensor(flat, dtype=torch.long),
        draft_eos=tuple(rng.sample(range(vd), min(vd, rng.randint(0, 2)))),
        target_eos=tuple(rng.sample(range(vt), min(vt, rng.randint(0, 2)))),
        roles=tuple(roles), placeholder_counts=placeholders,
    )  # fmt: skip


def odvm_input(pick: Pick) -> bytes:
    data = bytearray(odvm.to_bytes(small_mapper(random.Random(pick.int(0, 2**20)))))
    for _ in range(pick.int(1, 3)):
        if pick.bool() and len(data) >= 40:  # a u32 word of a table set to an edge value
            at = 32 + 4 * pick.int(0, (len(data) - 36) // 4 - 1)
            value = pick.choice([*U32_EDGES, 2**32 - 2])
            data[at : at + 4] = value.to_bytes(4, "little")
        else:
            data = _byte_edit(pick, data, header=32)
    return reseal(bytes(data)) if pick.int(0, 3) else bytes(data)


def _mapper_is_valid(m: VocabMapper) -> None:
    vd, vt = m.draft_vocab_size, m.target_vocab_size
    d2t, off, flat = m.draft_to_target, m.target_to_draft_offsets, m.target_to_draft_flat
    assert vd >= 1 and vt >= 1, "accepted an empty vocabulary"
    assert int(off[0]) == 0 and bool((off[1:] >= off[:-1]).all()) and int(off[-1]) == flat.numel()
    assert d2t.numel() == 0 or (int(d2t.min()) >= -1 and int(d2t.max()) < vt)
    assert flat.numel() == 0 or (int(flat.min()) >= 0 and int(flat.max()) < vd)
    assert all(0 <= e < vd for e in m.draft_eos) and all(0 <= e < vt for e in m.target_eos)
    codes = [int(r) for r, _, _ in m.roles]
    assert len(codes) == len(set(codes)) and set(codes) <= {1, 2, 3, 4, 5}
    assert all(-1 <= d < vd and -1 <= t < vt for _, d, t in m.roles)
    assert all(0 <= t < vt and n >= 1 for t, n in m.placeholder_counts.items())


def check_odvm(data: bytes) -> str:
    try:
        mapper = odvm.from_bytes(data, source="<fuzz>")
    except odvm.VocabMapFormatError as e:
        assert "<fuzz>" in str(e), e
        return "rejected"
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"crash: {type(e).__name__}: {e}") from e
    _mapper_is_valid(mapper)
    again = odvm.from_bytes(odvm.to_bytes(mapper))
    assert again.content_hash() == mapper.content_hash(), "tables do not round-trip"
    return "accepted"


# ---------------------------------------------------------------- manifest
def _graph(role: str, preset: str, tokenizer: str, vocab: int) -> dict[str, Any]:
    return {
        "file": f"{role}.onnx", "preset": preset, "family": "llama", "tokenizer": tokenizer,
        "vocab_size": vocab, "max_seq_len": 64, "seq_len": None, "n_layers": 2, "n_kv_heads": 2,
        "head_dim": 16, "quantization": "fp32",
        "parity": {"max_abs_logit_diff": 1e-6, "tolerance": 1e-3, "top1_agreement": 1.0},
    }  # fmt: skip


def seed_manifest() -> dict[str, Any]:
    files = {
        f"{r}.onnx": {"sha256": "a" * 64, "size": 1000, "role": f"{r}_graph"}
        for r in ("drafter", "target")
    }
    files["vocab_map.bin"] = {"sha256": "b" * 64, "size": 99, "role": "vocab_map"}
    files["ngram_cache.bin"] = {"sha256": "c" * 64, "size": 28, "role": "ngram_cache"}
    return {
        "schema_version": 1, "format": "omnidraft-bundle", "backend": "onnx",
        "created_by": "omnidraft-deploy 0.1.0", "draft_len": 4, "mapping_hash": "d" * 64,
        "graphs": {"drafter": _graph("drafter", "tiny-llama-68m", "llama2", 32000),
                   "target": _graph("target", "tiny-llama3-8b", "llama3", 128256)},
        "files": files, "extras": {"seed": 0},
    }  # fmt: skip


VALUES = [None, True, False, 0, -1, 1, 4, 4.5, 1e30, 2**70, "", "4", "x" * 300, "../x", "/etc/x",
          "a//b", "target.pte", [], {}, [1], {"a": 1}, "llama3", "qwen2", "NaN"]  # fmt: skip


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    return out


def manifest_input(pick: Pick) -> str:
    doc = seed_manifest()
    for _ in range(pick.int(1, 3)):
        path = pick.choice(_paths(doc)[1:])
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        op = pick.choice(["set", "set", "set", "delete", "add", "swap", "nan"])
        if op == "set":  # a copy: a later "add" must not edit the shared pool
            parent[path[-1]] = copy.deepcopy(pick.choice(VALUES))
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add":
            parent[pick.choice(["extra", "../x", "vocab_map.bin"])] = 1
        elif op == "swap" and isinstance(doc.get("graphs"), dict) and len(doc["graphs"]) == 2:
            g = doc["graphs"]
            g["drafter"], g["target"] = g.get("target"), g.get("drafter")
        elif op == "nan":
            parent[path[-1]] = pick.choice([math.nan, math.inf, -math.inf])
    text = json.dumps(doc, allow_nan=True)
    raw = pick.choice(["none", "none", "none", "deep", "dupkey", "trunc", "flip"])
    if raw == "deep":
        text = text[:-1] + ', "z": ' + "[" * pick.choice([20, 5000, 200000]) + "}"
    elif raw == "dupkey":
        text = text[:-1] + ', "backend": "qnn"}'
    elif raw == "trunc":
        text = text[: pick.int(0, len(text))]
    elif raw == "flip" and text:
        at = pick.int(0, len(text) - 1)
        text = text[:at] + pick.choice(['"', "{", "\\", "1", "\udcff"]) + text[at + 1 :]
    return text


def _manifest_is_valid(m: Manifest) -> None:
    """The documented schema, checked independently of ``Manifest.validate``."""

    def integer(x: object, lo: int, hi: int) -> bool:
        return type(x) is int and lo <= x <= hi

    assert m.schema_version == 1 and m.format == "omnidraft-bundle"
    assert m.backend in ("onnx", "xnnpack", "qnn") and integer(m.draft_len, 1, 32)
    assert type(m.mapping_hash) is str and len(m.mapping_hash) == 64 and type(m.extras) is dict
    assert set(m.graphs) == {"drafter", "target"}
    for role, g in m.graphs.items():
        assert g.file == role + (".pte" if m.backend == "xnnpack" else ".onnx")
        assert m.files[g.file].role == f"{role}_graph"
        assert integer(g.vocab_size, 1, 2**24) and integer(g.max_seq_len, 8, 131072)
        assert g.seq_len is None or integer(g.seq_len, 1, g.max_seq_len)
        assert all(integer(v, 1, 4096) for v in (g.n_layers, g.n_kv_heads, g.head_dim))
        assert all(type(v) in (int, float) and math.isfinite(v) for v in g.parity.values())
    for rel, e in m.files.items():
        assert ".." not in rel.split("/") and not rel.startswith("/") and "//" not in rel
        assert type(e.size) is int and e.size >= 0 and len(e.sha256) == 64


def check_manifest(text: str) -> str:
    try:
        m = Manifest.from_json(text, source="manifest.json")
    except BundleError as e:
        assert str(e).startswith("manifest.json: ") and e.problem, e
        return "rejected"
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"crash: {type(e).__name__}: {e}") from e
    _manifest_is_valid(m)
    assert Manifest.from_json(m.to_json()) == m, "manifest does not round-trip"
    return "accepted"


def odng_seed_cache(rng: random.Random, n: int, policy: str) -> NGramCache:
    rows = {tuple(rng.randrange(300) for _ in range(rng.randint(2, 4))) for _ in range(n)}
    uses = sorted(rng.randint(1, 9) for _ in rows)
    return NGramCache.from_checked_rows(
        list(rows), [rng.randrange(500) for _ in rows], uses, policy=policy
    )


# ---------------------------------------------------------------- special_tokens.json, expected.json
# raw JSON values a crafted file may hold where the readers expect ids, names, counts and lists
RAW_VALUES = ["1e999", "-1e999", "NaN", "Infinity", "1.7", "1.0", "true", "false", "null", '"x"',
              "-1", "0", "1", "2", "3", "4294967296", "99999999999999999999999", "1" * 5000, "[]",
              "[1.7, true]", "[1e999]", "[0]", "[-1]", "[0, 0]", "[true]", '["1"]', '{"a": 1}',
              "[" * 20 + "]" * 20, "[" * 100_000 + "]" * 100_000, '"' + "x" * 300 + '"']  # fmt: skip
SPECIAL_PATHS = [("name",), ("bos_id",), ("eos_ids",), ("eos_ids", 0), ("vocab_size",), ("z",)]
EXPECTED_PATHS = [("version",), ("max_new_tokens",), ("vocab_limit",), ("eos_ids",),
                  ("prompts",), ("prompts", 0), ("prompts", 0, "prompt_ids"),
                  ("prompts", 0, "prompt_ids", 0), ("prompts", 0, "output_ids"),
                  ("prompts", 0, "output_ids", 0), ("prompts", 0, "task"), ("z",)]  # fmt: skip
SPECIAL_VOCAB = 1000  # the tokenizer the fuzzed special_tokens.json describes


def json_edit(text: str, pick: Pick, paths: list[tuple[Any, ...]]) -> str:
    """One structure-aware edit of a JSON text: a field (by path) set to a raw crafted value,
    deleted or added, a key duplicated, the text truncated. ``KeyError`` / ``IndexError`` /
    ``TypeError`` when an earlier edit removed the path (the caller skips the edit)."""
    op = pick.choice(["set", "set", "set", "set", "delete", "dupkey", "trunc"])
    if op == "trunc":
        return text[: pick.int(0, max(0, len(text) - 1))]
    if op == "dupkey":
        return text[:-1] + ', "' + str(pick.choice(paths)[0]) + '": 1}'
    doc = json.loads(text)
    path = pick.choice(paths)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if op == "delete":
        del parent[path[-1]]
        return json.dumps(doc)
    parent[path[-1]] = "__RAW__"
    return json.dumps(doc).replace('"__RAW__"', pick.choice(RAW_VALUES))


def _edited(text: str, pick: Pick, paths: list[tuple[Any, ...]]) -> bytes:
    for _ in range(pick.int(0, 3)):  # an edit whose path is gone (or the text cut) is skipped
        with contextlib.suppress(KeyError, IndexError, TypeError, ValueError, RecursionError):
            text = json_edit(text, pick, paths)
    return text.encode("utf-8")


def special_input(pick: Pick) -> bytes:
    doc = {"name": pick.choice(["qwen2", "llama3", "x"]), "bos_id": pick.choice([None, 1, 999]),
           "eos_ids": [pick.int(0, SPECIAL_VOCAB - 1) for _ in range(pick.int(0, 3))],
           "vocab_size": pick.choice([SPECIAL_VOCAB, SPECIAL_VOCAB, 10])}  # fmt: skip
    if pick.int(0, 4) == 0:
        del doc["vocab_size"]  # a bundle from before issue 28
    return _edited(json.dumps(doc), pick, SPECIAL_PATHS)


def _strict_doc(data: bytes) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"accepted a file holding {name}")

    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def _ids_ok(value: object, n: int) -> bool:
    return type(value) is list and all(type(i) is int and 0 <= i < n for i in value)


def check_special(data: bytes) -> str:
    """``read_special``: refused with a ``BundleError`` naming the file, or accepted with every
    documented type exact (the oracle reads the JSON itself)."""
    from pathlib import Path

    from omnidraft_deploy.vocab.bundle_tokenizer import read_special

    try:
        got = read_special(data, Path("b/special_tokens.json"))
    except BundleError as e:
        assert str(e).startswith("b/special_tokens.json: ") and e.problem, e
        return "rejected"
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"crash: {type(e).__name__}: {e}") from e
    doc = _strict_doc(data)
    assert isinstance(doc, dict) and {"name", "bos_id", "eos_ids"} <= set(doc)
    assert set(doc) <= {"name", "bos_id", "eos_ids", "vocab_size"}, doc
    n = doc.get("vocab_size", 1 << 24)
    assert type(n) is int and 1 <= n <= 1 << 24 and type(doc["name"]) is str and doc["name"]
    assert _ids_ok(doc["eos_ids"], n) and (doc["bos_id"] is None or _ids_ok([doc["bos_id"]], n))
    assert got.eos_ids == tuple(doc["eos_ids"]) and got.bos_id == doc["bos_id"]
    return "accepted"


def expected_input(pick: Pick) -> bytes:
    rows = [{"task": pick.choice(["code", "math"]), "text": "x",
             "prompt_ids": [pick.int(0, SPECIAL_VOCAB - 1) for _ in range(pick.int(1, 4))],
             "output_ids": [pick.int(0, SPECIAL_VOCAB - 1) for _ in range(pick.int(0, 4))],
             "output_text": ""} for _ in range(pick.int(1, 3))]  # fmt: skip
    doc = {"version": 1, "max_new_tokens": pick.choice([4, 16]), "vocab_limit": SPECIAL_VOCAB,
           "eos_ids": [0], "prompts": rows}  # fmt: skip
    return _edited(json.dumps(doc), pick, EXPECTED_PATHS)


def check_expected(data: bytes) -> str:
    """``checks.expected.from_bytes`` (for a target tokenizer of ``SPECIAL_VOCAB`` ids)."""
    from omnidraft_deploy.checks.expected import from_bytes

    try:
        from_bytes(data, "b/expected.json", vocab_size=SPECIAL_VOCAB)
    except ValueError as e:
        assert str(e).startswith("b/expected.json: "), e
        return "rejected"
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"crash: {type(e).__name__}: {e}") from e
    doc = _strict_doc(data)
    n = SPECIAL_VOCAB
    assert isinstance(doc, dict) and doc["version"] == 1 and type(doc["version"]) is int
    assert type(doc["max_new_tokens"]) is int and doc["max_new_tokens"] >= 1, doc
    assert doc.get("vocab_limit", n) == n and type(doc.get("vocab_limit", n)) is int
    assert _ids_ok(doc.get("eos_ids", []), n) and type(doc["prompts"]) is list and doc["prompts"]
    for row in doc["prompts"]:
        assert _ids_ok(row["prompt_ids"], n) and row["prompt_ids"], row
        assert _ids_ok(row["output_ids"], n) and len(row["output_ids"]) <= doc["max_new_tokens"]
        assert type(row["task"]) is str
    return "accepted"
