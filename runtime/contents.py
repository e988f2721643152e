"""What a bundle carries besides its graphs, each file read by its schema and held against the rest.

``read_contents`` reads, for the (selected) target of a bundle whose manifest and hashes are
checked: both tokenizers (``vocab.bundle_tokenizer.load_bundle_tokenizer``: ``special_tokens.json``,
the tokenizer file, the chat template), the vocabulary map (``vocab.io``, its content hash against
the manifest's ``mapping_hash``, one entry per tokenizer id on each side, every target id spelled,
its sizes within the graphs'), the shipped n-gram cache (``ngram.format``, ids within the map's)
and the eager target's recorded output (``checks.expected``, ids within the target tokenizer's).
Each is listed in the manifest with its role and read once through ``bundle.files.read_listed``
(size and sha256 checked on the very bytes parsed, size-capped). A check never depends on whether
an optional file is there: the map is held against the tokenizers themselves, and a bundle
without ``expected.json`` is refused (every export writes one). Every failure is a
``BundleError`` naming the file.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnidraft_deploy.bundle.files import read_listed
from omnidraft_deploy.bundle.manifest import MANIFEST_NAME, BundleError, Manifest
from omnidraft_deploy.bundle.targets import parts
from omnidraft_deploy.checks.expected import EXPECTED_ROLE
from omnidraft_deploy.checks.expected import from_bytes as expected_from_bytes
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import NGramFormatError
from omnidraft_deploy.ngram.format import from_bytes as ngram_from_bytes
from omnidraft_deploy.vocab import io as vocab_io
from omnidraft_deploy.vocab.mapper import VocabMapper

MAX_VOCAB_MAP_BYTES = 64 << 20  # a 256k x 256k map with long spellings is ~10 MB
MAX_NGRAM_BYTES = 64 << 20  # ~6M entries
MAX_EXPECTED_BYTES = 16 << 20


@dataclass
class Contents:
    mapper: VocabMapper
    ngram_cache: NGramCache
    expected: dict[str, Any]  # ``checks.expected``'s document
    _tokenizers: Future[dict[str, Any]]  # role -> TokenizerLike (the selected target's)
    _pool: ThreadPoolExecutor

    def tokenizers(self) -> dict[str, Any]:
        """Both tokenizers, once built and checked (``BundleError`` if one is not sound)."""
        try:
            return self._tokenizers.result()
        finally:
            self.close()

    def close(self) -> None:
        """Let the tokenizers' thread go (a caller that failed first: its error is the one)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def read_contents(root: Path, manifest: Manifest) -> Contents:
    """Every non-graph file of the bundle, read and cross-checked (module docstring). Building
    the tokenizers takes longest (~1 s for Llama-3's 128k ids), so they are built in a thread
    while the caller goes on (``open_bundle``: its ONNX Runtime sessions); the map is held
    against the id counts their ``special_tokens.json`` states, and the thread holds each
    statement against its tokenizer. Without a statement, the count waits for the tokenizer."""
    from omnidraft_deploy.vocab.bundle_tokenizer import stated_vocab_size

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizers")
    job = pool.submit(load_tokenizers, root, manifest)
    try:
        stated = {r: stated_vocab_size(root, r, manifest.files, folder=f)
                  for r, f in _folders(manifest).items()}  # fmt: skip
        n_ids = {r: n for r, n in stated.items() if n is not None}
        if len(n_ids) < len(stated):  # no statement: count the tokenizer's own ids
            n_ids = {r: int(t.vocab_size) for r, t in job.result().items()}
        mapper, cache = load_tables(root, manifest, n_ids)
        expected = read_expected(root, manifest, n_ids["target"])
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    return Contents(mapper, cache, expected, job, pool)


def _folders(manifest: Manifest) -> dict[str, str]:
    return {"drafter": "drafter_tokenizer", "target": parts(manifest).tokenizer}


def load_tokenizers(root: Path, manifest: Manifest) -> dict[str, Any]:
    """Both tokenizers of the (selected target's) bundle, each file read by its schema."""
    from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer

    return {role: load_bundle_tokenizer(root, role, manifest.files, folder=folder)
            for role, folder in _folders(manifest).items()}  # fmt: skip


