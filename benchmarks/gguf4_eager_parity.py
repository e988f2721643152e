"""Eager ``gguf4`` (XNNPACK numerics in PyTorch: torchao int8 per-token activations) vs the fp32
reference, per prompt position: where the largest logit differences sit.

    flock /tmp/omnidraft-bigmem.lock python -m benchmarks.gguf4_eager_parity --preset qwen2.5-1.5b \
        --prompts 3 --out reports/xnnpack_gguf4/eager_rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from omnidraft_deploy.bundle.atomic import write_text_atomic


@torch.inference_mode()
def main() -> None:
    from omnidraft_deploy.exporters.verify import prompt_ids
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import gguf_file, gguf_quantized

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fp32", default="", help="linear kinds (e.g. down_proj) put back at fp32: "
                    "which linears' int8 activations carry the error")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load0, t0 = os.getloadavg(), time.time()
    spec = get_preset(a.preset)
    model = load_model(spec, max_seq_len=256).eval()
    quant, share = gguf_quantized(model, gguf_file(spec))
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
    out = {"preset": a.preset, "share": share.__dict__, "fp32": kinds, "rows": len(rows),
           "top1": sum(r["top1_same"] for r in rows) / len(rows), "worst": worst,
           "max_abs_diff_excluding_position_0": max(r["max_abs_diff"] for r in rows if r["position"]),
           "seconds": round(time.time() - t0, 1), "load_avg_start": load0,
           "load_avg_end": os.getloadavg()}  # fmt: skip
    write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
