"""Where quantisation loses a real model's top-1: fake-quantised eager probes (minutes, no export).

    .venv/bin/python -m benchmarks.quant_probe --study int4     # which linears int4 can touch
    .venv/bin/python -m benchmarks.quant_probe --study a16      # what uint16 activations break
    .venv/bin/python -m benchmarks.quant_probe --study xnnpack  # 8da8w / 8da4w in eager
    .venv/bin/python -m benchmarks.quant_probe --study xnnpack8 --model qwen2.5-0.5b  # 8da8w fp32 set
    .venv/bin/python -m benchmarks.quant_probe --study w8a8     # per-row int8 activations

Teacher-forced top-1 agreement with the fp32 eager model over the shipped prompts (first 24
tokens each, ``exporters.verify.prompt_ids``); weights dequantised in place (what MatMulNBits
computes, up to its int8 activation rounding). ``a16`` fake-quantises the input of every RMSNorm
(the residual stream) to 16 bits over the range calibrated on held-out text and, optionally,
RMSNorm's ``x^2`` as the decomposed QDQ graph does; ``reference.rotate`` first folds the norm weights
into the next linears and turns the residual stream by a seeded orthogonal matrix (exact in fp32).
Writes ``reports/quant_probe/quant_probe_<study>_<model>.json`` and the ``.md`` rendered from it.
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.exporters.quant.calibration import calibration_ids, calibration_prompts
from omnidraft_deploy.exporters.quant.grids import int4_rtn, per_row_int8, swap_modules
from omnidraft_deploy.exporters.quant.int4_plan import int8_blocks
from omnidraft_deploy.exporters.verify import prompt_ids
from torch import Tensor, nn

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference import model as ref_model
from omnidraft_deploy.reference.rotate import rotated as rotated_model
from omnidraft_deploy.resolve.load import load_model


def fake_quant(x: Tensor, bound: float, bits: int = 16, lo: float | None = None) -> Tensor:
    lo = -bound if lo is None else lo
    s = (bound - lo) / (2**bits - 1)
    return torch.round((x.clamp(lo, bound) - lo) / s) * s + lo


def top1(model: nn.Module, prompts: list[list[int]], ref: list[Tensor]) -> float:
    agree = rows = 0
    with torch.no_grad():
        for p, r in zip(prompts, ref, strict=True):
            out = model.forward_train(torch.tensor([p]))[0]
            agree += int((out.argmax(-1) == r.argmax(-1)).sum())
            rows += len(p)
    return agree / rows


def gptq_row(model: nn.Module, prompts: list[list[int]], ref: list[Tensor], tok: str,
             kinds: list[str]) -> str:  # fmt: skip
    """Every body linear at int4 (block 32) by GPTQ (``exporters.gptq``), Hessians of the fp32
    model's inputs over held-out calibration text."""
    from omnidraft_deploy.exporters.quant.gptq import gptq_int4, input_hessians

    hess = input_hessians(model, calibration_prompts(tok, limit=128), tuple(kinds))
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in m.named_modules():
            if name in hess:
                mod.weight.data = gptq_int4(mod.weight.data.float(), hess[name])
    return f"| int4 all body linears, GPTQ (block 32) | {top1(m, prompts, ref):.3f} |"


def int4_rows(model: nn.Module, prompts: list[list[int]], ref: list[Tensor], tok: str) -> list[str]:
    """int4 (block 32) on one kind of linear at a time, then on all of them (lm_head kept)."""
    kinds = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    rows = []
    for pick in [[k] for k in kinds] + [kinds]:
        m = copy.deepcopy(model)
        with torch.no_grad():
            for name, mod in m.named_modules():
                if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in pick:
                    mod.weight.data = int4_rtn(mod.weight.data.float(), 32)
        rows.append(f"| int4 {'+'.join(pick) if len(pick) == 1 else 'all body linears'} "
                    f"| {top1(m, prompts, ref):.3f} |")  # fmt: skip
    rows.append(gptq_row(model, prompts, ref, tok, kinds))
    for block, down8 in ((16, False), (32, True), (16, True)):  # the cheapest escapes, measured
        m = copy.deepcopy(model)
        with torch.no_grad():
            for name, mod in m.named_modules():
                if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in kinds:
                    w = mod.weight.data.float()
                    eight = down8 and name.endswith("down_proj")
                    mod.weight.data = int8_blocks(w, 32) if eight else int4_rtn(w, block)
        what = f"block {block}" + (", down_proj at int8 (block 32)" if down8 else "")
        rows.append(f"| int4 all body linears, {what} | {top1(m, prompts, ref):.3f} |")
    return rows


