"""How large a sinked QNN graph's first-token activations get, and whether calibration covers them.

    .venv/bin/python benchmarks/first_token.py --model qwen2.5-0.5b

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
Writes ``reports/first_token/first_token_<model>.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omnidraft_deploy.exporters.quant.calibration import calibration_ids, start_windows
from omnidraft_deploy.exporters.verify import prompt_ids

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
        name: [(first_token_peak(sinked, ids), tok.decode(ids)) for ids in firsts]
        for name, firsts in groups.items()
    }
    lines = [f"# First-token activations after the sink: {args.model}", "",
             f"`benchmarks/first_token.py --model {args.model}`: fp32 eager model conditioned on "
             f"its sink token {sinked.tokens[0]}; residual-stream max |x| at the prompt's first token.",
             "", "| first tokens | n | median | max | largest |", "|---|---|---|---|---|"]  # fmt: skip
    for name, vals in found.items():
        vals.sort(reverse=True)
        xs = [v for v, _ in vals]
        top = ", ".join(f"{s!r} {v:.0f}" for v, s in vals[:3])
        lines.append(f"| {name} | {len(xs)} | {xs[len(xs) // 2]:.0f} | {xs[0]:.0f} | {top} |")
    out = Path("reports/first_token")
    out.mkdir(exist_ok=True)
    (out / f"first_token_{args.model}.md").write_text("\n".join(lines) + "\n")
    plot(found, out / f"first_token_{args.model}.png", args.model)
    print("\n".join(lines))


def plot(found: dict[str, list[tuple[float, str]]], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot([[v for v, _ in vals] for vals in found.values()], vert=False)
    ax.set_yticks(range(1, len(found) + 1), [name.split(" (")[0] for name in found], fontsize=8)
    ax.set_xlabel("residual-stream max |x| at the first token after the sink")
    ax.set_title(f"{model}: first-token activations")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
