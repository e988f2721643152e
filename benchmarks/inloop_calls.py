"""Graph calls timed inside a real speculative decode, then re-timed alone at the same shapes.

The cost model charges each target and drafter call what ``runtime.profile`` measured (interleaved
calls at a fixed context). This benchmark checks that charge where it is paid: it decodes prompts
as ``run`` does (cost-aware drafting, the bundle's n-gram cache), records every graph call's width
T, position and milliseconds, then replays the same calls (same T, same positions, alternating as
the loop did, no host work between them) and compares the medians per (graph, T) beside the
profile's figure for that width. A loop that slowed its calls (thread pools fighting, host maths
evicting caches) shows as in-loop > replayed; a profile that misjudges a shape shows as replayed
far from the profile.

    python -m benchmarks.inloop_calls --bundle bundles/q15-kd3 --threads 2
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.report import meta_lines, run_meta, write_report
from benchmarks.real_pair_bundle import load_prompts
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer

OUT = Path("reports/inloop_calls")
Call = tuple[str, int, int, float]  # graph, T, first position, ms


def _record(model: Any, name: str, log: list[Call]) -> None:
    """Wrap ``model._run`` and ``model._run_tail`` (``runtime.base.RuntimeModel``: ``forward``
    and ``forward_tail``) to log each call."""
    for method in ("_run", "_run_tail"):
        inner = getattr(model, method)

        def timed(ids: np.ndarray, pos: np.ndarray, *rows: int, inner: Any = inner) -> np.ndarray:
            t0 = time.perf_counter()
            out = inner(ids, pos, *rows)
            log.append((name, int(ids.shape[1]), int(pos[0]), 1e3 * (time.perf_counter() - t0)))
            return out

        setattr(model, method, timed)


def run(a: argparse.Namespace) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.profile import measure_bundle

    torch.set_num_threads(1)
    load0 = os.getloadavg()
    b = open_bundle(a.bundle, threads=a.threads)
    prof = measure_bundle(b, k_max=2 * b.manifest.draft_len, reps=3)["drafter"]
    log: list[Call] = []
    _record(b.target, "target", log)
    _record(b.drafter, "drafter", log)
    tok = load_bundle_tokenizer(b.root, "target", b.manifest.files)
    cfg = DecodeConfig(max_new_tokens=64, host_threads=1)
    for _, ids in load_prompts(tok, a.tasks.split(","), 1):
        dec = build_decoder(b.target, b.drafter, b.mapper, policy="cost", config=cfg,
                            draft_len=b.manifest.draft_len, profile=prof,
                            ngram_cache=copy.deepcopy(b.ngram_cache))  # fmt: skip
        dec.generate(ids)
    calls = [c for c in log if c[1] <= 2 * b.manifest.draft_len + 1]  # not the prefills
    n_loop = len(calls)
    for name, t, pos, _ in calls:  # the replay, alternating as the loop did
        fed = torch.zeros(t, dtype=torch.long)
        if name == "target":
            b.target.forward(fed, pos)
        else:
            b.drafter.forward_tail(fed, pos, 1)  # the drafter reads the last row only
    replay = log[len(log) - n_loop :]
    groups: dict[tuple[str, int], dict[str, list[float]]] = collections.defaultdict(
        lambda: {"loop": [], "replay": [], "pos": []}
    )
    for (name, t, pos, ms), (_, _, _, ms2) in zip(calls, replay, strict=True):
        for key, v in (("loop", ms), ("replay", ms2), ("pos", float(pos))):
            groups[(name, t)][key].append(v)
    rows = []
    for (name, t), g in sorted(groups.items()):
        widths = prof.target_ms if name == "target" else prof.drafter_ms
        rows.append({"graph": name, "T": t, "calls": len(g["loop"]),
                     "mean_position": statistics.fmean(g["pos"]),
                     "in_loop_ms": statistics.median(g["loop"]),
                     "replayed_ms": statistics.median(g["replay"]),
                     "in_loop_mean_ms": statistics.fmean(g["loop"]),
                     "replayed_mean_ms": statistics.fmean(g["replay"]),
                     "profile_ms": widths[t - 1] if t <= len(widths) else None})  # fmt: skip
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "bundle": str(a.bundle),
               "profile_context": prof.context, "rows": rows}  # fmt: skip
    write_report(OUT / a.name, payload, markdown=_md)


def _md(p: dict[str, Any]) -> str:
    head = [f"# Graph calls in the loop vs alone ({p['bundle']})", "", *meta_lines(p["meta"]), "",
            f"Profile figures are at context {p['profile_context']}.", "",
            "Medians, then means (what a decode pays: the sum of its calls).", "",
            "| graph | T | calls | mean position | in loop (ms) | replayed alone (ms) | profile (ms) "
            "| in loop, mean | replayed, mean |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    body = [f"| {r['graph']} | {r['T']} | {r['calls']} | {r['mean_position']:.0f} | "
            f"{r['in_loop_ms']:.1f} | {r['replayed_ms']:.1f} | "
            f"{'-' if r['profile_ms'] is None else format(r['profile_ms'], '.1f')} | "
            f"{r.get('in_loop_mean_ms', float('nan')):.1f} | "
            f"{r.get('replayed_mean_ms', float('nan')):.1f} |"
            for r in p["rows"]]  # fmt: skip
    return "\n".join(head + body) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tasks", default="math,code,summarisation,code_edit")
    p.add_argument("--name", default="inloop_calls")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
