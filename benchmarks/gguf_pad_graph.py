"""Rewrite a gguf4 target graph exported before the 4-bit row pad (e92020e) into the padded form.

    PYTHONPATH=$PWD python -m benchmarks.gguf_pad_graph --bundle bundles/q15-q4 --out bundles/q15-q4-pad

The padded form is what ``exporters.onnx.gguf_grid._matmul`` writes now (``ROW_PAD``):
- each 4-bit MatMulNBits ``<name>/nbits`` and its block-sum Reshape ``<name>/split`` take
  ``Concat(x, zeros(1, 1, K))``;
- the final Add ``<name>/out`` becomes ``<name>/sum`` followed by a Slice that drops the last row.

The output folder holds the rewritten ``target.onnx`` and a copy of the bundle's
``manifest.json``, so ``benchmarks/gguf_bundle.py rows|speed`` can read it. It is not a bundle:
the hashes do not match. This lets the padded graph's row invariance and speed be measured
without a second 1.5B export.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np


def pad(model: object) -> int:
    """Rewrite ``model`` (onnx ModelProto) in place; returns the number of 4-bit matmuls padded."""
    from onnx import helper, numpy_helper

    graph = model.graph  # type: ignore[attr-defined]
    four = {}
    for n in graph.node:
        attrs = {a.name: a.i for a in n.attribute}
        if n.op_type == "MatMulNBits" and attrs.get("bits") == 4:
            four[n.output[0][: -len("/nbits")]] = (n.input[0], attrs["K"])
    consts = {"grid/zero": [0], "grid/drop_last": [-1], "grid/axis1": [1]}
    for name, value in consts.items():
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    for k in sorted({k for _, k in four.values()}):
        zero = np.zeros((1, 1, k), np.float32)
        graph.initializer.append(numpy_helper.from_array(zero, f"grid/zero_row{k}"))
    nodes = []
    for n in graph.node:
        prefix = n.output[0].rsplit("/", 1)[0]
        if prefix in four and n.output[0].endswith(("/nbits", "/split")):
            x, k = four[prefix]
            if n.output[0].endswith("/nbits"):
                nodes.append(helper.make_node("Concat", [x, f"grid/zero_row{k}"],
                                              [f"{prefix}/padded"], axis=1))  # fmt: skip
            n.input[0] = f"{prefix}/padded"
            nodes.append(n)
        elif prefix in four and n.op_type == "Add" and n.output[0] == f"{prefix}/out":
            n.output[0] = f"{prefix}/sum"
            nodes.append(n)
            nodes.append(helper.make_node(
                "Slice", [f"{prefix}/sum", "grid/zero", "grid/drop_last", "grid/axis1"],
                [f"{prefix}/out"]))  # fmt: skip
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(four)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import onnx

    model = onnx.load(str(a.bundle / "target.onnx"))
    print("padded", pad(model), "4-bit matmuls")
    a.out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(a.out / "target.onnx"))
    shutil.copyfile(a.bundle / "manifest.json", a.out / "manifest.json")


if __name__ == "__main__":
    main()
