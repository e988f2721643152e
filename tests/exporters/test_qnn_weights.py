"""QNN weights (``qnn_weights``): weight MatMuls become Gemm, which the quantiser gives one scale
per output channel, and GPTQ'd values survive the quantiser exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")


def test_pinned_grids_hold_the_gptq_codes_the_quantiser_would_move(tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort
    from omnidraft_deploy.exporters.qnn.weights import _key, matmuls_to_gemm, pin_grids
    from omnidraft_deploy.exporters.quant.gptq import gptq_per_channel
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    gen = torch.Generator().manual_seed(0)
    k, n = 64, 48
    x = torch.randn(512, k, generator=gen) @ (torch.randn(k, k, generator=gen) / 8 + torch.eye(k))
    codes, scale, zp = gptq_per_channel(torch.randn(n, k, generator=gen), x.T @ x / len(x))
    w = ((codes - zp[:, None]) * scale[:, None]).float()  # (N, K) on each row's grid
    grids = {
        _key(r): (s, int(z)) for r, s, z in zip(w.numpy(), scale.tolist(), zp.tolist(), strict=True)
    }
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, n])],
        [numpy_helper.from_array(w.T.contiguous().numpy(), "W")],  # (K, N): channels on axis 1
    )  # fmt: skip
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = onnx.load_from_string(fp32.SerializeToString())
    assert matmuls_to_gemm(fp32) == 1
    onnx.save(fp32, str(tmp_path / "f.onnx"))
    feed = {"x": x[:1, None].numpy()}
    same = [ort.InferenceSession(m.SerializeToString()).run(None, feed)[0] for m in (before, fp32)]
    np.testing.assert_allclose(same[0], same[1], rtol=0, atol=1e-5)  # the same function

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": x[i : i + 1, None].numpy()} for i in range(8)])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.it, None)

    config = get_qnn_qdq_config(str(tmp_path / "f.onnx"), Reader(), activation_type=QuantType.QUInt16,
                                weight_type=QuantType.QUInt8, per_channel=True)  # fmt: skip
    quantize(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), config)
    qdq = onnx.load(str(tmp_path / "q.onnx"))

    def dequantised() -> np.ndarray:  # (N, K): one scale and zero point per output channel
        t = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
        q, s, z = t["W.nk_quantized"], t["W.nk_scale"], t["W.nk_zero_point"]
        assert s.shape == (n,)
        return (q.astype(np.float32) - z[:, None]) * s[:, None]

    moved = float(np.abs(dequantised() - w.numpy()).max())
    assert moved > 1e-3 * float(scale.min())  # the quantiser re-rounds rows off their grid ...
    assert pin_grids(qdq, fp32, grids) == n  # ... pinning puts every channel back on it
    np.testing.assert_allclose(dequantised(), w.numpy(), rtol=0, atol=1e-6)
