"""Does the target graph give the same logits for a token fed alone and inside a T-token call?

    .venv/bin/python -m benchmarks.batch_invariance --quant fp32,int8 [--widths 2,5,9] [--tokens 64]

Greedy speculative output equals target-only output only if the graph's argmax does not depend on
how many tokens one call feeds (a verification call feeds ``1 + proposals``; target-only feeds 1).
For every ``--every``-th benchmark prompt: decode target-only with 1-token calls, keeping each
call's logits row, then re-score the same text in ``width``-token calls, as verification does, and
count the rows whose logits are not bitwise equal, the largest |difference|, and the positions
whose argmax changes (with the top-1/top-2 logit gap: near-ties). The summary goes to
``--out`` (JSON, one object per graph; the ``.md`` beside it is rendered from it by
``render_reports.batch_invariance_md``, as ``make reports`` does) and the log.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import ort_pair as op
from benchmarks.common.pair import prompt_texts
from benchmarks.common.report import run_meta, write_report
from benchmarks.render_reports import batch_invariance_md
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

log = logging.getLogger("batch_invariance")
VOCAB_LIMIT = 151665  # Qwen2.5's real vocabulary; rows past it are embedding padding


@torch.inference_mode()
def decode_rows(target: CausalLM, ids: list[int], n_new: int) -> tuple[list[int], torch.Tensor]:
    """Greedy target-only decode (prompt in one call, then 1-token calls): (new ids, rows (n, V))
    where row ``i`` is the logits that chose new id ``i``."""
    rows, out, feed, pos = [], [], list(ids), 0
    for _ in range(n_new):
        row = target.forward(torch.tensor(feed), pos)[-1, :VOCAB_LIMIT].clone()
        pos += len(feed)
        rows.append(row)
        out.append(int(row.argmax()))
        feed = [out[-1]]
    return out, torch.stack(rows)


@torch.inference_mode()
def compare_width(target: CausalLM, ids: list[int], out: list[int], rows: torch.Tensor,
                  width: int) -> dict[str, Any]:  # fmt: skip
    """Re-score ``ids + out`` in ``width``-token calls from the prompt's last token on (a
    verification call's shape) and compare every row with the 1-token call's row."""
    full, base = ids + out, len(ids) - 1
    n_rows, unequal, max_diff, flips = 0, 0, 0.0, []
    for i in range(0, len(out) - 1, width):
        feed = full[base + i : base + i + width]
        got = target.forward(torch.tensor(feed), base + i)[:, :VOCAB_LIMIT]
        for j in range(min(len(feed), len(out) - i)):
            ref = rows[i + j]
            n_rows += 1
            if not torch.equal(got[j], ref):
                unequal += 1
                max_diff = max(max_diff, float((got[j] - ref).abs().max()))
            if int(got[j].argmax()) != out[i + j]:
                top = ref.topk(2).values
                flips.append(round(float(top[0] - top[1]), 5))
    return {"rows": n_rows, "rows_not_bitwise_equal": unequal, "max_abs_diff": max_diff,
            "argmax_changes": len(flips), "near_tie_gaps": flips}  # fmt: skip


def run_graph(quant: str, prompts: list[dict[str, Any]], widths: list[int],
              tokens: int, threads: int) -> dict[str, Any]:  # fmt: skip
    tok = load_tokenizer("qwen2")
    path, info, parity = op.verify_graph(op.TARGET, "target", quant)
    target = op.ort_graph(path, info, threads)
    min_gap = float("inf")  # smallest top-1/top-2 gap of any 1-token row decoded
    per_width: dict[int, dict[str, Any]] = {
        w: {"rows": 0, "rows_not_bitwise_equal": 0, "max_abs_diff": 0.0, "argmax_changes": 0,
            "near_tie_gaps": []} for w in widths}  # fmt: skip
    for p in prompts:
        ids = tok.encode(p["text"])
        out, rows = decode_rows(target, ids, tokens)
        top2 = rows.topk(2, dim=-1).values
        min_gap = min(min_gap, float((top2[:, 0] - top2[:, 1]).min()))
        for w in widths:
            r, acc = compare_width(target, ids, out, rows, w), per_width[w]
            for k in ("rows", "rows_not_bitwise_equal", "argmax_changes"):
                acc[k] += r[k]
            acc["max_abs_diff"] = max(acc["max_abs_diff"], r["max_abs_diff"])
            acc["near_tie_gaps"] += r["near_tie_gaps"]
            log.info("%s %s w=%d: %s", quant, p["task"], w, r)
    max_diff = max(v["max_abs_diff"] for v in per_width.values())
    return {"graph": quant, "file": str(path), "top1_vs_eager": parity.get("top1_agreement"),
            "widths": per_width, "min_top1_top2_gap": min_gap, "max_abs_diff": max_diff,
            # a row's argmax cannot change while its top-1/top-2 gap exceeds twice the largest
            # |logit difference| between call widths
            "argmax_safe_margin": min_gap > 2 * max_diff,
            "batch_invariant": all(v["rows_not_bitwise_equal"] == 0 for v in per_width.values())}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quant", default="fp32,int8", help="target graphs (ort_pair quant names)")
    ap.add_argument("--widths", default="2,5,9", help="verification call widths to compare")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--every", type=int, default=4, help="every n-th benchmark prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="reports/batch_invariance/batch_invariance.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    raw = prompt_texts()
    widths = [int(w) for w in a.widths.split(",")]
    load0, t0 = os.getloadavg(), time.strftime("%H:%M", time.gmtime())
    graphs = [run_graph(q, raw[:: a.every], widths, a.tokens, a.threads)
              for q in a.quant.split(",")]  # fmt: skip
    meta = {**run_meta(threads=a.threads, load_avg_start=load0), "prompts": len(raw[:: a.every]),
            "utc": f"{t0}-{time.strftime('%H:%M', time.gmtime())}"}  # fmt: skip
    write_report(Path(a.out).with_suffix(""), {"meta": meta, "graphs": graphs},
                 markdown=lambda d: batch_invariance_md(d, Path(a.out)))  # fmt: skip
    for g in graphs:
        log.info("%s: batch-invariant %s; %s", g["graph"], g["batch_invariant"],
                 {w: (v["rows_not_bitwise_equal"], v["argmax_changes"]) for w, v in
                  g["widths"].items()})  # fmt: skip


if __name__ == "__main__":
    main()
