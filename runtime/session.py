"""One opened bundle that answers ``omnidraft run`` requests: in-process, or kept by ``serve``.

``open_session`` opens the bundle as ``run`` always has (``open_bundle``: every check, the hash
record in the state folder; the target's tokenizer parsed meanwhile) and ``generate`` does what
``run`` prints: the prompt (unless ``--chat``), the text as it streams, then with ``--stats`` the
target-only baseline and the statistics lines. ``run`` calls both once; ``omnidraft serve`` opens
once, ``warm``s, and calls ``generate`` per request with the socket's writers, so a served run
prints what an in-process run prints, byte for byte.

A served session starts each request from what an in-process run would load: the n-gram cache
grown in the state folder, else the bundle's shipped cache as it was opened
(``Session.shipped``), never what an earlier, interrupted request left in memory. Parsing that
cache (0.13 s for the 65,536 shipped entries) is kept off the way to a request's first text: ``prepare`` parses
it ahead (at warm-up, and by the server after each reply) with the identity of the state file it
read (size, mtime, ctime, inode; None when there was none); a request takes the prepared cache
only while the file still has that identity, else parses it itself (``request_cache``), and a
prepared cache serves one request at most.
``changed`` notes the bundle files, and the adapted drafter weights in the state folder, that
changed since the open (the server then refuses: its sessions hold the old graphs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnidraft_deploy.runtime import bundle as opener
from omnidraft_deploy.runtime.bundle import SESSION_CACHE, OpenBundle, load_session_cache

from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER
from omnidraft_deploy.bundle.manifest import MANIFEST_NAME
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import from_bytes as ngram_from_bytes
from omnidraft_deploy.ngram.format import to_bytes as ngram_to_bytes
from omnidraft_deploy.request.protocol import RunRequest, Writer

WARM_PROMPT = "def add(a, b):"
FileId = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode
FileIds = dict[str, FileId]


@dataclass
class Session:
    bundle: OpenBundle
    tokenizer: Any  # the selected target's tokenizer
    state: Path
    shipped: bytes | None = None  # served: the bundle's n-gram cache as opened (``ngram.format``)
    file_ids: FileIds | None = None  # served: (size, mtime, ctime, inode) of every bundle file
    prepared: tuple[FileId | None, NGramCache] | None = None  # served: ``prepare``'s cache


def target_tokenizer(root: Path, target: str | None) -> Any:
    """The selected target's tokenizer, read from the bundle's manifest (loaded beside
    ``open_bundle``, whose checks of the same files come first in any error)."""
    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.targets import parts, select
    from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer

    manifest = select(read_manifest(root), target)
    return load_bundle_tokenizer(root, "target", manifest.files, folder=parts(manifest).tokenizer)


def _file_ids(root: Path, names: list[str], state: Path) -> FileIds:
    """(size, mtime, ctime, inode) of each bundle file ``names``, and of the state folder's
    adapted drafter weights (which a multi-target bundle's open swaps in; zeros when absent)."""
    adapted = state / ADAPTED_DRAFTER
    paths = {name: root / name for name in names} | {str(adapted): adapted}
    ids = {}
    for name, path in paths.items():
        if path == adapted and not path.exists():
            ids[name] = (0, 0, 0, 0)
            continue
        st = os.stat(path, follow_symlinks=False)
        ids[name] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return ids


def open_session(
    bundle_dir: str | Path, *, state: Path, provider: str | None = None,
    target: str | None = None, trust_record: bool = True, threads: int | None = None,
    served: bool = False,
) -> Session:  # fmt: skip
    """``open_bundle`` (its arguments) with the target's tokenizer (read and checked by the open,
    ``runtime.contents``). ``served``: kept for many requests (module docstring)."""
    root = Path(bundle_dir)
    bundle = opener.open_bundle(root, provider=provider, state=state, target=target,
                                trust_record=trust_record, threads=threads)  # fmt: skip
    tok = bundle.tokenizer
    if not served:
        return Session(bundle, tok, state)
    mapper = bundle.mapper
    shipped = ngram_to_bytes(bundle.ngram_cache, draft_vocab_size=mapper.draft_vocab_size,
                             target_vocab_size=mapper.target_vocab_size)  # fmt: skip
    ids = _file_ids(root, [MANIFEST_NAME, *bundle.manifest.files], state)
    return Session(bundle, tok, state, shipped, ids)


def changed(session: Session) -> list[str]:
    """The bundle files whose size, mtime, ctime or inode differ from the open's (or are gone)."""
    before = session.file_ids or {}
    names = [MANIFEST_NAME, *session.bundle.manifest.files]
    try:
        now = _file_ids(session.bundle.root, names, session.state)
    except OSError as e:
        return [str(e.filename)]
    return [name for name, ids in now.items() if before[name] != ids]


def _cache_file_id(state: Path) -> FileId | None:
    """The identity of the state folder's session cache file (the link itself for a link,
    which ``load_session_cache`` refuses), or None when there is none."""
    try:
        st = os.stat(state / SESSION_CACHE, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _load_cache(session: Session) -> NGramCache:
    """What an in-process run decodes with: the state folder's grown cache when it is sound
    (``load_session_cache``, which warns otherwise), else the shipped cache as opened."""
    assert session.shipped is not None
    m, root = session.bundle.mapper, session.bundle.root
    fallback = NGramCache()  # a marker: ``load_session_cache`` returns it when it falls back
    cache = load_session_cache(session.state, m, fallback)
    if cache is not fallback:
        return cache
    shipped, _ = ngram_from_bytes(session.shipped, source=root,
                                  expect_draft_vocab=m.draft_vocab_size,
                                  expect_target_vocab=m.target_vocab_size)  # fmt: skip
    return shipped


def prepare(session: Session) -> None:
    """Parse the n-gram cache the next request of a served session starts from, unless one is
    ready for the state file as it is now (module docstring)."""
    if session.shipped is None:
        return
    session.bundle.ngram_cache = NGramCache()  # the last request's, freed here, not on the next's
    key = _cache_file_id(session.state)  # before the read: a later change re-parses, never misses
    if session.prepared is None or session.prepared[0] != key:
        session.prepared = (key, _load_cache(session))


def request_cache(session: Session) -> NGramCache | None:
    """The cache a served request decodes with: the prepared one while the state file still has
    the identity it was read with, else parsed now; None for an in-process session
    (``run_bundle`` loads it from the state folder)."""
    if session.shipped is None:
        return None
    ready, session.prepared = session.prepared, None
    if ready is not None and ready[0] == _cache_file_id(session.state):
        return ready[1]
    return _load_cache(session)


def generate(session: Session, request: RunRequest, out: Writer, err: Writer) -> None:
    """What ``omnidraft run`` writes for ``request`` (module docstring): text to ``out``, the
    ``--stats`` lines to ``err``; errors raise (the caller reports them)."""
    import torch
    from omnidraft_deploy.runtime.run import run_bundle, target_only

    from omnidraft_deploy.request.streaming import TextStreamer, print_stats
    from omnidraft_deploy.speculative.decoder import DecodeConfig, check_prompt
    from omnidraft_deploy.speculative.drafter import Mode
    from omnidraft_deploy.speculative.kv_reuse import keep
    from omnidraft_deploy.vocab.bundle_tokenizer import render_chat

    tok, bundle = session.tokenizer, session.bundle
    prompt = request.prompt
    text = render_chat(getattr(tok, "chat_template", None), prompt,
                       source=getattr(tok, "chat_template_source", None)) if request.chat else prompt  # fmt: skip
    greedy = Mode(request.mode) is Mode.GREEDY
    cfg = DecodeConfig(mode=Mode(request.mode), temperature=0.0 if greedy else request.temperature,
                       top_p=None if greedy else request.top_p,
                       max_new_tokens=request.max_new_tokens)  # fmt: skip
    ids = tok.encode(text)
    capacity = bundle.target.max_seq_len  # a prompt refused here is never echoed
    check_prompt(ids, bundle.mapper.target_vocab_size, capacity)
    if note := capacity_note(len(ids), request.max_new_tokens, capacity):
        err.write(f"note: {note}\n")
    stream = TextStreamer(tok, out, err if request.stats == "steps" else None)
    if not request.chat:
        out.write(prompt)
    cache = request_cache(session)
    if request.stats:  # time both decodes on settled memory, not the first one during the move
        from omnidraft_deploy.host.pages_later import settle

        settle()
    result, stats = run_bundle(bundle, ids, observer=stream, config=cfg, state=session.state,
                               generator=torch.Generator().manual_seed(request.seed),
                               ngram_cache=cache)  # fmt: skip
    stream.finish()
    if request.stats:  # the baseline starts from what the speculative run found cached
        keep(bundle.target, stats.prompt_reused)
        base, base_stats = target_only(bundle, ids, cfg,
                                       generator=torch.Generator().manual_seed(request.seed))  # fmt: skip
        print_stats(stats, base_stats, identical=result == base if greedy else None, err=err)


def capacity_note(prompt_len: int, max_new_tokens: int, capacity: int) -> str | None:
    """What to say when ``--max-new-tokens`` asks for more tokens than the target's KV capacity
    leaves after the prompt (the decode stops there: ``DecodeStats.stopped_by_capacity``)."""
    room = capacity - prompt_len + 1  # the last token needs no slot of its own
    if max_new_tokens <= room:
        return None
    return (f"--max-new-tokens {max_new_tokens}: this prompt of {prompt_len} tokens leaves room "
            f"for at most {room} new tokens in the target's capacity of {capacity} "
            "(max_seq_len); generation stops there")  # fmt: skip


def warm(session: Session) -> None:
    """Ready a served session before its first request: the weights settled on huge pages, the
    cost profile measured (or loaded) from the state folder, one short generation through both
    graphs on an empty n-gram cache (of the chat-rendered warm prompt where the target has a
    template: the template is compiled, and both caches then hold its system turn, which every
    ``--chat`` request reuses, ``speculative.kv_reuse``), and the first request's n-gram cache
    parsed (``prepare``)."""
    from omnidraft_deploy.runtime.run import decoding_profile, run_bundle

    from omnidraft_deploy.host.pages_later import settle
    from omnidraft_deploy.vocab.bundle_tokenizer import render_chat

    bundle = session.bundle
    settle()
    decoding_profile(bundle, session.state)
    template = getattr(session.tokenizer, "chat_template", None)
    source = getattr(session.tokenizer, "chat_template_source", None)
    text = render_chat(template, WARM_PROMPT, source=source) if template else WARM_PROMPT
    ids = session.tokenizer.encode(text)[: max(1, bundle.target.max_seq_len - 4)]
    kept, bundle.ngram_cache = bundle.ngram_cache, NGramCache()
    try:
        run_bundle(bundle, ids, max_new_tokens=2, state=None)
    finally:
        bundle.ngram_cache = kept
    prepare(session)
