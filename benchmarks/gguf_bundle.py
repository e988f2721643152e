"""A bundle's target graph against its GGUF: top-1 on 12 prompts, row invariance, decode speed.

    PYTHONPATH=$PWD python -m benchmarks.gguf_bundle top1 --bundle B --out F.json
    PYTHONPATH=$PWD python -m benchmarks.gguf_bundle rows --bundle B --out F.json
    python -m benchmarks.gguf_bundle speed --bundle B [B2 ...] --threads 2 --out F.json
    python -m benchmarks.gguf_bundle prefill --bundle B --gguf G --out F.json

- ``top1``: ``checks.parity.parity`` (the export's verification: prefill, greedy single steps and
  a rollback, every row compared) of the reloaded target graph against the eager fp32 model (the
  preset's GGUF dequantised) on ``--prompts`` shipped prompts (``exporters.verify.prompt_ids``);
  with ``--gguf``, llama.cpp's own logits for the same calls too (what the tool users pick today
  reaches against the same reference).
  Loads the eager model: run under ``flock /tmp/omnidraft-bigmem.lock`` for 1.5B targets.
- ``rows``: per prompt, greedy target-only decode with 1-token calls keeping each row, then the
  same text re-scored in ``--width``-token calls (a verification call's shape): rows not bitwise
  equal, the largest |difference|, argmax changes (what would break greedy speculative ==
  target-only), the smallest top-1/top-2 gap of the 1-token rows.
- ``speed``: decode tok/s (64 greedy 1-token calls after each of 3 prompts, median per-call time)
  of each bundle's target graph through the runtime's ``OrtModel``, ``--threads`` intra-op threads,
  no spinning (an XNNPACK ``.pte``: ``PteModel``, the ExecuTorch threadpool at ``--threads``);
  with ``--gguf``, llama.cpp's plain decode of that GGUF in the same run (the same prompts, the
  median time between two generated tokens); the load average beside the figures.
- ``prefill``: one call over a T-token prompt (T = 16, 64, 128; median of 3 after a warm-up) of
  each bundle's target graph, and with ``--gguf`` llama.cpp's ``eval`` of the same ids (its
  ``n_batch`` 512: one batch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.peers import llama
from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.bundle.manifest import Manifest
from omnidraft_deploy.bundle.sections import GraphInfo


def target_info(bundle: Path, role: str = "target") -> GraphInfo:
    manifest = Manifest.from_json((bundle / "manifest.json").read_text(), source=bundle)
    return manifest.graphs[role]


def top1(bundles: list[Path], n_prompts: int, gguf: Path | None = None, threads: int = 2
         ) -> list[dict[str, Any]]:  # fmt: skip
    """``parity`` of each bundle's target graph, and with ``gguf`` of llama.cpp's own logits
    for the same rows (the tool a CPU user picks today, as the bar's yardstick), against one
    eager fp32 reference (the preset's GGUF dequantised) on ``n_prompts`` shipped prompts."""
    from omnidraft_deploy.exporters.verify import EAGER_THREADS, artifact_step, prompt_ids

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.checks.parity import eager_step, parity
    from omnidraft_deploy.resolve.load import load_model
    from omnidraft_deploy.speculative.decoder import torch_threads

    infos = [target_info(b) for b in bundles]
    if len({(i.preset, i.max_seq_len) for i in infos}) != 1:
        raise SystemExit("top1: the bundles' targets differ in preset or context; one at a time")
    info = infos[0]
    model = load_model(get_preset(info.preset), max_seq_len=info.max_seq_len)
    prompts = prompt_ids(info.tokenizer, info.vocab_size, n=n_prompts)
    out: list[dict[str, Any]] = []
    with torch_threads(EAGER_THREADS):
        for b, i in zip(bundles, infos, strict=True):
            got = parity(artifact_step(b / i.file, i), eager_step(model), prompts)
            out.append({"bundle": str(b), "quantization": i.quantization, **got})
        if gguf is not None:
            got = parity(llamacpp_step(gguf, threads, info.vocab_size), eager_step(model), prompts)
            out.append({"bundle": f"llama.cpp {gguf.name}", "quantization": "gguf", **got})
    return out


def llamacpp_step(gguf: Path, threads: int, vocab: int) -> Any:
    """A ``checks.parity`` step over llama.cpp: ``(ids (T,), start) -> logits (T, V)``, its KV
    cache cut back to ``start`` first (``Llama.eval`` drops what lies beyond ``n_tokens``)."""
    llm = llama(gguf, threads, logits_all=True)
    if llm.n_vocab() != vocab:
        raise SystemExit(
            f"{gguf.name}: llama.cpp's vocabulary {llm.n_vocab()} != the graph's {vocab}"
        )

    def step(token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        llm.n_tokens = start_pos
        llm.eval([int(t) for t in token_ids])
        return torch.tensor(llm.scores[start_pos : start_pos + len(token_ids)])

    return step


def ort_model(bundle: Path, threads: int, role: str = "target") -> Any:
    """The bundle's ``role`` graph through the runtime: ``OrtModel`` (``--threads`` intra-op, no
    spinning), or ``PteModel`` for an XNNPACK ``.pte`` (the ExecuTorch threadpool at ``threads``)."""
    info = target_info(bundle, role)
    if info.file.endswith(".pte"):
        from executorch.extension.pybindings import portable_lib
        from omnidraft_deploy.runtime.executorch_model import PteModel

        portable_lib._unsafe_reset_threadpool(threads)
        return PteModel(bundle / info.file, info)
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    return OrtModel(bundle / info.file, info, threads=threads, spinning=False)


def texts(n: int) -> list[str]:
    from omnidraft_deploy.catalog.prompts import load_prompts

    items = load_prompts()
    return [p.text for p in items[:: max(1, len(items) // n)][:n]]


@torch.inference_mode()
def rows(bundle: Path, n_prompts: int, width: int, tokens: int, threads: int) -> dict[str, Any]:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    info = target_info(bundle)
    target, tok = ort_model(bundle, threads), load_tokenizer(info.tokenizer)
    limit = tok.vocab_size
    acc: dict[str, Any] = {"rows": 0, "rows_not_bitwise_equal": 0, "max_abs_diff": 0.0,
                           "argmax_changes": 0, "min_top1_top2_gap": float("inf")}  # fmt: skip
    for text in texts(n_prompts):
        ids = tok.encode(text)
        feed, pos, out, kept = list(ids), 0, [], []
        for _ in range(tokens):  # target-only: the prompt, then 1-token calls
            row = target.forward(torch.tensor(feed), pos)[-1, :limit].clone()
            pos += len(feed)
            kept.append(row)
            out.append(int(row.argmax()))
            feed = [out[-1]]
        gaps = torch.stack(kept).topk(2, -1).values
        acc["min_top1_top2_gap"] = min(
            acc["min_top1_top2_gap"], float((gaps[:, 0] - gaps[:, 1]).min())
        )
        full, base = ids + out, len(ids) - 1
        for i in range(0, tokens - 1, width):
            chunk = full[base + i : base + i + width]
            got = target.forward(torch.tensor(chunk), base + i)[:, :limit]
            for j in range(min(len(chunk), tokens - i)):
                acc["rows"] += 1
                if not torch.equal(got[j], kept[i + j]):
                    acc["rows_not_bitwise_equal"] += 1
                    diff = float((got[j] - kept[i + j]).abs().max())
                    acc["max_abs_diff"] = max(acc["max_abs_diff"], diff)
                acc["argmax_changes"] += int(int(got[j].argmax()) != out[i + j])
    return acc | {"width": width, "tokens": tokens, "prompts": n_prompts}


@torch.inference_mode()
def speed(bundle: Path, threads: int, tokens: int = 64) -> dict[str, Any]:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    info = target_info(bundle)
    target, tok = ort_model(bundle, threads), load_tokenizer(info.tokenizer)
    per_call = []
    for text in texts(3):
        ids = tok.encode(text)
        row = target.forward(torch.tensor(ids), 0)[-1]
        pos, nxt = len(ids), int(row.argmax())
        for _ in range(tokens):
            t0 = time.perf_counter()
            row = target.forward(torch.tensor([nxt]), pos)[-1]
            per_call.append(time.perf_counter() - t0)
            pos, nxt = pos + 1, int(row.argmax())
    size = sum(p.stat().st_size for p in bundle.glob(f"{info.file}*"))
    return {"bundle": str(bundle), "quantization": info.quantization, "graph_bytes": size,
            "decode_tok_s": 1.0 / statistics.median(per_call), "calls": len(per_call)}  # fmt: skip


PREFILL_T = (16, 64, 128)


def ordinary_ids(t: int) -> list[int]:
    return [100 + (i * 37) % 5000 for i in range(t)]  # ordinary ids of both vocabularies


def _median_s(call: Any, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def prefill(bundle: Path, threads: int) -> dict[str, Any]:
    target = ort_model(bundle, threads)
    target.forward(torch.tensor(ordinary_ids(128)), 0)  # warm-up: the widest shape first
    ms = {t: 1e3 * _median_s(lambda t=t: target.forward(torch.tensor(ordinary_ids(t)), 0))
          for t in PREFILL_T}  # fmt: skip
    return {"bundle": str(bundle), "ms_per_token": {t: v / t for t, v in ms.items()}}


def llamacpp_prefill(gguf: Path, threads: int) -> dict[str, Any]:
    llm = llama(gguf, threads)

    def call(t: int) -> None:
        llm.reset()
        llm.eval(ordinary_ids(t))

    call(128)
    ms = {t: 1e3 * _median_s(lambda t=t: call(t)) for t in PREFILL_T}
    return {"bundle": f"llama.cpp {gguf.name}", "ms_per_token": {t: v / t for t, v in ms.items()}}


def llamacpp_speed(gguf: Path, threads: int, tokens: int = 64) -> dict[str, Any]:
    """llama.cpp's decode tok/s on ``gguf`` as ``speed`` measures ours (``llama-cpp-python``)."""
    llm = llama(gguf, threads)
    per_call: list[float] = []
    for text in texts(3):
        stamps: list[float] = []
        for _ in llm.generate(llm.tokenize(text.encode()), temp=0.0, top_k=1, reset=True):
            stamps.append(time.perf_counter())  # a token: one eval + greedy pick since the last
            if len(stamps) > tokens:
                break
        per_call += [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"bundle": f"llama.cpp {gguf.name}", "quantization": "gguf (as stored)",
            "graph_bytes": gguf.stat().st_size,
            "decode_tok_s": 1.0 / statistics.median(per_call), "calls": len(per_call)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["top1", "rows", "speed", "prefill"])
    ap.add_argument("--bundle", type=Path, nargs="+", required=True)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--width", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, help="top1 / speed / prefill: llama.cpp on this GGUF too")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load0, t0 = os.getloadavg(), time.time()
    if a.what == "top1":
        result: Any = top1(a.bundle, a.prompts, a.gguf, a.threads)
    elif a.what == "rows":
        result = [rows(b, a.prompts, a.width, a.tokens, a.threads) for b in a.bundle]
    elif a.what == "speed":
        result = [speed(b, a.threads) for b in a.bundle]
        result += [llamacpp_speed(a.gguf, a.threads)] if a.gguf else []
    else:
        result = [prefill(b, a.threads) for b in a.bundle]
        result += [llamacpp_prefill(a.gguf, a.threads)] if a.gguf else []
    rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    meta = {"command": "benchmarks/gguf_bundle.py " + " ".join(os.sys.argv[1:]),  # type: ignore[attr-defined]
            "git": rev.strip(), "seconds": round(time.time() - t0, 1), "threads": a.threads,
            "load_avg_start": load0, "load_avg_end": os.getloadavg()}  # fmt: skip
    write_text_atomic(a.out, json.dumps({"meta": meta, "results": result}, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
