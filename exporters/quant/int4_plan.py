"""Which weight matmuls of an ``int4`` graph keep 8 bits: mixed precision chosen by measurement.

Round-to-nearest int4 on every body matmul keeps teacher-forced top-1 0.85 of Qwen2.5-Coder-0.5B
(12 shipped prompts, fused graph), while SmolLM2-135M, published as a Q4_1 GGUF, comes back on
its own grid exactly (``quant.grids.int4_grid``). So the recipe decides per fused matmul (a
layer's qkv, o_proj, gate_up, down_proj), as llama.cpp's Q4_K_M keeps some tensors at 6 bits:

1. rank the matmuls by the share of their output that int4 rounding changes, weighting each
   input channel by its mean square on calibration text (``relative_errors``: the diagonal of
   GPTQ's ``X^T X``, one eager forward);
2. simulate the graph in eager PyTorch (``Simulator``: int4 / int8 block weights as the graph
   holds them, the lm_head at 8 bits, and every matmul input rounded to int8 per block of 32, as
   MatMulNBits' ``accuracy_level=4`` computes) and binary-search the longest prefix of that
   ranking at int4 whose teacher-forced top-1 against fp32 stays within ``MAX_TOP1_LOSS`` of the
   all-int8 graph's and whose max |logit diff| stays inside the recipe's tolerance (with a
   margin), on calibration text held out from the verification prompts.

Pure functions of the eager model; ``plan`` is what the exporter calls.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Iterator

import torch
from omnidraft_deploy.exporters.quant.calibration import calibration_ids, input_stats
from omnidraft_deploy.exporters.quant.grids import int4_rtn, quantize_blocks, swap_modules
from torch import Tensor, nn

from omnidraft_deploy.catalog.backends import Backend
from omnidraft_deploy.reference.model import DecoderLayer, Transformer

log = logging.getLogger(__name__)
MAX_TOP1_LOSS = 0.015  # int4 may cost this much top-1 (calibration text) over the int8 graph
EXACT = 1e-12  # relative error of a matmul int4 holds exactly (float rounding of the grid)
DIFF_SHARE = 0.75  # ... and reach this share of the recipe's max |logit diff| (verification margin)
_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
          "gate_up": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}  # fmt: skip


def fused_linears(model: Transformer) -> Iterator[tuple[str, list[nn.Module]]]:
    """``(graph name, the eager linears it packs)`` for every body matmul of the fused graph
    (``onnx.fused``'s names: ``layers.<i>.qkv_proj`` / ``o_proj`` / ``gate_up`` / ``down_proj``)."""
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer, DecoderLayer)
        for fused, parts in _PARTS.items():
            owner = layer.self_attn if fused in ("qkv_proj", "o_proj") else layer.mlp
            yield f"layers.{i}.{fused}", [getattr(owner, p) for p in parts]


def int8_blocks(w: Tensor, block: int) -> Tensor:
    """``w (N, K)`` on the ``int8`` recipe's grid (symmetric per block), dequantised."""
    q, scales, _ = quantize_blocks(w, 8, block)
    n, k = w.shape
    deq = (torch.from_numpy(q).float() - 128.0) * torch.from_numpy(scales).view(n, -1, 1)
    return deq.reshape(n, -1)[:, :k]


def _weight(m: nn.Module) -> Tensor:
    w = m.weight
    assert isinstance(w, Tensor)
    return w.detach().float()


@torch.no_grad()
def relative_errors(model: Transformer, prompts: list[list[int]], block: int) -> dict[str, float]:
    """Per fused matmul: ``sum_j ||dW_:,j||^2 E[x_j^2] / sum_j ||W_:,j||^2 E[x_j^2]``, ``dW`` the
    int4 rounding error, ``E[x_j^2]`` input channel ``j``'s mean square over ``prompts``."""

    def fold(acc: Tensor | None, x: Tensor) -> Tensor:
        x = x.double()
        return (x * x).sum(0) if acc is None else acc + (x * x).sum(0)

    firsts = {name: linears[0] for name, linears in fused_linears(model)}  # parts share an input
    stats = input_stats(model, prompts, firsts, fold)
    out = {}
    for name, linears in fused_linears(model):
        squares, rows = stats[name]
        ms = (squares / rows).float()
        w = torch.cat([_weight(m) for m in linears])
        err = ((int4_rtn(w, block) - w) ** 2).sum(0)
        out[name] = float((err * ms).sum() / ((w * w).sum(0) * ms).sum().clamp(min=1e-30))
    return out


