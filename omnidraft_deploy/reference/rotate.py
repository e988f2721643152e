"""The residual stream turned by an orthogonal matrix: the same function, fewer outlier channels.

QuaRot (Ashkboos et al. 2024) and SpinQuant (Liu et al. 2024): an LLM's residual stream carries
a few outlier channels, so one uint16 scale per tensor over its range rounds the ordinary
channels coarsely in every residual ``Add``, every RMSNorm and the outputs of ``o_proj`` /
``down_proj``. Turning the stream by an orthogonal ``Q`` (``x -> x Q``) spreads each outlier
over all channels, and an RMSNorm without its weight commutes with the turn
(``x Q / ||x Q|| = (x / ||x||) Q``), so the model is rewritten exactly, in its weights alone:

- each RMSNorm weight ``g`` is folded into the linears that read the norm (``W <- W diag(g)``) and
  set to ones;
- readers of the stream (``q/k/v``, ``gate/up``, the lm_head: ``W (out, dim)``) become ``W Q``;
  writers (``o_proj``, ``down_proj``: ``W (dim, in)``, and their biases) become ``Q^T W``; the
  embedding table becomes ``E Q``. A tied lm_head is untied (it reads the norm, the table does
  not).

Measured on SmolLM2-135M's QNN graph (sink, GPTQ'd per-channel 8-bit weights, uint16
activations; CPU run of the QDQ graph, 12 shipped prompts, 340 teacher-forced rows): top-1
against eager 0.950 -> 0.971, max |logit diff| over rollback calls 13.9 -> 1.7.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import cast

import torch
from torch import Tensor, nn

from omnidraft_deploy.reference.model import DecoderLayer, RMSNorm, Transformer


def orthogonal(dim: int, seed: int = 0) -> Tensor:
    """A seeded random orthogonal ``(dim, dim)`` matrix (QR of a Gaussian, in float64)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))[0].float()


@torch.no_grad()
def rotated(model: Transformer, seed: int = 0) -> Transformer:
    """A copy of ``model`` computing the same logits with its residual stream turned by
    ``orthogonal(dim, seed)`` (module docstring); ``model`` is not changed."""
    out = copy.deepcopy(model)
    out.args = dataclasses.replace(model.args, tie_embeddings=False)
    q = orthogonal(model.args.dim, seed)
    body, layers = out.model, cast("list[DecoderLayer]", list(out.model.layers))
    norms = [body.norm, *(n for layer in layers
                          for n in (layer.input_layernorm, layer.post_attention_layernorm))]  # fmt: skip
    if not all(type(n) is RMSNorm for n in norms):
        raise TypeError("rotated: every norm must be the reference RMSNorm (weight, no bias)")
    grad = out.lm_head.weight.requires_grad
    out.lm_head.weight = nn.Parameter(_reads(out.lm_head.weight, body.norm.weight, q), grad)
    body.embed_tokens.weight = nn.Parameter(body.embed_tokens.weight @ q, grad)
    body.norm.weight.fill_(1.0)
    for layer in layers:
        at, mlp = layer.self_attn, layer.mlp
        for norm, readers in ((layer.input_layernorm, (at.q_proj, at.k_proj, at.v_proj)),
                              (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj))):  # fmt: skip
            for lin in readers:
                lin.weight.copy_(_reads(lin.weight, norm.weight, q))
            norm.weight.fill_(1.0)
        for lin in (at.o_proj, mlp.down_proj):
            lin.weight.copy_(q.T @ lin.weight)  # (dim, in)
            if lin.bias is not None:
                lin.bias.copy_(lin.bias @ q)
    return out


def _reads(weight: Tensor, norm_weight: Tensor, q: Tensor) -> Tensor:
    """``W diag(g) Q`` of a linear ``W (out, dim)`` that reads an RMSNorm with weight ``g``."""
    return (weight * norm_weight[None, :]) @ q
