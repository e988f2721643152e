"""ONNX Runtime on the Qualcomm QNN HTP backend (simulated on x86 by onnxruntime-qnn).

QNN graphs are static-T explicit-cache ONNX graphs: the model wrapper is ``OrtModel`` with an
HTP-only session (CPU fallback disabled). The session helper lives in ``omnidraft_deploy.host.onnx_host``,
where the exporter's HTP validation uses it too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.host.onnx_host import QnnUnsupportedError, htp_session

__all__ = ["QnnUnsupportedError", "htp_session", "qnn_model"]
log = logging.getLogger(__name__)


def qnn_model(
    path: Path,
    info: GraphInfo,
    *,
    context: Path | None = None,
    decode: Path | None = None,
    decode_context: Path | None = None,
) -> OrtModel:
    """``OrtModel`` on the HTP; raises ``QnnUnsupportedError`` naming ops the NPU cannot take.

    ``context``: the graph's precompiled EPContext model (``onnx_host.context_path``), loaded
    instead of compiling ``path`` when this QNN build takes it (a context binary is tied to the
    QNN SDK and HTP architecture that compiled it; otherwise the QDQ graph is compiled here).
    ``decode`` / ``decode_context``: the same for the graph's T = 1 twin (one-token calls).
    """
    used, session = _htp(path, context)
    twin = None if decode is None else _htp(decode, decode_context)[1]
    return OrtModel(used, info, session=session, decode=twin)


def _htp(path: Path, context: Path | None) -> tuple[Path, Any]:
    if context is not None:
        try:
            return context, htp_session(context)
        except QnnUnsupportedError as e:
            log.warning("%s refused (%s); compiling %s instead", context.name, e, path.name)
    return path, htp_session(path)
