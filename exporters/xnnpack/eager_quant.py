"""XNNPACK eager quantisation: the ``xnnpack`` recipes applied to the eager model before export.

``xnnpack`` recipes act on the eager model before ``torch.export`` (what ExecuTorch 1.5.1 +
torchao 0.18 lower to XNNPACK kernels, each checked here end to end through the ``.pte`` runtime):

- ``fp32``: no quantisation.
- ``8da4w``: int8 dynamic (per-token) activations, int4 weights in groups of ``group_size`` on
  each group's own min..max grid (``Int4GroupLinear``: torchao's symmetric kernel plus a per-group
  constant), the lm_head at 8da8w.
- ``8da8w``: int8 dynamic activations x int8 per-channel weights (torchao
  ``Int8DynamicActivationIntxWeightConfig``) after SmoothQuant; down_proj, o_proj and v_proj
  stay fp32 (``QuantRecipe.fp32_linears``, measured in ``backends``).
- ``int8w``: int8 per-channel weight-only linears (``Int8WeightOnlyLinear``: int8 weight,
  fp32 scale per output row, bias kept). A small file, not a fast one: ExecuTorch 1.5.1's XNNPACK
  partitioner takes an int8 weight only beside quantized activations (``gemm_configs``: a
  dequantised weight with float activations is "static quant" without its activation Q/DQ), so
  the weight conversion and the ``mm`` run in the portable kernels, every call: SmolLM2-135M
  decodes at 1.6 tok/s (8da4w-emb8 in the same run: 21.4). torchao's ``IntxWeightOnlyConfig``
  lowers to XNNPACK but the ``.pte`` returns NaN / garbage, and ExecuTorch's
  ``WeightOnlyInt8QuantHandler`` drops biases (Qwen2 q/k/v), so neither is used.
- ``*-emb8`` variants also store the embedding table as int8 per row (``Int8Embedding``:
  ``quantized_decomposed.embedding_byte``, a kernel the ExecuTorch runtime has): torchao's own
  weight-only embedding lowers to ``torchao::dequantize_affine``, which has no out-variant kernel
  in the ExecuTorch runtime.

Which scheme each linear gets is read from the recipe's fields (``linear``, ``head``,
``fp32_linears``, ``embedding_bits``) and an int4 plan's bits; the grids are
``exporters.quant.grids``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from omnidraft_deploy.exporters.quant.grids import int4_blocks, per_row_int8, swap_modules
from torch import Tensor, nn
from torch.nn.utils import skip_init

from omnidraft_deploy.catalog.backends import Backend, QuantRecipe


def quantize_eager(
    model: nn.Module, recipe: QuantRecipe, bits: Mapping[str, int] | None = None
) -> nn.Module:
    """Apply an XNNPACK recipe to a deep copy of ``model`` (the original stays the fp32 reference).

    Each ``nn.Linear`` gets the recipe's scheme (``linear_scheme``: the lm_head may have its own,
    kinds in ``fp32_linears`` stay fp32, an 8da4w linear that ``bits`` (module path -> 4 or 8, an
    ``int4_plan``) keeps at 8 bits is 8da8w). Returns ``model`` itself for fp32. Needs ``torchao``
    and ``executorch`` (quantized kernels).
    """
    if recipe.backend is not Backend.XNNPACK:
        raise ValueError(f"{recipe.backend}/{recipe.name} is not an eager (xnnpack) recipe")
    if recipe.linear == "none" and recipe.embedding_bits == 0:
        return model
    model = copy.deepcopy(model)
    if recipe.embedding_bits:
        # defines quantized_decomposed::embedding_byte (eager + export); the runtime has the kernel
        from executorch.exir.passes import _quant_patterns_and_replacements  # noqa: F401

        swap_modules(model, nn.Embedding, Int8Embedding.from_float)
    for name, linear in [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]:
        scheme = linear_scheme(recipe, name, bits)
        if scheme != "none":
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, quantize_linear(linear, scheme, recipe))
    return model


def linear_scheme(recipe: QuantRecipe, name: str, bits: Mapping[str, int] | None = None) -> str:
    """The scheme of the linear at module path ``name`` under ``recipe`` (and a plan's ``bits``)."""
    kind = name.rsplit(".", 1)[-1]
    if kind in recipe.fp32_linears:
        return "none"
    scheme = (recipe.head or recipe.linear) if kind == "lm_head" else recipe.linear
    return "8da8w" if scheme == "8da4w" and (bits or {}).get(name) == 8 else scheme


def quantize_linear(linear: nn.Linear, scheme: str, recipe: QuantRecipe) -> nn.Module:
    """``linear`` (in place where torchao quantises it) as ``scheme`` computes it."""
    if scheme == "int8w":
        return Int8WeightOnlyLinear.from_float(linear)
    if scheme == "8da4w":
        return Int4GroupLinear.from_float(linear, recipe.group_size)
    if scheme == "8da8w":
        return torchao_8da(linear, bits=8)
    raise ValueError(f"recipe {recipe.name}: no eager linear for scheme {scheme!r}")


def torchao_8da(linear: nn.Linear, bits: int, group_size: int = 32) -> nn.Linear:
    """``linear`` with torchao's int8 dynamic per-token activations x int``bits`` symmetric weights
    (8: per output channel; 4: per group of ``group_size`` inputs), what XNNPACK lowers."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    config = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8 if bits == 8 else getattr(torch, "int4"),  # noqa: B009 (stubs lack int4)
        weight_granularity=PerAxis(0) if bits == 8 else PerGroup(group_size),
    )
    holder = nn.Sequential(linear)
    quantize_(holder, config)
    out = holder[0]
    assert isinstance(out, nn.Linear)
    return out


class Int4GroupLinear(nn.Module):
    """Asymmetric int4 groups on XNNPACK's symmetric int4 kernel: ``W = step * (q - 8) + c``.

    XNNPACK's blockwise int4 GEMM (int8 per-token activations, ``qb4w``) takes symmetric groups
    only: a scale per group, no zero point. Round-to-nearest on that grid loses most of a small
    model (SmolLM2-135M: teacher-forced top-1 0.478), and a model published as GGUF Q4_1
    is on an asymmetric grid already (``quant.grids.int4_grid``: 16 levels from min to max per
    block), which the symmetric grid cannot hold. Here each group of ``block`` inputs keeps its
    own grid exactly: the codes centred on 8 go to XNNPACK's kernel with the step as scale, and
    the per-group constant ``c = offset + 8 * step`` multiplies the group sums of the (fp32)
    input in a small fp32 matmul, ``(N, K / block)``, as the ``int4`` ONNX graph does. SmolLM2
    (lm_head at 8da8w): top-1 0.862, max |logit diff| 7.17 in eager.
    """

    def __init__(self, centred: nn.Linear, constant: Tensor, bias: Tensor | None,
                 block: int) -> None:  # fmt: skip
        super().__init__()
        self.centred, self.block = centred, block
        self.register_buffer("constant", constant)  # (N, K / block) fp32
        self.register_buffer("ones", torch.ones(1, block), persistent=False)  # group sums
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)

    @classmethod
    def from_float(cls, linear: nn.Module, block: int) -> Int4GroupLinear:
        assert isinstance(linear, nn.Linear)
        n, k = linear.weight.shape
        if k % block:
            raise ValueError(f"8da4w: input size {k} is not a multiple of the group {block}")
        codes, step, offset = int4_blocks(linear.weight.detach().float(), block)
        return cls.from_codes(codes.reshape(n, k), step, offset + 8 * step, linear.bias, block)

    @classmethod
    def from_codes(cls, codes: Tensor, step: Tensor, constant: Tensor, bias: Tensor | None,
                   block: int) -> Int4GroupLinear:  # fmt: skip
        """``W = step * (codes - 8) + constant`` per group: ``codes (N, K)`` 0..15, ``step`` and
        ``constant`` ``(N, K / block)`` (a GGUF block ``scale * q - minimum`` is ``step = scale``,
        ``constant = 8 * scale - minimum``)."""
        n, k = codes.shape
        centred = torchao_8da(skip_init(nn.Linear, k, n, bias=False), bits=4, group_size=block)
        held: Any = centred.weight  # torchao's IntxUnpackedToInt8Tensor
        with torch.no_grad():  # its layout: int8 codes in [-8, 7], fp32 scale per group
            held.qdata.copy_((codes.to(torch.int16) - 8).to(torch.int8))
            held.scale.copy_(step)
            held.zero_point.zero_()
        return cls(centred, constant.float().contiguous(), bias, block)

    def forward(self, x: Tensor) -> Tensor:
        # the group sums as a (block -> 1) matmul by ones, which XNNPACK takes (a ``sum`` runs
        # in the portable kernels: 196 a call on Qwen2.5-1.5B, issue 44); one product per group
        # in a fixed order, so a row's sums do not depend on the other rows of the call
        ones: Tensor = self.ones  # type: ignore[assignment]
        sums = nn.functional.linear(x.reshape(-1, self.block), ones).reshape(*x.shape[:-1], -1)
        constant: Tensor = self.constant  # type: ignore[assignment]
        y = self.centred(x) + nn.functional.linear(sums, constant)
        return y if self.bias is None else y + self.bias


class Int8WeightOnlyLinear(nn.Module):
    """``y = (x @ W_int8^T) * scale + bias``: int8 weights stored, fp32 compute (XNNPACK)."""

    def __init__(self, weight_int8: Tensor, scales: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight_int8)  # (out, in) int8
        self.register_buffer("scales", scales)  # (out,)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)

    @classmethod
    def from_float(cls, linear: nn.Module) -> Int8WeightOnlyLinear:
        assert isinstance(linear, nn.Linear)
        q, scales = per_row_int8(linear.weight.detach().float())
        return cls(q, scales, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        w: Tensor = self.weight  # type: ignore[assignment]
        scales: Tensor = self.scales  # type: ignore[assignment]
        y = nn.functional.linear(x, w.to(x.dtype)) * scales
        return y if self.bias is None else y + self.bias


class Int8Embedding(nn.Module):
    """Embedding table as int8 rows + fp32 row scales (``quantized_decomposed.embedding_byte``)."""

    def __init__(self, weight_int8: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight_int8)  # (V, dim) int8
        self.register_buffer("scales", scales)  # (V,)

    @classmethod
    def from_float(cls, emb: nn.Module) -> Int8Embedding:
        assert isinstance(emb, nn.Embedding)
        return cls(*per_row_int8(emb.weight.detach().float()))

    def forward(self, token_ids: Tensor) -> Tensor:
        return torch.ops.quantized_decomposed.embedding_byte.dtype(
            self.weight, self.scales, None, -128, 127, token_ids, dtype=torch.float32
        )
