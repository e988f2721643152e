"""Distil the bundle's drafter on its target's own chat replies, then measure agreement (issue 26).

Three steps, each resumable from the files of the one before (``.bench/kd/<name>/``):

1. ``teach``: requests in the five benchmark shapes from the offline corpus's training split
   (``common.chat_kd.request_texts``; never a benchmark prompt), rendered with the target's chat
   template, answered greedily by the teacher: ``--teacher bundle`` (the bundle's own target
   graph, what the drafter is verified against) or ``--teacher llamacpp --gguf F`` (llama.cpp on
   the GGUF the target was exported from: same weights, ~1.7x faster here, not bit-identical).
   Writes ``replies.jsonl`` (rewritten atomically every 10 replies, so a stop loses little).
2. ``train``: the drafter's preset weights, every parameter trained on the replies as the decoder
   feeds them (``chat_kd.kd_row``: prompt and reply spelled in drafter ids); 10% of the replies
   are kept back and their teacher-forced agreement is reported before and after. Writes a
   Hugging Face folder (``drafter-hf/``: config.json + model.safetensors) that
   ``omnidraft-export --drafter-model`` takes.
3. ``agree``: on the real-pair benchmark prompts (never trained on), the bundle's target decodes
   greedily and the base and distilled drafters (eager fp32, the same code for both) are
   classified teacher-forced at every position as ``benchmarks.agreement`` does.

    python -m benchmarks.kd_drafter teach --bundle bundles/q15-byom --teacher llamacpp \
        --gguf Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf --per-task 40 --max-new-tokens 96
    python -m benchmarks.kd_drafter train --drafter smollm2-135m --target qwen2.5-1.5b
    python -m benchmarks.kd_drafter agree --bundle bundles/q15-byom --drafter smollm2-135m

Report: ``reports/local/kd_drafter/<name>.{json,md}`` (command, revision, machine, load average);
one a page cites is folded into ``reports/kd_drafter/runs.json`` as a row
(``python -m benchmarks.common.runs_index reports/kd_drafter <json>``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from omnidraft_deploy.runtime.bundle import open_bundle

from benchmarks.agreement import CLASSES, drafter_classes, target_greedy
from benchmarks.common import chat_kd
from benchmarks.common.pair import prompt_texts
from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.data import DataConfig, build_corpus, split
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat

WORK, OUT = Path(".bench/kd"), Path("reports/local/kd_drafter")


def _requests(per_task: int, seed: int) -> list[tuple[str, str]]:
    import sysconfig

    cfg = DataConfig()
    train, _ = split(build_corpus(cfg), cfg.heldout_frac)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p.read_text("utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:120]]
    bench = {q["text"] for q in prompt_texts(code_edit=True)}
    got = [r for r in chat_kd.request_texts(train, sources, per_task, seed) if r[1] not in bench]
    by_task = [[r for r in got if r[0] == t] for t in chat_kd.TASKS]
    return [r[i] for i in range(per_task) for r in by_task if i < len(r)]  # tasks in turn


def _teacher(a: argparse.Namespace, root: Path) -> Any:
    if a.teacher == "bundle":  # the graphs are opened only for this teacher (~3 GB for the 1.5B)
        b = open_bundle(root, threads=a.threads)
        vocab = b.mapper.target_vocab_size
        return lambda ids: target_greedy(b.target, ids, a.max_new_tokens, vocab)
    from benchmarks.common.peers import llamacpp_method

    run = llamacpp_method(Path(a.gguf), a.threads, a.max_new_tokens)
    return lambda ids: run(ids)[0]


def teach(a: argparse.Namespace) -> None:
    from omnidraft_deploy.bundle.folder import verify_bundle

    root = Path(a.bundle)
    tok = load_bundle_tokenizer(root, "target", verify_bundle(root).files)
    eos = set(tok.eos_ids)
    answer = _teacher(a, root)
    path = WORK / a.name / ("replies-rev.jsonl" if a.reverse else "replies.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    todo = _requests(a.per_task, a.seed)[:: -1 if a.reverse else 1][len(done) :]
    t0 = time.time()
    for i, (task, text) in enumerate(todo):
        prompt = tok.encode(render_chat(getattr(tok, "chat_template", None), text))
        reply = answer(prompt)
        reply = reply[: next((j for j, t in enumerate(reply) if t in eos), len(reply))]
        done.append({"task": task, "text": text, "prompt": prompt, "reply": reply})
        if (i + 1) % 10 == 0 or i + 1 == len(todo):
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in done))
            n = sum(len(r["reply"]) for r in done)
            print(f"teach: {len(done)} replies, {n} tokens, {time.time() - t0:.0f} s", flush=True)


def _rows(a: argparse.Namespace) -> tuple[list[chat_kd.KDRow], list[chat_kd.KDRow]]:
    from omnidraft_deploy.vocab.pair import load_pair_vocab

    mapper = load_pair_vocab(get_preset(a.target), get_preset(a.drafter)).mapper
    replies: dict[str, dict[str, Any]] = {}  # text -> reply, both teach directions
    for path in sorted((WORK / a.name).glob("replies*.jsonl")):
        replies |= {(r := json.loads(x))["text"]: r for x in path.read_text().splitlines()}
    rows = [
        chat_kd.kd_row(mapper, r["prompt"], r["reply"], a.max_len)
        for r in replies.values()
        if r["reply"]
    ]
    held = [r for i, r in enumerate(rows) if i % 10 == 9]
    return [r for i, r in enumerate(rows) if i % 10 != 9], held


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

    torch.set_num_threads(a.threads)
    load0, t0 = os.getloadavg(), time.time()
    spec = get_preset(a.drafter)
    rows, held = _rows(a)
    model = load_model(spec, max_seq_len=a.max_len)
    if a.keep_layers:  # a shallower drafter: the preset's first blocks (benchmarks/drafter_depth)
        from omnidraft_deploy.reference.truncate import truncate_layers

        model = truncate_layers(model, a.keep_layers, max_seq_len=a.max_len)
    before = chat_kd.reply_agreement(model, held)
    print(f"train: {len(rows)} rows, {sum(len(r.ids) - r.start for r in rows)} reply ids; "
          f"held-out agreement before {before:.3f}", flush=True)  # fmt: skip
    cfg = chat_kd.TrainConfig(epochs=a.epochs, lr=a.lr, train_layers=a.train_layers)
    losses = chat_kd.train_on_replies(model, rows, cfg)
    after = chat_kd.reply_agreement(model, held)
    _save_hf(model, spec, WORK / a.name / "drafter-hf")
    payload = {"meta": run_meta(threads=a.threads, load_avg_start=load0), "rows": len(rows),
               "held_out_rows": len(held), "config": cfg.__dict__,
               "layers": len(model.model.layers), "held_out_agreement_before": before,
               "held_out_agreement_after": after, "seconds": round(time.time() - t0, 1),
               "loss_first_20": sum(losses[:20]) / 20, "loss_last_20": sum(losses[-20:]) / 20,
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
    for name in ("teach", "train", "agree"):
        s = sub.add_parser(name)
        s.add_argument("--name", default="q15")
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--drafter", default="smollm2-135m")
        s.add_argument("--target", default="qwen2.5-1.5b")
    t = sub.choices["teach"]
    t.add_argument("--bundle", required=True)
    t.add_argument("--teacher", choices=("bundle", "llamacpp"), default="bundle")
    t.add_argument("--gguf", help="with --teacher llamacpp: the target's GGUF")
    t.add_argument("--per-task", type=int, default=40)
    t.add_argument("--max-new-tokens", type=int, default=96)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--reverse", action="store_true", help="from the last request back, into "
                   "replies-rev.jsonl: a second teacher process beside the first")  # fmt: skip
    r = sub.choices["train"]
    r.add_argument("--epochs", type=int, default=2)
    r.add_argument("--lr", type=float, default=3e-5)
    r.add_argument("--max-len", type=int, default=256, help="drafter ids per row (context cut)")
    r.add_argument("--train-layers", type=int, default=0, help="0: every parameter")
    r.add_argument("--keep-layers", type=int, default=0, help="keep the first N blocks (0: all)")
    g = sub.choices["agree"]
    g.add_argument("--bundle", required=True)
    g.add_argument("--per-task", type=int, default=2)
    g.add_argument("--max-new-tokens", type=int, default=64)
    a = p.parse_args(argv)
    if a.cmd == "teach" and a.teacher == "llamacpp" and not a.gguf:
        p.error("--teacher llamacpp needs --gguf")
    {"teach": teach, "train": train, "agree": agree}[a.cmd](a)


if __name__ == "__main__":
    main()
