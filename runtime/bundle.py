"""Open an exported bundle: every check runs before any model does.

Order: manifest (schema, format, every section's ``validate()``), no symlink anywhere in the folder,
every listed file's size and sha256 (on every open: a hash record vouches for bytes, never for the
manifest's claims), then every other file the bundle carries, read by its schema and held against
the rest (``runtime.contents``: tokenizers, vocabulary map, n-gram cache, reference output), then
each graph's own metadata against the manifest, quantization label included (ONNX
``metadata_props`` / ``.pte`` constant methods; ONNX external data must be a listed file). Each
failure is a ``BundleError`` naming the file and the problem. The session
cache (``ngram_cache.session.bin``, written by ``run``) is the user's own state, not part of the
bundle: its CRC-32 is its checksum, and a damaged one falls back to the bundle's cache with a
warning (``load_session_cache``). A multi-target bundle is opened for one of its targets
(``target=``; ``bundle.targets.select``): its graph, map, cache and reference, beside the shared
drafter; ``check_every_target`` checks them all. That target's adapted drafter weights, kept in
its state folder, replace the shared drafter's (``runtime.adapted``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnidraft_deploy.runtime.adapted import adapted_drafter, adapted_weights
from omnidraft_deploy.runtime.base import RuntimeModel
from omnidraft_deploy.runtime.contents import MAX_NGRAM_BYTES, Contents, read_contents

from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER
from omnidraft_deploy.bundle.files import open_plain, read_plain
from omnidraft_deploy.bundle.folder import verify_bundle
from omnidraft_deploy.bundle.manifest import HTP_CONTEXT, MANIFEST_NAME, BundleError, Manifest
from omnidraft_deploy.bundle.onnx_meta import OnnxMeta, read_onnx_meta
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.bundle.targets import select, target_names
from omnidraft_deploy.host.onnx_host import context_path
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import NGramFormatError
from omnidraft_deploy.ngram.format import from_bytes as ngram_from_bytes
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)
SESSION_CACHE = "ngram_cache.session.bin"
ONNX_FORMAT_VERSION = "1"  # metadata_props "omnidraft.format_version" this reader understands
# the graph's own description that the manifest must repeat (quantization included: ``validate``
# holds an fp32 graph to token equality with eager, so the label decides what PASS means)
GRAPH_KEYS = ("vocab_size", "max_seq_len", "n_layers", "n_kv_heads", "head_dim", "seq_len",
              "quantization")  # fmt: skip


@dataclass
class OpenBundle:
    root: Path
    manifest: Manifest
    drafter: RuntimeModel
    target: RuntimeModel
    mapper: VocabMapper
    ngram_cache: NGramCache
    provider: str = "cpu"
    drafter_weights: Path | None = None  # the target's adapted drafter weights, when swapped in
    tokenizer: Any = None  # the target's (``runtime.contents``), as the open read it
    expected: dict[str, Any] = field(default_factory=dict)  # expected.json (``checks.expected``)


def _onnx_meta(path: Path) -> OnnxMeta:
    """The graph's metadata and external-data files, its weights not parsed (``onnx_meta``)."""
    fd = open_plain(path.parent, path.name)
    try:
        return read_onnx_meta(fd)
    except (ValueError, OSError) as e:  # foreign bytes: the wire format breaks somewhere
        raise BundleError(path, f"not a readable ONNX model ({e})") from None
    finally:
        os.close(fd)


def check_onnx_metadata(
    path: Path, info: GraphInfo, files: dict[str, object] | None = None
) -> None:
    """Graph metadata == ``info``; external data only in files the manifest lists (``files``)."""
    onnx_meta = _onnx_meta(path)
    meta = onnx_meta.metadata
    if "omnidraft.graph_info" not in meta:
        raise BundleError(path, "ONNX model has no omnidraft.graph_info metadata (foreign graph)")
    version = meta.get("omnidraft.format_version")
    if version != ONNX_FORMAT_VERSION:
        raise BundleError(
            path, f"graph format_version {version!r}; this reader reads {ONNX_FORMAT_VERSION!r}"
        )
    try:
        stored = json.loads(meta["omnidraft.graph_info"])
    except (json.JSONDecodeError, RecursionError) as e:
        raise BundleError(path, f"omnidraft.graph_info metadata is not JSON ({e})") from None
    if not isinstance(stored, dict):
        raise BundleError(path, "omnidraft.graph_info metadata is not a JSON object")
    for key in GRAPH_KEYS:
        if stored.get(key) != getattr(info, key):
            raise BundleError(
                path,
                f"graph metadata {key}={stored.get(key)!r:.80} but manifest says "
                f"{getattr(info, key)!r}",
            )
    if files is None:
        return
    for name, location in onnx_meta.external.items():
        if location not in files:
            raise BundleError(
                path, f"initializer {name!r} reads {location!r}, a file the manifest does not "
                "list",
            )  # fmt: skip


