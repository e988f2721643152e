"""A bundle's tokenizers travel with it: written at export, read back by ``run`` and ``validate``.

``<role>_tokenizer/`` holds the tokenizer's own file (``tokenizer.json`` for byte-level BPE,
``tokenizer.model`` for SentencePiece, plus ``tokenizer-no-dummy-prefix.model`` for Hugging Face's
``legacy=false`` whitespace handling), ``special_tokens.json`` and, when the model has one,
``chat_template.jinja`` (its own chat template, as ONNX Runtime GenAI ships it)::

    special_tokens.json = {"name": "<str>", "bos_id": <id> | null, "eos_ids": [<id>, ...],
                           "vocab_size": <ids of the tokenizer file>}   (vocab_size: issue 28)

Every file is listed in the manifest with role ``<role>_tokenizer`` and read through
``bundle.files.read_listed`` (size and sha256 checked), then by its schema
(``load_bundle_tokenizer``): the opener builds both tokenizers on every open and holds the
vocabulary map against their id counts, so a bundle without ``special_tokens.json`` (older
exports) is checked the same way. A bundle copied to another machine decodes exactly as it did
where it was exported, with no tokenizer registry or asset cache involved. The chat template is
code from the bundle: it renders in a sandboxed worker process (``chat_sandbox``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from os.path import commonprefix
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnidraft_deploy.protocols import TokenizerLike

if TYPE_CHECKING:
    from omnidraft_deploy.bundle.sections import FileEntry

SPECIAL, TEMPLATE = "special_tokens.json", "chat_template.jinja"
JSON, SPM, SPM_RAW = "tokenizer.json", "tokenizer.model", "tokenizer-no-dummy-prefix.model"
MAX_TOKENIZER_BYTES = 64 << 20
MAX_TEMPLATE_BYTES = 1 << 20  # Qwen2.5's is 2.5 KB; tool-use templates reach ~20 KB
MAX_IDS = 1 << 24  # the manifest's bound on a vocabulary
MAX_EOS_IDS = 64
SPECIAL_KEYS = {"name": True, "bos_id": True, "eos_ids": True, "vocab_size": False}  # required?


def tokenizer_files(tok: Any) -> dict[str, bytes]:
    """File name -> bytes for ``<role>_tokenizer/`` (module docstring)."""
    files: dict[str, bytes] = dict(tok.files())
    special = {"name": tok.name, "bos_id": tok.bos_id, "eos_ids": list(tok.eos_ids),
               "vocab_size": tok.vocab_size}  # fmt: skip
    files[SPECIAL] = (json.dumps(special, indent=1) + "\n").encode()
    template = getattr(tok, "chat_template", None)
    if template:
        files[TEMPLATE] = template.encode("utf-8")
    return files


def _reader(
    root: Path, folder: str, role: str, files: dict[str, FileEntry]
) -> Callable[[str], bytes | None]:
    """``read(name)``: the listed file ``<folder>/<name>`` (checked), None if unlisted."""
    from omnidraft_deploy.bundle.files import read_listed

    def read(name: str) -> bytes | None:
        rel = f"{folder}/{name}"
        if rel not in files:
            return None
        return read_listed(
            root, rel, files, role=f"{role}_tokenizer", max_bytes=MAX_TOKENIZER_BYTES
        )

    return read


def _id(where: str, value: object, hi: int = MAX_IDS) -> int:
    if type(value) is not int:  # a bool or 1.7 is not an id ("eos_ids": [1.7, true])
        raise ValueError(f"field {where}: expected an integer id, got {value!r:.40}")
    if not 0 <= value < hi:
        raise ValueError(f"field {where}: {value} outside [0, {hi})")
    return value


@dataclass(frozen=True)
class Special:
    """``special_tokens.json`` as read (``read_special``); a bundle without one: ``Special(role)``."""

    name: str
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    vocab_size: int | None = None  # the tokenizer file's id count (bundles since issue 28)


def read_special(raw: bytes, path: Path) -> Special:
    """``special_tokens.json`` by its schema (module docstring): ``{"name": str, "bos_id": int |
    null, "eos_ids": [int, ...], "vocab_size": int}`` (``vocab_size`` since issue 28), exact JSON
    types, ids in ``[0, vocab_size)``, at most ``MAX_EOS_IDS`` EOS ids, no other key, no NaN,
    nesting bounded; a ``BundleError`` naming ``path`` and the field otherwise."""
    from omnidraft_deploy.bundle.manifest import BundleError
    from omnidraft_deploy.bundle.strict_json import parse_strict

    try:
        doc = parse_strict(raw.decode("utf-8"), max_depth=4)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(doc) - set(SPECIAL_KEYS))
        missing = [k for k, required in SPECIAL_KEYS.items() if required and k not in doc]
        if unknown or missing:
            raise ValueError(f"unknown fields {unknown}" if unknown else f"no field {missing[0]}")
        name = doc["name"]
        if type(name) is not str or not 0 < len(name) <= 256:
            raise ValueError(f"field name: expected a non-empty string, got {name!r:.40}")
        size = _id("vocab_size", doc["vocab_size"], MAX_IDS + 1) if "vocab_size" in doc else None
        hi = MAX_IDS if size is None else size
        if hi < 1:
            raise ValueError("field vocab_size: 0 ids")
        bos = None if doc["bos_id"] is None else _id("bos_id", doc["bos_id"], hi)
        eos = doc["eos_ids"]
        if type(eos) is not list or len(eos) > MAX_EOS_IDS:
            raise ValueError(f"field eos_ids: expected a list of at most {MAX_EOS_IDS} ids")
        eos_ids = tuple(_id(f"eos_ids[{i}]", e, hi) for i, e in enumerate(eos))
    except UnicodeDecodeError as e:
        raise BundleError(path, f"not UTF-8 ({e.reason} at byte {e.start})") from None
    except ValueError as e:
        raise BundleError(path, f"not a special-tokens file ({e})") from None
    return Special(name, bos, eos_ids, size)


def stated_vocab_size(
    root: Path, role: str, files: dict[str, FileEntry], *, folder: str | None = None
) -> int | None:
    """Ids of the ``role`` tokenizer as its ``special_tokens.json`` states them, read by its
    schema without building the tokenizer (``load_bundle_tokenizer`` holds the statement against
    the tokenizer file); None when the file is not listed or states no size (older bundles)."""
    folder = folder or f"{role}_tokenizer"
    raw = _reader(root, folder, role, files)(SPECIAL)
    return None if raw is None else read_special(raw, root / folder / SPECIAL).vocab_size


def _build(path: Path, special: Special, read: Any) -> Any:
    """The tokenizer of the folder at ``path`` from its listed files (``read``); every failure of
    the tokenizer libraries (``tokenizers`` raises a bare ``Exception``) a ``BundleError``."""
    from omnidraft_deploy.bundle.manifest import BundleError
    from omnidraft_deploy.vocab import gguf_vocab as gv
    from omnidraft_deploy.vocab.tokenizers import BPETokenizer, SentencePieceTokenizer

    if (data := read(JSON)) is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BundleError(path / JSON, f"not UTF-8 ({e.reason} at byte {e.start})") from None
        lib = gv.require("tokenizers")
        try:  # serde_json bounds the nesting itself ("recursion limit exceeded"), no Python stack
            inner = lib.Tokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - the library's only error type for a bad file
            raise BundleError(path / JSON, f"not a tokenizer file ({_first_line(e)})") from None
        return BPETokenizer(special.name, inner, bos_id=special.bos_id, eos_ids=special.eos_ids)
    if (data := read(SPM)) is not None:
        raw = read(SPM_RAW)
        try:
            return SentencePieceTokenizer(special.name, data, hf_prefix=raw)
        except (RuntimeError, ValueError, TypeError, OSError) as e:  # a proto it cannot read
            raise BundleError(path / SPM, f"not a SentencePiece model ({_first_line(e)})") from None
    raise BundleError(path, f"no {JSON} or {SPM} listed in the manifest")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def load_bundle_tokenizer(
    root: Path, role: str, files: dict[str, FileEntry], *, folder: str | None = None
) -> TokenizerLike:
    """The ``role`` tokenizer of the bundle at ``root`` (``files``: the manifest's listing),
    every file read by its schema and held against the others: ``special_tokens.json``
    (``read_special``; when listed: its ``vocab_size`` is the tokenizer's id count, its ids are
    inside it), the tokenizer file, the chat template (UTF-8, at most ``MAX_TEMPLATE_BYTES``;
    ``tok.chat_template_source`` names it for ``render_chat``'s errors). ``folder``: where its
    files are (default ``<role>_tokenizer``; a target of a multi-target bundle:
    ``bundle.targets.parts(manifest).tokenizer``). Any failure: a ``BundleError`` naming the file."""
    from omnidraft_deploy.bundle.manifest import BundleError

    folder = folder or f"{role}_tokenizer"
    path, read = root / folder, _reader(root, folder, role, files)
    raw = read(SPECIAL)
    special = Special(role) if raw is None else read_special(raw, path / SPECIAL)
    tok = _build(path, special, read)
    n = tok.vocab_size
    if special.vocab_size is not None and special.vocab_size != n:
        raise BundleError(path / SPECIAL, f"vocab_size {special.vocab_size}, but the tokenizer "
                          f"file defines {n} ids")  # fmt: skip
    ids = [*special.eos_ids, *([] if special.bos_id is None else [special.bos_id])]
    if any(i >= n for i in ids):
        raise BundleError(path / SPECIAL, f"bos_id / eos_ids outside the tokenizer's {n} ids")
    tok.chat_template, tok.chat_template_source = _template(path, read), str(path / TEMPLATE)
    return tok  # type: ignore[no-any-return]


def _template(path: Path, read: Any) -> str | None:
    from omnidraft_deploy.bundle.manifest import BundleError

    data = read(TEMPLATE)
    if data is None:
        return None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise BundleError(path / TEMPLATE, f"{len(data)} B is over the cap of "
                          f"{MAX_TEMPLATE_BYTES} B for a chat template")  # fmt: skip
    try:
        return str(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BundleError(path / TEMPLATE, f"not UTF-8 ({e.reason} at byte {e.start})") from None


def render_chat(template: str | None, user_text: str, *, source: str | None = None) -> str:
    """One user turn rendered with the model's own chat template, ready for the assistant's
    reply (``add_generation_prompt``), in a sandboxed worker process with limits on time, memory
    and output (``chat_sandbox``); any failure is one ``ChatTemplateError`` naming ``source`` (the
    template's file, ``tok.chat_template_source``); ``ValueError`` without a template."""
    if not template:
        raise ValueError("--chat: this bundle's target has no chat template (a base model?)")
    from omnidraft_deploy import optional
    from omnidraft_deploy.vocab import chat_sandbox

    optional.require("jinja2", extra="tokenizers", purpose="rendering chat templates")
    return chat_sandbox.render(template, [user_text], source=source or TEMPLATE)[0]


def chat_prefix_ids(tok: Any) -> list[int]:
    """The ids every chat-rendered prompt of ``tok`` begins with (the template's system turn and
    the user turn's header): the common start of two renders whose user texts share nothing. A
    served session keeps them in its caches (``speculative.kv_reuse``); [] without a template."""
    template = getattr(tok, "chat_template", None)
    if not template:
        return []
    from omnidraft_deploy.vocab import chat_sandbox

    source = getattr(tok, "chat_template_source", TEMPLATE)
    a, b = (tok.encode(t) for t in chat_sandbox.render(template, ["Alpha.", "(2)"], source=source))
    return list(commonprefix([a, b]))
