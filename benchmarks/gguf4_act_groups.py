"""Sweep: eager ``gguf4`` (``--fast`` emulation of XNNPACK's int8 activations) with finer
activation scales on chosen linears, against the fp32 reference on the export's parity rows.

XNNPACK's ``qd8`` gives each token's input row one int8 scale. Splitting a linear's input (K)
into ``G`` column groups, each quantised per row on its own (``G`` linears over input slices,
outputs summed), gives ``G`` scales per row. Here the emulation's ``Int8RowsLinear`` gets
``groups`` per config, so one loaded model serves every config (each is ``checks.parity`` over
``--parity-prompts`` shipped prompts: the rows ``benchmarks.gguf_bundle top1`` reads).

    flock /tmp/omnidraft-bigmem.lock nice -n 19 python -m benchmarks.gguf4_act_groups \
        --preset qwen2.5-1.5b --split gate_proj,up_proj --k 4 --parity-prompts 12 \
        --configs "all=1|all=s32|gate_proj,up_proj=4;down_proj=2" --out reports/xnnpack_gguf4/G.json

Configs are ``|``-separated; a config is ``;``-separated ``KINDS=G[@LAYERS]`` items (``all``:
every linear; ``G`` a group count, ``sN`` groups of N columns, 0 one scale per element (fp32
activations, up to rounding), ``smA`` a static smoothing (x / s quantised, weight * s) constant
over each block of 32 inputs, s = the block's peak |x| on ``--calib`` held-out prompts ** A,
which keeps a GGUF block's grid exact; ``LAYERS`` ``a-b`` or ``a,b,..``; a later item wins).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.gguf4_eager_parity import (
    Int8RowsLinear,
    calibration,
    emulate_torchao,
    outlier_quantized,
)
from omnidraft_deploy.bundle.atomic import write_text_atomic


def parse_config(text: str) -> list[tuple[tuple[str, ...], str, set[int] | None]]:
    """``"gate_proj,up_proj=4@0-3;down_proj=2"`` -> ``[(kinds, G, layers or None), ...]``."""
    items = []
    for item in filter(None, text.split(";")):
        kinds, _, rest = item.partition("=")
        groups, _, layers = rest.partition("@")
        chosen: set[int] | None = None
        if layers:
            chosen = set()
            for part in layers.split(","):
                a, _, b = part.partition("-")
                chosen |= set(range(int(a), int(b or a) + 1))
        items.append((tuple(kinds.split(",")), groups, chosen))
    return items


def column_peaks(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Per emulated linear, the max |x| per input column over one forward per prompt."""
    peaks: dict[str, torch.Tensor] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, Int8RowsLinear):

            def hook(_m: torch.nn.Module, args: tuple[torch.Tensor], name: str = name) -> None:
                p = args[0].detach().abs().flatten(0, -2).amax(0)
                peaks[name] = p if name not in peaks else torch.maximum(peaks[name], p)

            hooks.append(m.register_forward_pre_hook(hook))
    for ids in prompts:
        model.reset_cache()
        model(torch.tensor([ids]), torch.arange(len(ids)))
    for h in hooks:
        h.remove()
    return peaks


def block_smooth(peak: torch.Tensor, alpha: float, block: int = 32) -> torch.Tensor:
    """Per-column factors constant over each block of ``block`` inputs (so a GGUF block's scale
    and minimum times the factor keep its grid exactly): the block's peak ** alpha."""
    b = peak.unflatten(-1, (-1, block)).amax(-1).clamp(min=1e-6) ** alpha
    return (b / b.max()).repeat_interleave(block)


def apply_config(
    model: torch.nn.Module, text: str, peaks: dict[str, torch.Tensor] | None = None
) -> int:
    """Set ``groups`` / ``smooth`` on every emulated linear (1 / none unless a config item names
    it: ``smA`` smooths per block of 32 with exponent A); returns how many were changed."""
    items = parse_config(text)
    changed = 0
    for name, m in model.named_modules():
        if not isinstance(m, Int8RowsLinear):
            continue
        parts = name.split(".")
        kind = next((p for p in reversed(parts) if p.endswith("proj") or p == "lm_head"), "")
        layer = int(parts[2]) if parts[:2] == ["model", "layers"] else -1
        m.groups, m.smooth, m.smooth_weight = 1, None, None
        for kinds, groups, layers in items:
            if not (("all" in kinds or kind in kinds) and (layers is None or layer in layers)):
                continue
            if groups.startswith("sm"):
                assert peaks is not None
                m.smooth = block_smooth(peaks[name], float(groups[2:]))
                if not name.endswith("centred"):  # an 8da8w weight: W * s re-rounded per row
                    m.smooth_weight = _rows8(m.weight * m.smooth) / m.smooth
            else:
                m.groups = _groups(groups, m.weight.shape[1])
        changed += m.groups > 1 or m.smooth is not None
    return changed


def _rows8(w: torch.Tensor) -> torch.Tensor:
    scale = w.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return torch.round(w / scale).clamp(-127, 127) * scale


def _groups(text: str, width: int) -> int:
    size = int(text[1:]) if text.startswith("s") else (width // int(text) if int(text) else 1)
    if width % size:
        raise ValueError(f"{text}: {width} columns do not split evenly")
    return width // size


@torch.inference_mode()
def main() -> None:
    from omnidraft_deploy.exporters.verify import prompt_ids

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.checks.parity import eager_step, parity
    from omnidraft_deploy.resolve.load import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split", default="", help="linear kinds whose inputs get outlier channels")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--parity-prompts", type=int, default=12)
    ap.add_argument("--configs", required=True, help="'|'-separated configs (module docstring)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    spec = get_preset(a.preset)
    model = load_model(spec, max_seq_len=256).eval()
    split = tuple(k for k in a.split.split(",") if k)
    quant, _, _ = outlier_quantized(spec, model, split, a.k, a.calib)
    emulate_torchao(quant)
    ids = prompt_ids(spec.tokenizer, model.args.vocab_size, n=a.parity_prompts)
    peaks = None
    if "=sm" in a.configs:  # smoothing factors from the held-out calibration prompts
        apply_config(quant, "")
        peaks = column_peaks(quant, [list(p) for p in calibration(spec, model, a.calib)])
    results = []
    for config in a.configs.split("|"):
        t1, load = time.time(), os.getloadavg()
        grouped = apply_config(quant, config, peaks)
        model.reset_cache()
        quant.reset_cache()
        got = parity(eager_step(quant), eager_step(model), ids)
        results.append({"config": config, "grouped_linears": grouped, "parity": got,
                        "seconds": round(time.time() - t1, 1), "load_avg_start": load})  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
        out = {"preset": a.preset, "split": split, "k": a.k, "results": results,
               "setup_and_total_seconds": round(time.time() - t0, 1)}  # fmt: skip
        write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
