"""The lm_head as the QNN HTP takes it: constant weight chunks of at most ``max_cols`` vocabulary
columns, one MatMul each, concatenated into ``logits`` inside the graph.

Why: ``torch.onnx`` leaves a large linear as ``MatMul(h, Transpose(W))`` (its constant folding
stops at big tensors), so the quantiser sees the lm_head weight as an *activation*: with uint16
activations SmolLM2-135M's 49152 x 576 table became a uint16 tensor the HTP refused inside the
full graph. Writing ``W.T`` as constant initializers makes each chunk a weight (per-channel uint8
once ``weights.matmuls_to_gemm`` has made it a Gemm) and bounds the size of each HTP matmul. A tied embedding keeps its own
table for the ``Gather`` (the file then holds the vocabulary twice, the price of tying on the HTP).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnidraft_deploy.bundle.graph_contract import LOGITS

DEFAULT_MAX_COLS = 8192  # vocabulary columns per HTP MatMul (SmolLM2: 6 chunks, Qwen2.5: 19)


def _head_matmul(proto: Any) -> Any:
    """The MatMul node whose output is ``logits`` (the exporter names it so)."""
    for node in proto.graph.node:
        if node.op_type == "MatMul" and node.output[0] == LOGITS:
            return node
    raise ValueError("graph has no MatMul producing 'logits': not an omnidraft traced graph")


def _head_weight(proto: Any, name: str) -> tuple[np.ndarray, list[Any]]:
    """``(K, V)`` weight feeding the head MatMul as ``name``, and the nodes that only fed it."""
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    if name in inits:
        return numpy_helper.to_array(inits[name]), []
    producer = next((n for n in proto.graph.node if name in n.output), None)
    if producer is None or producer.op_type != "Transpose" or producer.input[0] not in inits:
        raise ValueError(f"lm_head weight {name!r} is neither an initializer nor its Transpose")
    perm = [a.ints for a in producer.attribute if a.name == "perm"]
    if perm and list(perm[0]) != [1, 0]:
        raise ValueError(f"lm_head Transpose perm {list(perm[0])} is not [1, 0]")
    return numpy_helper.to_array(inits[producer.input[0]]).T, [producer]


def split_lm_head(proto: Any, max_cols: int = DEFAULT_MAX_COLS) -> int:
    """Rewrite the lm_head of ``proto`` in place as constant chunks; returns the chunk count.

    ``logits = Concat(h @ W[:, 0:c], h @ W[:, c:2c], ..., axis=-1)`` with ``W (K, V)`` stored as
    initializers ``lm_head.chunk{i}``; bit-identical in fp32 to the single MatMul.
    """
    from onnx import helper, numpy_helper

    if max_cols < 1:
        raise ValueError(f"max_cols must be >= 1, got {max_cols}")
    head = _head_matmul(proto)
    weight, dead = _head_weight(proto, head.input[1])
    bounds = list(range(0, weight.shape[1], max_cols))
    outs, nodes = [], []
    for i, start in enumerate(bounds):
        chunk = np.ascontiguousarray(weight[:, start : start + max_cols])
        proto.graph.initializer.append(numpy_helper.from_array(chunk, f"lm_head.chunk{i}"))
        outs.append(f"lm_head.logits{i}")
        nodes.append(
            helper.make_node("MatMul", [head.input[0], f"lm_head.chunk{i}"], [outs[-1]],
                             name=f"lm_head_matmul{i}")
        )  # fmt: skip
    nodes.append(helper.make_node("Concat", outs, [LOGITS], name="lm_head_concat", axis=-1))
    # logits is a graph output read by no node: the new nodes can go last, in topological order
    kept = [n for n in proto.graph.node if n is not head and all(n is not d for d in dead)]
    del proto.graph.node[:]
    proto.graph.node.extend(kept + nodes)
    drop_unused_initializers(proto)
    return len(bounds)


def drop_unused_initializers(proto: Any) -> None:
    """Remove the initializers no node reads any more (after a rewrite of ``proto``)."""
    used = {i for n in proto.graph.node for i in n.input}
    keep = [t for t in proto.graph.initializer if t.name in used]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
