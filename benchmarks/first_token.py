"""How large a sinked QNN graph's first-token activations get, and whether calibration covers them.

    .venv/bin/python -m benchmarks.first_token --model qwen2.5-0.5b

A QNN graph is the model conditioned on a sink token (``reference.sink``), so the sink's own
massive activations stay out of it. The prompt's first token then comes right after the sink, and
in Qwen2.5-0.5B (sink ``<|endoftext|>``) some first tokens grow massive activations of their own,
how large depending on the token. Static uint16 ranges calibrated on prompt starts alone missed
them: one shipped prompt starting with ' Leading' read logits 21.8 off on the QDQ graph.
``exporters.calibration.start_windows`` adds mid-text windows read from position 0.

This measures, in the fp32 eager sinked model, the residual stream's max |x| (over layers and
channels) at position 0 for: the calibration prompts' first tokens (what calibration saw before),
the windows' first tokens (what it sees now), the shipped prompts' first tokens (what verification
reads; never calibrated on) and every distinct token of the held-out calibration text read alone.
Writes ``reports/first_token/first_token_<model>.json`` and the ``.md`` and ``.png`` rendered from it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters.quant.calibration import calibration_ids, start_windows
from omnidraft_deploy.exporters.verify import prompt_ids

from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.sink import SinkModel, first_token_peak, sink_for
from omnidraft_deploy.resolve.load import load_model
from omnidraft_deploy.vocab.tokenizers import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    spec = get_preset(args.model)
    model = load_model(spec, max_seq_len=256)
    sinked = SinkModel(model, sink_for(model, spec.tokenizer)).eval()
    tok = load_tokenizer(spec.tokenizer)
    calib = calibration_ids(spec.tokenizer, spec.vocab_size)
    groups = {
        "calibration prompts' first tokens": [p[:1] for p in calib],
        "start windows' first tokens (calibrated now)": [w[:1] for w in start_windows(calib, 1)],
        "shipped prompts' first tokens (verification)": [
            p[:1] for p in prompt_ids(spec.tokenizer, spec.vocab_size, n=12, limit=24)
        ],
        "every distinct token of the calibration text": [[t] for t in sorted({t for p in calib for t in p})],
    }  # fmt: skip
    found = {
        name: sorted(((first_token_peak(sinked, ids), tok.decode(ids)) for ids in firsts),
                     reverse=True)
        for name, firsts in groups.items()
    }  # fmt: skip
    payload = {"meta": run_meta(threads=args.threads, load_avg_start=load0), "model": args.model,
               "sink": sinked.tokens[0], "groups": found}  # fmt: skip
    stem = Path("reports/first_token") / f"first_token_{args.model}"
    write_report(stem, payload, markdown=to_markdown, plot=plot)
    print(stem.with_suffix(".md").read_text())


def to_markdown(d: dict[str, Any]) -> str:
    """Per group of first tokens (peaks sorted, largest first): how many, median, max, top 3."""
    lines = [f"# First-token activations after the sink: {d['model']}", "", *meta_lines(d["meta"]),
             f"fp32 eager model conditioned on its sink token {d['sink']}; residual-stream max |x| "
             "at the prompt's first token.", "", "| first tokens | n | median | max | largest |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, vals in d["groups"].items():
        xs = [v for v, _ in vals]
        top = ", ".join(f"{s!r} {v:.0f}" for v, s in vals[:3])
        lines.append(f"| {name} | {len(xs)} | {xs[len(xs) // 2]:.0f} | {xs[0]:.0f} | {top} |")
    return "\n".join(lines) + "\n"


def plot(d: dict[str, Any], path: Path) -> None:
    found = d["groups"]
    fig, ax = pyplot().subplots(figsize=(8, 4))
    ax.boxplot([[v for v, _ in vals] for vals in found.values()], vert=False)
    ax.set_yticks(range(1, len(found) + 1), [name.split(" (")[0] for name in found], fontsize=8)
    ax.set_xlabel("residual-stream max |x| at the first token after the sink")
    ax.set_title(f"{d['model']}: first-token activations")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    main()
