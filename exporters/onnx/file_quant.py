"""ONNX file recipes: ONNX Runtime's quantisers applied to a written (traced) fp32 graph.

``quantize_onnx_file`` applies a recipe read from its fields (``backends.QuantRecipe``): dynamic
activations (``quantize_dynamic``: int8 weights, per-tensor int8 activations at run time), or
weight-only blocks (``MatMulNBitsQuantizer``: ``weight_bits`` 8 symmetric, 4 asymmetric with the
lm_head at 8 bits). Recipes with per-row activations (``w8a8``) exist in the fused graph only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnidraft_deploy.bundle.graph_contract import LOGITS
from omnidraft_deploy.catalog.backends import Activations, Backend, QuantRecipe


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
    if recipe.backend is not Backend.ONNX or not recipe.quantized:
        raise ValueError(f"{recipe.backend}/{recipe.name} is not an ONNX file recipe")
    if recipe.activations is Activations.DYNAMIC:
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
    bits = recipe.weight_bits
    if recipe.activations is Activations.FLOAT and bits in (8, 4):
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
            bits=bits,
            block_size=recipe.group_size,
            is_symmetric=bits == 8,
            nodes_to_exclude=[head] if bits == 4 and head else [],
        )
        quant.process()
        if bits == 4 and head:
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
        "(exporters.onnx.fused; it needs head_dim % 16 == 0), not applied to a traced graph"
    )
