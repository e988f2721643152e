"""ONNX Runtime on the Qualcomm QNN HTP backend (simulated on x86 by onnxruntime-qnn).

QNN graphs are static-T explicit-cache ONNX graphs: the model wrapper is ``OrtModel`` with an
HTP-only session (CPU fallback disabled). The session helper lives in ``omnidraft_deploy.onnx_host``,
where the exporter's HTP validation uses it too.
"""

from __future__ import annotations

from pathlib import Path

from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

from omnidraft_deploy.manifest import GraphInfo
from omnidraft_deploy.onnx_host import QnnUnsupportedError, htp_session

__all__ = ["QnnUnsupportedError", "htp_session", "qnn_model"]


def qnn_model(path: Path, info: GraphInfo) -> OrtModel:
    """``OrtModel`` on the HTP; raises ``QnnUnsupportedError`` naming ops the NPU cannot take."""
    return OrtModel(path, info, session=htp_session(path))
