"""Bundle manifest: the contract between exporters, the reference runtime and the Android demo.

A bundle is a folder::

    manifest.json            this schema (JSON, UTF-8)
    drafter.<ext>            drafter graph (.pte / .onnx / .ort), plus optional external data
    target.<ext>             target graph
    drafter_tokenizer/...    tokenizer files of the drafter
    target_tokenizer/...     tokenizer files of the target
    vocab_map.bin            omnidraft_deploy.vocab.io format
    ngram_cache.bin          omnidraft_deploy.ngram.format format

``manifest.json`` lists every file with its sha256 and size; readers verify all of them before any
model runs (``verify_bundle``). Bundles are written into a temporary sibling folder and renamed
into place as the last step (``atomic_bundle_dir``), so an interrupted export never leaves a folder
that looks complete. Readers refuse a newer ``schema_version`` with a message naming the file.

Schema (version 1)::

    {"schema_version": 1, "format": "omnidraft-bundle", "backend": "xnnpack|qnn|onnx",
     "created_by": "omnidraft-deploy 0.1.0", "draft_len": 4, "mapping_hash": "<sha256 hex>",
     "graphs": {"drafter": GraphInfo, "target": GraphInfo},
     "files": {"<relative path>": {"sha256": "<hex>", "size": <int>, "role": "<role>"}},
     "extras": {...free-form, e.g. export timings and peak RSS...}}

    GraphInfo = {"file": "drafter.pte", "preset": "tiny-llama-68m", "family": "llama",
                 "tokenizer": "llama2", "vocab_size": 32000, "max_seq_len": 512,
                 "seq_len": null (dynamic) | <int> (static), "n_layers": 2, "n_kv_heads": 4,
                 "head_dim": 16, "quantization": "fp32|8da4w|int8w|qdq-u8|int8|int4",
                 "parity": {"max_abs_logit_diff": <float>, "tolerance": <float>,
                            "top1_agreement": <float>, "prompts": <int>}}
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
FORMAT_NAME = "omnidraft-bundle"
MANIFEST_NAME = "manifest.json"
BACKENDS = ("xnnpack", "qnn", "onnx")


class BundleError(ValueError):
    """A bundle (or one file of it) is missing, corrupted, foreign or from a newer schema."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


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


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int
    role: str


@dataclass(frozen=True)
class Manifest:
    backend: str
    draft_len: int
    mapping_hash: str
    graphs: dict[str, GraphInfo]
    files: dict[str, FileEntry]
    created_by: str = "omnidraft-deploy 0.1.0"
    extras: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT_NAME

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} not one of {BACKENDS}")
        if set(self.graphs) != {"drafter", "target"}:
            raise ValueError(f"graphs must be drafter and target, got {sorted(self.graphs)}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str | os.PathLike[str] = MANIFEST_NAME) -> Manifest:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise BundleError(source, f"not valid JSON ({e})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise BundleError(
                source, f"not an omnidraft bundle manifest (format != {FORMAT_NAME!r})"
            )
        version = raw.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise BundleError(
                source,
                f"schema_version {version!r} is newer than this reader ({SCHEMA_VERSION}); "
                "upgrade omnidraft-deploy",
            )
        try:
            graphs = {k: GraphInfo(**v) for k, v in raw.pop("graphs").items()}
            files = {k: FileEntry(**v) for k, v in raw.pop("files").items()}
            return cls(graphs=graphs, files=files, **raw)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BundleError(source, f"malformed manifest ({e})") from None


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(bundle_dir: Path, rel: str, role: str) -> FileEntry:
    p = bundle_dir / rel
    return FileEntry(sha256=sha256_file(p), size=p.stat().st_size, role=role)


def read_manifest(bundle_dir: str | os.PathLike[str]) -> Manifest:
    path = Path(bundle_dir) / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(path, "missing: not an exported bundle (or the export did not finish)")
    return Manifest.from_json(path.read_text(encoding="utf-8"), source=path)


def verify_bundle(bundle_dir: str | os.PathLike[str]) -> Manifest:
    """Read the manifest and check every listed file's presence, size and sha256."""
    root = Path(bundle_dir)
    manifest = read_manifest(root)
    for rel, entry in manifest.files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(root / MANIFEST_NAME, f"file path {rel!r} leaves the bundle folder")
        p = root / rel
        if not p.is_file():
            raise BundleError(p, f"missing (listed in {MANIFEST_NAME} as {entry.role})")
        size = p.stat().st_size
        if size != entry.size:
            raise BundleError(p, f"size {size} B != {entry.size} B in manifest (truncated?)")
        if sha256_file(p) != entry.sha256:
            raise BundleError(p, "sha256 mismatch with manifest (corrupted or replaced)")
    for role, g in manifest.graphs.items():
        if g.file not in manifest.files:
            raise BundleError(root / MANIFEST_NAME, f"{role} graph {g.file!r} not in files")
    return manifest


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; artifacts are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_bundle_dir(final_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp folder beside ``final_dir``; on success it replaces ``final_dir`` whole."""
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        if not (tmp / MANIFEST_NAME).is_file():
            raise BundleError(tmp, f"export finished without writing {MANIFEST_NAME}")
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
