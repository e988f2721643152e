"""ONNX Runtime sessions on the Qualcomm QNN HTP backend (simulated on x86 by onnxruntime-qnn).

The graph wrapper is ``OrtModel``: QNN graphs are static-T explicit-cache ONNX graphs, and
``OrtModel`` already feeds them in T-sized chunks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def qnn_session(path: Path) -> Any:
    """HTP-only session (CPU fallback disabled); see ``exporters.qnn.htp_session`` for the twin."""
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as e:
        raise ImportError(
            "running on QNN needs onnxruntime-qnn: pip install 'omnidraft-deploy[qnn]'"
        ) from e
    if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(
            "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
        )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    opts.add_provider_for_devices(devices, {"backend_type": "htp"})
    return ort.InferenceSession(str(path), opts)
