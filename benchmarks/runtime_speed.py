"""Runtime speed: our ONNX graphs + host loop vs ONNX Runtime GenAI vs ExecuTorch, same weights.

    .venv/bin/python -m benchmarks.runtime_speed prepare           # exports + GenAI builds (slow)
    .venv/bin/python -m benchmarks.runtime_speed time --threads 2  # the timed run (quiet machine)

``prepare`` (cached under ``.bench/runtime_speed/``): per model (SmolLM2-135M, Qwen2.5-Coder-0.5B,
the pinned GGUFs of ``omnidraft assets fetch --models``) the weights are saved as an HF folder
(safetensors + config + tokenizer from the GGUF); per precision our fused graph is exported
(``exporters.onnx``: load, build, write, ``.ort``, verification against eager PyTorch, each stage
timed) and ONNX Runtime GenAI's model builder (``pip install 'omnidraft-deploy[bench]'``) builds
its model from the same folder (timed); ``--pte`` also writes our ExecuTorch ``.pte`` (fp32).

``time``: per (model, precision) one worker process per engine (each loads one model; its peak RSS
is its own ``ru_maxrss``), driven round-robin (engines alternate per measurement) for ``--rounds`` rounds: prefill
tok/s (``--prefill`` tokens from position 0), 1-token greedy decode tok/s (``--decode`` tokens
after a ``--context``-token prompt), verify-call latency for T = 1..8 (median of ``--reps`` calls
at the same position: a speculative verification, rolled back every time). Intra-op threads are
explicit (``--threads``). Writes ``reports/runtime_speed/runtime_speed.{json,md,png}``. Figures are ratios
measured side by side in one run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.peers import MAX_SEQ_LEN, GenAI
from benchmarks.common.report import command, meta_lines, run_meta, write_report
from benchmarks.render_reports import runtime_speed_png
from omnidraft_deploy.speculative.kv_reuse import common_prefix

log = logging.getLogger("runtime_speed")
WORK = Path(".bench/runtime_speed")
# preset -> (pinned GGUF asset, HF model id of the config family for GenAI's builder)
MODELS = {
    "smollm2-135m": ("smollm2-135m-gguf", "HuggingFaceTB/SmolLM2-135M"),
    "qwen2.5-0.5b": ("qwen2.5-0.5b-gguf", "Qwen/Qwen2.5-Coder-0.5B"),
    "qwen2.5-1.5b": ("qwen2.5-1.5b-gguf", "Qwen/Qwen2.5-Coder-1.5B"),
}
VERIFY_T = tuple(range(1, 9))


def hf_folder(preset: str) -> Path:
    """config.json + model.safetensors (the GGUF dequantised once) + tokenizer files."""
    from transformers import AutoTokenizer

    from omnidraft_deploy.catalog import assets
    from omnidraft_deploy.reference.hf_adapter import gguf_to_hf_folder

    out = WORK / "hf" / preset
    if (out / "ready").is_file():
        return out
    gguf = assets.asset_path(MODELS[preset][0])
    src, _ = gguf_to_hf_folder(gguf)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "model.safetensors", out / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[config["model_type"]]
    config["architectures"] = [arch]  # the builder dispatches on it; the GGUF config lacks it
    config.pop("quantization_config", None)  # the weights are dequantised fp32 now
    (out / "config.json").write_text(json.dumps(config, indent=2))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
    (out / "ready").write_text("1")
    return out


def build_genai(preset: str, precision: str, *, force: bool = False) -> dict[str, Any]:
    """ONNX Runtime GenAI's builder on the HF folder; returns its wall seconds."""
    out = WORK / "genai" / f"{preset}-{precision}"
    if (out / "genai_config.json").is_file() and not force:
        return json.loads((out / "build.json").read_text())
    src = hf_folder(preset)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", MODELS[preset][1],
           "-i", str(src), "-o", str(out), "-p", precision, "-e", "cpu",
           "-c", str(WORK / "genai_cache")]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    facts = {"seconds": round(time.perf_counter() - t0, 1), "command": " ".join(cmd)}
    (out / "build.json").write_text(json.dumps(facts))
    return facts


