"""Recipe: Transformer -> static-shape QDQ ONNX for ONNX Runtime's QNN execution provider (NPU).

Stages: prepare + export (``exporters.onnx`` with static T = draft_len + 1) -> calibrate (real
prompts through the fp32 graph, ``calibration``) -> quantize (``get_qnn_qdq_config`` + ``quantize``:
uint8 per-channel weights; uint16 (``qdq-a16w8``, default) or uint8 (``qdq-u8``) activations in
QDQ format, what the Hexagon HTP runs). Before quantisation the lm_head becomes constant
vocabulary chunks concatenated in the graph (``qnn_lm_head``: traced, it was a Transpose of the
table, quantised as a uint16 activation the HTP refused). Real LLMs' massive activations (24k in
SmolLM2-135M) do not fit one 16-bit scale per tensor (top-1 0.04); ``float_residual_stream``
leaves the residual stream and RMSNorms in float (``qnn_mixed``: 0.89 on the CPU run of the QDQ
graph) but the HTP does not yet finalize that graph (MEM_ALLOC): opt-in, open ->
serialize (metadata_props) -> validate on the QNN HTP backend with CPU fallback disabled, so any
operator the NPU cannot take fails here and is reported by name; the EPContext dump must hold
nothing but EPContext nodes (100 % HTP placement). On x86 ``onnxruntime-qnn`` simulates the HTP.
There is no fp32 QNN recipe: the HTP runs integer (or fp16) graphs.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters.calibration import (
    StepReader,
    calibration_prompts,
    reciprocal_to_div,
    step_feeds,
)
from omnidraft_deploy.exporters.onnx import export_onnx, set_metadata
from omnidraft_deploy.exporters.qnn_lm_head import DEFAULT_MAX_COLS, split_lm_head
from omnidraft_deploy.exporters.qnn_mixed import float_residual
from omnidraft_deploy.exporters.quantize import QuantRecipe

from omnidraft_deploy.graph_contract import ExplicitCacheGraph, contiguous_positions
from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.onnx_host import htp_session
from omnidraft_deploy.parity import StepFn
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)


def export_qnn(
    model: Transformer,
    path: Path,
    *,
    info: GraphInfo,
    recipe: QuantRecipe,
    validate: bool = True,
    prompts: list[list[int]] | None = None,
    float_residual_stream: bool = False,
) -> dict[str, Any]:
    """Write the static-T (QDQ) graph to ``path``; returns calibration / HTP facts.

    ``prompts``: calibration token ids; None -> held-out real text through ``info.tokenizer``.
    ``float_residual_stream``: leave the residual stream and RMSNorms unquantised (``qnn_mixed``).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    extras: dict[str, Any] = {"seq_len": info.seq_len}
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        fp32 = export_onnx(model, Path(tmp) / "fp32.onnx", info=info, seq_len=info.seq_len)
        graph = onnx.load(str(fp32))
        extras["reciprocal_to_div"] = reciprocal_to_div(graph)
        extras["lm_head_chunks"] = split_lm_head(graph, DEFAULT_MAX_COLS)
        # residual stream + RMSNorm in fp16: top-1 0.041 -> 0.891 on SmolLM2 (CPU run of the QDQ
        # graph), but the HTP then fails to finalize the real graph (MEM_ALLOC): opt-in, open
        keep_float = float_residual(graph) if float_residual_stream else []
        extras["float_nodes"] = len(keep_float)
        onnx.save(graph, str(fp32))
        calib = prompts if prompts is not None else calibration_prompts(info.tokenizer)
        feeds = step_feeds(fp32, info, calib)
        extras["calibration_steps"] = len(feeds)
        config = get_qnn_qdq_config(
            str(fp32),
            StepReader(feeds),
            activation_type=QuantType.QUInt16 if recipe.name == "qdq-a16w8" else QuantType.QUInt8,
            weight_type=QuantType.QUInt8,
            per_channel=True,
            nodes_to_exclude=keep_float,
        )
        qdq = Path(tmp) / "qdq.onnx"
        quantize(str(fp32), str(qdq), config)
        proto = onnx.load(str(qdq))
        set_metadata(proto, info)
        onnx.save(proto, str(path))
    if validate:  # compile for the HTP once; the EPContext dump shows what a phone would load
        with tempfile.TemporaryDirectory() as tmp:
            session = htp_session(path, context=Path(tmp) / "ctx.onnx")
            extras["htp_context_bytes"] = sum(f.stat().st_size for f in Path(tmp).iterdir())
            extras["htp_cpu_nodes"] = nodes_outside_htp(Path(tmp) / "ctx.onnx")
        extras["htp_providers"] = session.get_providers()
        extras["htp_validated"] = True
    return extras


def nodes_outside_htp(context: Path) -> list[str]:
    """``"OpType (name)"`` of every node of an EPContext dump that is not an HTP context binary:
    empty means the whole graph runs on the HTP (CPU fallback was disabled, so it must be)."""
    import onnx

    graph = onnx.load(str(context), load_external_data=False).graph
    return [f"{n.op_type} ({n.name})" for n in graph.node if n.op_type != "EPContext"]


def htp_step(path: Path, info: GraphInfo) -> StepFn:
    """A ``parity.StepFn`` running ``path`` on the (simulated) HTP, CPU fallback disabled: what
    the NPU computes in integers, where ``verify.artifact_step`` runs the QDQ graph in float."""
    import torch

    graph = ExplicitCacheGraph(htp_session(path), info)

    def step(token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        pos = contiguous_positions(start_pos, len(token_ids))
        return torch.from_numpy(graph.run(token_ids.numpy()[None], pos))

    return step
