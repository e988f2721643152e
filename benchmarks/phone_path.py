"""The phone path's target graph against the desktop one and llama.cpp: decode tok/s by context.

    python -m benchmarks.phone_path --pte bundles/q15-xnn bundles/q15-xnn8 --onnx bundles/q15-onnx \
        --gguf <the target's GGUF> --contexts 64,512,4000 --verify-width 5 --threads 2

For each context length C (``--contexts``) and each engine (the ``.pte`` target of ``--pte``
through ExecuTorch's runtime, the ONNX target of ``--onnx`` through the runtime's ``OrtModel``,
llama.cpp's ``Llama.eval`` on ``--gguf``): a C-token prompt of ordinary ids is prefilled from
position 0 (timed: prefill tok/s), then ``--tokens`` greedy 1-token calls follow (each timed: the
median is the decode figure); with ``--verify-width W``, ``--tokens`` calls of W tokens at the same
position follow (a verify call, rolled back each time: what a speculative step pays the target;
the ``.pte`` and ONNX score all W rows, llama.cpp computes the last row's logits only, so its
figure is a lower bound). Several ``--pte`` bundles (recipes) are rows side by side, each named by
its target recipe. Engines run in one process with explicit threads (``--threads``:
the ExecuTorch threadpool, ORT intra-op without spinning, llama.cpp's ``n_threads``), and rows are
interleaved round-robin (context, then engine, ``--rounds`` times) so a change in the machine's
state reaches every engine alike; the load average is recorded beside every row. Writes
``reports/phone_path/phone_path.{json,md,png}`` (``--role drafter``: the bundles' drafters, with
their GGUF: ``phone_path_drafter.*``). Nothing is asserted: the figures are ratios
measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.peers import llama
from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report
from benchmarks.gguf_bundle import ordinary_ids

OUT = Path("reports/phone_path")
Step = Callable[[list[int], int], np.ndarray]  # (ids, start) -> logits of the last row (V,)


def bundle_step(bundle: Path, threads: int, role: str) -> tuple[Step, int]:
    """The bundle's ``role`` graph as a step function (the last row's logits alone, as a decoder
    asks for them: ``forward_tail``), and its KV slots."""
    import torch

    from benchmarks.gguf_bundle import ort_model, target_info

    model, info = ort_model(bundle, threads, role), target_info(bundle, role)

    def step(ids: list[int], start: int) -> np.ndarray:
        # a prefill scores its last row; a verify call (few ids) every row, as a decoder asks
        rows = 1 if len(ids) > VERIFY_MAX else len(ids)
        return np.asarray(model.forward_tail(torch.tensor(ids), start, rows)[-1])

    return step, info.max_seq_len


VERIFY_MAX = 16  # calls of at most this many ids are verify calls (every row scored)


def engine_name(bundle: Path, role: str) -> str:
    """``<backend> <recipe>`` of the bundle's ``role`` graph (``xnnpack gguf8``)."""
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    return f"{manifest['backend']} {manifest['graphs'][role]['quantization']}"


def llamacpp_step(gguf: Path, threads: int, n_ctx: int) -> tuple[Step, int]:
    llm = llama(gguf, threads, n_ctx=n_ctx)

    def step(ids: list[int], start: int) -> np.ndarray:
        llm.n_tokens = start  # the KV cache cut back to ``start`` (a rollback, as ours)
        llm.eval(ids)  # without logits_all it keeps no rows in ``scores``: read the last row
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).copy()

    return step, n_ctx


def measure(step: Step, context: int, tokens: int, width: int = 0) -> dict[str, float]:
    """Prefill ``context`` tokens, then ``tokens`` greedy 1-token calls, then (``width`` > 0)
    ``tokens`` calls of ``width`` ids at the next position, each rolled back."""
    t0 = time.perf_counter()
    row = step(ordinary_ids(context), 0)
    prefill_s = time.perf_counter() - t0
    calls, pos, nxt = [], context, int(row.argmax())
    for _ in range(tokens):
        t0 = time.perf_counter()
        row = step([nxt], pos)
        calls.append(time.perf_counter() - t0)
        pos, nxt = pos + 1, int(row.argmax())
    out = {"prefill_tok_s": context / prefill_s, "decode_tok_s": 1.0 / statistics.median(calls),
           "decode_ms_p90": 1e3 * float(np.percentile(calls, 90))}  # fmt: skip
    if width:
        wide = []
        for _ in range(tokens):
            t0 = time.perf_counter()
            step(ordinary_ids(width), pos)
            wide.append(time.perf_counter() - t0)
        out |= {
            "verify_width": width,
            "verify_ms": 1e3 * statistics.median(wide),
            "verify_over_decode": statistics.median(wide) / statistics.median(calls),
        }
    return out | {"load_avg_1m": os.getloadavg()[0]}


