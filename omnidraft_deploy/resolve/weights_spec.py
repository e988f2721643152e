"""A model named by its own weights: ``omnidraft-export --model X`` with no ``--target``.

``read_weights_spec(path, role, tokenizer=...)`` reads, without loading any tensor or importing
torch, a ``.gguf`` header (``vocab.gguf_meta``) or a Hugging Face folder's ``config.json`` and
returns the ``ModelSpec`` (source ``weights``) the export runs with:

- architecture (``general.architecture`` / ``model_type``: llama, mistral -> llama; qwen2), width,
  layers, heads, KV heads, FFN width, RoPE base, norm epsilon, tied embeddings, graph rows;
- ``max_seq_len``: the model's own context (``<arch>.context_length`` /
  ``max_position_embeddings``), which ``resolve.context`` caps by a memory budget;
- ``name``: the model's own name (``general.name``, else the file stem; a folder: its name),
  made a plain identifier (``Qwen2.5 Coder 1.5B Instruct`` -> ``Qwen2.5-Coder-1.5B-Instruct``).

``weights_record(path)`` is what a bundle's manifest says about the weights
(``extras.target_model`` / ``extras.drafter_model``): name, size label (``general.size_label``,
else from the parameter count), architecture, context, the file name and its sha256 (a folder:
the sha256 of its ``config.json`` and safetensors files' names and hashes). Never a path of the
exporting machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from omnidraft_deploy.catalog.presets import Family, ModelSpec, Role, Source
from omnidraft_deploy.vocab.gguf_meta import GGUFHeader, read_gguf_header

FAMILIES = {"llama": Family.LLAMA, "mistral": Family.LLAMA, "qwen2": Family.QWEN2}
DEFAULT_CONTEXT = 2048  # when the weights state none


def plain_name(text: str) -> str:
    """``text`` as a plain identifier: letters, digits, ``.``, ``_``, ``-`` (at most 64)."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-._")[:64] or "model"


def _family(model_type: str, where: Path) -> Family:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(
            f"{where}: architecture {model_type!r} is not supported (supported: "
            f"{', '.join(sorted(FAMILIES))}; Llama-3 models are llama)"
        ) from None


def _gguf_dims(h: GGUFHeader) -> dict[str, Any]:
    a = h.arch_field
    dims = {"dim": a("embedding_length"), "n_layers": a("block_count"),
            "n_heads": a("attention.head_count"), "intermediate_size": a("feed_forward_length")}  # fmt: skip
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        raise ValueError(f"{h.path}: GGUF metadata lacks {h.architecture}.* fields for {missing}")
    emb = h.tensors.get("token_embd.weight")
    rows = emb[1] if emb else a("vocab_size", len(h.fields.get("tokenizer.ggml.tokens", [])))
    return {k: int(v) for k, v in dims.items()} | {
        "n_kv_heads": int(a("attention.head_count_kv") or dims["n_heads"]),
        "vocab_size": int(rows),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        "tie_embeddings": "output.weight" not in h.tensors,
        "max_seq_len": int(a("context_length") or DEFAULT_CONTEXT),
    }


def _config_dims(cfg: dict[str, Any]) -> dict[str, Any]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    n_heads = int(cfg["num_attention_heads"])
    return {
        "dim": int(cfg["hidden_size"]), "n_layers": int(cfg["num_hidden_layers"]),
        "n_heads": n_heads, "n_kv_heads": int(cfg.get("num_key_value_heads") or n_heads),
        "intermediate_size": int(cfg["intermediate_size"]), "vocab_size": int(cfg["vocab_size"]),
        "rope_theta": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "max_seq_len": int(cfg.get("max_position_embeddings") or DEFAULT_CONTEXT),
    }  # fmt: skip


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{folder}: no config.json (not a Hugging Face model folder)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: not a JSON object")
    return cfg


def _read(path: Path) -> tuple[Family, str, dict[str, Any]]:
    """(family, the model's own name, ``ModelSpec`` dimensions) of a .gguf file or a folder."""
    if path.suffix == ".gguf":
        h = read_gguf_header(path)
        own = str(h.fields.get("general.name") or path.stem)
        return _family(h.architecture, path), own, _gguf_dims(h)
    cfg = _config(path)
    family = _family(str(cfg.get("model_type")), path / "config.json")
    try:
        return family, path.name, _config_dims(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path / 'config.json'}: missing or bad field {e}") from None


def read_weights_spec(path: str | Path, role: Role, *, tokenizer: str,
                      name: str | None = None) -> ModelSpec:  # fmt: skip
    """The spec of the weights at ``path`` (module docstring); ``tokenizer``: the registered
    tokenizer the weights' own equals (``vocab.from_weights.registered_tokenizer``); ``name``
    overrides the model's own (a hub id). ``ValueError`` naming the file when unsupported."""
    path = Path(path)
    family, own, dims = _read(path)
    try:
        gguf = str(path.resolve()) if path.suffix == ".gguf" else None
        return ModelSpec(plain_name(name or own), role, family, tokenizer, source=Source.WEIGHTS,
                         gguf_path=gguf, **dims)  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def own_name(value: str) -> str:
    """The model's own name (``plain_name``) for the weights ``value`` names (a path or a hub
    id), e.g. for the default ``--out``; never raises (the export checks the weights)."""
    path = Path(value).expanduser()
    if not path.exists():
        return plain_name(value.split("/")[-1])
    try:
        return plain_name(_read(path)[1])
    except (OSError, ValueError):
        return plain_name(path.stem)


def context_length(path: str | Path) -> int:
    """The model's own context (positions it was trained for) as its weights state it."""
    return int(_read(Path(path))[2]["max_seq_len"])


def n_params(path: str | Path) -> int:
    """Parameter count from the weights' headers (GGUF tensor infos / safetensors headers)."""
    path = Path(path)
    if path.suffix == ".gguf":
        return sum(math.prod(d) for d in read_gguf_header(path).tensors.values())
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(min(n, 1 << 26)))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def size_label(n: int) -> str:
    """``1543714304`` -> ``"1.5B"``, ``134515008`` -> ``"135M"`` (llama.cpp's labels)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}".replace(".0", "") if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def _sha256(files: list[Path]) -> str:
    from omnidraft_deploy.bundle.files import sha256_file

    if len(files) == 1:
        return sha256_file(files[0])
    listing = "".join(f"{f.name} {sha256_file(f)}\n" for f in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def weights_record(path: str | Path, *, name: str | None = None) -> dict[str, Any]:
    """What the manifest records about the weights at ``path`` (module docstring)."""
    path = Path(path)
    family, own, dims = _read(path)
    label = None
    if path.suffix == ".gguf":
        label = read_gguf_header(path).fields.get("general.size_label")
        files = [path]
    else:
        files = [path / "config.json", *sorted(path.glob("*.safetensors"))]
    return {
        "name": name or own, "size": str(label or size_label(n_params(path))),
        "architecture": family.value, "context_length": dims["max_seq_len"], "file": path.name,
        "sha256": _sha256(files),
    }  # fmt: skip
