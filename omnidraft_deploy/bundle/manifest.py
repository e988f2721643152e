"""Bundle manifest: the contract between exporters, the reference runtime and the Android demo.

A bundle is a folder::

    manifest.json            this schema (JSON, UTF-8)
    drafter.<ext>            drafter graph (.pte for xnnpack, .onnx for onnx / qnn), plus
                             optional external data (.onnx.data) and an ORT mobile file (.ort)
    target.<ext>             target graph
    drafter_tokenizer/...    tokenizer files of the drafter
    target_tokenizer/...     tokenizer files of the target
    vocab_map.bin            omnidraft_deploy.vocab.io format
    ngram_cache.bin          omnidraft_deploy.ngram.format format

A bundle is a closed world: ``manifest.json`` lists every file a reader opens with its sha256 and
size. This module is the schema only, without I/O: ``omnidraft_deploy.bundle.folder`` reads it,
verifies the listed files before any model runs (``verify_bundle``) and stages new bundles
(``atomic_bundle_dir``); ``omnidraft_deploy.bundle.files`` opens files as a closed world (no
symlink, nothing outside the folder). ``extras`` is informational: no reader acts on it.

Schema (version 1)::

    {"schema_version": 1, "format": "omnidraft-bundle", "backend": "xnnpack|qnn|onnx",
     "created_by": "omnidraft-deploy 0.1.0", "draft_len": 4, "mapping_hash": "<sha256 hex>",
     "graphs": {"drafter": GraphInfo, "target": GraphInfo},
     "files": {"<relative path>": {"sha256": "<hex>", "size": <int>, "role": "<role>"}},
     "extras": {...free-form, informational only, e.g. export timings and peak RSS...}}

    GraphInfo = {"file": "drafter.pte", "preset": "tiny-llama-68m" | "<model's own name>",
                 "family": "llama",
                 "tokenizer": "llama2", "vocab_size": 32000, "max_seq_len": 512,
                 "seq_len": null (dynamic) | <int> (static), "n_layers": 2, "n_kv_heads": 4,
                 "head_dim": 16, "quantization": "fp32|8da4w|int8w|qdq-u8|int8|int4",
                 "parity": {"max_abs_logit_diff": <float>, "tolerance": <float>,
                            "top1_agreement": <float>, "prompts": <int>},
                 "decode_file": null | "<role>_decode.onnx" (qnn: the same graph at T = 1)}

Schema 2: one drafter, 2 to ``MAX_TARGETS`` targets (issue 30; ``bundle.targets`` picks one)::

    as schema 1, except "graphs": {"drafter": GraphInfo}, "mapping_hash": sha256 of the lines
    "<name>:<its map's mapping_hash>\n" (names sorted), and, per target, its files in a folder
    and its map stored by content (targets of one vocabulary share one map file):
    "targets": {"<name>": {"graph": GraphInfo (file "targets/<name>/target.<ext>"; its .ort and
                           .onnx.data beside it), "mapping_hash": "<hex>",
                           "vocab_map": "maps/<first 16 hex of the file's sha256>.bin",
                           "ngram_cache": "targets/<name>/ngram_cache.bin",
                           "tokenizer": "targets/<name>/target_tokenizer",
                           "expected": "targets/<name>/expected.json"}}

Single-target bundles keep writing schema 1, without "targets" (readers of schema 1 open them).

Validation (``validate()`` of each section, run on construction and so before anything is
allocated): ``schema_version`` and ``created_by`` present (never defaulted), exact JSON types (a bool is not an int), ranges, no NaN / infinity, no duplicate JSON
keys, at most ``MAX_MANIFEST_BYTES`` and ``MAX_JSON_DEPTH`` levels; ``file`` is ``<role>.pte`` for
xnnpack and ``<role>.onnx`` otherwise; ``preset`` is a known preset whose family and tokenizer
match, or (weights exported with no preset) the model's own name, a plain identifier with a known
family and tokenizer; ``quantization`` is a recipe of the backend; qnn graphs are static (``seq_len`` ==
``draft_len + 1``), others dynamic; the KV cache a graph implies stays under ``MAX_KV_BYTES``.
Every failure is a ``BundleError`` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from omnidraft_deploy.bundle.strict_json import check_finite, depth, loads_strict
from omnidraft_deploy.catalog.backends import backend_names, recipe_names

SCHEMA_VERSION = 2  # the newest schema this reader reads
SINGLE_TARGET_VERSION = 1  # what single-target bundles write (readers of schema 1 open them)
MULTI_TARGET_VERSION = 2  # a bundle of one drafter and several targets (``targets``)
MAX_TARGETS = 64
FORMAT_NAME = "omnidraft-bundle"
MANIFEST_NAME = "manifest.json"
BACKENDS = tuple(backend_names())  # omnidraft_deploy.catalog.backends: the one list
MAX_MANIFEST_BYTES = 1 << 20
MAX_JSON_DEPTH = 16
MAX_FILES = 4096
MAX_FILE_BYTES = 1 << 40
MAX_KV_BYTES = 64 << 30  # fp32 K + V of one graph at max_seq_len
REQUIRED = ("schema_version", "created_by")  # never defaulted when read
_HEX64 = re.compile(r"[0-9a-f]{64}")
_REL_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


class BundleError(ValueError):
    """A bundle (or one file of it) is missing, corrupted, foreign or from a newer schema."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


