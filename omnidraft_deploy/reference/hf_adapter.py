"""Real weights into ``reference.model.Transformer``: local HF folders, HF model ids, GGUF files.

Sources accepted by ``load_model``:
- a folder with ``config.json`` + ``model.safetensors`` (or sharded ``model.safetensors.index.json``);
- a ``.gguf`` file: dequantised once (``reference.gguf_weights``: the values transformers'
  GGUF loader gives; 3 s for SmolLM2-135M, 12 s for Qwen2.5-0.5B), then saved as safetensors
  under the cache's ``derived/`` folder keyed by the GGUF's sha256, so later loads read
  safetensors directly (about a second);
- a Hugging Face model id (``org/name``): resolved with ``huggingface_hub.snapshot_download``.
  No hub is reachable here, so this fails with a message saying what to do instead.

Parameter names already equal Hugging Face's (``model.layers.0.self_attn.q_proj.weight``), so
loading is a per-tensor read from safetensors, cast to ``dtype`` and ``load_state_dict(assign=
True)`` into a model built on the ``meta`` device: parameters are never allocated twice and the
peak is one copy of the weights in ``dtype`` plus one tensor in flight. Memory a 7-8B target needs:
~2 bytes/param in bf16 (Llama-3-8B: 16 GB, Vicuna-7B/Qwen2-7B: 13.5-15 GB) or 4 bytes/param in
fp32 (27-32 GB), plus the KV cache ``2 * n_layers * n_kv_heads * max_seq_len * head_dim * bytes``
(Llama-3-8B, 2048 positions, bf16: 256 MB). On a 24 GiB machine load 7-8B targets in bf16.

Config conversion: transformers 5 keeps ``rope_theta`` in ``config.rope_parameters`` (older
configs have it top level); Qwen2 has q/k/v bias; tied embeddings keep one tensor. The
default RoPE and Llama-3.x scaling (``rope_type: llama3``; from a GGUF, its ``rope_freqs``
tensor) are supported: any other scaled ``rope_type`` raises instead of silently diverging.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from omnidraft_deploy.vocab.gguf_meta import GGUFHeader

from omnidraft_deploy import optional
from omnidraft_deploy.bundle.files import sha256_file
from omnidraft_deploy.catalog import assets
from omnidraft_deploy.catalog.presets import Family, get_preset
from omnidraft_deploy.reference.model import ModelArgs, Transformer
from omnidraft_deploy.reference.rope import llama3_from_freq_factors, scaling_from_config
from omnidraft_deploy.reference.truncate import materialise

log = logging.getLogger(__name__)
_ARCH_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size")


@dataclass(frozen=True)
class LoadedModel:
    """What was loaded and from where (the ModelSpec-like info returned next to the model)."""

    source: str  # what the caller passed
    weights_dir: Path  # folder holding config.json + safetensors actually read
    family: Family
    args: ModelArgs
    dtype: torch.dtype
    n_params: int
    seconds: float
    dequantised_now: bool = False  # True when a GGUF was dequantised during this call


def _require(module: str) -> Any:
    return optional.require(module, extra="hf", purpose="loading real weights")


def args_from_config(
    cfg: dict[str, Any], *, max_seq_len: int | None = None
) -> tuple[Family, ModelArgs]:
    """HF ``config.json`` dict -> (family, ``ModelArgs``); raises ``ValueError`` if unsupported."""
    mtype = cfg.get("model_type")
    if mtype not in ("llama", "qwen2", "mistral"):
        raise ValueError(f"model_type {mtype!r} not supported (llama, qwen2, mistral)")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    scaling = scaling_from_config(cfg)  # Llama-3.x; other scaled rope_types raise
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    dim, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or dim // n_heads
    if head_dim * n_heads != dim:
        raise ValueError(f"head_dim {head_dim} * {n_heads} heads != hidden_size {dim}")
    if cfg.get("mlp_bias") or (cfg.get("attention_bias") and mtype != "qwen2"):
        raise ValueError("attention/mlp bias outside Qwen2's q/k/v bias is not supported")
    family = Family.QWEN2 if mtype == "qwen2" else Family.LLAMA
    limit = int(cfg.get("max_position_embeddings") or 2048)
    args = ModelArgs(
        vocab_size=int(cfg["vocab_size"]), dim=dim, n_layers=int(cfg["num_hidden_layers"]),
        n_heads=n_heads, n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        intermediate_size=int(cfg["intermediate_size"]), rope_theta=theta,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), qkv_bias=family is Family.QWEN2,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=max_seq_len or min(limit, 2048), rope_scaling=scaling,
    )  # fmt: skip
    return family, args


def _safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no model.safetensors or *.safetensors shards")
    return files


def _read_state_dict(folder: Path, dtype: torch.dtype) -> dict[str, Tensor]:
    """Tensor by tensor from safetensors, each cast to ``dtype`` as it is read."""
    st = _require("safetensors")
    out: dict[str, Tensor] = {}
    for path in _safetensor_files(folder):
        with st.safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                if re.search(r"rotary_emb\.inv_freq$", key):
                    continue  # recomputed from rope_theta
                out[key] = f.get_tensor(key).to(dtype)
    return out


def load_hf_folder(folder: str | Path, *, dtype: torch.dtype = torch.float32,
                   max_seq_len: int | None = None) -> tuple[Transformer, Family]:  # fmt: skip
    """Build the model described by ``folder/config.json`` with its safetensors weights."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (expected a Hugging Face model folder)")
    try:
        family, args = args_from_config(json.loads(cfg_path.read_text()), max_seq_len=max_seq_len)
    except (ValueError, KeyError) as e:
        raise ValueError(f"{cfg_path}: {e}") from e
    with torch.device("meta"):
        model = Transformer(args)
    state = _read_state_dict(folder, dtype)
    if args.tie_embeddings:
        state.pop("lm_head.weight", None)  # one tensor for both
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (args.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")  # fmt: skip
    del state
    if args.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    materialise(model, dtype)
    return model.eval(), family


def gguf_to_hf_folder(gguf: str | Path) -> tuple[Path, bool]:
    """Dequantise a GGUF into a cached safetensors folder once; returns (folder, built_now).

    ``reference.gguf_weights`` does the work (what transformers' GGUF loader gives, 5x faster);
    the folder (``config.json`` + ``model.safetensors``) also loads in transformers and GenAI."""
    from omnidraft_deploy.reference import gguf_weights
    from omnidraft_deploy.vocab.gguf_meta import read_gguf_header

    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: GGUF file not found")
    sha = next((a.sha256 for a in assets.ASSETS.values() if _is_asset_file(a.name, gguf)), None)
    sha = sha or sha256_file(gguf)
    folder = assets.derived_path("hf-gguf", sha, "model.safetensors").parent
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder, False
    h = read_gguf_header(gguf)
    config = gguf_weights.hf_config(h)  # an unsupported architecture fails before any work
    rope = _gguf_rope_parameters(h)  # and so does an unsupported RoPE scaling
    if rope is not None:
        config["rope_parameters"] = rope
    st = _require("safetensors.numpy")
    log.info("dequantising %s (one time, seconds)", gguf.name)
    state = gguf_weights.hf_state_dict(h)
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        meta = {"format": "pt", "source": gguf.name}
        st.save_file(state, str(stage / "model.safetensors"), metadata=meta)
        del state
        (stage / "config.json").write_text(json.dumps(config, indent=2))
        if folder.exists():
            shutil.rmtree(folder)
        stage.rename(folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return folder, True


def _gguf_rope_parameters(h: GGUFHeader) -> dict[str, Any] | None:
    """HF ``rope_parameters`` (llama3) of a GGUF with a ``rope_freqs.weight`` tensor, else None
    (default RoPE). Raises ``ValueError`` on any other scaling (``<arch>.rope.scaling.type``)."""
    from omnidraft_deploy.reference.gguf_weights import tensor_array

    kind = h.arch_field("rope.scaling.type")
    if kind not in (None, "none"):
        raise ValueError(f"{h.path}: rope scaling {kind!r} not supported (default and llama3 only)")
    if "rope_freqs.weight" not in h.tensors:
        return None
    factors = tensor_array(h, "rope_freqs.weight").ravel()
    n_heads, dim = int(h.arch_field("attention.head_count")), int(h.arch_field("embedding_length"))
    head_dim = int(h.arch_field("rope.dimension_count") or dim // n_heads)
    theta = float(h.arch_field("rope.freq_base", 10000.0))
    original = h.arch_field("rope.scaling.original_context_length")
    scaling = llama3_from_freq_factors([float(f) for f in factors], head_dim, theta,
                                       original=int(original) if original else None)  # fmt: skip
    return scaling.to_config(theta)


def _is_asset_file(name: str, path: Path) -> bool:
    try:
        return assets.asset_path(name).resolve() == path.resolve()
    except assets.AssetError:
        return False


def resolve_hub_id(model_id: str) -> Path:
    """Local snapshot folder of a hub model id; raises ``RuntimeError`` saying what to do offline."""
    hub = _require("huggingface_hub")
    try:
        return Path(
            hub.snapshot_download(
                model_id,
                allow_patterns=["config.json", "*.safetensors", "*.safetensors.index.json"],
            )
        )
    except Exception as e:  # noqa: BLE001 - hub errors are many types; all mean "not available"
        raise RuntimeError(
            f"cannot get {model_id!r} from the Hugging Face hub ({type(e).__name__}: "
            f"{str(e)[:200]}). No hub is reachable offline: download the model folder elsewhere "
            "and pass its path, or use a preset with a pinned GGUF (smollm2-135m, qwen2.5-0.5b)."
        ) from e  # fmt: skip


def load_model(source: str | Path, *, dtype: torch.dtype = torch.float32,
               max_seq_len: int | None = None) -> tuple[Transformer, LoadedModel]:  # fmt: skip
    """Load real weights from a HF folder, a ``.gguf`` file or a HF model id (see module doc).

    ``max_seq_len`` sizes the static KV cache (default: ``max_position_embeddings`` capped at
    2048). Returns the eval-mode model in ``dtype`` and a ``LoadedModel`` record.
    """
    t0 = time.perf_counter()
    path, built = Path(source).expanduser(), False
    if path.is_file() and path.suffix == ".gguf":
        folder, built = gguf_to_hf_folder(path)
    elif path.is_dir():
        folder = path
    elif path.exists():
        raise ValueError(f"{path}: expected a model folder or a .gguf file")
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", str(source)):
        folder = resolve_hub_id(str(source))
    else:
        raise FileNotFoundError(f"{source}: no such file or folder, and not a hub id (org/name)")
    model, family = load_hf_folder(folder, dtype=dtype, max_seq_len=max_seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    info = LoadedModel(str(source), folder, family, model.args, dtype, n_params,
                       time.perf_counter() - t0, built)  # fmt: skip
    log.info("loaded %s (%.1fM params, %s) in %.1f s", source, n_params / 1e6, dtype, info.seconds)
    return model, info


def load_preset_weights(preset_name: str, *, dtype: torch.dtype = torch.float32,
                        max_seq_len: int | None = None) -> tuple[Transformer, LoadedModel]:  # fmt: skip
    """Real weights of a preset: its pinned GGUF asset if it has one, else its ``hf_id``.

    The loaded architecture must equal the preset's; ``max_seq_len`` defaults to the preset's.
    """
    spec = get_preset(preset_name)
    if spec.gguf_asset:
        source: str | Path = assets.asset_path(spec.gguf_asset)
    elif spec.hf_id:
        source = spec.hf_id
    else:
        raise ValueError(f"preset {preset_name!r} has no real weights (tiny presets are random-init:"
                         " use reference.model.build_model)")  # fmt: skip
    model, info = load_model(source, dtype=dtype, max_seq_len=max_seq_len or spec.max_seq_len)
    want = ModelArgs.from_spec(spec, max_seq_len=model.args.max_seq_len)
    diff = {f: (getattr(info.args, f), getattr(want, f)) for f in _ARCH_FIELDS
            if getattr(info.args, f) != getattr(want, f)}  # fmt: skip
    if diff:
        raise ValueError(f"{source}: architecture differs from preset {preset_name!r}: "
                         f"{{field: (loaded, preset)}} = {diff}")  # fmt: skip
    return model, info
