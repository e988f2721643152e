"""Headline decoding benchmark on the real cross-vocabulary pair, side by side in one run.

Drafter SmolLM2-135M-Instruct (vocab 49152) -> target Qwen2.5-Coder-0.5B-Instruct (Qwen2 vocab),
fp32, greedy, raw prompts (no chat template; the same target ids for every method), CPU:
target-only and speculative decoding with our ``reference.model.Transformer``, and target-only and
cross-tokenizer assisted generation with transformers. See ``omnidraft_deploy.real_pair``.

    .venv/bin/python benchmarks/real_pair.py                      # headline, reports/real_pair.*
    .venv/bin/python benchmarks/real_pair.py --sweep --repeats 1  # draft_len 2-6 x policies
Needs the optional model assets (``omnidraft assets fetch --models``). Slow: tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy import real_pair as rp
from omnidraft_deploy.manifest import write_text_atomic
from omnidraft_deploy.prompts import load_prompts

log = logging.getLogger("real_pair")


def _prompts(
    pair: rp.RealPair, per_task: int, tasks: set[str] | None
) -> list[tuple[str, list[int]]]:
    seen: dict[str, int] = {}
    out = []
    for p in load_prompts(tasks):
        if seen.get(p.task, 0) < per_task:
            seen[p.task] = seen.get(p.task, 0) + 1
            out.append((p.task, pair.target_tok.encode(p.text)))
    return out


def _specs(text: str) -> list[rp.SpecSetting]:
    """ "heuristic:4,predictor:3" -> settings."""
    out = []
    for item in text.split(","):
        policy, _, k = item.partition(":")
        out.append(rp.SpecSetting(policy.strip(), int(k or 4)))
    return out


def _md_table(summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| method | wall s (sum of medians) | tokens | tokens/s | speedup vs own target-only | "
        "speedup vs HF target-only | identical to own target-only | acceptance | "
        "target tokens/call | merged acc/prop | drafter / target / overhead time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, t in summary.items():
        spec = (
            f"{t['acceptance_rate']:.3f} | {t['tokens_per_target_call']:.2f} | "
            f"{t['merged_accepted']:.0f}/{t['merged_proposed']:.0f} | {t['drafter_frac']:.2f} / "
            f"{t['target_frac']:.2f} / {t['overhead_frac']:.3f}"
            if "acceptance_rate" in t
            else "- | - | - | -"
        )
        lines.append(
            f"| {m} | {t['wall_s']:.2f} | {t['tokens']} | {t['tokens_per_s']:.2f} | "
            f"{t['speedup_vs_own_target']:.2f}x | {t['speedup_vs_hf_target']:.2f}x | "
            f"{t['identical_to_own_target']}/{t['prompts']} | {spec} |"
        )
    return lines


def _markdown(title: str, payload: dict[str, Any]) -> str:
    meta, prof = payload["meta"], payload.get("latency_ms")
    lines = [f"# {title}", "", *(f"- {k}: {v}" for k, v in meta.items()), ""]
    lines += ["## All prompts", "", *_md_table(payload["summary"]), ""]
    if prof:
        lines += ["## Per-call latency of our models (ms, median; tokens fed at position 64)", "",
                  "| fed tokens | " + " | ".join(str(n) for n in prof["drafter"]) + " |",
                  "|---|" + "---|" * len(prof["drafter"])]  # fmt: skip
        for role in ("drafter", "target"):
            lines.append(
                f"| {role} | " + " | ".join(f"{v:.1f}" for v in prof[role].values()) + " |"
            )
        lines += [
            "",
            f"drafter/target 1-token latency ratio: {prof['drafter_to_target_ratio']:.2f}",
            "",
        ]
    for task, summ in payload["per_task"].items():
        lines += [f"## {task}", "", *_md_table(summ), ""]
    return "\n".join(lines) + "\n"


def _plot(per_task: dict[str, dict[str, dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(per_task)
    methods = [m for m in next(iter(per_task.values())) if m not in ("ours_target", "hf_target")]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        xs = [i + j * width for i in range(len(tasks))]
        ax.bar(xs, [per_task[t][m]["speedup_vs_own_target"] for t in tasks], width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks)
    ax.set_ylabel("speedup vs own target-only")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specs", default="heuristic:4,predictor:4", help="policy:draft_len,...")
    ap.add_argument("--sweep", action="store_true", help="fixed/heuristic/predictor x k=2..6")
    ap.add_argument("--per-task", type=int, default=3, help="prompts per task (<= 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers methods")
    ap.add_argument("--no-warmup", action="store_true", help="skip the per-method warm-up run")
    ap.add_argument("--tasks", default="", help="comma-separated task subset (default: all)")
    ap.add_argument("--out-dir", default="reports")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(a.threads)
    title = "real_pair_sweep" if a.sweep else "real_pair"
    specs = (
        [rp.SpecSetting(p, k) for p in ("fixed", "heuristic", "predictor") for k in range(2, 7)]
        if a.sweep
        else _specs(a.specs)
    )
    t0 = time.perf_counter()
    pair = rp.load_real_pair(max_seq_len=512, with_hf=not a.no_hf)
    load_s = time.perf_counter() - t0
    cfg = rp.decode_config(pair, a.max_new_tokens)
    prompts = _prompts(pair, a.per_task, set(a.tasks.split(",")) if a.tasks else None)
    prof = rp.latency_profile(pair, max_tokens=5, reps=3)
    log.info("latency profile (ms): %s", prof)
    methods = rp.make_methods(pair, cfg, specs, with_hf=not a.no_hf)
    res = rp.run_side_by_side(methods, prompts, repeats=a.repeats, warmup=not a.no_warmup)
    meta = {
        "target": "Qwen2.5-Coder-0.5B-Instruct (GGUF -> fp32)",
        "drafter": "SmolLM2-135M-Instruct (Q4_1 GGUF -> fp32)",
        "prompts": f"{len(prompts)} ({a.per_task} per task, raw text, no chat template)",
        "max_new_tokens": a.max_new_tokens, "repeats (median kept)": a.repeats,
        "torch threads": a.threads, "dtype": "float32", "our max_seq_len": 512,
        "load_s": round(load_s, 1), "hf_assisted": "transformers "
        + _tf_version() + " AssistedCandidateGeneratorDifferentTokenizers, default settings",
        "load average at end": " ".join(f"{x:.2f}" for x in _loadavg()),
    }  # fmt: skip
    payload: dict[str, Any] = {"meta": meta, "latency_ms": prof, "summary": rp.summarise(res.rows),
               "per_task": rp.per_task(res.rows), "rows": res.rows}  # fmt: skip
    out = Path(a.out_dir)
    write_text_atomic(out / f"{title}.json", json.dumps(payload, indent=2) + "\n")
    write_text_atomic(out / f"{title}.md", _markdown(title, payload))
    _plot(payload["per_task"], out / f"{title}.png", title)
    log.info("wrote %s (.json, .png); median wall of all runs %.2f s", out / f"{title}.md",
             statistics.median(r["wall_s"] for r in res.rows))  # fmt: skip


def _tf_version() -> str:
    try:
        import transformers

        return str(transformers.__version__)
    except ImportError:
        return "not installed"


def _loadavg() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


if __name__ == "__main__":
    main()
