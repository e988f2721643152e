"""The residual stream of a QDQ graph kept in float (fp16 on the HTP), the matmuls in integers.

Why: real LLMs carry *massive activations* in the residual stream (SmolLM2-135M: 24,245 on the
first token from layer 12 on, while ordinary tokens have an RMS of 4-20). One uint16 scale per
tensor over that range leaves top-1 0.45, and RMSNorm's decomposed ``x^2`` (range 5.9e8) rounds
ordinary tokens to zero: top-1 0.01 (``benchmarks/quant_probe.py --study a16``). Clipping the range
is worse. So the nodes that carry the residual stream stay float and the HTP runs them in fp16
(float Add, MatMul and the decomposed RMSNorm compile there; its fused RmsNorm op does not):

- every residual ``Add`` and the ``MatMul`` feeding it (o_proj, down_proj: their outputs are the
  massive values), the ``SiLU(gate) * up`` product down_proj reads (its massive input), and each
  RMSNorm chain ``Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul``;
- each RMSNorm normalises ``x * 2^-8`` with ``eps * 2^-16`` (the same function: RMSNorm is scale
  invariant), so ``x^2`` stays inside fp16 (24,245^2 would overflow 65,504).

The rest (q/k/v/gate/up projections, attention, lm_head chunks) is quantised a16w8 as before.
Measured on SmolLM2-135M (CPU run of the QDQ graph, 12 shipped prompts): top-1 0.041 -> 0.891.
Open: toy graphs of these float ops compile on the simulated HTP, but the whole SmolLM2 graph
fails to finalize there (QNN_COMMON_ERROR_MEM_ALLOC), so ``export_qnn`` applies this only when
asked (``float_residual_stream``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

SCALE = 2.0**-8  # RMSNorm input scale: 24,245 * 2^-8 = 95, squared 9,000 < fp16 max 65,504


def _init_value(proto: Any, name: str) -> np.ndarray | None:
    from onnx import numpy_helper

    for t in proto.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    return None


def _rms_chain(pow_node: Any, users: dict[str, list[Any]]) -> list[Any] | None:
    """``[Pow, ReduceMean, Add(eps), Sqrt, Div, Mul(weight)]`` of one decomposed RMSNorm, or None."""
    chain, out = [pow_node], pow_node.output[0]
    for op in ("ReduceMean", "Add", "Sqrt", "Div"):
        nxt = [n for n in users.get(out, []) if n.op_type == op]
        if len(nxt) != 1:
            return None
        chain.append(nxt[0])
        out = nxt[0].output[0]
    div = chain[-1]
    if div.input[0] != pow_node.input[0]:
        return None
    mul = [n for n in users.get(out, []) if n.op_type == "Mul"]
    return chain + mul[:1]


def _gated_product(matmul: Any, producer: dict[str, Any]) -> list[Any]:
    """``Mul(Mul(g, Sigmoid(g)), u)`` feeding a down_proj ``matmul`` (SiLU(gate) * up), or []."""
    prod = producer.get(matmul.input[0])
    if prod is None or prod.op_type != "Mul":
        return []
    silu = [producer.get(i) for i in prod.input]
    silu_mul = next((n for n in silu if n is not None and n.op_type == "Mul"), None)
    if silu_mul is None:
        return []
    sig = [producer.get(i) for i in silu_mul.input]
    return [prod, silu_mul, *(n for n in sig if n is not None and n.op_type == "Sigmoid")]


def float_residual(proto: Any, scale: float = SCALE) -> list[str]:
    """Rescale every decomposed RMSNorm of ``proto`` in place; returns the names of the nodes to
    leave unquantised (``nodes_to_exclude``): residual Adds, the MatMuls feeding them, the norms.
    """
    from onnx import helper, numpy_helper

    nodes = list(proto.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    users: dict[str, list[Any]] = {}
    for n in nodes:
        for i in n.input:
            users.setdefault(i, []).append(n)
    keep: list[str] = []
    inserts: dict[int, Any] = {}
    for k, node in enumerate(nodes):
        if node.op_type != "Pow" or (chain := _rms_chain(node, users)) is None:
            continue
        x, add_eps = node.input[0], chain[2]
        eps_name = next(i for i in add_eps.input if i != chain[1].output[0])
        eps = _init_value(proto, eps_name)
        if eps is None:
            raise ValueError(f"RMSNorm {node.name}: eps {eps_name!r} is not an initializer")
        scaled, new_eps = f"{node.name}/x_scaled", f"{node.name}/eps_scaled"
        proto.graph.initializer.extend([
            numpy_helper.from_array(np.array(scale, np.float32), f"{node.name}/scale"),
            numpy_helper.from_array((eps * scale**2).astype(np.float32), new_eps),
        ])  # fmt: skip
        inserts[k] = helper.make_node(
            "Mul", [x, f"{node.name}/scale"], [scaled], name=f"{node.name}/scale_mul"
        )
        node.input[0], chain[4].input[0] = scaled, scaled
        add_eps.input[list(add_eps.input).index(eps_name)] = new_eps
        keep += [inserts[k].name, *(n.name for n in chain)]
        residual = producer.get(x)
        if residual is not None and residual.op_type == "Add":
            keep.append(residual.name)
            matmuls = [producer[i] for i in residual.input
                       if i in producer and producer[i].op_type == "MatMul"]  # fmt: skip
            keep += [m.name for m in matmuls]
            keep += [n.name for m in matmuls for n in _gated_product(m, producer)]
    ordered = []
    for k, node in enumerate(nodes):
        if k in inserts:
            ordered.append(inserts[k])
        ordered.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(ordered)
    return sorted(set(keep))