def check_graph(root: Path, manifest: Manifest, role: str) -> None:
    """The graph's own metadata against the manifest, whatever the backend (before any session)."""
    info = manifest.graphs[role]
    path = root / info.file
    if path.suffix == ".onnx":
        # external data is named relative to the graph's folder (targets/<name>/ in a
        # multi-target bundle): the listed files as that folder sees them
        folder = info.file.rpartition("/")[0]
        files: dict[str, object] = {
            k.removeprefix(f"{folder}/"): v for k, v in manifest.files.items()
            if not folder or k.startswith(f"{folder}/")
        }  # fmt: skip
        check_onnx_metadata(path, info, files)
        if info.decode_file is not None:
            check_onnx_metadata(root / info.decode_file, info.decode_info(), files)
    else:  # .pte (the manifest allows nothing else): constant methods, no execution of forward
        from omnidraft_deploy.runtime.executorch_model import check_metadata, load_program

        check_metadata(load_program(path), path, info)


def load_model(
    path_or_bundle: str | Path, role: str = "target", *, provider: str | None = None,
    target: str | None = None,
) -> RuntimeModel:  # fmt: skip
    """One graph of a bundle as a ``CausalLM``, after the bundle's manifest and sha256 checks.

    ``provider`` None: chosen by the manifest's backend (qnn -> the QNN HTP, else CPU); the
    ``.pte`` / ``.onnx`` suffix picks ExecuTorch or ONNX Runtime. ``path_or_bundle`` may also be a
    graph file inside a bundle folder; ``target``: which target of a multi-target bundle.
    """
    root = Path(path_or_bundle)
    root = root.parent if root.is_file() else root
    manifest = select(verify_bundle(root), target, source=root / MANIFEST_NAME)
    if role not in manifest.graphs:
        raise KeyError(f"unknown role {role!r}; choose from {sorted(manifest.graphs)}")
    check_graph(root, manifest, role)
    return load_graph_file(root, manifest, role, provider=provider or default_provider(manifest))


def htp_context(root: Path, manifest: Manifest, file: str) -> Path | None:
    """Graph ``file``'s precompiled EPContext model when the manifest lists it (QNN bundles)."""
    ctx = context_path(root / file)
    entry = manifest.files.get(ctx.name)
    return ctx if entry is not None and entry.role == HTP_CONTEXT else None


def load_graph_file(
    root: Path, manifest: Manifest, role: str, *, provider: str = "cpu",
    background_pages: bool = False, threads: int | None = None,
) -> RuntimeModel:  # fmt: skip
    """A runtime model for ``role``'s graph (.pte -> ExecuTorch; .onnx -> ONNX Runtime CPU or
    QNN, with the graph's T = 1 decode twin and, on QNN, their precompiled EPContext models).
    ONNX Runtime CPU sessions get their weights on huge pages: before this returns, or with
    ``background_pages`` in a background thread (``host.pages_later``: off the first token's
    path)."""
    info = manifest.graphs[role]
    path = root / info.file
    if path.suffix == ".pte":
        from omnidraft_deploy.runtime.executorch_model import PteModel

        return PteModel(path, info)
    decode = None if info.decode_file is None else root / info.decode_file
    if provider == "qnn":
        from omnidraft_deploy.runtime.qnn_model import QnnUnsupportedError, qnn_model

        context = htp_context(root, manifest, info.file)
        decode_context = None if decode is None else htp_context(root, manifest, decode.name)
        try:
            return qnn_model(
                path, info, context=context, decode=decode, decode_context=decode_context
            )
        except QnnUnsupportedError as e:
            raise BundleError(path, f"the QNN HTP refuses this graph ({e})") from None
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    if background_pages:
        from omnidraft_deploy.host.pages_later import collapse_later

        return collapse_later(
            lambda: OrtModel(path, info, decode=decode, huge_pages=False, threads=threads)
        )
    return OrtModel(path, info, decode=decode, threads=threads)


def default_provider(manifest: Manifest) -> str:
    """Where a bundle runs unless told otherwise: qnn bundles on the QNN HTP, others on the CPU."""
    return "qnn" if manifest.backend == "qnn" else "cpu"


