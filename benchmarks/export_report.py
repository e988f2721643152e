"""Export real small LMs to every xnnpack / onnx recipe and record size, time, peak RSS, parity.

    .venv/bin/python -m benchmarks.export_report                      # SmolLM2-135M, all recipes
    .venv/bin/python -m benchmarks.export_report --models smollm2-135m,qwen2.5-0.5b \\
        --configs xnnpack:fp32,xnnpack:8da4w,onnx:fp32,onnx:int4

Weights come from the pinned GGUF assets (``omnidraft assets fetch --models``) through
``reference.hf_adapter`` (dequantised to fp32 once, cached as safetensors). Each config exports
the model as one graph (role ``target``) into a temporary folder with the backend's registered
exporter, then reloads it (ONNX Runtime / ExecuTorch Runtime) and compares its logits with eager
PyTorch over real prompts encoded with the model's own tokenizer (``exporters.verify``: prefill,
single-token steps, a rollback). Peak RSS is the sampled peak of this process during the stage.
Writes ``reports/local/export_report/export_report.json`` (``--out``) and the ``.md`` rendered from
it (``render_reports.export_report_md``, as ``make reports`` does); a run a page cites is folded into
``reports/export_report/runs.json`` (``python -m benchmarks.common.runs_index reports/export_report
<json>``).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters import get_exporter
from omnidraft_deploy.exporters.memory import PeakRSS
from omnidraft_deploy.exporters.verify import artifact_step, prompt_ids, reference_for

from benchmarks.common.report import run_meta, write_report
from benchmarks.render_reports import export_report_md
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import ModelSpec, get_preset
from omnidraft_deploy.checks.parity import eager_step, parity, step_speed
from omnidraft_deploy.resolve.load import load_model

log = logging.getLogger("export_report")
DEFAULT_CONFIGS = (
    "xnnpack:fp32,xnnpack:8da4w,xnnpack:8da4w-emb8,xnnpack:int8w,onnx:fp32,onnx:int8,onnx:int4"
)


def _folder_bytes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}


def run_config(
    model: Any, spec: ModelSpec, backend: str, quant: str, prompts: list[list[int]], htp: bool
) -> dict[str, Any]:
    """Export + reload + parity of one (backend, quantization); errors are recorded, not raised.

    ``htp``: qnn graphs are also run on the simulated HTP (CPU fallback disabled) for parity.
    """
    recipe = get_recipe(backend, quant)
    row: dict[str, Any] = {"model": spec.name, "backend": backend, "quantization": quant}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        try:
            with PeakRSS() as rss:
                info, facts = get_exporter(backend)(
                    model, spec, Path(tmp), role="target", recipe=recipe,
                    draft_len=4, eos_ids=(0,),
                )  # fmt: skip
        except Exception as e:  # report the failure and go on with the next config
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            log.exception("%s %s/%s failed", spec.name, backend, quant)
            return row
        row |= {"export_s": round(time.perf_counter() - t0, 1), "export_peak_rss_mb": rss.peak_mb}
        row["files_bytes"] = _folder_bytes(Path(tmp))
        row["graph_bytes"] = row["files_bytes"][info.file] + row["files_bytes"].get(
            f"{info.file}.data", 0
        )
        row |= {k: v for k, v in facts.items() if k != "op_coverage"}
        if "op_coverage" in facts:
            row["op_coverage"] = facts["op_coverage"]
        path = Path(tmp) / info.file
        t1 = time.perf_counter()
        artifact = artifact_step(path, info)
        reference = eager_step(reference_for(path, model))  # a QNN graph's sink included
        result = parity(artifact, reference, prompts)
        row["verify_s"] = round(time.perf_counter() - t1, 1)
        row["parity"] = result
        row["speed"] = step_speed(artifact, verify_len=5, max_seq_len=info.max_seq_len)
        if htp and backend == "qnn":
            from omnidraft_deploy.exporters.qnn.qdq import htp_step

            t2 = time.perf_counter()
            row["htp_parity"] = parity(htp_step(path, info), reference, prompts)
            row["htp_verify_s"] = round(time.perf_counter() - t2, 1)
        row["tolerance"], row["min_top1"] = recipe.tolerance, recipe.min_top1
        row["passed"] = (result["max_abs_logit_diff"] <= recipe.tolerance
                         and result["top1_agreement"] >= recipe.min_top1)  # fmt: skip
    log.info("%s", row)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="reports/local/export_report/export_report")
    ap.add_argument("--htp", action="store_true", help="qnn: also measure parity on the HTP")
    ap.add_argument("--prompts", type=int, default=3, help="shipped prompts parity reads")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    out, load0 = Path(args.out), os.getloadavg()
    facts = {"torch": torch.__version__, "max_seq_len": args.max_seq_len, "prompts": args.prompts}
    for preset in args.models.split(","):
        spec = get_preset(preset)
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            model = load_model(spec, max_seq_len=args.max_seq_len)
        log.info(
            "%s loaded in %.1f s (peak RSS %.0f MB)", preset, time.perf_counter() - t0, rss.peak_mb
        )
        prompts = prompt_ids(spec.tokenizer, spec.vocab_size, n=args.prompts, limit=24)
        for cfg in args.configs.split(","):
            backend, quant = cfg.split(":")
            rows.append(run_config(model, spec, backend, quant, prompts, args.htp))
            meta = run_meta(threads=args.threads, load_avg_start=load0) | facts
            src = write_report(out, {"meta": meta, "rows": rows},  # partial results survive a crash
                               markdown=lambda d: export_report_md(d, out.with_suffix(".json")))  # fmt: skip
        del model
    print(src.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
