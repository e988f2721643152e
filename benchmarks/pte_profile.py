"""Where a ``.pte`` decode call spends its time: per kernel, delegated (XNNPACK) or portable.

    python -m benchmarks.pte_profile bundles/q15-xnn/target.pte --context 512 --calls 16

The program is loaded with ExecuTorch's event tracer on (``enable_etdump``), prefilled with
``--context`` ordinary ids, then stepped ``--calls`` times with 1-token calls; the trace is read
back with ``executorch.devtools.Inspector``. Per call it reports: the instructions outside the
delegate by kernel (count and milliseconds: ``aten::mean``, ``llama::update_cache``, ...), the
delegate calls (count and milliseconds), the time inside the delegate by XNNPACK operator, and
the call's wall time. The counts come from the
serialized program (``lower.program_ops``) and do not depend on the machine, so a regression
(a new portable op, a cache rewrite back in the loop) shows as a count; the milliseconds say
what it costs. Writes ``<--out>/<name>.{json,md}`` (default ``reports/pte_profile``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.bundle.graph_contract import pte_inputs

OUT = Path("reports/pte_profile")


def trace_calls(
    pte: Path, context: int, calls: int, threads: int, width: int = 1
) -> tuple[Any, list[float]]:
    """Run ``pte`` with the event tracer; returns the Inspector's frame of the decode calls
    (``width`` tokens each: 1 is a decode step, more a verify call) and their wall times (s)."""
    from executorch.devtools import Inspector
    from executorch.extension.pybindings import portable_lib

    from omnidraft_deploy.optional import executorch_runtime

    executorch_runtime()  # the quantized and llama kernels registered
    portable_lib._unsafe_reset_threadpool(threads)
    module = portable_lib._load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
    n_inputs = (
        int(module.run_method("get_forward_inputs", ())[0])
        if "get_forward_inputs" in (module.method_names())
        else 2
    )
    ids = torch.tensor([[5 + (i * 37) % 300 for i in range(context)]])  # ids of any vocabulary
    module.run_method("forward", pte_inputs(n_inputs, ids, torch.arange(context)))
    step, pos = torch.full((1, width), 11), torch.arange(context, context + width)
    walls = []
    for _ in range(calls):  # each call rewrites the same slots: a verify call rolled back
        t0 = time.perf_counter()
        module.run_method("forward", pte_inputs(n_inputs, step, pos))
        walls.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.etdp"
        module.write_etdump_result_to_file(str(path))
        frame = Inspector(etdump_path=str(path)).to_dataframe()
    return frame, walls


def per_call(frame: Any) -> dict[str, dict[str, float]]:
    """Kernel -> {count, ms} of one decode call. Each traced row is one instruction, its ``raw``
    the instruction's durations over the runs in order: the prefill first (left out: it is not
    a decode call), then the decode calls, whose mean it adds. Portable kernels appear as
    ``native_call_<kernel>``, XNNPACK's subgraphs as ``DELEGATE_CALL``."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0.0, "ms": 0.0})
    for _, row in frame.iterrows():
        if row["event_block_name"] != "Execute" or row["is_delegated_op"]:
            continue
        name = str(row["event_name"])
        if name == "OPERATOR_CALL":
            continue  # the dispatch wrapper around each native_call_* (counted there)
        decode = list(row["raw"])[1:] or list(row["raw"])
        key = name.removeprefix("native_call_")
        out[key]["count"] += 1
        out[key]["ms"] += statistics.fmean(decode)
    return dict(out)


def delegate_ops(frame: Any) -> dict[str, float]:
    """XNNPACK operator kind (``Fully Connected (NC, QD8, F32, QB4W) GEMM``, ...) -> ms of one
    decode call, summed over its instances (the prefill run left out, as in ``per_call``)."""
    out: dict[str, float] = defaultdict(float)
    for _, row in frame.iterrows():
        if row["event_block_name"] == "Execute" and row["is_delegated_op"]:
            decode = list(row["raw"])[1:] or list(row["raw"])
            out[str(row["event_name"]).split(" #")[0]] += statistics.fmean(decode)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def kernel_ms(kernels: dict[str, dict[str, float]], op: str) -> float | None:
    """The traced ms of a program op (``aten::mean.out`` is traced as ``mean.out``,
    ``llama::update_cache.out`` under its full name); None if it was not traced."""
    hit = kernels.get(op) or kernels.get(op.split("::", 1)[-1])
    return None if hit is None else hit["ms"]


def profile(pte: Path, context: int, calls: int, threads: int, width: int = 1) -> dict[str, Any]:
    from omnidraft_deploy.exporters.xnnpack.lower import program_ops

    frame, walls = trace_calls(pte, context, calls, threads, width)
    kernels = per_call(frame)
    return {"pte": str(pte), "context": context, "calls": calls, "width": width,
            "wall_ms_median": 1e3 * statistics.median(walls),
            "program_ops": program_ops(pte.read_bytes()), "delegate_ops": delegate_ops(frame),
            "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1]["ms"]))}  # fmt: skip


def markdown(data: dict[str, Any]) -> str:
    r = data["result"]
    portable = {k: v for k, v in r["program_ops"].items() if k != "DelegateCall"}
    lines = [f"# Per-call profile of `{r['pte']}` at context {r['context']}", "",
             *meta_lines(data["meta"]),
             f"Wall time of a {r.get('width', 1)}-token call (median of {r['calls']}): {r['wall_ms_median']:.2f} ms. "
             f"Delegate calls per call: {r['program_ops'].get('DelegateCall', 0)}; portable "
             f"instructions per call: {sum(portable.values())}.", "",
             "| kernel (portable) | per call | ms per call |", "|---|---|---|"]  # fmt: skip
    for name, count in portable.items():
        ms = kernel_ms(r["kernels"], name)
        lines.append(f"| `{name}` | {count} | {'-' if ms is None else f'{ms:.3f}'} |")
    lines += ["", "Traced events per decode call (ms, mean over the calls):", "",
              "| event | ms |", "|---|---|"]  # fmt: skip
    lines += [f"| `{k}` | {v['ms']:.3f} |" for k, v in list(r["kernels"].items())[:20]]
    lines += ["", "Inside the delegate, per decode call (ms, by XNNPACK operator):", "",
              "| XNNPACK operator | ms |", "|---|---|"]  # fmt: skip
    lines += [f"| {k} | {v:.3f} |" for k, v in list(r.get("delegate_ops", {}).items())[:12]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pte", type=Path)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=int, default=1, help="tokens per call (>1: a verify call)")
    ap.add_argument("--name", default="")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    load0 = os.getloadavg()
    result = profile(a.pte, a.context, a.calls, a.threads, a.width)
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "result": result}
    a.out.mkdir(parents=True, exist_ok=True)
    name = a.name or f"{a.pte.parent.name}_{a.pte.stem}_ctx{a.context}_w{a.width}"
    print(write_report(a.out / name, payload, markdown=markdown).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