def a16_rows(model: nn.Module, prompts: list[list[int]], ref: list[Tensor], tok: str) -> list[str]:
    calib = calibration_prompts(tok, limit=48)
    orig = ref_model.RMSNorm.forward
    rows = []
    for rotated in (False, True):
        m = copy.deepcopy(model)
        if rotated:
            m = rotated_model(m)
        seen = [0.0]

        def record(
            self: nn.Module, x: Tensor, _o: Callable = orig, _s: list[float] = seen
        ) -> Tensor:
            _s[0] = max(_s[0], float(x.abs().max()))
            return _o(self, x)

        ref_model.RMSNorm.forward = record  # type: ignore[method-assign]
        with torch.no_grad():
            for p in calib:
                m.forward_train(torch.tensor([p]))
        bound = seen[0]
        for square in (True, False):

            def fq(self: nn.Module, x: Tensor, _b: float = bound, _sq: bool = square) -> Tensor:
                x32 = fake_quant(x.float(), _b)
                ms = x32.pow(2)
                ms = fake_quant(ms, _b**2, lo=0.0) if _sq else ms
                return self.weight * (x32 * torch.rsqrt(ms.mean(-1, keepdim=True) + self.eps))

            ref_model.RMSNorm.forward = fq  # type: ignore[method-assign]
            what = "residual + x^2" if square else "residual only (fused RmsNorm)"
            rows.append(f"| {'rotated' if rotated else 'plain'}: {what}, range +-{bound:.4g} "
                        f"| {top1(m, prompts, ref):.3f} |")  # fmt: skip
        ref_model.RMSNorm.forward = orig  # type: ignore[method-assign]
    return rows


def xnnpack_rows(
    model: nn.Module, prompts: list[list[int]], ref: list[Tensor], _tok: str
) -> list[str]:
    from omnidraft_deploy.exporters.xnnpack.eager_quant import quantize_eager

    from omnidraft_deploy.catalog.backends import get_recipe

    turned = rotated_model(model)  # the same function, residual outliers spread (QuaRot)
    return [f"| xnnpack {name} (torchao, eager){', rotated' if m is turned else ''} | "
            f"{top1(quantize_eager(m, get_recipe('xnnpack', name)), prompts, ref):.3f} |"
            for name in ("8da8w", "8da4w") for m in (model, turned)]  # fmt: skip


def xnnpack8_rows(
    model: nn.Module, prompts: list[list[int]], ref: list[Tensor], tok: str
) -> list[str]:
    """8da8w with SmoothQuant: which linears to leave in fp32 and which alpha, as max |logit diff|
    / top-1 on held-out text (how the recipe is chosen) and on the verification prompts."""
    import dataclasses

    from omnidraft_deploy.exporters.quant.int4_plan import compare, logits
    from omnidraft_deploy.exporters.quant.smoothquant import activation_absmax, smoothed
    from omnidraft_deploy.exporters.xnnpack.eager_quant import quantize_eager

    from omnidraft_deploy.catalog.backends import get_recipe

    vocab = model.args.vocab_size  # type: ignore[union-attr]
    held = calibration_ids(tok, vocab, 64)
    held_ref = logits(model, held)
    stats = activation_absmax(model, calibration_ids(tok, vocab, 128))  # type: ignore[arg-type]
    down_ov = ("down_proj", "o_proj", "v_proj")
    n_held, rows = sum(map(len, held)), []
    for label, alpha, fp32 in (
        ("down, o, v fp32 (alpha 0.5)", 0.5, down_ov),
        ("down, o, v, q, k fp32 (the recipe)", 0.5, (*down_ov, "q_proj", "k_proj")),
        ("down, o, v and lm_head fp32", 0.5, (*down_ov, "lm_head")),
        ("down, o, v fp32, alpha 0.7", 0.7, down_ov),
        ("down, o, v fp32, alpha 0.3", 0.3, down_ov),
        ("down, o, v, gate, up fp32", 0.5, (*down_ov, "gate_proj", "up_proj")),
    ):
        recipe = dataclasses.replace(get_recipe("xnnpack", "8da8w"), fp32_linears=fp32)
        m = quantize_eager(smoothed(model, stats, alpha), recipe)  # type: ignore[arg-type]
        t_h, d_h = compare(logits(m, held), held_ref)
        t_v, d_v = compare(logits(m, prompts), ref)
        rows.append(f"| {label} | {t_v:.3f} (max diff {d_v:.2f}); held-out text ({n_held} rows): "
                    f"{t_h:.3f} (max diff {d_h:.2f}) |")  # fmt: skip
    return rows


