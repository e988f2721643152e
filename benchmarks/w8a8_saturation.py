"""Which form of the w8a8 graph's integer products is exact on this CPU, and how fast (issue 28).

ONNX Runtime's u8 x s8 integer GEMM saturates on x86 without VNNI (int16 pair sums,
``vpmaddubsw``); with VNNI (``vpdpbusd``, int32 sums) it is exact and the fastest form. The
exporter writes u8 x s8 (int8 weights), and sessions on CPUs without VNNI ask for the exact kernel
(``host.onnx_host.cpu_session``); from 2026-11-27 to 28 it wrote u8 x u8 (weights ``q + 128``).

    .venv/bin/python -m benchmarks.w8a8_saturation --threads 2 [--model tiny-qwen2-7b]

Two parts, each on this machine's CPU (its flags are recorded); the sessions here are opened
directly, each form with exactly the options its name says:

- ``kernel``: one ``MatMulInteger`` per shape of Qwen2.5-Coder-1.5B (qkv 1536x2048, down_proj
  8960x1536, lm_head 1536x151936), with the w8a8 recipe's inputs (activations quantised per row,
  uint8 with zero point 128; weights symmetric int8), in three forms: ``u8s8`` (int8 weights: the
  graph as written), ``u8s8+precision`` (the same with ONNX Runtime's session option
  ``session.x64quantprecision=1``) and ``u8u8`` (weights stored ``q + 128`` with zero point 128).
  Per form: the share of outputs that differ from the exact integer product (numpy int64), the
  largest relative error, and the median ms of T = 1 and T = 5 rows.
- ``graph``: the fused w8a8 target graph of ``--model`` (SmoothQuant and all, as the exporter
  writes it) against eager fp32 on the export's verification prompts
  (``exporters.verify.prompt_ids``, ``checks.parity``), as written (u8 x s8, without and with the
  option) and rewritten to u8 x u8 weights: top-1 agreement and max |logit diff|, the numbers of
  the export's gate.

Writes ``reports/w8a8_saturation/w8a8_saturation.{json,md}``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.host import onnx_host

SHAPES = {"qkv 1536x2048": (1536, 2048), "down_proj 8960x1536": (8960, 1536),
          "lm_head 1536x151936": (1536, 151936)}  # fmt: skip
FORMS = ("u8s8", "u8s8+precision", "u8u8")
PRECISION = onnx_host.EXACT_U8S8  # ORT: exact (slower) u8 x s8 kernels on AVX2


def cpu_flags() -> list[str]:
    """The SIMD flags that decide the integer kernels (``onnx_host.cpu_flags``)."""
    flags = onnx_host.cpu_flags() or frozenset()
    return sorted(f for f in flags if f.startswith(("avx", "amx")) or "vnni" in f)


def session(model: Any, form: str, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = threads, 3
    if form.endswith("+precision"):
        opts.add_session_config_entry(PRECISION, "1")
    blob = model if isinstance(model, bytes | str) else model.SerializeToString()
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def matmul_model(w: np.ndarray, rows: int, form: str) -> bytes:
    """``MatMulInteger(a (rows, K) uint8 zp 128, w (K, N))`` in ``form`` (int8 or u8 + 128)."""
    from onnx import TensorProto as TP
    from onnx import helper

    k, n = w.shape
    u8 = form == "u8u8"
    b = (w.astype(np.int16) + 128).astype(np.uint8) if u8 else w
    inits = [helper.make_tensor("b", TP.UINT8 if u8 else TP.INT8, [k, n], b.tobytes(), raw=True),
             helper.make_tensor("z", TP.UINT8, [], [128])]  # fmt: skip
    node = helper.make_node("MatMulInteger", ["a", "b", "z", *(["z"] if u8 else [])], ["y"])
    graph = helper.make_graph(
        [node], "mmi", [helper.make_tensor_value_info("a", TP.UINT8, [rows, k])],
        [helper.make_tensor_value_info("y", TP.INT32, [rows, n])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def kernel_rows(threads: int, reps: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    out = []
    for name, (k, n) in SHAPES.items():
        w = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
        for form in FORMS:
            row: dict[str, Any] = {"shape": name, "form": form}
            for t in (1, 5):
                x = rng.standard_normal((t, k)) * np.exp(rng.standard_normal(k))  # outlier columns
                xq = np.round(x / (np.abs(x).max(1, keepdims=True) / 127))
                exact = xq.astype(np.int64) @ w.astype(np.int64)
                sess = session(matmul_model(w, t, form), form, threads)
                feed = {"a": (xq + 128).astype(np.uint8)}
                y = sess.run(None, feed)[0]
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    sess.run(None, feed)
                    times.append(1e3 * (time.perf_counter() - t0))
                row[f"ms_t{t}"] = round(float(np.median(times)), 2)
                if t == 5:
                    row["wrong_share"] = round(float((y != exact).mean()), 4)
                    rel = np.abs(y - exact).max() / max(1, np.abs(exact).max())
                    row["max_rel_err"] = round(float(rel), 4)
            out.append(row)
    return out


def to_u8u8(proto: Any) -> Any:
    """The graph as written from 2026-11-27 to 28: every ``MatMulInteger``'s int8 weights stored
    as u8 + 128, its weight zero point the activations' (u8 128) (in place)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "MatMulInteger" and len(node.input) == 3:  # no weight zero point: 0
            t = inits[node.input[1]]  # one weight per node (``GraphWriter.const``)
            w = (numpy_helper.to_array(t).astype(np.int16) + 128).astype(np.uint8)
            t.CopyFrom(numpy_helper.from_array(w, t.name))
            node.input.append(node.input[2])
    return proto


