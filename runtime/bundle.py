"""Open an exported bundle: every check runs before any model does.

Order: manifest (schema, format), every file's size and sha256, each graph's own metadata against
the manifest (ONNX ``metadata_props`` / ``.pte`` constant methods), the vocabulary map and n-gram
cache formats and their vocabulary sizes against the graphs and tokenizers. Each failure is a
``BundleError`` naming the file and the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omnidraft_deploy.runtime.base import RuntimeModel

from omnidraft_deploy.manifest import BundleError, GraphInfo, Manifest, verify_bundle
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import NGramFormatError
from omnidraft_deploy.ngram.format import load as load_ngram
from omnidraft_deploy.vocab import io as vocab_io
from omnidraft_deploy.vocab.mapper import VocabMapper

VOCAB_MAP, NGRAM_CACHE = "vocab_map.bin", "ngram_cache.bin"
ONNX_FORMAT_VERSION = "1"  # metadata_props "omnidraft.format_version" this reader understands


@dataclass
class OpenBundle:
    root: Path
    manifest: Manifest
    drafter: RuntimeModel
    target: RuntimeModel
    mapper: VocabMapper
    ngram_cache: NGramCache
    provider: str = "cpu"


def check_onnx_metadata(path: Path, info: GraphInfo) -> None:
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others for foreign bytes
        raise BundleError(path, f"not a readable ONNX model ({type(e).__name__})") from None
    meta = {p.key: p.value for p in proto.metadata_props}
    if "omnidraft.graph_info" not in meta:
        raise BundleError(path, "ONNX model has no omnidraft.graph_info metadata (foreign graph)")
    version = meta.get("omnidraft.format_version")
    if version != ONNX_FORMAT_VERSION:
        raise BundleError(
            path, f"graph format_version {version!r}; this reader reads {ONNX_FORMAT_VERSION!r}"
        )
    try:
        stored = json.loads(meta["omnidraft.graph_info"])
    except json.JSONDecodeError as e:
        raise BundleError(path, f"omnidraft.graph_info metadata is not JSON ({e})") from None
    for key in ("vocab_size", "max_seq_len", "n_layers", "n_kv_heads", "head_dim", "seq_len"):
        if stored.get(key) != getattr(info, key):
            raise BundleError(
                path,
                f"graph metadata {key}={stored.get(key)} but manifest says {getattr(info, key)}",
            )


def load_graph(root: Path, manifest: Manifest, role: str, *, provider: str = "cpu") -> RuntimeModel:
    info = manifest.graphs[role]
    path = root / info.file
    if path.suffix == ".onnx":
        check_onnx_metadata(path, info)
    return load_graph_file(path, info, provider=provider)


def load_model(
    path_or_bundle: str | Path, role: str = "target", *, provider: str | None = None
) -> RuntimeModel:
    """One graph of a bundle as a ``CausalLM``, after the bundle's manifest and sha256 checks.

    ``provider`` None: chosen by the manifest's backend (qnn -> the QNN HTP, else CPU); the
    ``.pte`` / ``.onnx`` suffix picks ExecuTorch or ONNX Runtime. ``path_or_bundle`` may also be a
    graph file inside a bundle folder.
    """
    root = Path(path_or_bundle)
    root = root.parent if root.is_file() else root
    manifest = verify_bundle(root)
    if role not in manifest.graphs:
        raise KeyError(f"unknown role {role!r}; choose from {sorted(manifest.graphs)}")
    chosen = provider or default_provider(manifest)
    return load_graph(root, manifest, role, provider=chosen)


def load_graph_file(path: Path, info: GraphInfo, *, provider: str = "cpu") -> RuntimeModel:
    """A runtime model for one graph file (.pte -> ExecuTorch; .onnx -> ONNX Runtime CPU or QNN)."""
    if path.suffix == ".pte":
        from omnidraft_deploy.runtime.executorch_model import PteModel

        return PteModel(path, info)
    if provider == "qnn":
        from omnidraft_deploy.runtime.qnn_model import qnn_model

        return qnn_model(path, info)
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    return OrtModel(path, info)


def default_provider(manifest: Manifest) -> str:
    """Where a bundle runs unless told otherwise: qnn bundles on the QNN HTP, others on the CPU."""
    return "qnn" if manifest.backend == "qnn" else "cpu"


def open_bundle(bundle_dir: str | Path, *, provider: str | None = None) -> OpenBundle:
    """Verify, then load a bundle; ``provider`` None -> ``default_provider``."""
    root = Path(bundle_dir)
    manifest = verify_bundle(root)
    provider = provider or default_provider(manifest)
    d_info, t_info = manifest.graphs["drafter"], manifest.graphs["target"]
    mapper = vocab_io.load(root / VOCAB_MAP)
    if mapper.content_hash() != manifest.mapping_hash:
        raise BundleError(root / VOCAB_MAP, "content hash differs from manifest mapping_hash")
    if mapper.draft_vocab_size > d_info.vocab_size or mapper.target_vocab_size > t_info.vocab_size:
        raise BundleError(
            root / VOCAB_MAP,
            f"vocabulary sizes ({mapper.draft_vocab_size}, "
            f"{mapper.target_vocab_size}) exceed the graphs' ({d_info.vocab_size}, "
            f"{t_info.vocab_size})",
        )
    try:
        cache, _ = load_ngram(
            root / NGRAM_CACHE,
            expect_draft_vocab=mapper.draft_vocab_size,
            expect_target_vocab=mapper.target_vocab_size,
        )
    except NGramFormatError as e:
        raise BundleError(root / NGRAM_CACHE, str(e)) from None
    for info in (d_info, t_info):  # every graph's metadata before any session is created
        if info.file.endswith(".onnx"):
            check_onnx_metadata(root / info.file, info)
    drafter = load_graph_file(root / d_info.file, d_info, provider=provider)
    target = load_graph_file(root / t_info.file, t_info, provider=provider)
    return OpenBundle(root, manifest, drafter, target, mapper, cache, provider)
