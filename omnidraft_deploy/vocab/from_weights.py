"""What a model's own files say about its vocabulary: architecture, graph rows, tokenizer, specials.

The weights are the truth. ``read_weights_vocab(source)`` reads, without loading any tensor:

- a ``.gguf`` file: its header (``gguf_meta``): ``general.architecture``, the rows of
  ``token_embd.weight``, the tokenizer tables (rebuilt exactly as in ``gguf_vocab``), BOS/EOS ids
  and ``tokenizer.chat_template``;
- a Hugging Face folder: ``config.json`` (``model_type``, ``vocab_size``), ``tokenizer.json`` or
  ``tokenizer.model``, ``tokenizer_config.json`` / ``generation_config.json`` (BOS, EOS, chat
  template) and ``chat_template.jinja``.

Padding rows (the only accepted difference between graph rows and tokenizer ids):

- GGUF: llama.cpp's converter fills the ids a padded embedding has beyond the tokenizer with
  entries named ``[PAD<id>]`` (type UNUSED or USER_DEFINED); those trailing entries are padding.
  Qwen2.5: 151,665 tokens, 151,936 rows.
- HF folder and presets: ``vocab_size`` rounded up to a multiple of 64 with less than 1 % surplus
  (Qwen2-7B: 151,646 ids, 152,064 rows).

Padding ids are never produced: decoding masks logits past the tokenizer (``vocab_limit``).

EOS ids: the file's ``eos``/``eot``/``eom`` ids plus ``<|endoftext|>`` when it is a special token
(Qwen2 and SmolLM2 end plain-text documents with it and chats with ``<|im_end|>``). BOS: the
file's BOS id when ``add_bos_token`` is set (default: on for SentencePiece, off for byte-level BPE).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnidraft_deploy.vocab import gguf_vocab as gv
from omnidraft_deploy.vocab.gguf_meta import GGUFHeader, read_gguf_header

if TYPE_CHECKING:  # protocols imports torch; the checks here must not
    from omnidraft_deploy.protocols import TokenizerLike

_PAD = re.compile(r"\[PAD(\d+)\]")
_EOS_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}  # model_type -> Family


@dataclass(frozen=True)
class WeightsVocab:
    """The vocabulary facts of one weights source (see the module docstring)."""

    source: str  # what the user passed (--model / --drafter-model)
    model_type: str  # general.architecture / config.json model_type
    graph_rows: int  # rows of the embedding / lm_head
    tokenizer: TokenizerLike | None  # from the weights' own files; None: they carry none
    chat_template: str | None = None
    listed_ids: int | None = None  # GGUF: entries of its token table, [PAD<id>] rows included

    @property
    def family(self) -> str | None:
        return FAMILIES.get(self.model_type)


def padding_allowed(graph_rows: int, n_ids: int, *, gguf_pad: bool = False) -> bool:
    """True when ``graph_rows`` may exceed ``n_ids`` by the documented padding rules."""
    if graph_rows == n_ids:
        return True
    if graph_rows < n_ids:
        return False
    return gguf_pad or (graph_rows % 64 == 0 and (graph_rows - n_ids) < 0.01 * graph_rows)


def _gguf_defined(tokens: list[str], types: list[int]) -> int:
    """Number of ids before the trailing run of ``[PAD<id>]`` entries."""
    n = len(tokens)
    while (
        n
        and types[n - 1] in (gv.USER_DEFINED, gv.UNUSED)
        and ((m := _PAD.fullmatch(tokens[n - 1])) is not None and int(m.group(1)) == n - 1)
    ):
        n -= 1
    return n


def _eos_ids(
    fields: dict[str, Any], tokens: list[str], special: set[int], n: int
) -> tuple[int, ...]:
    ids = [int(fields[f"tokenizer.ggml.{k}"]) for k in _EOS_KEYS if f"tokenizer.ggml.{k}" in fields]
    ids += [i for i in special if tokens[i] == "<|endoftext|>"]
    return tuple(dict.fromkeys(i for i in ids if 0 <= i < n))


def _gguf_tokenizer(h: GGUFHeader, name: str) -> TokenizerLike:
    from omnidraft_deploy.vocab.tokenizers import BPETokenizer, SentencePieceTokenizer

    f = h.fields
    tokens, types = list(f["tokenizer.ggml.tokens"]), list(f["tokenizer.ggml.token_type"])
    n = _gguf_defined(tokens, types)
    model = str(f.get("tokenizer.ggml.model", ""))

    def opt(key: str) -> int | None:
        v = f.get(f"tokenizer.ggml.{key}")
        return None if v is None or not 0 <= int(v) < n else int(v)

    v = gv.GGUFVocab(
        path=h.path, model=model, pre=str(f.get("tokenizer.ggml.pre") or "default"),
        tokens=tuple(tokens[:n]), token_types=tuple(types[:n]),
        scores=tuple(float(s) for s in f.get("tokenizer.ggml.scores", [])[:n]),
        merges=tuple(f.get("tokenizer.ggml.merges", [])), bos_id=opt("bos_token_id"),
        eos_id=opt("eos_token_id"), unk_id=opt("unknown_token_id"),
    )  # fmt: skip
    add_bos = bool(f.get("tokenizer.ggml.add_bos_token", model == "llama"))
    if model == "llama":
        return SentencePieceTokenizer(name, gv.sentencepiece_model_bytes(v))
    if model != "gpt2":
        raise ValueError(f"{h.path}: tokenizer.ggml.model {model!r} is not supported (llama, gpt2)")
    tok = gv.require("tokenizers").Tokenizer.from_str(json.dumps(gv.bpe_tokenizer_json(v)))
    special = {i for i, t in enumerate(types[:n]) if t == gv.CONTROL}
    return BPETokenizer(
        name, tok, bos_id=v.bos_id if add_bos else None, eos_ids=_eos_ids(f, tokens, special, n)
    )


def _gguf_vocab(path: Path, source: str) -> WeightsVocab:
    h = read_gguf_header(path)
    if "tokenizer.ggml.tokens" not in h.fields:
        raise ValueError(f"{path}: GGUF has no tokenizer.ggml.tokens table")
    emb = h.tensors.get("token_embd.weight")
    rows = (
        emb[1] if emb else int(h.arch_field("vocab_size", len(h.fields["tokenizer.ggml.tokens"])))
    )
    tok = _gguf_tokenizer(h, _name(path))
    tok.chat_template = h.fields.get("tokenizer.chat_template")  # type: ignore[attr-defined]
    return WeightsVocab(
        source=source,
        model_type=h.architecture,
        graph_rows=int(rows),
        tokenizer=tok,
        chat_template=h.fields.get("tokenizer.chat_template"),
        listed_ids=len(h.fields["tokenizer.ggml.tokens"]),
    )


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return doc if isinstance(doc, dict) else {}


def _token_id(tok: Any, spec: Any) -> int | None:
    text = spec.get("content") if isinstance(spec, dict) else spec
    return None if not isinstance(text, str) else tok.token_to_id(text)


def _hf_tokenizer(folder: Path, name: str) -> tuple[TokenizerLike | None, str | None]:
    from omnidraft_deploy.vocab.tokenizers import BPETokenizer, SentencePieceTokenizer

    cfg = _json(folder / "tokenizer_config.json")
    gen = _json(folder / "generation_config.json")
    template = cfg.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if (folder / "tokenizer.json").is_file():
        tok = gv.require("tokenizers").Tokenizer.from_file(str(folder / "tokenizer.json"))
        eos = gen.get("eos_token_id", _token_id(tok, cfg.get("eos_token")))
        eos_ids = tuple(e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int))
        bos = _token_id(tok, cfg.get("bos_token")) if cfg.get("add_bos_token") else None
        return BPETokenizer(name, tok, bos_id=bos, eos_ids=eos_ids), template
    if (folder / "tokenizer.model").is_file():
        return SentencePieceTokenizer(name, (folder / "tokenizer.model").read_bytes()), template
    return None, template


def _name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem if path.is_file() else path.name)[:60]


def read_weights_vocab(source: str | Path) -> WeightsVocab:
    """Vocabulary facts of a ``.gguf`` file or a Hugging Face folder (no tensor is read)."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_vocab(path, str(source))
    if not path.is_dir():
        raise ValueError(f"{source}: expected a Hugging Face model folder or a .gguf file")
    cfg = _json(path / "config.json")
    if "vocab_size" not in cfg:
        raise ValueError(
            f"{path}: no config.json with a vocab_size (not a Hugging Face model folder)"
        )
    tok, template = _hf_tokenizer(path, _name(path))
    if tok is not None:
        tok.chat_template = template  # type: ignore[attr-defined]  # shipped with the bundle
    return WeightsVocab(str(source), str(cfg.get("model_type")), int(cfg["vocab_size"]), tok,
                        template)  # fmt: skip