def int4_parts(w: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """``w (N, K)`` on its int4 grid split as the graph computes it: the part MatMulNBits holds,
    ``step * (code - 8)``, and the per-block constant ``offset + 8 * step`` the graph adds in fp32
    (``onnx.fused.GraphWriter.block_offsets``), each expanded to ``(N, K)``."""
    n, k = w.shape
    q, steps, offsets = quantize_blocks(w, 4, block)
    b = torch.from_numpy(q)
    codes = torch.stack([b & 15, b >> 4], -1).view(n, -1, block).float()
    step = torch.from_numpy(steps).view(n, -1, 1)
    const = torch.from_numpy(offsets)[..., None] + 8 * step
    expand = torch.ones(1, 1, block)
    return ((codes - 8) * step).view(n, -1)[:, :k], (const * expand).view(n, -1)[:, :k]


def round_blocks(x: Tensor, block: int) -> Tensor:
    """``x`` rounded to int8 per block of ``block`` inputs (symmetric), as MatMulNBits'
    ``accuracy_level=4`` computes."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    scale = xb.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 127.0
    return (torch.round(xb / scale) * scale).reshape(x.shape)


def round_tokens(x: Tensor, _block: int = 0) -> Tensor:
    """``x`` rounded to int8 per token (row), asymmetric over a range holding 0: XNNPACK's
    dynamically quantised activations (``qd8``, torchao's per-token int8)."""
    lo = x.amin(-1, keepdim=True).clamp(max=0.0)
    hi = x.amax(-1, keepdim=True).clamp(min=0.0)
    scale = ((hi - lo) / 255.0).clamp(min=1e-10)
    zero = torch.round(-lo / scale) - 128.0
    return (torch.clamp(torch.round(x / scale) + zero, -128, 127) - zero) * scale


def int8_rows(w: Tensor, _block: int = 0) -> Tensor:
    """``w (N, K)`` on XNNPACK 8da8w's grid, dequantised: torchao's symmetric int8 per output
    channel (scale ``amax / 127.5``, codes in [-128, 127])."""
    scale = (w.abs().amax(-1, keepdim=True) / 127.5).clamp(min=1e-10)
    return torch.clamp(torch.round(w / scale), -128, 127) * scale


Rounding = Callable[[Tensor, int], Tensor]  # (tensor, block) -> the tensor as the kernel sees it
# backend -> (how a matmul's input is rounded, an 8-bit weight's grid); int4 is the same grid.
# ONNX: MatMulNBits, accuracy_level=4. XNNPACK: 8da4w / 8da8w linears (int8 per-token activations).
NUMERICS: dict[Backend, tuple[Rounding, Rounding]] = {
    Backend.ONNX: (round_blocks, int8_blocks),
    Backend.XNNPACK: (round_tokens, int8_rows),
}


def whole_blocks(model: Transformer, block: int) -> bool:
    """Whether every body matmul's input splits into blocks of ``block`` (what the simulation
    reshapes it into)."""
    return not (model.args.dim % block or model.args.intermediate_size % block)


class SimLinear(nn.Module):
    """A quantised graph matmul in eager: ``round(x) @ centred.T + x @ constant.T (+ bias)``,
    the input rounded as the backend's kernel does (``NUMERICS``)."""

    def __init__(self, linear: nn.Linear, block: int, rounding: Rounding = round_blocks) -> None:
        super().__init__()
        self.block, self.bias, self.rounding = block, linear.bias, rounding
        self.weight = linear.weight.detach().float()  # replaced by ``set``
        self.constant: Tensor | None = None

    def set(self, centred: Tensor, constant: Tensor | None) -> None:
        self.weight, self.constant = centred, constant

    def forward(self, x: Tensor) -> Tensor:
        y = nn.functional.linear(self.rounding(x, self.block), self.weight)
        if self.constant is not None:
            y = y + nn.functional.linear(x, self.constant)
        return y if self.bias is None else y + self.bias


class Simulator:
    """The int4 graph in eager PyTorch for any set of int4 matmuls (the rest at int8).

    Holds one working copy of ``model`` (its linears as ``SimLinear``, the lm_head untied, at
    int8) and both quantised versions of every body weight, so each candidate plan is a swap of
    tensors, not of models. ``backend`` picks the ``NUMERICS`` (activation rounding, 8-bit grid).
    """

    def __init__(self, model: Transformer, block: int, backend: Backend = Backend.ONNX) -> None:
        if not whole_blocks(model, block):
            raise ValueError(f"int4 plan: dims {model.args.dim}/{model.args.intermediate_size} "
                             f"are not multiples of the block {block}")  # fmt: skip
        rounding, int8 = NUMERICS[backend]
        self.work = copy.deepcopy(model).eval().requires_grad_(False)
        swap_modules(self.work, nn.Linear, lambda m: SimLinear(m, block, rounding))
        head = self.work.lm_head
        assert isinstance(head, SimLinear)
        head.set(int8(_weight(head), block), None)
        self.options: dict[str, dict[int, list[tuple[Tensor, Tensor | None]]]] = {}
        for name, linears in fused_linears(self.work):
            weights = [_weight(m) for m in linears]
            self.options[name] = {
                4: [int4_parts(w, block) for w in weights],
                8: [(int8(w, block), None) for w in weights],
            }

    def score(self, int4: set[str], prompts: list[list[int]], ref: list[Tensor]
              ) -> tuple[float, float]:  # fmt: skip
        """Teacher-forced (top-1 agreement, max |logit diff|) against ``ref`` (fp32 logits per
        prompt) with the matmuls in ``int4`` at 4 bits and the rest at 8."""
        for name, linears in fused_linears(self.work):
            for m, parts in zip(linears, self.options[name][4 if name in int4 else 8], strict=True):
                m.set(*parts)  # type: ignore[operator]
        return compare(logits(self.work, prompts), ref)


@torch.no_grad()
def logits(model: nn.Module, prompts: list[list[int]]) -> list[Tensor]:
    return [model.forward_train(torch.tensor([p]))[0] for p in prompts]  # type: ignore[operator]


def compare(got: list[Tensor], ref: list[Tensor]) -> tuple[float, float]:
    """(top-1 agreement, max |diff|) of per-prompt logits ``got`` against ``ref``."""
    pairs = list(zip(got, ref, strict=True))
    agree = sum(int((g.argmax(-1) == r.argmax(-1)).sum()) for g, r in pairs)
    return agree / sum(len(r) for r in ref), max(float((g - r).abs().max()) for g, r in pairs)


def longest_prefix(ranked: list[str], accept: Callable[[set[str]], bool]) -> int:
    """Largest ``n`` with ``accept(set(ranked[:n]))`` by binary search (``accept`` assumed
    monotone: a longer prefix is never better; the empty prefix is accepted unasked)."""
    lo, hi = 0, len(ranked)
    if accept(set(ranked)):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accept(set(ranked[:mid])) else (lo, mid)
    return lo


def plan(
    model: Transformer,
    prompts: list[list[int]],
    block: int = 32,
    max_diff: float = math.inf,
    backend: Backend = Backend.ONNX,
) -> dict[str, int]:
    """Bits (4 or 8) of every fused body matmul. A matmul whose weights are on their int4 grid
    already (``relative_errors`` <= ``EXACT``: a GGUF Q4_1 layer) is int4: 8 bits could only
    round it off that grid (SmolLM2-135M on XNNPACK: 3 of 120 kept at int4 without this rule,
    max |diff| 6.27 -> 8.4). Of the rest, the longest prefix of the ``relative_errors`` ranking
    at int4 whose simulated top-1 (``backend``'s numerics) stays within ``MAX_TOP1_LOSS`` of the
    graph with only those at int4 and whose max |logit diff| stays within ``DIFF_SHARE`` of
    ``max_diff`` (the recipe's tolerance)."""
    if not prompts:
        raise ValueError("int4 plan: calibration needs at least one prompt")
    errors = relative_errors(model, prompts, block)
    exact = {name for name, e in errors.items() if e <= EXACT}
    ranked = sorted(set(errors) - exact, key=errors.__getitem__)
    n = 0
    if ranked:
        ref = logits(model, prompts)
        sim = Simulator(model, block, backend)
        floor = sim.score(exact, prompts, ref)[0] - MAX_TOP1_LOSS

        def accept(int4: set[str]) -> bool:
            top1, diff = sim.score(int4 | exact, prompts, ref)
            return top1 >= floor and diff <= DIFF_SHARE * max_diff

        n = longest_prefix(ranked, accept)
        log.info("int4 plan: %d on their int4 grid, %d of the other %d at int4 (floor top-1 %.3f, "
                 "max diff %.3g; largest relative error kept at int4 %.2e)", len(exact), n,
                 len(ranked), floor, DIFF_SHARE * max_diff,
                 errors[ranked[n - 1]] if n else float("nan"))  # fmt: skip
    chosen = exact | set(ranked[:n])
    return {name: 4 if name in chosen else 8 for name in errors}


def plan_on_text(
    model: Transformer,
    tokenizer: str,
    label: str,
    block: int,
    max_diff: float,
    backend: Backend = Backend.ONNX,
) -> dict[str, int] | None:
    """``plan`` on real text in ``tokenizer`` held out from the verification prompts
    (``calibration_ids``); None (every matmul at int4) where the dims are not whole blocks (the
    simulation reshapes inputs into blocks). ``label`` names the graph in the log."""
    if not whole_blocks(model, block):
        log.warning("%s: dims not multiples of %d; every body matmul at int4", label, block)
        return None
    t0 = time.perf_counter()
    prompts = calibration_ids(tokenizer, model.args.vocab_size, min(64, model.args.max_seq_len))
    chosen = plan(model, prompts, block, max_diff, backend)
    log.info("%s: int4 plan (%d of %d matmuls at int4) chosen in %.1f s", label,
             sum(b == 4 for b in chosen.values()), len(chosen), time.perf_counter() - t0)  # fmt: skip
    return chosen


def module_bits(model: Transformer, chosen: dict[str, int]) -> dict[str, int]:
    """``plan``'s bits per eager linear, keyed by module path (``model.named_modules``): every
    part of a fused matmul (q, k, v of ``qkv_proj``) takes the fused matmul's bits."""
    paths = {id(m): name for name, m in model.named_modules()}
    return {paths[id(m)]: chosen[fused] for fused, linears in fused_linears(model)
            for m in linears if fused in chosen}  # fmt: skip
