"""Recipe: Transformer -> static-shape QDQ ONNX for ONNX Runtime's QNN execution provider (NPU).

Stages: prepare + export (``exporters.onnx`` with static T = draft_len + 1) -> calibrate (real
prompts through the fp32 graph, ``calibration``) -> quantize (``get_qnn_qdq_config`` +
``quantize``: uint8 weights, uint8 or uint16 activations in QDQ format, what the Hexagon HTP runs) -> serialize
(metadata_props) -> validate on the QNN HTP backend with CPU fallback disabled, so any operator the
NPU cannot take fails here and is reported by name. On x86 ``onnxruntime-qnn`` simulates the HTP.
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
from omnidraft_deploy.exporters.quantize import QuantRecipe

from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)


class QnnUnsupportedError(RuntimeError):
    """The HTP backend refused the graph; ``ops`` names the operators it could not take."""

    def __init__(self, path: Path, ops: list[str], detail: str) -> None:
        super().__init__(
            f"{path.name}: QNN HTP cannot run ops {ops or '(unnamed)'}: {detail[:400]}"
        )
        self.ops = ops


def _htp_options(ort: Any, *, fallback: bool, context: Path | None = None) -> Any:
    """SessionOptions on the QNN HTP device; ``context``: also write the EPContext model there."""
    if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
        import onnxruntime_qnn

        ort.register_execution_provider_library(
            "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
        )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if fallback else "1")
    if context is not None:
        opts.add_session_config_entry("ep.context_enable", "1")
        opts.add_session_config_entry("ep.context_file_path", str(context))
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    opts.add_provider_for_devices(devices, {"backend_type": "htp"})
    return opts


def cpu_nodes(path: Path) -> list[str]:
    """``"OpType (node name)"`` of every node QNN HTP leaves to the CPU EP.

    ORT's "fallback disabled" error names no node, so the graph is compiled again with fallback
    allowed and an EPContext dump: every node left beside the ``EPContext`` node(s) is one the HTP
    refused. No context file means the HTP took nothing, so every node is listed.
    """
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp) / "ctx.onnx"
        ort.InferenceSession(str(path), _htp_options(ort, fallback=True, context=ctx))
        graph = onnx.load(str(ctx if ctx.is_file() else path), load_external_data=False).graph
    return [f"{n.op_type} ({n.name})" for n in graph.node if n.op_type != "EPContext"]


def htp_session(path: Path, *, context: Path | None = None) -> Any:
    """ORT session on QNN HTP only (CPU fallback disabled); ``context``: write the precompiled
    EPContext model (what a phone loads without recompiling) to that path.

    Raises ``QnnUnsupportedError`` naming the nodes the HTP cannot take (see ``cpu_nodes``); a
    graph the HTP accepts but fails to finalize names no op (the QNN error text is kept).
    """
    try:
        import onnxruntime as ort
        import onnxruntime_qnn  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "the qnn backend needs the QNN execution provider: "
            "pip install 'omnidraft-deploy[qnn]' (onnxruntime-qnn)"
        ) from e
    try:
        return ort.InferenceSession(str(path), _htp_options(ort, fallback=False, context=context))
    except Exception as e:  # ORT's Fail / EPFail have no common public base class
        detail = str(e)
    ops = cpu_nodes(path) if "fallback to CPU EP has been explicitly disabled" in detail else []
    raise QnnUnsupportedError(path, ops, detail)


def export_qnn(
    model: Transformer,
    path: Path,
    *,
    info: GraphInfo,
    recipe: QuantRecipe,
    validate: bool = True,
    prompts: list[list[int]] | None = None,
) -> dict[str, Any]:
    """Write the static-T (QDQ) graph to ``path``; returns calibration / HTP facts.

    ``prompts``: calibration token ids; None -> the shipped prompt set through ``info.tokenizer``.
    """
    import onnx

    extras: dict[str, Any] = {"seq_len": info.seq_len}
    if recipe.name == "fp32":
        export_onnx(model, path, info=info, seq_len=info.seq_len)
    else:
        from onnxruntime.quantization import QuantType, quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            fp32 = export_onnx(model, Path(tmp) / "fp32.onnx", info=info, seq_len=info.seq_len)
            graph = onnx.load(str(fp32))
            extras["reciprocal_to_div"] = reciprocal_to_div(graph)
            onnx.save(graph, str(fp32))
            calib = prompts if prompts is not None else calibration_prompts(info.tokenizer)
            feeds = step_feeds(fp32, info, calib)
            extras["calibration_steps"] = len(feeds)
            config = get_qnn_qdq_config(
                str(fp32),
                StepReader(feeds),
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QUInt8,
                per_channel=True,
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
        extras["htp_providers"] = session.get_providers()
        extras["htp_validated"] = True
    return extras