def _int(where: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int:
        raise ValueError(
            f"field {where}: expected an integer, got {type(value).__name__} {value!r}"
        )
    if not lo <= value <= hi:
        raise ValueError(f"field {where}: {value} outside [{lo}, {hi}]")
    return value


def _str(where: str, value: object, choices: list[str] | None = None) -> str:
    if type(value) is not str or not value or len(value) > 256:
        raise ValueError(f"field {where}: expected a non-empty string, got {value!r:.80}")
    if choices is not None and value not in choices:
        raise ValueError(f"field {where}: {value!r} not one of {choices}")
    return value


def check_relpath(where: str, rel: object) -> str:
    """A plain relative path inside the bundle: no '..', no absolute path, no odd characters."""
    parts = _str(where, rel).split("/")
    if len(parts) > 4 or not all(_REL_PART.fullmatch(p) for p in parts) or ".." in parts:
        raise ValueError(f"field {where}: {rel!r} is not a plain relative path inside the bundle")
    return str(rel)


@dataclass(frozen=True)
class GraphInfo:
    file: str
    preset: str
    family: str
    tokenizer: str
    vocab_size: int
    max_seq_len: int
    seq_len: int | None  # None: dynamic sequence dim; int: static T (NPU graphs)
    n_layers: int
    n_kv_heads: int
    head_dim: int
    quantization: str
    parity: dict[str, float] = field(default_factory=dict)
    # static-T graphs: ``<role>_decode.onnx``, the same function at T = 1 (one-token calls)
    decode_file: str | None = None

    def __post_init__(self) -> None:
        self.validate("graph")

    @staticmethod
    def decode_name(role: str) -> str:
        """The file of ``role``'s T = 1 twin (the only name a manifest accepts for it)."""
        return f"{role}_decode.onnx"

    def decode_info(self) -> GraphInfo:
        """The decode graph's own description: this one at ``decode_file`` with T = 1."""
        if self.decode_file is None:
            raise ValueError(f"{self.file} has no decode graph")
        return dataclasses.replace(self, file=self.decode_file, seq_len=1, decode_file=None)

    def validate(self, where: str) -> None:
        """Types and ranges of this section alone; ``Manifest.validate`` does the cross-checks."""
        check_relpath(f"{where}.file", self.file)
        if self.decode_file is not None:
            check_relpath(f"{where}.decode_file", self.decode_file)
        for name in ("preset", "family", "tokenizer"):
            _str(f"{where}.{name}", getattr(self, name))
        _int(f"{where}.vocab_size", self.vocab_size, 1, 1 << 24)
        _int(f"{where}.max_seq_len", self.max_seq_len, 8, 131072)
        if self.seq_len is not None:
            _int(f"{where}.seq_len", self.seq_len, 1, self.max_seq_len)
        _int(f"{where}.n_layers", self.n_layers, 1, 1024)
        _int(f"{where}.n_kv_heads", self.n_kv_heads, 1, 1024)
        _int(f"{where}.head_dim", self.head_dim, 1, 4096)
        _str(f"{where}.quantization", self.quantization)
        kv = 2 * 4 * self.n_layers * self.n_kv_heads * self.head_dim * self.max_seq_len
        if kv > MAX_KV_BYTES:
            raise ValueError(f"field {where}: a {kv / 2**30:.0f} GiB KV cache is implausible")
        if type(self.parity) is not dict or len(self.parity) > 16:
            raise ValueError(f"field {where}.parity: expected a small object")
        for key, value in self.parity.items():
            ok = type(value) in (int, float) and math.isfinite(value) and value >= 0
            if not (_REL_PART.fullmatch(str(key)) and ok):
                raise ValueError(
                    f"field {where}.parity.{key}: {value!r} is not a finite number >= 0"
                )


# file role of a QNN graph's EPContext model and its context binary (``onnx_host.context_path``)
HTP_CONTEXT = "htp_context"


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int
    role: str

    def __post_init__(self) -> None:
        self.validate("file")

    def validate(self, where: str) -> None:
        if type(self.sha256) is not str or not _HEX64.fullmatch(self.sha256):
            raise ValueError(f"field {where}.sha256: {self.sha256!r:.80} is not 64 lowercase hex")
        _int(f"{where}.size", self.size, 0, MAX_FILE_BYTES)
        _str(f"{where}.role", self.role)


@dataclass(frozen=True)
class TargetInfo:
    """One target of a multi-target bundle: its graph and the files pairing it with the drafter."""

    graph: GraphInfo  # file: targets/<name>/target.<ext>
    mapping_hash: str  # content hash of its vocabulary map (``VocabMapper.content_hash``)
    vocab_map: str  # maps/<hex16>.bin, shared by the targets of one vocabulary
    ngram_cache: str  # targets/<name>/ngram_cache.bin
    tokenizer: str  # folder of its tokenizer files: targets/<name>/target_tokenizer
    expected: str  # targets/<name>/expected.json (``checks.expected``)

    def __post_init__(self) -> None:
        self.validate("target")

    def validate(self, where: str) -> None:
        if type(self.graph) is not GraphInfo:
            raise ValueError(f"field {where}.graph: not a graph description")
        if type(self.mapping_hash) is not str or not _HEX64.fullmatch(self.mapping_hash):
            raise ValueError(f"field {where}.mapping_hash: {self.mapping_hash!r:.80} is not 64 "
                             "lowercase hex")  # fmt: skip
        for name in ("vocab_map", "ngram_cache", "tokenizer", "expected"):
            check_relpath(f"{where}.{name}", getattr(self, name))


@dataclass(frozen=True)
class Manifest:
    backend: str
    draft_len: int
    mapping_hash: str
    graphs: dict[str, GraphInfo]
    files: dict[str, FileEntry]
    created_by: str = "omnidraft-deploy 0.1.0"
    extras: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SINGLE_TARGET_VERSION
    format: str = FORMAT_NAME
    # schema 2: name -> target; ``bundle.targets.select`` gives the one-target view the runtime
    # decodes with (graphs.target = that target's graph, targets = it alone)
    targets: dict[str, TargetInfo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field's type and range, then the cross-checks between sections."""
        _str("format", self.format, [FORMAT_NAME])
        _int("schema_version", self.schema_version, 1, SCHEMA_VERSION)
        backend = _str("backend", self.backend, list(BACKENDS))
        _str("created_by", self.created_by)
        _int("draft_len", self.draft_len, 1, 32)
        if type(self.mapping_hash) is not str or not _HEX64.fullmatch(self.mapping_hash):
            raise ValueError(
                f"field mapping_hash: {self.mapping_hash!r:.80} is not 64 lowercase hex"
            )
        if type(self.extras) is not dict:
            raise ValueError(f"field extras: expected an object, got {type(self.extras).__name__}")
        check_finite("extras", self.extras)
        if type(self.files) is not dict or len(self.files) > MAX_FILES:
            raise ValueError(f"field files: expected an object of at most {MAX_FILES} entries")
        for rel, entry in self.files.items():
            check_relpath(f"files[{rel!r:.80}]", rel)
            if rel == MANIFEST_NAME or type(entry) is not FileEntry:
                raise ValueError(f"field files[{rel!r}]: not a file entry")
        ext = ".pte" if backend == "xnnpack" else ".onnx"
        roles = {"drafter", "target"}
        if self.targets or self.schema_version >= MULTI_TARGET_VERSION:
            roles = self._check_targets(ext)
        if type(self.graphs) is not dict or set(self.graphs) != roles:
            raise ValueError(f"field graphs: must hold exactly {sorted(roles)}")
        for role, g in self.graphs.items():
            file = f"{role}{ext}" if role == "drafter" or not self.targets else g.file
            self._check_graph(role, g, file)

    def _check_targets(self, ext: str) -> set[str]:
        """Schema 2's ``targets``; the roles ``graphs`` holds: the drafter alone, or with the
        selected target in a one-target view (``bundle.targets.select``)."""
        if self.schema_version < MULTI_TARGET_VERSION or type(self.targets) is not dict:
            raise ValueError(f"field targets: a schema {MULTI_TARGET_VERSION} field")
        view = len(self.targets) == 1 and type(self.graphs) is dict and "target" in self.graphs
        if not (view or 2 <= len(self.targets) <= MAX_TARGETS):
            raise ValueError(f"field targets: 2 to {MAX_TARGETS} targets, got {len(self.targets)}")
        for name, t in self.targets.items():
            where = f"targets.{name}"
            if not _REL_PART.fullmatch(str(name)) or type(t) is not TargetInfo:
                raise ValueError(f"field {where:.80}: not a target name and description")
            self._check_graph(
                "target", t.graph, f"targets/{name}/target{ext}", where=f"{where}.graph"
            )
            for part, role in (("vocab_map", "vocab_map"), ("ngram_cache", "ngram_cache"),
                               ("expected", "expected")):  # fmt: skip
                entry = self.files.get(getattr(t, part))
                if entry is None or entry.role != role:
                    raise ValueError(f"field {where}.{part}: {getattr(t, part)!r} is not listed "
                                     f"as {role} in files")  # fmt: skip
            if t.tokenizer != f"targets/{name}/target_tokenizer":
                raise ValueError(f"field {where}.tokenizer: {t.tokenizer!r}, a bundle has "
                                 f"targets/{name}/target_tokenizer")  # fmt: skip
        if view and self.graphs["target"] != next(iter(self.targets.values())).graph:
            raise ValueError("field graphs.target: not the graph of the selected target")
        return {"drafter", "target"} if view else {"drafter"}

    def _check_graph(self, role: str, g: GraphInfo, file: str, *, where: str = "") -> None:
        where = where or f"graphs.{role}"
        if type(g) is not GraphInfo:
            raise ValueError(f"field {where}: not a graph description")
        if g.file != file:
            raise ValueError(f"field {where}.file: {g.file!r}, a {self.backend} bundle has {file}")
        entry = self.files.get(g.file)
        if entry is None or entry.role != f"{role}_graph":
            raise ValueError(
                f"field {where}.file: {g.file!r} is not listed as {role}_graph in files"
            )
        _str(f"{where}.quantization", g.quantization, recipe_names(self.backend))
        _check_model(where, g)
        static = self.backend == "qnn"
        if static and g.seq_len != self.draft_len + 1:
            raise ValueError(f"field {where}.seq_len: {g.seq_len}, qnn graphs take draft_len + 1")
        if not static and g.seq_len is not None:
            raise ValueError(
                f"field {where}.seq_len: {g.seq_len}, {self.backend} graphs are dynamic"
            )
        if g.decode_file is not None:
            entry = self.files.get(g.decode_file)
            if not static or g.decode_file != GraphInfo.decode_name(role):
                raise ValueError(f"field {where}.decode_file: {g.decode_file!r}, a {self.backend} "
                                 f"bundle has none or {GraphInfo.decode_name(role)} (qnn)")  # fmt: skip
            if entry is None or entry.role != f"{role}_graph":
                raise ValueError(f"field {where}.decode_file: {g.decode_file!r} is not listed "
                                 f"as {role}_graph in files")  # fmt: skip

    def to_json(self) -> str:
        doc = dataclasses.asdict(self)
        if not self.targets:  # a single-target manifest stays schema 1's, key for key
            del doc["targets"]
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str | os.PathLike[str] = MANIFEST_NAME) -> Manifest:
        raw = _parse(text, source)
        version = raw.get("schema_version")
        if type(version) is int and version > SCHEMA_VERSION:
            raise BundleError(
                source,
                f"schema_version {version} is newer than this reader ({SCHEMA_VERSION}); "
                "upgrade omnidraft-deploy",
            )
        if raw.get("format") != FORMAT_NAME:
            raise BundleError(
                source, f"not an omnidraft bundle manifest (format != {FORMAT_NAME!r})"
            )
        missing = [k for k in REQUIRED if k not in raw]
        if missing:  # no silent defaults: a writer that leaves them out is not ours
            raise BundleError(source, f"field {missing[0]}: missing (a manifest states its "
                              f"{' and '.join(REQUIRED)})")  # fmt: skip
        try:
            graphs = {
                k: _section(GraphInfo, f"graphs.{k}", v)
                for k, v in _obj("graphs", raw.pop("graphs", None)).items()
            }
            files = {
                k: _section(FileEntry, f"files[{k!r:.80}]", v)
                for k, v in _obj("files", raw.pop("files", None)).items()
            }
            targets = {
                k: _target(f"targets.{k:.80}", v)
                for k, v in _obj("targets", raw.pop("targets", {})).items()
            }
            if targets and "target" in graphs:  # the one-target view is never written
                raise ValueError("field graphs: a multi-target manifest lists its targets "
                                 "under targets, graphs holds the drafter only")  # fmt: skip
            unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)[:5]}")
            return cls(graphs=graphs, files=files, targets=targets, **raw)
        except (TypeError, ValueError) as e:
            raise BundleError(source, str(e)) from None