def load_session_cache(root: Path, mapper: VocabMapper, shipped: NGramCache) -> NGramCache:
    """The session cache beside the bundle when it is sound, else ``shipped`` with a warning."""
    path = root / SESSION_CACHE
    if not path.exists() and not path.is_symlink():
        return shipped
    try:
        data = read_plain(root, SESSION_CACHE, max_bytes=MAX_NGRAM_BYTES)
        cache, _ = ngram_from_bytes(
            data,
            source=path,
            expect_draft_vocab=mapper.draft_vocab_size,
            expect_target_vocab=mapper.target_vocab_size,
        )
        return cache
    except (BundleError, NGramFormatError) as e:
        log.warning("%s; using the bundle's n-gram cache instead", e)
        return shipped


def check_bundle(
    bundle_dir: str | Path, *, state: Path | None = None, trust_record: bool = True,
    target: str | None = None,
) -> tuple[Manifest, VocabMapper, NGramCache]:  # fmt: skip
    """Every check of ``open_bundle`` (module docstring), nothing allocated for the graphs yet;
    ``state`` / ``trust_record``: ``bundle.folder.verify_bundle``'s hash record; ``target``: which
    target of a multi-target bundle (``bundle.targets.select``; the manifest returned is its
    one-target view)."""
    manifest, contents = _checked(Path(bundle_dir), state, trust_record, target)
    contents.tokenizers()  # built and checked (in a thread, beside the other checks)
    return manifest, contents.mapper, contents.ngram_cache


def _checked(
    root: Path, state: Path | None, trust_record: bool, target: str | None
) -> tuple[Manifest, Contents]:
    manifest = verify_bundle(root, state=state, trust_record=trust_record)
    manifest = select(manifest, target, source=root / MANIFEST_NAME)
    contents = read_contents(root, manifest)
    try:
        for role in ("drafter", "target"):  # every graph's metadata before any session exists
            check_graph(root, manifest, role)
    except BaseException:
        contents.close()
        raise
    return manifest, contents


def check_every_target(bundle_dir: str | Path) -> list[str]:
    """``check_bundle`` for each target of the bundle (the exporter's opener); their names."""
    root = Path(bundle_dir)
    names = target_names(verify_bundle(root))
    for name in names:
        check_bundle(root, target=name)
    return names


def open_bundle(
    bundle_dir: str | Path,
    *,
    provider: str | None = None,
    state: Path | None = None,
    trust_record: bool = True,
    threads: int | None = None,
    target: str | None = None,
) -> OpenBundle:
    """Verify, then load a bundle; ``provider`` None -> ``default_provider``. A command opens its
    bundle once and passes the ``OpenBundle`` on (``runtime.run``); with the bundle's session
    folder ``state``, files hashed by an earlier open and unchanged since are not hashed again
    (``bundle.hash_record``; ``trust_record=False`` hashes them all). ``threads``: ONNX Runtime
    intra-op threads of CPU sessions (None: the runtime's default). ``target``: which target of a
    multi-target bundle (None: the only one; several: a ``BundleError`` listing them). For a
    target of a multi-target bundle ``state`` is that target's folder (``targets.target_state``):
    its adapted drafter weights there, when ``omnidraft adapt --target`` wrote some, are checked
    and swapped into the shared drafter graph (``runtime.adapted``)."""
    root = Path(bundle_dir)
    manifest, contents = _checked(root, state, trust_record, target)
    provider = provider or default_provider(manifest)
    try:  # the tokenizers are built meanwhile (``runtime.contents``)
        drafter, model, adapted = _sessions(root, manifest, provider, state, threads)
    except BaseException:
        contents.close()
        raise
    tokenizer = contents.tokenizers()["target"]
    return OpenBundle(root, manifest, drafter, model, contents.mapper, contents.ngram_cache,
                      provider, adapted, tokenizer, contents.expected)  # fmt: skip


def _sessions(
    root: Path, manifest: Manifest, provider: str, state: Path | None, threads: int | None
) -> tuple[RuntimeModel, RuntimeModel, Path | None]:
    """(drafter, target, the adapted drafter weights swapped in or None) of a checked bundle."""
    weights, adapted = adapted_weights(root, manifest, state), None
    if weights is not None and state is not None:
        drafter = adapted_drafter(root, manifest, weights, state, provider=provider,
                                  threads=threads)  # fmt: skip
        adapted = state / ADAPTED_DRAFTER
    else:
        drafter = load_graph_file(root, manifest, "drafter", provider=provider,
                                  background_pages=True, threads=threads)  # fmt: skip
    model = load_graph_file(
        root, manifest, "target", provider=provider, background_pages=True, threads=threads
    )
    return drafter, model, adapted
