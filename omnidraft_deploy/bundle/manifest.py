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

The sections (``GraphInfo``, ``FileEntry``, ``TargetInfo``) and the field checks they share live
in ``bundle.sections``; this module holds ``Manifest``, its cross-checks and the JSON reader.

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
import os
from dataclasses import dataclass, field
from typing import Any

from omnidraft_deploy.bundle.sections import (
    HEX64,
    REL_PART,
    FileEntry,
    GraphInfo,
    TargetInfo,
    check_int,
    check_model,
    check_relpath,
    check_str,
)
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
REQUIRED = ("schema_version", "created_by")  # never defaulted when read


class BundleError(ValueError):
    """A bundle (or one file of it) is missing, corrupted, foreign or from a newer schema."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


# file role of a QNN graph's EPContext model and its context binary (``onnx_host.context_path``)
HTP_CONTEXT = "htp_context"


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
        check_str("format", self.format, [FORMAT_NAME])
        check_int("schema_version", self.schema_version, 1, SCHEMA_VERSION)
        backend = check_str("backend", self.backend, list(BACKENDS))
        check_str("created_by", self.created_by)
        check_int("draft_len", self.draft_len, 1, 32)
        if type(self.mapping_hash) is not str or not HEX64.fullmatch(self.mapping_hash):
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
            if not REL_PART.fullmatch(str(name)) or type(t) is not TargetInfo:
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
        check_str(f"{where}.quantization", g.quantization, recipe_names(self.backend))
        check_model(where, g)
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
