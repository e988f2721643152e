"""Torch threads beside one busy process: a pretraining step and a distillation step (issue 28).

    .venv/bin/python -m benchmarks.torch_threads [--pretrain-steps 12] [--updates 3] \
        [--out reports/torch_threads]    # under for figures

Each workload runs the product's own loop, timed per step, alone and beside one busy process
(``python -c 'while True: pass'``, started and stopped here), under three thread settings:

- ``default``: ``OMNIDRAFT_TORCH_THREADS`` = torch's own pool size (one thread per physical core):
  what every one of these loops ran with before issue 28;
- ``1``: one thread;
- ``free``: the product's setting (variable unset): ``host.threads.FreeCoreThreads``, one thread
  per core no other process is using, counted again every 2 s.

Workloads: ``pretrain``: ``distill.pretrain.train_compact`` of ``trained-llama3-demo`` (the
``make demo-toy`` target, 26M params, 128-token windows of the offline corpus), a fresh model per
run; ``distill``: ``OnlineDistiller.update`` (``omnidraft adapt``'s step: AdaptConfig's batch
and window, 4 optimiser steps) on the ``tiny-llama-68m`` drafter (4.2M params, llama2 vocabulary)
with observations of corpus text in the ``tiny-llama3-8b`` (llama3) vocabulary. A step's time
includes the 0.1 s first look of ``free`` (once per run). The load average is recorded beside each
row; ``reports/torch_threads/torch_threads.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, make_distiller
from omnidraft_deploy.distill.data import build_corpus, split
from omnidraft_deploy.distill.online import observation
from omnidraft_deploy.distill.pretrain import (
    compact_streams,
    pretrain_config,
    tokenize_corpus,
    train_compact,
)
from omnidraft_deploy.host.threads import THREADS_ENV, FreeCoreThreads
from omnidraft_deploy.resolve.load import load_model
from omnidraft_deploy.vocab.pair import load_pair_vocab

SETTINGS = ("default", "1", "free")
BUSY = "while True: pass"


def pretrain_workload(steps: int) -> Callable[[], float]:
    """Seconds per step of ``train_compact`` (``steps`` steps, model build included)."""
    cfg = dataclasses.replace(pretrain_config(get_preset("trained-llama3-demo")), steps=steps)
    docs, _ = split(build_corpus(cfg.data), cfg.data.heldout_frac)
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    streams, _, _ = compact_streams(tokenize_corpus(load_tokenizer(cfg.tokenizer), docs))

    def run() -> float:
        t0 = time.perf_counter()
        train_compact(cfg, streams)
        return (time.perf_counter() - t0) / steps

    return run


def distill_workload(updates: int) -> Callable[[], float]:
    """Seconds per optimiser step of ``updates`` calls of ``OnlineDistiller.update`` by a fresh
    ``make_distiller`` on tiny-llama-68m (its first look is part of the cost), its buffer filled
    with corpus-text observations: 4 committed target ids a step, each first in a top-8."""
    target, drafter = get_preset("tiny-llama3-8b"), get_preset("tiny-llama-68m")
    vocab = load_pair_vocab(target, drafter)
    docs, _ = split(build_corpus(pretrain_config(get_preset("trained-llama3-demo")).data), 0.1)
    gen, observations = torch.Generator().manual_seed(0), []
    for text in [d for texts in docs.values() for d in texts][:64]:
        ids = vocab.target_tok.encode(text)
        for i in range(8, len(ids) - 4, 24):
            new = ids[i : i + 4]
            top = torch.tensor([[t, *((t + torch.arange(1, 8)) % target.vocab_size)] for t in new])
            probs = torch.softmax(torch.randn(len(new), 8, generator=gen), -1)
            observations.append(observation(ids[:i], new, top, probs, 96))

    def run() -> float:
        distiller = make_distiller(load_model(drafter), vocab.mapper, AdaptConfig(guard=False))
        for obs in observations:
            distiller.buffer.add(obs)
        t0, steps = time.perf_counter(), 0
        for _ in range(updates):
            steps += distiller.update().steps
        return (time.perf_counter() - t0) / max(1, steps)

    return run


def measure(run: Callable[[], float], setting: str, busy: bool) -> dict[str, Any]:
    os.environ[THREADS_ENV] = str(torch.get_num_threads()) if setting == "default" else setting
    if setting == "free":
        del os.environ[THREADS_ENV]
    proc = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        time.sleep(0.5 if busy else 0.0)  # the busy process is running before we start
        others = FreeCoreThreads()
        others.mark()  # the CPU share other processes take during the run
        seconds = run()
        taken = others.others_cores()
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    return {"setting": setting, "busy": busy, "step_s": round(seconds, 4),
            "others_cores": None if taken is None else round(taken, 2),
            "load": os.getloadavg()[0]}  # fmt: skip


def report_md(result: dict[str, Any]) -> str:
    lines = [
        "# Torch threads beside one busy process",
        "",
        f"{result['meta']['command']}; torch {result['meta']['torch']}, "
        f"{result['meta']['cpus']} CPUs, torch's pool {result['meta']['torch_threads']} threads.",
        "",
        "| workload | threads | step alone | beside a busy process | slowdown |",
        "|---|---|---|---|---|",
    ]
    for name, rows in result["workloads"].items():
        for setting in SETTINGS:
            alone, busy = (statistics.median(r["step_s"] for r in rows
                                             if r["setting"] == setting and r["busy"] is b)
                           for b in (False, True))  # fmt: skip
            lines.append(f"| {name} | {setting} | {alone * 1e3:.0f} ms | {busy * 1e3:.0f} ms | "
                         f"{busy / alone:.1f}x |")  # fmt: skip
    rows = [r for rows in result["workloads"].values() for r in rows]
    loads = [r["load"] for r in rows]
    quiet = [r["others_cores"] for r in rows if not r["busy"] and r["others_cores"] is not None]
    lines += ["", f"Medians of {result['meta']['rounds']} rounds. Load average (1 min) across "
              f"the rows: {min(loads):.2f} - {max(loads):.2f}; CPU other processes took during "
              f"the 'alone' rows: {min(quiet, default=0):.2f} - {max(quiet, default=0):.2f} cores "
              "(beside the busy process: its 1 core plus that)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrain-steps", type=int, default=12)
    ap.add_argument("--updates", type=int, default=3, help="OnlineDistiller.update calls")
    ap.add_argument("--rounds", type=int, default=2, help="medians over this many rounds")
    ap.add_argument("--out", default="reports/torch_threads")
    args = ap.parse_args()
    workloads = {"pretrain": pretrain_workload(args.pretrain_steps),
                 "distill": distill_workload(args.updates)}  # fmt: skip
    for run in workloads.values():
        run()  # warm-up: imports, allocator, first-touch pages
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in workloads}
    for _ in range(args.rounds):  # round-robin: a slow patch of the machine hits every setting
        for name, run in workloads.items():
            for setting in SETTINGS:
                for busy in (False, True):
                    rows[name].append(measure(run, setting, busy))
                    print(name, rows[name][-1], flush=True)
    meta = {"command": "benchmarks/torch_threads.py " + " ".join(sys.argv[1:]),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "rounds": args.rounds,
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    result = {"meta": meta, "workloads": rows}
    out = Path(args.out)
    write_text_atomic(out / "torch_threads.json", json.dumps(result, indent=2) + "\n")
    write_text_atomic(out / "torch_threads.md", report_md(result))
    print(report_md(result))


if __name__ == "__main__":
    main()