def graph_rows(preset: str, threads: int, max_seq_len: int) -> list[dict[str, Any]]:
    import onnx
    import torch
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx
    from omnidraft_deploy.exporters.verify import prompt_ids

    from omnidraft_deploy.bundle import graph_contract as gc
    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.checks.parity import eager_step, parity
    from omnidraft_deploy.resolve.load import load_model

    spec, recipe = get_preset(preset), get_recipe("onnx", "w8a8")
    model = load_model(spec, max_seq_len=max_seq_len)
    info = graph_info(model, spec, file="target.onnx", quantization="w8a8", seq_len=None)
    prompts = prompt_ids(info.tokenizer, info.vocab_size)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(model, Path(tmp) / info.file, info=info, recipe=recipe, fused=True,
                           invariant=True)  # fmt: skip
        written = onnx.load(str(path))
        for form, proto in (("u8s8", written), ("u8u8", to_u8u8(onnx.load(str(path))))):
            for sess_form in (form, f"{form}+precision") if form == "u8s8" else (form,):
                graph = gc.ExplicitCacheGraph(session(proto, sess_form, threads), info)

                def step(ids: torch.Tensor, start: int, g: Any = graph) -> torch.Tensor:
                    pos = gc.contiguous_positions(start, len(ids))
                    return torch.from_numpy(g.run(ids.numpy()[None], pos))

                with torch.inference_mode():
                    res = parity(step, eager_step(model), prompts)
                out.append({"model": preset, "form": sess_form,
                            "top1": round(res["top1_agreement"], 4),
                            "max_abs_logit_diff": round(res["max_abs_logit_diff"], 3),
                            "rows": int(res["rows"]), "gate": f">= {recipe.min_top1}, "
                            f"<= {recipe.tolerance}"})  # fmt: skip
    return out


def to_markdown(r: dict[str, Any]) -> str:
    lines = ["# w8a8 on this CPU: which integer products are exact, and how fast", "",
             *meta_lines(r["meta"]),
             f"CPU flags: {' '.join(r['cpu_flags']) or '-'}", "",
             "## One MatMulInteger per shape (w8a8 inputs; T = 5 rows for the errors)", "",
             "| shape | form | outputs wrong | max rel. error | ms T=1 | ms T=5 |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for k in r["kernel"]:
        lines.append(f"| {k['shape']} | {k['form']} | {k['wrong_share']:.1%} | "
                     f"{k['max_rel_err']} | {k['ms_t1']} | {k['ms_t5']} |")  # fmt: skip
    lines += ["", "## The w8a8 target graph against eager fp32 (the export's verification rows)",
              "", "| model | weights / session | top-1 | max abs logit diff | rows | gate |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for g in r["graph"]:
        lines.append(f"| {g['model']} | {g['form']} | {g['top1']} | {g['max_abs_logit_diff']} | "
                     f"{g['rows']} | {g['gate']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--model", default="tiny-qwen2-7b", help="preset of the graph part")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("reports/w8a8_saturation/w8a8_saturation"))
    args = p.parse_args()
    load0 = os.getloadavg()
    kernel = kernel_rows(args.threads, args.reps)
    graph = graph_rows(args.model, args.threads, args.max_seq_len)
    payload = {"meta": run_meta(threads=args.threads, load_avg_start=load0),
               "cpu_flags": cpu_flags(), "kernel": kernel, "graph": graph}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(write_report(args.out, payload, markdown=to_markdown))


if __name__ == "__main__":
    main()