def _check_model(where: str, g: GraphInfo) -> None:
    """``preset`` is a preset whose family and tokenizer ``g`` repeats, or (weights exported with
    no preset) the model's own name: a plain identifier with a known family and tokenizer."""
    from omnidraft_deploy.catalog.presets import PRESETS, Family
    from omnidraft_deploy.vocab.tokenizers import TOKENIZERS

    spec = PRESETS.get(g.preset)
    if spec is None and not _REL_PART.fullmatch(g.preset):
        raise ValueError(f"field {where}.preset: {g.preset!r:.80} is neither a preset nor a "
                         "model's own name (letters, digits, '.', '_', '-')")  # fmt: skip
    families = [f.value for f in Family] if spec is None else [spec.family.value]
    _str(f"{where}.family", g.family, families)
    _str(
        f"{where}.tokenizer", g.tokenizer, sorted(TOKENIZERS) if spec is None else [spec.tokenizer]
    )


def _obj(where: str, value: object) -> dict[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"field {where}: expected an object, got {type(value).__name__}")
    return value


def _section(cls: Any, where: str, value: object) -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    got = _obj(where, value)
    if set(got) - set(names) or set(names) - set(got) - {"parity", "decode_file"}:
        raise ValueError(f"field {where}: keys {sorted(got)} != {sorted(names)}")
    try:
        return cls(**got)
    except ValueError as e:  # the section's validate() names "graph"/"file": name the real place
        raise ValueError(
            str(e)
            .replace("field graph", f"field {where}", 1)
            .replace("field file", f"field {where}", 1)
        ) from None


def _target(where: str, value: object) -> TargetInfo:
    got = dict(_obj(where, value))
    names = [f.name for f in dataclasses.fields(TargetInfo)]
    if set(got) != set(names):
        raise ValueError(f"field {where}: keys {sorted(got)} != {sorted(names)}")
    graph = _section(GraphInfo, f"{where}.graph", got.pop("graph"))
    try:
        return TargetInfo(graph=graph, **got)
    except ValueError as e:
        raise ValueError(str(e).replace("field target", f"field {where}", 1)) from None


def _parse(text: str, source: str | os.PathLike[str]) -> dict[str, Any]:
    if len(text) > MAX_MANIFEST_BYTES:
        raise BundleError(source, f"{len(text)} characters, more than {MAX_MANIFEST_BYTES}")

    if depth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise BundleError(source, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        raw = loads_strict(text)  # NaN parses, and is refused per field
    except (ValueError, RecursionError) as e:
        raise BundleError(source, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise BundleError(source, "not an omnidraft bundle manifest (not a JSON object)")
    return raw