def read_expected(root: Path, manifest: Manifest, target_vocab: int) -> dict[str, Any]:
    """The eager target's recorded output (``checks.expected``), its ids within the target
    tokenizer's ``target_vocab``; refused when the manifest does not list it."""
    files, rel = manifest.files, parts(manifest).expected
    if rel not in files:
        raise BundleError(root / MANIFEST_NAME, f"{rel} is not listed in files: no reference "
                          "output to validate against; export the bundle again")  # fmt: skip
    raw = read_listed(root, rel, files, role=EXPECTED_ROLE, max_bytes=MAX_EXPECTED_BYTES)
    try:
        return expected_from_bytes(raw, str(root / rel), vocab_size=target_vocab)
    except ValueError as e:
        raise BundleError(root / rel, str(e).removeprefix(f"{root / rel}: ")) from None


def load_tables(
    root: Path, manifest: Manifest, n_ids: dict[str, int]
) -> tuple[VocabMapper, NGramCache]:
    """Vocabulary map and shipped n-gram cache, each listed, verified and checked against the
    tokenizers' id counts (``n_ids``: role -> ids) and the graphs."""
    d_info, t_info = manifest.graphs["drafter"], manifest.graphs["target"]
    vocab_map, ngram_cache = parts(manifest).vocab_map, parts(manifest).ngram_cache
    data = read_listed(
        root, vocab_map, manifest.files, role="vocab_map", max_bytes=MAX_VOCAB_MAP_BYTES
    )
    try:
        mapper = vocab_io.from_bytes(data, source=str(root / vocab_map))
    except ValueError as e:
        raise BundleError(root / vocab_map, str(e).removeprefix(f"{root / vocab_map}: ")) from None
    if mapper.content_hash() != manifest.mapping_hash:
        raise BundleError(root / vocab_map, "content hash differs from manifest mapping_hash")
    check_map_tokenizers(root, manifest, mapper, n_ids)
    # either graph may pad its vocabulary past its tokenizer (every Qwen: 151936 rows for 151665
    # ids); the padded rows are never decoded (drafter: ``CrossVocabDrafter`` keeps the mapper's
    # ``draft_vocab_size`` logits; target: ``DecodeConfig.vocab_limit``)
    if mapper.draft_vocab_size > d_info.vocab_size or mapper.target_vocab_size > t_info.vocab_size:
        raise BundleError(
            root / vocab_map,
            f"vocabulary sizes (drafter {mapper.draft_vocab_size}, target "
            f"{mapper.target_vocab_size}) do not fit the graphs' (drafter {d_info.vocab_size}, "
            f"target {t_info.vocab_size}: each at least its map's) in {MANIFEST_NAME} "
            "graphs.drafter/target.vocab_size",
        )
    data = read_listed(
        root, ngram_cache, manifest.files, role="ngram_cache", max_bytes=MAX_NGRAM_BYTES
    )
    try:
        cache, _ = ngram_from_bytes(
            data,
            source=root / ngram_cache,
            expect_draft_vocab=mapper.draft_vocab_size,
            expect_target_vocab=mapper.target_vocab_size,
        )
    except NGramFormatError as e:
        raise BundleError(root / ngram_cache, e.problem) from None
    return mapper, cache


def check_map_tokenizers(
    root: Path, manifest: Manifest, mapper: VocabMapper, n_ids: dict[str, int]
) -> None:
    """The map against the bundle's tokenizers: one entry per tokenizer id on each side (``n_ids``:
    role -> ids of the bundle's tokenizer, whatever files it has: ``read_contents``), and
    every target id spelled by at least one drafter id, except a target BOS the drafter has no
    counterpart of (``mapper``: spelled by nothing). Bytes the drafter cannot spell are counted
    in the map (placeholders), never left out."""
    from omnidraft_deploy.vocab.roles import Role

    target = parts(manifest)
    path = root / target.vocab_map
    for role, n_map, folder in (("target", mapper.target_vocab_size, target.tokenizer),
                                ("drafter", mapper.draft_vocab_size, "drafter_tokenizer")):  # fmt: skip
        n_tok = n_ids[role]
        if n_tok != n_map:
            raise BundleError(path, f"its {role} side has {n_map} ids but the bundle's {role} "
                              f"tokenizer ({folder}/) has {n_tok}: the map was built for "
                              "another tokenizer; export the bundle again")  # fmt: skip
    offsets = mapper.target_to_draft_offsets
    empty = set((offsets[1:] == offsets[:-1]).nonzero().flatten().tolist())
    empty -= {t for r, d, t in mapper.roles if r is Role.BOS and d < 0}
    if empty:
        shown = sorted(empty)[:5]
        raise BundleError(path, f"{len(empty)} of {mapper.target_vocab_size} target ids (e.g. "
                          f"{shown}) have no drafter spelling and are not counted as "
                          "unspellable: the drafter could never propose them")  # fmt: skip