class RowInt8Linear(nn.Module):
    """What ``onnx_fused.GraphWriter.linear_rows`` computes: int8 weights per output row x int8
    activations with one symmetric scale per token, dequantised (fp32 products)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q, s = per_row_int8(linear.weight.detach().float())
        self.weight_q = q.float() * s[:, None]
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        s = x.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 127
        y = (torch.round(x / s) * s) @ self.weight_q.T
        return y if self.bias is None else y + self.bias


def w8a8_rows(model: nn.Module, prompts: list[list[int]], ref: list[Tensor], tok: str) -> list[str]:
    """Per-row int8 activations on every linear incl. lm_head, with and without SmoothQuant
    (``exporters.smoothquant``, calibrated on held-out text), against blockwise int8 (``int8``)."""
    from omnidraft_deploy.exporters.quant.smoothquant import activation_absmax, smoothed

    calib = calibration_prompts(tok, limit=128)
    stats = activation_absmax(model, calib)
    rows = []
    for name, alpha in (("no smoothing", None), ("SmoothQuant alpha 0.5", 0.5),
                        ("SmoothQuant alpha 0.8", 0.8)):  # fmt: skip
        m = copy.deepcopy(model) if alpha is None else smoothed(model, stats, alpha)
        swap_modules(m, nn.Linear, RowInt8Linear)
        rows.append(f"| w8a8 per-row activations, {name} | {top1(m, prompts, ref):.3f} |")
    m = copy.deepcopy(model)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.data = int8_blocks(mod.weight.data.float(), 32)
    rows.append(f"| int8 weights in blocks of 32, fp32 activations | {top1(m, prompts, ref):.3f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--study", choices=["int4", "a16", "xnnpack", "xnnpack8", "w8a8"], required=True
    )
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    spec = get_preset(args.model)
    model = load_model(spec, max_seq_len=256)
    prompts = prompt_ids(spec.tokenizer, spec.vocab_size, n=12, limit=24)
    with torch.no_grad():
        ref = [model.forward_train(torch.tensor([p]))[0] for p in prompts]
    study = {"int4": int4_rows, "a16": a16_rows, "xnnpack": xnnpack_rows,
             "xnnpack8": xnnpack8_rows, "w8a8": w8a8_rows}[args.study]  # fmt: skip
    table = [_cells(line) for line in study(model, prompts, ref, spec.tokenizer)]
    payload = {"meta": run_meta(threads=1, load_avg_start=load0), "study": args.study,
               "model": args.model, "prompts": len(prompts), "rows": sum(map(len, prompts)),
               "table": table}  # fmt: skip
    stem = Path("reports/quant_probe") / f"quant_probe_{args.study}_{args.model}"
    write_report(stem, payload, markdown=to_markdown)
    print(stem.with_suffix(".md").read_text())


def _cells(line: str) -> list[str]:
    """``| variant | result |`` (a study's table row) -> [variant, result]."""
    return line.strip().removeprefix("| ").removesuffix(" |").split(" | ", 1)


def to_markdown(d: dict[str, Any]) -> str:
    lines = [f"# Quantisation probe: {d['study']}, {d['model']}", "", *meta_lines(d["meta"]),
             f"Teacher-forced top-1 vs fp32 eager, {d['prompts']} shipped prompts, {d['rows']} rows.",
             "", "| variant | top-1 |", "|---|---|", *(f"| {v} | {r} |" for v, r in d["table"])]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