def first_difference(a: TokenizerLike, b: TokenizerLike) -> tuple[int, bytes, bytes] | None:
    """First id below both sizes where two tokenizers' ordinary tokens differ (specials aside:
    releases rename reserved special tokens), or None when one vocabulary extends the other."""
    ta, tb = _table(a), _table(b)
    skip = a.special_ids | b.special_ids
    for i in range(min(len(ta), len(tb))):
        if i not in skip and ta[i] != tb[i]:
            return i, ta[i], tb[i]
    return None


def registered_tokenizer(tok: TokenizerLike) -> str | None:
    """The registered tokenizer (``vocab.tokenizers.TOKENIZERS``) whose ordinary tokens ``tok``
    spells id for id (``first_difference``: one may extend the other by under 1 %), or None.
    Only tokenizers of a similar size are built; one whose asset is not cached is skipped."""
    from omnidraft_deploy.catalog.assets import AssetError
    from omnidraft_deploy.catalog.tokenizers import IDS
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    n = tok.vocab_size
    for name, ids in IDS.items():
        if abs(ids - n) > 0.01 * max(ids, n):
            continue
        try:
            ours = load_tokenizer(name)
        except AssetError:
            continue
        if first_difference(tok, ours) is None:
            return name
    return None


def _table(tok: TokenizerLike) -> list[bytes]:
    table = getattr(tok, "token_bytes_table", None)
    return list(table()) if callable(table) else [tok.token_bytes(i) for i in range(tok.vocab_size)]