def export_ours(preset: str, precision: str, *, force: bool = False) -> dict[str, Any]:
    """Our fused graph of ``preset`` (``target.onnx`` + ``.ort``), every stage timed."""
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import (
        convert_to_ort,
        export_onnx,
        ort_format_blocker,
    )
    from omnidraft_deploy.exporters.verify import verify_artifact

    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    out = WORK / "ours" / f"{preset}-{precision}"
    if (out / "stages.json").is_file() and not force:
        return json.loads((out / "stages.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    spec, recipe, stages = get_preset(preset), get_recipe("onnx", precision), {}
    t0 = time.perf_counter()
    model = load_model(spec, max_seq_len=MAX_SEQ_LEN)
    stages["load"] = time.perf_counter() - t0
    info = graph_info(model, spec, file="target.onnx", quantization=precision, seq_len=None)
    t0 = time.perf_counter()
    export_onnx(model, out / info.file, info=info, recipe=recipe, fused=True)
    stages["export"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if ort_format_blocker(out / info.file) is None:
        convert_to_ort(out / info.file)
    stages["ort_format"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    parity = verify_artifact(out / info.file, info, model, recipe)
    stages["verify"] = time.perf_counter() - t0
    stages = {k: round(v, 1) for k, v in stages.items()} | {"total": round(sum(stages.values()), 1)}
    facts = {"stages_s": stages, "parity": parity}
    (out / "graph_info.json").write_text(json.dumps(dataclasses.asdict(info)))
    (out / "stages.json").write_text(json.dumps(facts))
    return facts


def export_pte(preset: str) -> None:
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte as write_pte

    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    path = WORK / "ours" / f"{preset}-fp32" / "target.pte"
    if not path.is_file():
        model = load_model(get_preset(preset), max_seq_len=MAX_SEQ_LEN)
        write_pte(model, path, recipe=get_recipe("xnnpack", "fp32"), eos_ids=(0,))


# ---- engines (run inside worker processes) -------------------------------------------------


def graph_info_of(path: Path) -> Any:
    """The graph's ``GraphInfo``: from the export's ``graph_info.json`` (reading the ONNX
    metadata would load the whole inline-weight protobuf, 1.1 GB, into the worker's peak RSS)."""
    from omnidraft_deploy.bundle.sections import GraphInfo

    sidecar = path.parent / "graph_info.json"
    if sidecar.is_file():
        return GraphInfo(**json.loads(sidecar.read_text()))
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return GraphInfo(**json.loads(meta["omnidraft.graph_info"]))


class Ours:
    """Our runtime: ``OrtModel`` over the fused graph (IOBinding, caches shared in place,
    logits written into the returned array; weights on huge pages unless ``huge_pages`` is off)."""

    def __init__(self, path: Path, threads: int, *, huge_pages: bool = True) -> None:
        info = graph_info_of(path)
        if path.suffix == ".pte":
            from omnidraft_deploy.runtime.executorch_model import PteModel

            self.model: Any = PteModel(path, info)
        else:
            from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

            self.model = OrtModel(path, info, threads=threads, huge_pages=huge_pages)

    def logits(self, ids: list[int], start: int) -> np.ndarray:
        import torch

        return self.model.forward(torch.tensor(ids), start).numpy()

    def decode(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        tok = int(self.logits(prompt, 0)[-1].argmax())
        out, t0 = [tok], time.perf_counter()
        for i in range(n - 1):
            tok = int(self.logits([tok], len(prompt) + i)[-1].argmax())
            out.append(tok)
        return out, time.perf_counter() - t0

    def call(self, ids: list[int], start: int) -> float:
        t0 = time.perf_counter()
        self.logits(ids, start)
        return time.perf_counter() - t0


def _worker(kind: str, path: str, threads: int, conn: Any) -> None:
    if kind.startswith("genai"):
        engine: Ours | GenAI = GenAI(Path(path), threads)
    else:
        engine = Ours(Path(path), threads, huge_pages=kind != "ours-4k")
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        op, args = msg
        if op == "decode":
            conn.send(engine.decode(*args))
        elif op == "call":
            ids, start, reps = args
            conn.send(sorted(engine.call(ids, start) for _ in range(reps))[reps // 2])
    conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # MiB


# ---- driver ---------------------------------------------------------------------------------


# worker kind -> environment it is started with (glibc reads its tunables at process start)
KIND_ENV = {"genai-hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}


def engines_for(preset: str, precision: str, controls: bool) -> dict[str, tuple[str, Path]]:
    """name -> (worker kind, artifact) of what exists for (preset, precision); ``controls``:
    also ours without huge pages and GenAI with glibc's huge-page tunable (the same memory
    advantage given to GenAI), to show what the huge pages are worth on each side."""
    ours = WORK / "ours" / f"{preset}-{precision}"
    genai = WORK / "genai" / f"{preset}-{precision}"
    found = {
        "ours (onnx)": ("ours", ours / "target.onnx"),
        "ort-genai": ("genai", genai),
        "ours (executorch)": ("ours", ours / "target.pte"),
    }
    if controls:
        found["ours (onnx, 4 KiB pages)"] = ("ours-4k", ours / "target.onnx")
        found["ort-genai (glibc hugetlb)"] = ("genai-hugetlb", genai)
    return {k: v for k, v in found.items() if v[1].exists()}


def start_worker(ctx: Any, kind: str, path: Path, threads: int) -> tuple[Any, Any]:
    """A worker process of ``kind`` (started with ``KIND_ENV[kind]``), once it is ready."""
    parent, child = ctx.Pipe()
    saved = {k: os.environ.get(k) for k in KIND_ENV.get(kind, {})}
    os.environ.update(KIND_ENV.get(kind, {}))
    try:
        proc = ctx.Process(target=_worker, args=(kind, str(path), threads, child))
        proc.start()
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    assert parent.recv() == "ready"
    return proc, parent


def time_group(preset: str, precision: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Round-robin timing of every engine of (preset, precision); one worker process each."""
    ctx = mp.get_context("spawn")
    workers = {}
    for name, (kind, path) in engines_for(preset, precision, args.controls).items():
        workers[name] = start_worker(ctx, kind, path, args.threads)
    prompt = [(i * 7919) % 1000 + 100 for i in range(args.context)]
    load_before = round(os.getloadavg()[0], 2)
    rows: dict[str, dict[str, Any]] = {
        n: {"decode": [], "prefill": [], "verify": {}} for n in workers
    }
    for _ in range(args.rounds):  # engines alternate per measurement, not per round
        for name, (_, conn) in workers.items():
            conn.send(("decode", (prompt, args.decode)))
            tokens, secs = conn.recv()
            rows[name]["decode"].append((args.decode - 1) / secs)
            rows[name]["greedy_tokens"] = tokens
        for name, (_, conn) in workers.items():
            conn.send(("call", (prompt[:1] * args.prefill, 0, 1)))
            rows[name]["prefill"].append(args.prefill / conn.recv())
        for t in VERIFY_T:
            for name, (_, conn) in workers.items():
                conn.send(("call", (prompt[:t], args.context, args.reps)))
                rows[name]["verify"].setdefault(t, []).append(1e3 * conn.recv())
    for name, (proc, conn) in workers.items():
        conn.send(None)
        rows[name]["peak_rss_mb"] = round(conn.recv(), 1)
        proc.join()
    load = f"{load_before}-{round(os.getloadavg()[0], 2)}"
    out = {n: summarise(r) | {"load": load} for n, r in rows.items()}
    base = out.get("ort-genai", {}).get("greedy_tokens")
    for e in out.values():  # greedy decode of the same prompt: common prefix with GenAI's
        e["same_tokens_as_genai"] = common_prefix(e["greedy_tokens"], base or [])
    return out


def summarise(r: dict[str, Any]) -> dict[str, Any]:
    med = lambda xs: round(float(np.median(xs)), 2)  # noqa: E731
    return {
        "decode_tok_s_rounds": [round(x, 2) for x in r["decode"]],
        "decode_tok_s": med(r["decode"]),
        "prefill_tok_s": med(r["prefill"]),
        "verify_ms": {t: med(v) for t, v in r["verify"].items()},
        "peak_rss_mb": r["peak_rss_mb"],
        "greedy_tokens": r["greedy_tokens"],
    }


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Exports and builds every (model, precision); returns their timings (cached)."""
    facts: dict[str, Any] = {}
    for preset in args.models:
        hf_folder(preset)
        for precision in args.precisions:
            key = f"{preset}/{precision}"
            log.info("%s: our export", key)
            facts[key] = {"ours": export_ours(preset, precision, force=args.force)}
            log.info("%s: ORT GenAI build", key)
            facts[key]["genai"] = build_genai(preset, precision, force=args.force)
        if args.pte:
            export_pte(preset)
    return facts


def to_markdown(result: dict[str, Any]) -> str:
    """The report from its JSON (``verify_ms`` keyed by T as text)."""
    meta = result.get("meta") or {"command": result["command"], "threads": result["threads"],
                                  "load_avg_start": result["load_before"],
                                  "load_avg_end": result["load_after"]}  # runs before run_meta  # fmt: skip
    lines = [
        "# Runtime speed: our ONNX graphs vs ONNX Runtime GenAI vs ExecuTorch",
        "",
        *meta_lines(meta),
        f"Medians of {result['rounds']} round-robin rounds; ratios are what this run shows (the "
        "machine is shared).",
        "",
        "| model | precision | engine | decode tok/s | x GenAI | prefill tok/s | verify T=1 / 5 / 8 ms "
        "| peak RSS MiB | greedy = GenAI | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, engines in result["groups"].items():
        base = engines.get("ort-genai", {}).get("decode_tok_s")
        for name, e in engines.items():
            ratio = f"{e['decode_tok_s'] / base:.2f}" if base else "-"
            v = e["verify_ms"]
            lines.append(
                f"| {key.replace('/', ' | ')} | {name} | {e['decode_tok_s']} | {ratio} | "
                f"{e['prefill_tok_s']} | {v['1']} / {v['5']} / {v['8']} | {e['peak_rss_mb']} | "
                f"{e['same_tokens_as_genai']}/{len(e['greedy_tokens'])} | {e['load']} |"
            )
    lines += ["", "## Verify-call latency (ms) by T", "", "| model/precision | engine | "
              + " | ".join(f"T={t}" for t in VERIFY_T) + " |", "|---|---|" + "---|" * len(VERIFY_T)]  # fmt: skip
    for key, engines in result["groups"].items():
        for name, e in engines.items():
            cells = " | ".join(str(e["verify_ms"][str(t)]) for t in VERIFY_T)
            lines.append(f"| {key} | {name} | {cells} |")
    lines += ["", "## Export time (s)", "", "| model/precision | ours: load / export / .ort / "
              "verify / total | GenAI builder |", "|---|---|---|"]  # fmt: skip
    for key, f in result.get("builds", {}).items():
        s = f["ours"]["stages_s"]
        lines.append(
            f"| {key} | {s['load']} / {s['export']} / {s['ort_format']} / {s['verify']} / "
            f"**{s['total']}** | {f['genai']['seconds']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["prepare", "time"])
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    p.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "int8"])
    p.add_argument("--pte", action="store_true", help="prepare: also our ExecuTorch .pte (fp32)")
    p.add_argument("--force", action="store_true", help="prepare: export and build again")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--controls", action="store_true",
        help="time: also ours without huge pages and GenAI with glibc's huge-page tunable",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--decode", type=int, default=24)
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("reports/runtime_speed/runtime_speed"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.command == "prepare":
        print(json.dumps(prepare(args), indent=2))
        return
    load0 = os.getloadavg()
    result: dict[str, Any] = {
        "command": command(), "threads": args.threads, "rounds": args.rounds,
        "load_before": load0[0], "groups": {}, "builds": {},
    }  # fmt: skip
    for preset in args.models:
        for precision in args.precisions:
            key = f"{preset}/{precision}"
            log.info("timing %s", key)
            result["groups"][key] = time_group(preset, precision, args)
            stages = WORK / "ours" / f"{preset}-{precision}" / "stages.json"
            build = WORK / "genai" / f"{preset}-{precision}" / "build.json"
            if stages.is_file() and build.is_file():
                result["builds"][key] = {
                    "ours": json.loads(stages.read_text()),
                    "genai": json.loads(build.read_text()),
                }
    result["meta"] = run_meta(threads=args.threads, load_avg_start=load0)
    result["load_after"] = result["meta"]["load_avg_end"][0]
    write_report(args.out, result, markdown=to_markdown,
                 plot=lambda d, png: runtime_speed_png(d, png.with_suffix(".json")))  # fmt: skip


if __name__ == "__main__":
    main()
