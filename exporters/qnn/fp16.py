"""The attention MatMuls of a QDQ graph (two activations: ``Q K^T`` and ``P V``) in fp16.

Why: ONNX Runtime's QNN EP takes ``DQ -> MatMul -> Q`` with two uint16 activations as one
16 x 16-bit integer MatMul on the HTP, and the simulated HTP computes it far less precisely than
the QDQ graph says. Tapping 909 tensors of the real SmolLM2-135M graph on the HTP and on the CPU
for one decoding step: inputs of layer 0's ``Q K^T`` 8e-4 apart (relative to their range), its
output 1.65e-2 apart; the masking after it adds nothing. Leaving those MatMuls out of
quantisation (``nodes_to_exclude``) changes nothing: the DQ / Q pairs around them stay, and the EP
fuses them again.

So each such MatMul reads its dequantised inputs through ``Cast(float16)`` and its output is cast
back to float before the QuantizeLinear: the EP sees an fp16 MatMul between a standalone
Dequantize and a standalone Quantize, which the HTP runs in fp16 (and the CPU execution provider,
which verification runs, in fp16 too: the check covers the rounding). Simulated-HTP top-1 on 3
shipped prompts (teacher-forced rows): SmolLM2-135M 0.894 -> 0.941 (85 rows), Qwen2.5-Coder-0.5B
0.811 -> 0.946 (74 rows); the CPU runs stay 0.953 / 0.959. An exact power-of-two ``Mul`` in the
same place gave the same 0.941. fp32 float ops (``Exp``, ``Div`` fed by DequantizeLinear) make the
simulated HTP fail to finalize (``QNN_COMMON_ERROR_MEM_ALLOC``); fp16 between Casts compiles, but
fp16 ``Sigmoid`` and ``Exp`` on top of the MatMuls changed nothing (0.941), so the island is the
MatMuls alone.
"""

from __future__ import annotations

from typing import Any


def fp16_activation_matmuls(proto: Any) -> int:
    """Rewrite ``proto`` in place: every MatMul whose two inputs are dequantised activations
    (not weights) runs in fp16 between Casts; returns how many were rewritten."""
    from onnx import TensorProto, helper

    weights = {t.name for t in proto.graph.initializer}
    producer = {o: n for n in proto.graph.node for o in n.output}

    def activation(name: str) -> bool:
        dq = producer.get(name)
        return dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] not in weights

    out, done = [], 0
    for node in proto.graph.node:
        if node.op_type != "MatMul" or not all(activation(i) for i in node.input):
            out.append(node)
            continue
        name = node.name or node.output[0]
        for k, x in enumerate(list(node.input)):
            half = f"{name}/in{k}_fp16"
            out.append(helper.make_node("Cast", [x], [half], name=f"{name}/in{k}_cast",
                                        to=TensorProto.FLOAT16))  # fmt: skip
            node.input[k] = half
        y = node.output[0]
        node.output[0] = f"{name}/out_fp16"
        out += [node, helper.make_node("Cast", [node.output[0]], [y], name=f"{name}/out_cast",
                                       to=TensorProto.FLOAT)]  # fmt: skip
        done += 1
    del proto.graph.node[:]
    proto.graph.node.extend(out)
    return done
