"""Early-exit (layer-truncated) models: the first ``n`` decoder layers of a model, plus its final
norm and ``lm_head`` (tied embeddings stay tied).

An early-exit drafter reuses a larger model's embeddings, its first ``n`` blocks and its output
head unchanged: the hidden state after block ``n`` is read out as if it were the last one. Its
quality is then recovered by distillation (``distill.offline``); the architecture is the parent's
with ``n_layers = n``, so every exporter and runtime handles it as an ordinary ``Transformer``.
"""

from __future__ import annotations

import dataclasses

import torch

from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.rope import rope_tables


def truncate_layers(
    model: Transformer, n_layers: int, *, max_seq_len: int | None = None
) -> Transformer:
    """A new eval-mode ``Transformer`` with the first ``n_layers`` blocks of ``model`` (copied).

    ``max_seq_len`` sizes the new model's KV cache (default: ``model``'s). The parent is untouched.
    """
    if not 1 <= n_layers <= model.args.n_layers:
        raise ValueError(f"n_layers must be in [1, {model.args.n_layers}], got {n_layers}")
    args = dataclasses.replace(
        model.args, n_layers=n_layers, max_seq_len=max_seq_len or model.args.max_seq_len
    )
    dtype = model.model.embed_tokens.weight.dtype
    with torch.device("meta"):
        out = Transformer(args)
    keep = {
        k: v
        for k, v in model.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < n_layers
    }
    if args.tie_embeddings:
        keep.pop("lm_head.weight", None)
    out.load_state_dict({k: v.clone() for k, v in keep.items()}, strict=False, assign=True)
    if args.tie_embeddings:
        out.lm_head.weight = out.model.embed_tokens.weight
    materialise(out, dtype)
    missing = [n for n, p in out.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"truncation left parameters unset: {missing[:5]}")
    return out.eval()


def materialise(model: Transformer, dtype: torch.dtype) -> None:
    """Real (non-meta) RoPE tables and zeroed KV caches for a model built on ``meta``."""
    a = model.args
    cos, sin = rope_tables(a.head_dim, a.max_seq_len, a.rope_theta, a.rope_scaling)
    model.register_buffer("rope_cos", cos.to(dtype), persistent=False)
    model.register_buffer("rope_sin", sin.to(dtype), persistent=False)
    for i, shape in enumerate(model.cache_shapes()):
        model.register_buffer(f"kv_cache_{i}", torch.zeros(shape, dtype=dtype), persistent=False)


def truncated_param_count(model: Transformer, n_layers: int) -> int:
    """Parameters of ``truncate_layers(model, n_layers)`` (tied weights counted once)."""
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    rest = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.layers."))
    return rest + n_layers * per_layer
