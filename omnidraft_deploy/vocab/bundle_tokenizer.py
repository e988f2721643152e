"""A bundle's tokenizers travel with it: written at export, read back by ``run`` and ``validate``.

``<role>_tokenizer/`` holds the tokenizer's own file (``tokenizer.json`` for byte-level BPE,
``tokenizer.model`` for SentencePiece, plus ``tokenizer-no-dummy-prefix.model`` for Hugging Face's
``legacy=false`` whitespace handling), ``special_tokens.json`` (``{"name", "bos_id",
"eos_ids"}``) and, when the model has one, ``chat_template.jinja`` (its own chat template, as
ONNX Runtime GenAI ships it). ``special_tokens.json`` also states the tokenizer's id count
(``"vocab_size"``, bundles since issue 28), which the opener checks the vocabulary map against
without building the tokenizer (``vocab_size_of``); loading the tokenizer checks the statement. Every file is listed in the manifest with role
``<role>_tokenizer`` and read through ``bundle.files.read_listed`` (size and sha256 checked), so a
bundle copied to another machine decodes exactly as it did where it was exported, with no
tokenizer registry or asset cache involved.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.speculative.kv_reuse import common_prefix

if TYPE_CHECKING:
    from omnidraft_deploy.bundle.sections import FileEntry

SPECIAL, TEMPLATE = "special_tokens.json", "chat_template.jinja"
JSON, SPM, SPM_RAW = "tokenizer.json", "tokenizer.model", "tokenizer-no-dummy-prefix.model"
MAX_TOKENIZER_BYTES = 64 << 20


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


def _special(root: Path, folder: str, raw: bytes | None) -> dict[str, Any]:
    from omnidraft_deploy.bundle.manifest import BundleError

    path = root / folder / SPECIAL
    try:
        special = json.loads(raw) if raw else {}
        if not isinstance(special, dict):
            raise TypeError("not a JSON object")
        special["eos_ids"] = tuple(int(i) for i in special.get("eos_ids", ()))
        size = special.get("vocab_size")
        if size is not None and (type(size) is not int or size < 1):
            raise ValueError(f"vocab_size {size!r} is not a positive integer")
    except (ValueError, TypeError, AttributeError) as e:
        raise BundleError(path, f"not a special-tokens file ({e})") from None
    return special


def vocab_size_of(
    root: Path, role: str, files: dict[str, FileEntry], *, folder: str | None = None
) -> int | None:
    """Ids of the bundle's ``role`` tokenizer as its ``special_tokens.json`` states them (without
    building the tokenizer; ``load_bundle_tokenizer`` checks the statement); None for a bundle
    older than the field or without that tokenizer. ``folder`` as ``load_bundle_tokenizer``'s."""
    folder = folder or f"{role}_tokenizer"
    raw = _reader(root, folder, role, files)(SPECIAL)
    size = _special(root, folder, raw).get("vocab_size")
    return None if size is None else int(size)


def load_bundle_tokenizer(
    root: Path, role: str, files: dict[str, FileEntry], *, folder: str | None = None
) -> TokenizerLike:
    """The ``role`` tokenizer of the bundle at ``root`` (``files``: the manifest's listing);
    ``folder``: where its files are (default ``<role>_tokenizer``; a target of a multi-target
    bundle: ``bundle.targets.parts(manifest).tokenizer``)."""
    from omnidraft_deploy.bundle.manifest import BundleError
    from omnidraft_deploy.vocab import gguf_vocab as gv
    from omnidraft_deploy.vocab.tokenizers import BPETokenizer, SentencePieceTokenizer

    folder = folder or f"{role}_tokenizer"
    read = _reader(root, folder, role, files)
    special = _special(root, folder, read(SPECIAL))
    bos, eos, name = special.get("bos_id"), special["eos_ids"], str(special.get("name", role))
    tok: Any
    if (data := read(JSON)) is not None:
        inner = gv.require("tokenizers").Tokenizer.from_str(data.decode("utf-8"))
        tok = BPETokenizer(name, inner, bos_id=bos, eos_ids=eos)
    elif (data := read(SPM)) is not None:
        tok = SentencePieceTokenizer(name, data, hf_prefix=read(SPM_RAW))
    else:
        raise BundleError(root / folder, f"no {JSON} or {SPM} listed in the manifest")
    declared = special.get("vocab_size")
    if declared is not None and declared != tok.vocab_size:
        raise BundleError(root / folder / SPECIAL, f"vocab_size {declared}, but the tokenizer "
                          f"file defines {tok.vocab_size} ids")  # fmt: skip
    template = read(TEMPLATE)
    tok.chat_template = template.decode("utf-8") if template else None
    return tok  # type: ignore[no-any-return]


def render_chat(template: str | None, user_text: str) -> str:
    """One user turn rendered with the model's own chat template, ready for the assistant's
    reply (``add_generation_prompt``), in a Jinja sandbox; ``ValueError`` without a template.
    The template is compiled once per text (``_compiled``): ``omnidraft serve`` renders every
    request's prompt with the same one, and compiling it costs ~20 ms (Qwen2.5's)."""
    if not template:
        raise ValueError("--chat: this bundle's target has no chat template (a base model?)")
    from omnidraft_deploy import optional

    jinja2 = optional.require("jinja2", extra="tokenizers", purpose="rendering chat templates")
    try:
        return str(_compiled(template).render(
            messages=[{"role": "user", "content": user_text}], add_generation_prompt=True,
            bos_token="", eos_token="",
        ))  # fmt: skip
    except (jinja2.TemplateError, TypeError) as e:
        raise ValueError(f"--chat: the chat template does not render ({e})") from None


def chat_prefix_ids(tok: Any) -> list[int]:
    """The ids every chat-rendered prompt of ``tok`` begins with (the template's system turn and
    the user turn's header): the common start of two renders whose user texts share nothing. A
    served session keeps them in its caches (``speculative.kv_reuse``); [] without a template."""
    template = getattr(tok, "chat_template", None)
    if not template:
        return []
    a, b = (tok.encode(render_chat(template, t)) for t in ("Alpha.", "(2)"))
    return list(a[: common_prefix(a, b)])


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """``template`` compiled in a sandboxed environment whose ``raise_exception`` raises
    ``ValueError`` (a template's own error); keyed by the template's text."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
