"""Exact tokenizers rebuilt from the tokenizer tables inside a GGUF file.

transformers' own GGUF tokenizer loading is not exact (Llama-2 fails on text that starts with
whitespace; see ``tokenizers.py``). Rebuilding the original artefact from the GGUF tables is:

- ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE with byte fallback): a sentencepiece
  ``ModelProto`` with the GGUF pieces/scores/types, ``add_dummy_prefix`` and no whitespace
  folding, which is what Llama-2's ``tokenizer.model`` contains.
- ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE): a ``tokenizers`` BPE with the GGUF
  vocabulary and merges, the pre-tokenizer that ``tokenizer.ggml.pre`` names, a ByteLevel
  decoder, and every CONTROL token registered as a special added token.

GGUF token types (llama.cpp enum, equal to sentencepiece's piece types): 1 NORMAL, 2 UNKNOWN,
3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnidraft_deploy import optional

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def require(module: str) -> Any:
    """Import an optional tokenizer dependency or raise an actionable ``ImportError``."""
    return optional.require(module, extra="tokenizers", purpose="building real tokenizers")


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer tables of one GGUF file (index = token id)."""

    path: Path
    model: str  # tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str  # tokenizer.ggml.pre: pre-tokenizer name ("default", "gpt-2", "smollm", ...)
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...]  # empty for BPE files
    merges: tuple[str, ...]  # empty for SentencePiece files
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None


def read_gguf_vocab(path: str | Path) -> GGUFVocab:
    """Read only the tokenizer key/values of a GGUF (``gguf_meta``'s header reader: well under a
    second for a model's 150k-token tables, where ``gguf.GGUFReader`` takes 5-18 s)."""
    from omnidraft_deploy.vocab.gguf_meta import read_gguf_header

    path = Path(path)
    try:
        fields = read_gguf_header(path).fields
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e

    def strings(key: str) -> tuple[str, ...]:
        return tuple(str(x) for x in fields.get(key, ()))

    def numbers(key: str) -> tuple[Any, ...]:
        return tuple(fields.get(key, ()))

    def scalar(key: str) -> Any:
        return fields.get(key)

    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"{path}: GGUF has no tokenizer.ggml.tokens table")
    return GGUFVocab(
        path=path,
        model=str(scalar("tokenizer.ggml.model")),
        pre=str(scalar("tokenizer.ggml.pre") or "default"),
        tokens=strings("tokenizer.ggml.tokens"),
        token_types=tuple(int(t) for t in numbers("tokenizer.ggml.token_type")),
        scores=tuple(float(s) for s in numbers("tokenizer.ggml.scores")),
        merges=strings("tokenizer.ggml.merges"),
        bos_id=scalar("tokenizer.ggml.bos_token_id"),
        eos_id=scalar("tokenizer.ggml.eos_token_id"),
        unk_id=scalar("tokenizer.ggml.unknown_token_id"),
    )


def sentencepiece_model_bytes(v: GGUFVocab, *, add_dummy_prefix: bool = True) -> bytes:
    """Serialized sentencepiece ``ModelProto`` equivalent to the original ``tokenizer.model``."""
    if v.model != "llama":
        raise ValueError(f"{v.path}: tokenizer.ggml.model is {v.model!r}, not SentencePiece")
    require("google.protobuf")
    pb = require("sentencepiece.sentencepiece_model_pb2")
    m = pb.ModelProto()
    for piece, score, kind in zip(v.tokens, v.scores, v.token_types, strict=True):
        p = m.pieces.add()
        p.piece, p.score, p.type = piece, score, kind
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(v.tokens)
    ts.byte_fallback = True
    ts.unk_id = v.unk_id if v.unk_id is not None else 0
    ts.bos_id = v.bos_id if v.bos_id is not None else -1
    ts.eos_id = v.eos_id if v.eos_id is not None else -1
    ts.pad_id = -1
    ns = m.normalizer_spec
    ns.name = "identity"  # Llama-2: no NFKC, keep runs of spaces
    ns.add_dummy_prefix = add_dummy_prefix
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    return bytes(m.SerializeToString())


# tokenizer.ggml.pre -> list of tokenizers pre-tokenizer configs applied before byte-level BPE
_GPT2_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                   "use_regex": True}  # fmt: skip
_BYTELEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                       "use_regex": False}  # fmt: skip


def _split(digits: str) -> dict[str, Any]:
    """The tiktoken-style split of Llama-3 / Qwen2 (``digits``: how digits are grouped)."""
    regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits
             + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


_PRE_TOKENIZERS: dict[str, list[dict[str, Any]]] = {
    "gpt-2": [_GPT2_BYTELEVEL],
    "smollm": [{"type": "Digits", "individual_digits": True}, _GPT2_BYTELEVEL],
    "qwen2": [_split(r"\p{N}"), _BYTELEVEL_NO_REGEX],  # input NFC-normalised (below)
    "llama-bpe": [_split(r"\p{N}{1,3}"), _BYTELEVEL_NO_REGEX],  # merges ignored (below)
}


def bpe_tokenizer_json(v: GGUFVocab) -> dict[str, Any]:
    """A ``tokenizer.json`` document (as a dict) for a byte-level BPE GGUF vocabulary."""
    if v.model != "gpt2":
        raise ValueError(f"{v.path}: tokenizer.ggml.model is {v.model!r}, not byte-level BPE")
    if v.pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"{v.path}: pre-tokenizer {v.pre!r} not supported; choose from {sorted(_PRE_TOKENIZERS)}"
        )
    special = [i for i, t in enumerate(v.token_types) if t in (CONTROL, USER_DEFINED)]
    added = [
        {"id": i, "content": v.tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": v.token_types[i] == CONTROL}
        for i in special
    ]  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if v.pre == "qwen2" else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": _PRE_TOKENIZERS[v.pre]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": v.pre == "llama-bpe",
                  "vocab": {t: i for i, t in enumerate(v.tokens)},
                  "merges": [m.split(" ", 1) for m in v.merges]},
    }  # fmt: skip
