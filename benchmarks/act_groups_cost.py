"""What activation groups (``exporters.xnnpack.act_groups``) cost one 4-bit linear in XNNPACK.

    python -m benchmarks.act_groups_cost --threads 2 \
        --out reports/xnnpack_gguf4/act_groups_cost.json

Each case is one ``Int4GroupLinear`` on random Q4_K-like codes (groups of 32, the 1.5B's
gate / up ``1536 -> 8960`` and down ``8960 -> 1536`` shapes), wrapped in ``GroupedActLinear``
with ``G`` groups (1: not wrapped), lowered alone to an XNNPACK ``.pte`` (T dynamic) and timed
in the ExecuTorch runtime: the median of ``--calls`` calls of T = 1 (a decode step) and T = 8
(a verification), cases interleaved round-robin. A figure for the report, never an assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy.bundle.atomic import write_text_atomic

SHAPES = {"gate_up": (1536, 8960), "down": (8960, 1536)}


def one_linear(k: int, n: int, groups: int) -> torch.nn.Module:
    from omnidraft_deploy.exporters.xnnpack.act_groups import GroupedActLinear
    from omnidraft_deploy.exporters.xnnpack.eager_quant import Int4GroupLinear

    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    step = torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3
    linear = Int4GroupLinear.from_codes(codes, step, 8 * step, None, 32)
    if groups > 1:
        linear.centred = GroupedActLinear.wrap(linear.centred, groups)
    return linear.eval()


def lowered(module: torch.nn.Module, k: int, path: Path) -> Path:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    t = torch.export.Dim("T", min=1, max=64)
    with torch.no_grad():
        ep = torch.export.export(module, (torch.randn(1, 2, k),), dynamic_shapes=({1: t},))
    program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(program.buffer)
    return path


def main() -> None:
    from omnidraft_deploy.optional import pte_program

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--groups", default="1,2,4")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    methods: dict[tuple[str, int], Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape, (k, n) in SHAPES.items():
            for g in map(int, a.groups.split(",")):
                path = lowered(one_linear(k, n, g), k, Path(tmp) / f"{shape}_{g}.pte")
                methods[(shape, g)] = pte_program(path).load_method("forward")
    times: dict[tuple[str, int, int], list[float]] = {key: [] for key in
                                                     [(s, g, t) for s, g in methods for t in (1, 8)]}  # fmt: skip
    for _ in range(a.calls):
        for (shape, g), method in methods.items():
            k = SHAPES[shape][0]
            for t in (1, 8):
                x = torch.randn(1, t, k)
                t0 = time.perf_counter()
                method.execute([x])
                times[(shape, g, t)].append(time.perf_counter() - t0)
    rows = [{"shape": s, "groups": g, "T": t, "median_ms": round(1e3 * statistics.median(v), 3)}
            for (s, g, t), v in times.items()]  # fmt: skip
    out = {"threads": a.threads, "calls": a.calls, "rows": rows, "load_avg_start": load0,
           "load_avg_end": os.getloadavg()}  # fmt: skip
    write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