def run(engines: dict[str, tuple[Step, int]], contexts: list[int], tokens: int,
        rounds: int, width: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for r in range(rounds):
        for c in contexts:
            for name, (step, slots) in engines.items():
                if c + tokens + 1 > slots:
                    continue
                rows.append({"engine": name, "context": c, "round": r}
                            | measure(step, c, tokens, width))  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (engine, context): the median over rounds of decode and prefill tok/s."""
    keys = sorted({(r["engine"], r["context"]) for r in rows}, key=lambda k: (k[1], k[0]))
    out = []
    for engine, ctx in keys:
        mine = [r for r in rows if r["engine"] == engine and r["context"] == ctx]
        out.append({"engine": engine, "context": ctx,
                    "decode_tok_s": statistics.median(r["decode_tok_s"] for r in mine),
                    "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in mine),
                    **({"verify_ms": statistics.median(r["verify_ms"] for r in mine),
                        "verify_over_decode": statistics.median(
                            r["verify_over_decode"] for r in mine)}
                       if "verify_ms" in mine[0] else {}),
                    "load_avg_1m": [round(r["load_avg_1m"], 2) for r in mine]})  # fmt: skip
    return out


def markdown(data: dict[str, Any]) -> str:
    engines = list(dict.fromkeys(s["engine"] for s in data["summary"]))
    contexts = sorted({s["context"] for s in data["summary"]})
    cell = {(s["engine"], s["context"]): s for s in data["summary"]}
    role = data["meta"].get("role", "target")
    lines = [f"# Phone path: {role} decode tok/s by context", "", *meta_lines(data["meta"]),
             "| context | " + " | ".join(engines) + " |",
             "|---|" + "---|" * len(engines)]  # fmt: skip
    for c in contexts:
        vals = [cell.get((e, c)) for e in engines]
        lines.append(f"| {c} | " + " | ".join(
            "-" if v is None else f"{v['decode_tok_s']:.1f} (prefill {v['prefill_tok_s']:.0f})"
            + (f", verify {v['verify_ms']:.0f} ms = {v['verify_over_decode']:.1f}x"
               if "verify_ms" in v else "")
            for v in vals) + " |")  # fmt: skip
    width = next((r["verify_width"] for r in data["rows"] if "verify_width" in r), 0)
    lines += ["", "Decode: median of 1-token calls; prefill: one call over the context"
              + (f"; verify: median of {width}-token calls at the next position (rolled back), "
                 "and its cost in 1-token calls (llama.cpp scores the last row only)" if width
                 else "") + ". Load averages per row are in the JSON."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for engine in dict.fromkeys(s["engine"] for s in data["summary"]):
        pts = [(s["context"], s["decode_tok_s"]) for s in data["summary"] if s["engine"] == engine]
        ax.plot(*zip(*pts, strict=True), marker="o", label=engine)
    ax.set(xscale="log", xlabel="context (tokens)", ylabel="decode tok/s", title="target decode")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pte", type=Path, nargs="+", default=[],
                    help="bundles with an XNNPACK .pte target (one row each)")  # fmt: skip
    ap.add_argument("--onnx", type=Path, help="bundle with an ONNX target")
    ap.add_argument("--gguf", type=Path, help="llama.cpp on this GGUF")
    ap.add_argument("--role", default="target", choices=("target", "drafter"),
                    help="which graph of the bundles (the GGUF should be that model's)")  # fmt: skip
    ap.add_argument("--contexts", default="64,512,4000")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--verify-width", type=int, default=0, help="time W-token calls too")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",")]
    load0 = os.getloadavg()
    engines: dict[str, tuple[Step, int]] = {}
    bundles = [*a.pte, *([a.onnx] if a.onnx else [])]
    names = [engine_name(bundle, a.role) for bundle in bundles]
    for bundle, name in zip(bundles, names, strict=True):  # two of one recipe: named by folder too
        name = f"{name} ({bundle.name})" if names.count(name) > 1 else name
        engines[name] = bundle_step(bundle, a.threads, a.role)
    if a.gguf:
        engines["llama.cpp"] = llamacpp_step(a.gguf, a.threads, max(contexts) + a.tokens + 8)
    rows = run(engines, contexts, a.tokens, a.rounds, a.verify_width)
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0) | {"role": a.role},
               "rows": rows,
               "summary": summary(rows)}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    name = "phone_path" if a.role == "target" else f"phone_path_{a.role}"
    print(write_report(a.out / name, payload, markdown=markdown, plot=plot))


if __name__ == "__main__":
    main()
