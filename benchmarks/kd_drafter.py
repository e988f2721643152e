"""Measure a drafter distilled on its target's replies; the distillation itself is the product's.

``omnidraft distill`` (issue 48) collects the target's replies and trains the drafter with the
learner ``omnidraft adapt`` uses (``distill.adapt.learn_replies``). This benchmark keeps what the
product does not do:

1. ``train``: the same learner on a replies file given here (the committed
   ``reports/kd_drafter/replies.jsonl``, collected by this benchmark's former ``teach`` step
   without the target's top-k, so every reply token is a hard label: sequence-level KD; or a
   ``distill.replies.jsonl`` of ``omnidraft distill --teach-only``, with the top-k), from the
   drafter preset's weights. It writes a Hugging Face folder (``drafter-hf/``: config.json +
   model.safetensors) that ``omnidraft-export --drafter-model`` takes, and the held-out agreement
   before and after (the product's split: 10% of the replies by a hash of their key).
2. ``agree``: on the real-pair benchmark prompts (never trained on), the bundle's target decodes
   greedily and the base and distilled drafters (eager fp32, the same code for both) are
   classified teacher-forced at every position as ``benchmarks.agreement`` does.

    omnidraft distill bundles/q15 --teach-only --replies 1000 --state .bench/kd/q15-state
    python -m benchmarks.kd_drafter train --replies reports/kd_drafter/replies.jsonl --name q15i \
        --epochs 2 --lr 5e-5 --train-layers 10 --max-len 224 --seqkd 0
    python -m benchmarks.kd_drafter agree --bundle bundles/q15 --drafter smollm2-135m --name q15i

Report: ``reports/local/kd_drafter/<name>.{json,md}`` (command, revision, machine, load average);
one a page cites is folded into ``reports/kd_drafter/runs.json`` as a row
(``python -m benchmarks.common.runs_index reports/kd_drafter <json>``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import open_bundle
from tqdm import tqdm

from benchmarks.agreement import CLASSES, drafter_classes, target_greedy
from benchmarks.common.pair import prompt_texts
from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, learn_replies
from omnidraft_deploy.distill.replies import Reply, request_key
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat

WORK, OUT = Path(".bench/kd"), Path("reports/local/kd_drafter")


def _replies(path: Path, only: str | None) -> list[Reply]:
    """The replies of ``path``: ``omnidraft distill``'s records, or this benchmark's older ones
    (``set``, ``task``, ``text``, ``prompt``, ``reply``: no key, no top-k), keyed as distill keys
    a chat request of 96 tokens; ``only``: the older records of that ``set``."""
    out = []
    for line in path.read_text("utf-8").splitlines():
        row = json.loads(line)
        if "key" in row:
            out.append(Reply(**row))
        elif only is None or row.get("set") == only:
            key = request_key(row["task"], row["text"], 96, True)
            out.append(Reply(key, row["task"], row["text"], f"kd_drafter:{row.get('set')}",
                             row["prompt"], row["reply"]))  # fmt: skip
    return list({r.key: r for r in out}.values())  # a request answered twice: the last answer


def _save_hf(model: torch.nn.Module, spec: Any, out: Path) -> None:
    from safetensors.torch import save_file

    from omnidraft_deploy.catalog.assets import asset_path
    from omnidraft_deploy.reference.hf_adapter import gguf_to_hf_folder

    base, _ = gguf_to_hf_folder(asset_path(spec.gguf_asset))
    stage = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    config = json.loads((base / "config.json").read_text())
    config["num_hidden_layers"] = len(model.model.layers)  # type: ignore[union-attr, arg-type]
    (stage / "config.json").write_text(json.dumps(config, indent=2))  # a truncated drafter too
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not k.startswith(("rope_", "kv_cache_")) and k != "lm_head.weight"}  # fmt: skip
    save_file(state, str(stage / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)


def train(a: argparse.Namespace) -> None:
    from omnidraft_deploy.resolve.load import load_model
    from omnidraft_deploy.vocab.pair import load_pair_vocab

    torch.set_num_threads(a.threads)
    load0, t0 = os.getloadavg(), time.time()
    spec = get_preset(a.drafter)
    mapper = load_pair_vocab(get_preset(a.target), spec).mapper
    replies = _replies(Path(a.replies), a.set)
    model = load_model(spec, max_seq_len=a.max_len)
    if a.keep_layers:  # a shallower drafter: the preset's first blocks (benchmarks/drafter_depth)
        from omnidraft_deploy.reference.truncate import truncate_layers

        model = truncate_layers(model, a.keep_layers, max_seq_len=a.max_len)
    cfg = AdaptConfig(lr=a.lr, lam=a.lam, seqkd=a.seqkd, batch_size=a.batch_size,
                      steps_per_update=1, seq_len=a.max_len, train_layers=a.train_layers,
                      guard=False)  # fmt: skip
    bar = lambda r: tqdm(r, desc="train", unit="step", mininterval=10)  # noqa: E731
    got = learn_replies(model, mapper, replies, cfg, epochs=a.epochs, progress=bar)
    print(f"train: held-out agreement {got.before:.3f} -> {got.after:.3f}", flush=True)
    _save_hf(model, spec, WORK / a.name / "drafter-hf")
    losses = got.report.losses
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "rows": got.train_replies,
               "held_out_rows": got.held_replies, "replies_file": a.replies,
               "config": dataclasses.asdict(cfg) | {"epochs": a.epochs},
               "layers": len(model.model.layers), "held_out_agreement_before": got.before,
               "held_out_agreement_after": got.after, "seconds": round(time.time() - t0, 1),
               "loss_first_20": sum(losses[:20]) / max(1, len(losses[:20])),
               "loss_last_20": sum(losses[-20:]) / max(1, len(losses[-20:])),
               "losses": losses}  # fmt: skip
    write_report(OUT / f"{a.name}_train", payload, markdown=_train_md)


def agree(a: argparse.Namespace) -> None:
    from omnidraft_deploy.resolve.load import load_model

    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    b = open_bundle(a.bundle, threads=a.threads)
    ttok = load_bundle_tokenizer(b.root, "target", b.manifest.files)
    dtok = load_bundle_tokenizer(b.root, "drafter", b.manifest.files)
    spec, kd = get_preset(a.drafter), str(WORK / a.name / "drafter-hf")
    drafters = {
        "base": EagerLM(load_model(spec, max_seq_len=1024)),
        "distilled": EagerLM(load_model(spec, max_seq_len=1024, weights=kd)),
    }
    counts: dict[str, dict[str, collections.Counter[str]]] = {
        k: collections.defaultdict(collections.Counter) for k in drafters
    }
    for task in dict.fromkeys(q["task"] for q in prompt_texts(code_edit=True)):
        texts = [q["text"] for q in prompt_texts(code_edit=True) if q["task"] == task]
        for text in texts[: a.per_task]:
            prompt = ttok.encode(render_chat(getattr(ttok, "chat_template", None), text))
            out = target_greedy(b.target, prompt, a.max_new_tokens, b.mapper.target_vocab_size)
            for name, d in drafters.items():
                counts[name][task].update(drafter_classes(d, b.mapper, dtok, ttok, prompt, out))
            print(task, {k: round(c[task]["match"] / max(1, sum(c[task].values())), 2)
                         for k, c in counts.items()}, flush=True)  # fmt: skip
    shares = {}
    for name, by_task in counts.items():
        by_task["overall"] = sum(by_task.values(), collections.Counter())
        shares[name] = {
            t: {c: n[c] / max(1, sum(n.values())) for c in CLASSES} for t, n in by_task.items()
        }
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "bundle": a.bundle,
               "shares": shares, "positions": {t: sum(n.values()) for t, n in counts["base"].items()}}  # fmt: skip
    write_report(OUT / f"{a.name}_agree", payload, markdown=_agree_md)


def _train_md(p: dict[str, Any]) -> str:
    return "\n".join([f"# Drafter distilled on the target's replies: training ({p['rows']} rows)", "",
                      *meta_lines(p["meta"]), "",
                      f"- held-out replies ({p['held_out_rows']}): agreement "
                      f"{p['held_out_agreement_before']:.3f} -> {p['held_out_agreement_after']:.3f}",
                      f"- loss: first 20 steps {p['loss_first_20']:.3f}, last 20 {p['loss_last_20']:.3f}",
                      f"- config: {p['config']}; {p['seconds']} s", ""])  # fmt: skip


def _agree_md(p: dict[str, Any]) -> str:
    lines = [f"# Agreement on the benchmark prompts, base vs distilled drafter ({p['bundle']})", "",
             *meta_lines(p["meta"]), "", "| task | positions | base match | distilled match | "
             "base disagree | distilled disagree |", "|---|---|---|---|---|---|"]  # fmt: skip
    for t, n in p["positions"].items():
        base, kd = p["shares"]["base"][t], p["shares"]["distilled"][t]
        lines.append(f"| {t} | {n} | {base['match']:.2f} | {kd['match']:.2f} | "
                     f"{base['disagree']:.2f} | {kd['disagree']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("train", "agree"):
        s = sub.add_parser(name)
        s.add_argument("--name", default="q15")
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--drafter", default="smollm2-135m")
        s.add_argument("--target", default="qwen2.5-1.5b")
    r = sub.choices["train"]
    r.add_argument("--replies", default="reports/kd_drafter/replies.jsonl", help="replies file")
    r.add_argument("--set", help="older records: only this set (default: every reply)")
    r.add_argument("--epochs", type=float, default=2)
    r.add_argument("--lr", type=float, default=5e-5)
    r.add_argument("--lam", type=float, default=1.0, help="L_DM + lam * L_Ngram")
    r.add_argument("--seqkd", type=float, default=0.0, help="weight of the hard-label term")
    r.add_argument("--batch-size", type=int, default=1, help="replies a step")
    r.add_argument("--max-len", type=int, default=256, help="drafter ids per row (context cut)")
    r.add_argument("--train-layers", type=int, default=0, help="0: every parameter")
    r.add_argument("--keep-layers", type=int, default=0, help="keep the first N blocks (0: all)")
    g = sub.choices["agree"]
    g.add_argument("--bundle", required=True)
    g.add_argument("--per-task", type=int, default=2)
    g.add_argument("--max-new-tokens", type=int, default=64)
    a = p.parse_args(argv)
    {"train": train, "agree": agree}[a.cmd](a)


if __name__ == "__main__":
    main()
