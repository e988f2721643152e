"""Eager ``gguf4`` (XNNPACK numerics in PyTorch: torchao int8 per-token activations) vs the fp32
reference, per prompt position: where the largest logit differences sit.

    flock /tmp/omnidraft-bigmem.lock python -m benchmarks.gguf4_eager_parity --preset qwen2.5-1.5b \
        --prompts 3 --out reports/xnnpack_gguf4/eager_rows.json
    ... --split gate_proj,up_proj --k 4 --parity-prompts 12 --out reports/xnnpack_gguf4/F.json

``--split KINDS``: those linears' inputs get ``--k`` outlier channels (``exporters.quant.outliers``,
chosen on ``--calib`` held-out calibration prompts) in an exact fp32 side matmul.
``--fast``: every torchao linear (the 4-bit codes, the 8-bit weights) replaced by the same int8
per-token activations (``int8_rows``) times its weight dequantised once, instead of torchao
dequantising every weight on every call (12 prompts took over an hour on the 1.5B); checked
against torchao on one linear per kind (``emulation_max_rel_diff`` in the output).
``--parity-prompts N``: also ``checks.parity.parity`` (the export's verification rows: prefill,
greedy single steps, a rollback) of the eager shell against fp32 on N shipped prompts: the
top-1 that ``benchmarks.gguf_bundle top1`` reads from a bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy.bundle.atomic import write_text_atomic


def calibration(spec: Any, model: Any, n: int) -> list[list[int]]:
    """The first ``n`` held-out calibration prompts of ``spec``'s tokenizer."""
    from omnidraft_deploy.exporters.quant.calibration import calibration_ids

    return calibration_ids(spec.tokenizer, model.args.vocab_size)[:n]


def outlier_quantized(spec: Any, model: Any, split: tuple[str, ...], k: int,
                      n_calib: int) -> tuple[Any, Any, dict[str, Any]]:  # fmt: skip
    """``model`` on its GGUF grid (``gguf_quantized``: the shell, its grid share), ``split``'s
    linears with ``k`` outlier input channels chosen on ``n_calib`` calibration prompts (the
    third item: linear path -> channels; empty without ``split``)."""
    from omnidraft_deploy.exporters.quant.gguf_grid import gguf_file
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import gguf_quantized

    channels = {}
    if split:
        from omnidraft_deploy.exporters.quant.outliers import outlier_channels

        channels = outlier_channels(model, calibration(spec, model, n_calib), k, split)
    quant, share = gguf_quantized(model, gguf_file(spec), channels)
    return quant, share, channels


