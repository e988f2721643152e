"""SmoothQuant scales folded into a copy of the weights, for per-row int8 activations (``w8a8``).

The ``w8a8`` graph quantises every weight matmul's input to int8 with one scale per row (token), so
that ``MatMulInteger`` (ONNX Runtime's integer GEMM, u8 x s8: exact on every CPU the runtime
opens it on, see ``exporters.onnx.fused.GraphWriter.linear_rows``) does the products exactly and
a row's result does not depend on the other rows. One scale over the whole hidden vector is coarse
where a few channels carry most of the magnitude (Qwen2.5-0.5B's down_proj input above all).
SmoothQuant
(Xiao et al. 2023) moves that magnitude into the weights: input channel ``j`` is divided by

    s_j = max|X_j| ** alpha / max|W_:,j| ** (1 - alpha)

and the weight's column ``j`` multiplied by it, so the fp32 product is unchanged. The division is
folded into the op that produces ``X``:

- q|k|v and gate|up: the RMSNorm weight in front of them;
- down_proj: the rows of up_proj (``act = silu(gate) * up`` is linear in ``up``);
- lm_head: the final RMSNorm (a tied head gets its own copy of the table first).

o_proj's input (attention output) is left alone: folding into v would need one scale per kv head
shared by its query heads. ``max|X_j|`` comes from running the eager model over calibration text
(``activation_absmax``), held out from the verification prompts. Measured on Qwen2.5-0.5B
(``benchmarks/quant_probe.py --study w8a8``, 288 teacher-forced rows, top-1 against eager fp32):
per-row int8 everywhere 0.880 unsmoothed, 0.936 with alpha = 0.5, 0.916 at 0.8. The XNNPACK
``8da8w`` recipe (torchao: int8 per-token activations, int8 per-channel weights) is smoothed the
same way: SmolLM2-135M in eager, 12 shipped prompts, 268 rows, top-1 0.884 -> 0.937 and max
|logit diff| 8.3 -> 4.2 at alpha = 0.5 (0.911 at 0.4, 0.877 at 0.6), and 2.2 with down_proj left
in fp32 (the recipe). Not applied to ``8da4w``: its int4 groups keep the grid a GGUF model was
published on (``quantize.Int4GroupLinear``), and scaling the columns moves the weights off it
(SmolLM2: top-1 0.862 unsmoothed, 0.750 smoothed).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time

import torch
from omnidraft_deploy.exporters.quant.calibration import calibration_ids, input_stats
from torch import Tensor, nn

from omnidraft_deploy.reference.model import DecoderLayer, Transformer

log = logging.getLogger(__name__)
ALPHA = 0.5


def _layers(model: Transformer) -> list[DecoderLayer]:
    return [layer for layer in model.model.layers if isinstance(layer, DecoderLayer)]


@torch.no_grad()
def activation_absmax(model: Transformer, prompts: list[list[int]]) -> dict[str, Tensor]:
    """Per-channel max |input| of every smoothed matmul over ``prompts`` (one forward each):
    keys ``<layer>.qkv``, ``<layer>.gate_up``, ``<layer>.down`` and ``head``."""
    if not prompts:
        raise ValueError("SmoothQuant calibration needs at least one prompt")

    def fold(acc: Tensor | None, x: Tensor) -> Tensor:
        amax = x.abs().amax(0).float()
        return amax if acc is None else torch.maximum(acc, amax)

    modules: dict[str, nn.Module] = {"head": model.lm_head}
    for i, layer in enumerate(_layers(model)):
        modules |= {f"{i}.qkv": layer.self_attn.q_proj, f"{i}.gate_up": layer.mlp.gate_proj,
                    f"{i}.down": layer.mlp.down_proj}  # fmt: skip
    return {key: amax for key, (amax, _rows) in input_stats(model, prompts, modules, fold).items()}


def smoothing_scales(x_absmax: Tensor, weights: list[Tensor], alpha: float = ALPHA) -> Tensor:
    """``s_j = max|X_j|^alpha / max|W_:,j|^(1-alpha)`` over the weights that read ``X`` (each
    ``(out, in)``); channels that never fire keep ``s = 1``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"SmoothQuant alpha must be in [0, 1], got {alpha}")
    w_absmax = torch.stack([w.detach().abs().amax(0).float() for w in weights]).amax(0)
    s = x_absmax.clamp(min=1e-5) ** alpha / w_absmax.clamp(min=1e-5) ** (1.0 - alpha)
    return torch.where(x_absmax > 0, s, torch.ones_like(s))


@torch.no_grad()
def smoothed(model: Transformer, stats: dict[str, Tensor], alpha: float = ALPHA) -> Transformer:
    """A deep copy of ``model`` with the scales folded in (fp32 outputs equal up to rounding)."""
    m = copy.deepcopy(model)
    if m.lm_head.weight is m.model.embed_tokens.weight:  # untie: the table must stay as it was
        m.lm_head.weight = nn.Parameter(m.lm_head.weight.detach().clone(), requires_grad=False)
    m.args = dataclasses.replace(m.args, tie_embeddings=False)  # a copy rebuilt from args too
    for i, layer in enumerate(_layers(m)):
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        s = smoothing_scales(stats[f"{i}.qkv"], [lin.weight for lin in qkv], alpha)
        layer.input_layernorm.weight.div_(s)
        for lin in qkv:
            lin.weight.mul_(s)
        s = smoothing_scales(
            stats[f"{i}.gate_up"], [mlp.gate_proj.weight, mlp.up_proj.weight], alpha
        )
        layer.post_attention_layernorm.weight.div_(s)
        mlp.gate_proj.weight.mul_(s)
        mlp.up_proj.weight.mul_(s)
        s = smoothing_scales(stats[f"{i}.down"], [mlp.down_proj.weight], alpha)
        mlp.up_proj.weight.div_(s[:, None])  # after the gate|up smoothing: rows, not columns
        mlp.down_proj.weight.mul_(s)
    s = smoothing_scales(stats["head"], [m.lm_head.weight], alpha)
    m.model.norm.weight.div_(s)
    m.lm_head.weight.mul_(s)
    return m


def smoothed_on_text(model: Transformer, tokenizer: str, label: str) -> Transformer:
    """``smoothed`` with scales calibrated on real text in ``tokenizer`` held out from the
    verification prompts (``calibration_ids``); ``label`` names the graph in the log."""
    prompts = calibration_ids(tokenizer, model.args.vocab_size, min(128, model.args.max_seq_len))
    t0 = time.perf_counter()
    out = smoothed(model, activation_absmax(model, prompts))
    log.info("%s: SmoothQuant calibrated on %d prompts (%d tokens) in %.1f s", label,
             len(prompts), sum(map(len, prompts)), time.perf_counter() - t0)  # fmt: skip
    return out
