"""Quantisation recipes per backend, as data: name -> how to apply it and its parity tolerance.

``xnnpack`` recipes act on the eager model before ``torch.export`` (what ExecuTorch 1.5.1 +
torchao 0.18 lower to XNNPACK kernels, each checked here end to end through the ``.pte`` runtime):

- ``fp32``: no quantisation.
- ``8da4w``: int8 dynamic (per-token) activations, int4 weights in groups of ``group_size``
  (torchao ``Int8DynamicActivationIntxWeightConfig``), on every ``nn.Linear`` incl. ``lm_head``.
- ``8da8w``: same with int8 per-channel weights.
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

``onnx`` recipes act on the exported fp32 graph: ``int8`` (``quantize_dynamic``, int8 weights,
dynamic uint8 activations) and ``int4`` (``MatMulNBitsQuantizer``, blockwise int4 MatMulNBits);
``w8a8`` (per-row int8 activations after SmoothQuant) exists in the fused graph only.
``qnn`` recipes belong to ``exporters.qnn``. Tolerances bound the max |logit difference| and the
top-1 agreement against eager fp32 on the verification prompts; they go into the manifest.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# The recipe table is data shared with the CLI and the manifest: ``omnidraft_deploy.backends``.
from omnidraft_deploy.backends import RECIPES as RECIPES
from omnidraft_deploy.backends import Backend as Backend
from omnidraft_deploy.backends import QuantRecipe as QuantRecipe
from omnidraft_deploy.backends import get_recipe as get_recipe
from omnidraft_deploy.backends import recipe_names as recipe_names
from omnidraft_deploy.graph_contract import LOGITS


def quantize_eager(model: nn.Module, recipe: QuantRecipe) -> nn.Module:
    """Apply an XNNPACK recipe to a deep copy of ``model`` (the original stays the fp32 reference).

    Returns ``model`` itself for fp32. Needs ``torchao`` and ``executorch`` (quantized kernels).
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
    if recipe.linear == "int8w":
        swap_modules(model, nn.Linear, Int8WeightOnlyLinear.from_float)
    elif recipe.linear in ("8da4w", "8da8w"):
        from torchao.quantization import quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup
        from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

        four = recipe.linear == "8da4w"
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=getattr(torch, "int4") if four else torch.int8,  # noqa: B009 (stubs lack int4)
            weight_granularity=PerGroup(recipe.group_size) if four else PerAxis(0),
        )
        quantize_(model, config, lambda m, _fqn: isinstance(m, nn.Linear))
    return model


def per_row_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: (rows, cols) fp32 -> int8 (rows, cols), scales (rows,)."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight / scales[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scales.float()


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


def swap_modules(model: nn.Module, kind: type[nn.Module], make: object) -> None:
    """Replace every ``kind`` submodule by ``make(old)`` (tied weights are quantised per user)."""
    for name, child in list(model.named_children()):
        if isinstance(child, kind):
            setattr(model, name, make(child))  # type: ignore[operator]
        else:
            swap_modules(child, kind, make)


def _lm_head_node(model: Any) -> str | None:
    """Name of the MatMul that produces the ``logits`` output (through reshapes), if any."""
    producer = {o: n for n in model.graph.node for o in n.output}
    name, seen = LOGITS, 0
    while name in producer and seen < 8:
        node = producer[name]
        if node.op_type == "MatMul":
            return str(node.name)
        name, seen = node.input[0], seen + 1
    return None


def quantize_onnx_file(src: Path, dst: Path, recipe: QuantRecipe) -> None:
    """Apply an ONNX recipe to a written fp32 graph (src -> dst, weights inline: < 2 GB)."""
    if recipe.backend is not Backend.ONNX or recipe.name == "fp32":
        raise ValueError(f"{recipe.backend}/{recipe.name} is not an ONNX file recipe")
    if recipe.name == "int8-dyn":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # int8 weights and per-tensor int8 activations quantised at run time (MatMulInteger).
        # Only weight matmuls: quantising Q.K^T / P.V and the embedding Gather too is worse still.
        # Real LLM activations have outlier channels, so this loses top-1 badly on SmolLM2-135M
        # (0.57, reports/export_report_quant.md): use weight-only "int8" for LLMs.
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul", "Gemm"],
            extra_options={"MatMulConstBOnly": True},
        )
        return
    if recipe.name in ("int8", "int4"):
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        # weight-only, blockwise along the input dimension (block = group_size), activations stay
        # fp32: MatMulNBits. int4 is asymmetric (min/max per block), the layout of GGUF Q4_1, and
        # keeps an untied lm_head at 8 bits (a second pass). A tied lm_head reads the embedding
        # through a Transpose, not a constant, so it stays fp32 in both recipes (SmolLM2-135M).
        model = onnx.load(str(src))
        head = _lm_head_node(model)
        quant = MatMulNBitsQuantizer(
            model,
            bits=8 if recipe.name == "int8" else 4,
            block_size=recipe.group_size,
            is_symmetric=recipe.name == "int8",
            nodes_to_exclude=[head] if recipe.name == "int4" and head else [],
        )
        quant.process()
        if recipe.name == "int4" and head:
            quant = MatMulNBitsQuantizer(
                quant.model.model,
                bits=8,
                block_size=recipe.group_size,
                is_symmetric=True,
                nodes_to_include=[head],
            )
            quant.process()
        quant.model.save_model_to_file(str(dst), use_external_data_format=False)
        return
    raise ValueError(
        f"{src.name}: ONNX recipe {recipe.name!r} is written by the fused exporter only "
        "(exporters.onnx_fused; it needs head_dim % 16 == 0), not applied to a traced graph"
    )