@torch.inference_mode()
def main() -> None:
    from omnidraft_deploy.exporters.verify import prompt_ids

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fp32", default="", help="linear kinds (e.g. down_proj) put back at fp32: "
                    "which linears' int8 activations carry the error")  # fmt: skip
    ap.add_argument("--split", default="", help="linear kinds whose inputs get outlier channels")
    ap.add_argument("--k", type=int, default=4, help="outlier channels per split input")
    ap.add_argument("--calib", type=int, default=8, help="held-out calibration prompts")
    ap.add_argument("--parity-prompts", type=int, default=0)
    ap.add_argument("--fast", action="store_true", help="int8-row emulation of torchao's linears")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load0, t0 = os.getloadavg(), time.time()
    spec = get_preset(a.preset)
    model = load_model(spec, max_seq_len=256).eval()
    split = tuple(k for k in a.split.split(",") if k)
    quant, share, channels = outlier_quantized(spec, model, split, a.k, a.calib)
    emulation = emulate_torchao(quant) if a.fast else {}
    kinds = tuple(k for k in a.fp32.split(",") if k)
    for name, module in model.named_modules():  # the eager fp32 linear back into the shell
        if name.rsplit(".", 1)[-1] in kinds:
            owner, _, attr = name.rpartition(".")
            setattr(quant.get_submodule(owner), attr, module)
    rows = []
    for p, ids in enumerate(prompt_ids(spec.tokenizer, model.args.vocab_size, n=a.prompts)):
        x, pos = torch.tensor([ids]), torch.arange(len(ids))
        model.reset_cache()
        quant.reset_cache()
        ref, got = model(x, pos)[0], quant(x, pos)[0]
        for i in range(len(ids)):
            rows.append({"prompt": p, "position": i, "max_abs_diff": float((got[i] - ref[i]).abs().max()),
                         "top1_same": int(got[i].argmax()) == int(ref[i].argmax())})  # fmt: skip
    worst = sorted(rows, key=lambda r: -r["max_abs_diff"])[:8]
    checked = {}
    if a.parity_prompts:
        from omnidraft_deploy.checks.parity import eager_step, parity

        model.reset_cache()
        quant.reset_cache()
        ids12 = prompt_ids(spec.tokenizer, model.args.vocab_size, n=a.parity_prompts)
        checked = parity(eager_step(quant), eager_step(model), ids12)
    out = {"preset": a.preset, "share": share.__dict__, "fp32": kinds, "split": split, "k": a.k,
           "calib_prompts": a.calib if split else 0, "parity": checked,
           "fast": a.fast, "emulation_max_rel_diff": emulation,
           "channels": {n: c.tolist() for n, c in channels.items()}, "rows": len(rows),
           "top1": sum(r["top1_same"] for r in rows) / len(rows), "worst": worst,
           "max_abs_diff_excluding_position_0": max(r["max_abs_diff"] for r in rows if r["position"]),
           "seconds": round(time.time() - t0, 1), "load_avg_start": load0,
           "load_avg_end": os.getloadavg()}  # fmt: skip
    write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


def int8_rows(x: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """torchao's dynamic int8 per-token activations (asymmetric, -128..127), dequantised;
    ``groups``: the row cut into that many equal column groups, each with its own scale."""
    if groups > 1:
        return int8_rows(x.unflatten(-1, (groups, -1))).flatten(-2)
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=torch.finfo(torch.float32).eps)
    zero = (-128 - torch.round(lo / scale)).clamp(-128, 127)
    return ((torch.round(x / scale) + zero).clamp(-128, 127) - zero) * scale


class Int8RowsLinear(torch.nn.Module):
    """``int8_rows(x) @ W.T + b`` with ``W`` a torchao weight dequantised once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.groups = 1  # activation scales per row (``benchmarks.gguf4_act_groups``)
        self.smooth: torch.Tensor | None = None  # (K,) x / smooth quantised, weight * smooth
        self.smooth_weight: torch.Tensor | None = None  # an 8-bit weight * smooth re-rounded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.smooth is None:
            return torch.nn.functional.linear(int8_rows(x, self.groups), self.weight, self.bias)
        x = int8_rows(x / self.smooth, self.groups) * self.smooth
        w = self.weight if self.smooth_weight is None else self.smooth_weight
        return torch.nn.functional.linear(x, w, self.bias)


def emulate_torchao(model: torch.nn.Module) -> dict[str, float]:
    """Replace each torchao-quantised ``nn.Linear`` of ``model`` by ``Int8RowsLinear``; returns,
    per linear kind, the largest relative difference from torchao on a random 5-row input."""
    checked: dict[str, float] = {}
    gen = torch.Generator().manual_seed(0)
    for name, m in list(model.named_modules()):
        if not isinstance(m, torch.nn.Linear) or type(m.weight) in (
            torch.Tensor,
            torch.nn.Parameter,
        ):
            continue
        fast = Int8RowsLinear(m.weight.dequantize().float(), m.bias)
        kind = ".".join(name.split(".")[-2:])  # "mlp.gate_proj"; "lm_head" alone
        if kind not in checked:
            x = torch.randn(5, m.in_features, generator=gen)
            want = m(x)
            checked[kind] = float((fast(x) - want).abs().max() / want.abs().max())
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, fast)
    return checked


if __name__ == "__main__":
    main()
