"""Decoding benchmark: target-only vs speculative, side by side in one run, per prompt and task.

Reports acceptance rate, mean target tokens per target call, speedup, and the mapper + n-gram
cache + verification overhead per step as a fraction of the drafter's step time. Nothing here is a
timed assertion: figures are measured and written to a report (JSON + Markdown + PNG).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM, DraftLengthPolicy
from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only
from omnidraft_deploy.speculative.factory import build_decoder, pair_config
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchPrompt:
    task: str
    ids: list[int]


@dataclass
class BenchResult:
    rows: list[dict[str, Any]] = field(default_factory=list)

    def totals(self) -> dict[str, float]:
        def s(key: str) -> float:
            return float(sum(r[key] for r in self.rows))

        spec_s, base_s = s("spec_s"), s("target_only_s")
        return {
            "prompts": len(self.rows),
            "identical_outputs": int(s("identical")),
            "acceptance_rate": s("accepted") / max(1.0, s("proposed")),
            "tokens_per_target_call": s("spec_tokens") / max(1.0, s("spec_target_calls")),
            "speedup": base_s / spec_s if spec_s else 0.0,
            "overhead_fraction_of_drafter": s("overhead_s") / max(1e-9, s("drafter_s")),
            "target_only_tokens_per_s": s("base_tokens") / max(1e-9, base_s),
            "spec_tokens_per_s": s("spec_tokens") / max(1e-9, spec_s),
        }


def run_decode_bench(
    target: CausalLM,
    drafter: CausalLM,
    mapper: VocabMapper,
    prompts: list[BenchPrompt],
    config: DecodeConfig,
    *,
    policy: str | DraftLengthPolicy = "heuristic",
    draft_len: int = 4,
    ngram_cache: NGramCache | None = None,
    seed: int = 0,
) -> BenchResult:
    """Run each prompt target-only and speculatively (same config, same seed) and record both;
    ``policy`` at ``draft_len`` as ``speculative.factory.build_decoder`` takes it."""
    cfg = pair_config(mapper, config)
    dec = build_decoder(target, drafter, mapper, policy=policy, draft_len=draft_len, config=cfg,
                        ngram_cache=ngram_cache)  # fmt: skip
    result = BenchResult()
    for p in tqdm(prompts, desc="bench", unit="prompt"):
        base_ids, base = generate_target_only(
            target, p.ids, cfg, torch.Generator().manual_seed(seed)
        )
        spec_ids, spec = dec.generate(p.ids, generator=torch.Generator().manual_seed(seed))
        result.rows.append(
            {
                "task": p.task,
                "identical": base_ids == spec_ids,
                "base_tokens": base.n_generated,
                "target_only_s": base.wall_s,
                "spec_tokens": spec.n_generated,
                "spec_s": spec.wall_s,
                "spec_target_calls": spec.target_calls,
                "proposed": spec.proposed,
                "accepted": spec.accepted,
                "merged_accepted": spec.merged_accepted,
                "drafter_s": spec.drafter_s,
                "overhead_s": spec.overhead_s,
                "accept_counts": spec.accept_counts,
                "draft_len_trace": spec.draft_len_trace,
            }
        )
    return result


def per_task(result: BenchResult) -> dict[str, dict[str, float]]:
    tasks: dict[str, BenchResult] = {}
    for r in result.rows:
        tasks.setdefault(r["task"], BenchResult()).rows.append(r)
    return {t: sub.totals() for t, sub in tasks.items()}


def write_report(
    result: BenchResult, out_dir: str | Path, *, title: str, meta: dict[str, Any]
) -> Path:
    """reports/<title>.json, .md and .png (speedup and acceptance per task)."""
    out = Path(out_dir)
    tasks, totals = per_task(result), result.totals()
    payload = {
        "title": title,
        "meta": meta,
        "totals": totals,
        "per_task": tasks,
        "rows": result.rows,
    }
    write_text_atomic(out / f"{title}.json", json.dumps(payload, indent=2) + "\n")
    lines = [
        f"# {title}",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "",
        "| task | prompts | identical | acceptance | tokens/target call | speedup | overhead/drafter |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in [*tasks.items(), ("ALL", totals)]:
        lines.append(
            f"| {name} | {t['prompts']} | {t['identical_outputs']} | "
            f"{t['acceptance_rate']:.3f} | {t['tokens_per_target_call']:.2f} | "
            f"{t['speedup']:.2f}x | {t['overhead_fraction_of_drafter']:.3f} |"
        )
    write_text_atomic(out / f"{title}.md", "\n".join(lines) + "\n")
    _plot(tasks, out / f"{title}.png", title)
    return out / f"{title}.md"


def _plot(tasks: dict[str, dict[str, float]], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib not installed (pip install omnidraft-deploy[plots]); no plot")
        return
    names = list(tasks)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].bar(names, [tasks[n]["speedup"] for n in names])
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_title("speedup vs target-only")
    axes[1].bar(names, [tasks[n]["acceptance_rate"] for n in names])
    axes[1].set_ylim(0, 1)
    axes[1].set_title("acceptance rate")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lossless_report(out_dir: str | Path, *, n_samples: int = 2000, length: int = 2) -> Path:
    """Measure how far each sampling mode's output law is from the target's (toy pair, exact law).

    ``exact`` must be indistinguishable from the target; ``omnidraft`` (merged n-gram proposals)
    is not exactly lossless and its total variation / chi-square figures are what it costs.
    """
    from omnidraft_deploy.speculative.drafter import Mode
    from omnidraft_deploy.speculative.lossless import (
        deviation_report,
        exact_sequence_probs,
        sample_sequences,
    )
    from omnidraft_deploy.testing import toy_models, toy_ngram_cache, toy_pair

    target, drafter, mapper = toy_models()
    prompt = toy_pair()[1].encode("ab c")
    truth = exact_sequence_probs(target, prompt, length)
    rows: dict[str, dict[str, float]] = {}
    for mode, cache in ((Mode.EXACT, None), (Mode.OMNIDRAFT, toy_ngram_cache())):
        cfg = DecodeConfig(mode=mode, temperature=1.0, max_new_tokens=length)
        dec = build_decoder(target, drafter, mapper, policy="fixed", draft_len=3, config=cfg,
                            ngram_cache=cache, stop_at_eos=False)  # the law of 2 whole tokens
        rows[mode.value] = deviation_report(sample_sequences(dec, prompt, n_samples), truth)
    out = Path(out_dir)
    write_text_atomic(out / "lossless.json", json.dumps(rows, indent=2) + "\n")
    lines = [
        "# Sampling modes vs the target's exact law (toy pair, 2-token sequences)",
        "",
        "| mode | samples | total variation | chi2 | dof | z (>4 = biased) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {m} | {r['samples']:.0f} | {r['total_variation']:.4f} | {r['chi2']:.1f} | "
        f"{r['dof']:.0f} | {r['chi2_z']:.2f} |"
        for m, r in rows.items()
    ]
    write_text_atomic(out / "lossless.md", "\n".join(lines) + "\n")
    return out / "lossless.md"
