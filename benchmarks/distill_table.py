"""Paper-style online-distillation table + drift experiment on pre-trained tiny real-vocab models.

Rows: no training, L_DM (lam = 0), L_DM + lam * L_Ngram. Columns: math, code, instruction,
summarisation (held-out documents of ``omnidraft_deploy.distill.data``). Per task and row: start from
the same pre-trained Llama-2-vocabulary drafter, stream ``n_adapt`` adaptation prompts through the
speculative decoder (greedy, real target, observer = ``OnlineDistiller``, ``update()`` after every
prompt), then measure acceptance rate and mean tokens per target call on ``n_eval`` other held-out
prompts with a fresh n-gram cache. Training runs the PyTorch step (``Transformer.forward_train``);
its parity with the exported ExecuTorch/ONNX steps is tested in tests/exporters.

Drift: one stream whose task switches half-way (math -> code by default); acceptance per prompt of
the frozen drafter vs the online one, plotted to reports/distill_table/distill_drift.png.

    .venv/bin/python -m benchmarks.distill_table [--n-adapt 24 --n-eval 6 --tasks math,code]
Writes reports/distill_table/distill_table.{json,md} and distill_drift.png beside them.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.common.evaluate import EvalSettings, answer_prefix, evaluate_drafter
from benchmarks.common.pair import load_pair
from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, adapt_stream, make_distiller
from omnidraft_deploy.distill.data import TASKS, build_corpus, split
from omnidraft_deploy.distill.pretrain import pretrain_config
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.factory import build_decoder
from omnidraft_deploy.vocab.mapper import VocabMapper
from omnidraft_deploy.vocab.tokenizers import load_tokenizer

log = logging.getLogger("distill_table")


@dataclass(frozen=True)
class TableConfig:
    drafter: str = "trained-llama2-drafter"
    target: str = "trained-llama3-target"
    tasks: tuple[str, ...] = TASKS
    n_adapt: int = 24  # adaptation prompts per task (online phase)
    n_eval: int = 6  # held-out evaluation prompts per task
    prompt_tokens: int = 24  # target tokens of each held-out document used as the prompt
    max_new_tokens: int = 32
    draft_len: int = 4
    lam: float = 1.0
    lr: float = 2e-3  # AdamW
    batch_size: int = 4
    steps_per_update: int = 4
    seq_len: int = 96
    out_dir: str = "reports/distill_table"
    onnx_row: bool = True  # extra row trained through the exported ONNX train step
    sgd_lr: float = 0.01  # SGD learning rate of that row (0.05 diverges, 0.02 overfits)
    drift: tuple[str, ...] = ("math", "code")  # empty: no drift run


@dataclass
class Setup:
    target: Transformer
    drafter: Transformer
    mapper: VocabMapper
    prompts: dict[str, list[list[int]]]  # task -> target-id prompts (adaptation then eval)


def make_prompts(cfg: TableConfig, target_name: str) -> dict[str, list[list[int]]]:
    """Held-out prompts per task: up to the answer marker (<= 200 tokens), else the first
    ``prompt_tokens`` tokens of the document."""
    pcfg = pretrain_config(get_preset(target_name))
    tok = load_tokenizer(pcfg.tokenizer)
    _, held = split(build_corpus(pcfg.data), pcfg.data.heldout_frac)
    bos = [tok.bos_id] if tok.bos_id is not None else []
    out = {}
    for task in cfg.tasks:
        prompts = []
        for doc in held[task]:
            head = answer_prefix(doc)  # the prompt ends where the answer starts
            ids = bos + tok.encode(head) if head is not None else []
            if not 4 <= len(ids) <= 200:
                ids = (bos + tok.encode(doc))[: cfg.prompt_tokens]
            if len(ids) >= 4:
                prompts.append(ids)
        out[task] = prompts[: cfg.n_adapt + cfg.n_eval]
        if len(out[task]) < cfg.n_adapt + cfg.n_eval:
            log.warning("%s: only %d held-out prompts", task, len(out[task]))
    return out


def split_prompts(prompts: list[list[int]], cfg: TableConfig) -> tuple[list, list]:
    """(adaptation, evaluation); evaluation keeps >= 1/3 of a short list."""
    n_eval = min(cfg.n_eval, max(1, len(prompts) // 3))
    return prompts[: len(prompts) - n_eval][: cfg.n_adapt], prompts[len(prompts) - n_eval :]


def load_setup(cfg: TableConfig, target_name: str | None = None) -> Setup:
    target_name = target_name or cfg.target
    pair = load_pair(target_name, cfg.drafter)
    return Setup(pair.target, pair.drafter, pair.mapper, make_prompts(cfg, target_name))


def _decoder(setup: Setup, drafter: Transformer, cfg: TableConfig) -> SpeculativeDecoder:
    return build_decoder(EagerLM(setup.target), EagerLM(drafter), setup.mapper, policy="fixed",
                         draft_len=cfg.draft_len, ngram_cache=NGramCache(), stop_at_eos=False,
                         config=DecodeConfig(max_new_tokens=cfg.max_new_tokens))  # fmt: skip


def evaluate(
    setup: Setup,
    drafter: Transformer,
    prompts: list[list[int]],
    cfg: TableConfig,
) -> dict[str, float]:
    """Acceptance and target tokens per call on ``prompts`` (one fresh n-gram cache for the
    whole stream)."""
    settings = EvalSettings(draft_len=cfg.draft_len, max_new_tokens=cfg.max_new_tokens)
    figs, _ = evaluate_drafter(EagerLM(setup.target), drafter, setup.mapper, prompts, settings,
                               teacher_forced=False)  # fmt: skip
    keep = ("acceptance_rate", "tokens_per_target_call", "accepted", "proposed")
    return {k: figs[k] for k in keep}


def adapt_config(cfg: TableConfig, lam: float, *, sgd: bool = False) -> AdaptConfig:
    """The library's settings for one row (``sgd``: the exported train step's, batch 1). Without
    the held-out guard: the exported step runs outside ``OnlineDistiller.update``, and the
    table compares the two learners step for step."""
    if sgd:
        return AdaptConfig(lr=cfg.sgd_lr, lam=lam, batch_size=1, optimizer="sgd",
                           steps_per_update=cfg.steps_per_update * cfg.batch_size,
                           seq_len=cfg.seq_len, guard=False)  # fmt: skip
    return AdaptConfig(lr=cfg.lr, lam=lam, batch_size=cfg.batch_size,
                       steps_per_update=cfg.steps_per_update, seq_len=cfg.seq_len,
                       guard=False)  # fmt: skip


def adapt(
    setup: Setup,
    drafter: Transformer,
    prompts: list[list[int]],
    cfg: TableConfig,
    lam: float,
) -> tuple[list[float], int]:
    """Online phase (``distill.adapt.adapt_stream``): decode each prompt with the learner as
    observer, update after each. Returns (acceptance per prompt, optimiser steps taken)."""
    dist = make_distiller(drafter, setup.mapper, adapt_config(cfg, lam))
    report = adapt_stream(_decoder(setup, drafter, cfg), dist, prompts)
    return report.acceptance, report.optimizer_steps


def adapt_onnx(
    setup: Setup, drafter: Transformer, prompts: list[list[int]], cfg: TableConfig, workdir: Path
) -> int:
    """The same loop, each update through the exported functional ONNX train step (plain SGD,
    B = 1, ``--sgd-lr``): ``steps_per_update * batch_size`` single-example steps in ONNX Runtime,
    then the weights are loaded into the decoder's drafter."""
    import onnxruntime as ort  # noqa: PLC0415
    from omnidraft_deploy.exporters.training_graph import (  # noqa: PLC0415
        TrainStepConfig,
        export_onnx_train_step,
        run_onnx_step,
    )

    acfg = adapt_config(cfg, cfg.lam, sgd=True)
    path = export_onnx_train_step(
        drafter, TrainStepConfig(seq_len=cfg.seq_len, topk=8), workdir / "drafter_train_step.onnx"
    )
    sess = ort.InferenceSession(str(path))
    dist = make_distiller(drafter, setup.mapper, acfg)
    params = {n: p.detach().clone() for n, p in drafter.named_parameters()}

    def onnx_update() -> int:
        nonlocal params
        steps = 0
        for _ in range(acfg.steps_per_update):
            batch, dm_rows, spans = dist.make_batch(dist.buffer.sample(1))
            if dm_rows or spans:
                _, params = run_onnx_step(sess, params, batch, lr=acfg.lr, lam=acfg.lam)
                steps += 1
        drafter.load_state_dict(params, strict=False)
        return steps

    return adapt_stream(
        _decoder(setup, drafter, cfg), dist, prompts, update=onnx_update
    ).optimizer_steps


def run_table(setup: Setup, cfg: TableConfig) -> dict[str, dict[str, dict[str, float]]]:
    hybrid = f"L_DM + {cfg.lam:g} L_Ngram"
    rows: dict[str, dict[str, dict[str, float]]] = {"no training": {}, "L_DM": {}, hybrid: {}}
    if cfg.onnx_row:
        rows[hybrid + " (ONNX train step, SGD)"] = {}
    for task in cfg.tasks:
        prompts = setup.prompts[task]
        adapt_p, eval_p = split_prompts(prompts, cfg)
        t0 = time.perf_counter()
        rows["no training"][task] = evaluate(setup, setup.drafter, eval_p, cfg)
        for row, lam in (("L_DM", 0.0), (f"L_DM + {cfg.lam:g} L_Ngram", cfg.lam)):
            drafter = copy.deepcopy(setup.drafter)
            _, steps = adapt(setup, drafter, adapt_p, cfg, lam)
            rows[row][task] = {**evaluate(setup, drafter, eval_p, cfg), "online_steps": steps}
        if cfg.onnx_row:
            drafter = copy.deepcopy(setup.drafter)
            with tempfile.TemporaryDirectory() as tmp:
                steps = adapt_onnx(setup, drafter, adapt_p, cfg, Path(tmp))
            rows[hybrid + " (ONNX train step, SGD)"][task] = {
                **evaluate(setup, drafter, eval_p, cfg),
                "online_steps": steps,
            }
        log.info(
            "%s done in %.0f s: %s",
            task,
            time.perf_counter() - t0,
            {r: round(v[task]["acceptance_rate"], 3) for r, v in rows.items()},
        )
    return rows


def run_drift(setup: Setup, cfg: TableConfig) -> dict[str, list]:
    a, b = cfg.drift
    n = cfg.n_adapt + cfg.n_eval
    stream = setup.prompts[a][:n] + setup.prompts[b][:n]
    dec = _decoder(setup, setup.drafter, cfg)  # one n-gram cache over the stream, as in adapt()
    frozen = [dec.generate(p)[1].acceptance_rate for p in stream]
    online, _ = adapt(setup, copy.deepcopy(setup.drafter), stream, cfg, cfg.lam)
    return {
        "stream": [a] * min(n, len(setup.prompts[a])) + [b] * min(n, len(setup.prompts[b])),
        "frozen": frozen,
        "online": online,
    }


def plot_drift(drift: dict[str, list], path: Path, title: str) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    for key in ("frozen", "online"):
        ax.plot(drift[key], marker="o", ms=3, label=f"{key} drafter")
    switch = drift["stream"].index(drift["stream"][-1])
    ax.axvline(switch - 0.5, color="grey", ls="--", label=f"task switch -> {drift['stream'][-1]}")
    ax.set(xlabel="prompt index in stream", ylabel="acceptance rate", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def plot(result: dict, path: Path) -> None:
    """The drift plot (``distill_drift.png`` beside the table), when the run had a drift."""
    if "drift" in result:
        cfg = result["config"]
        plot_drift(result["drift"], path.with_name("distill_drift.png"),
                   f"task drift {cfg['drift'][0]} -> {cfg['drift'][1]}, target {cfg['target']}")  # fmt: skip


def to_markdown(result: dict) -> str:
    cfg, rows = result["config"], result["table"]
    tasks = list(next(iter(rows.values())))
    lines = [
        f"# Online distillation: {cfg['drafter']} -> {cfg['target']}",
        "",
        *(meta_lines(result["meta"]) if "meta" in result else []),
        "acceptance rate / mean tokens per target call, greedy, draft_len "
        f"{cfg['draft_len']}, {cfg['n_adapt']} adaptation prompts then {cfg['n_eval']} "
        "held-out eval prompts per task (PyTorch train step).",
        "",
        "| row | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for row, by_task in rows.items():
        cells = [
            f"{v['acceptance_rate']:.3f} / {v['tokens_per_target_call']:.2f}"
            for v in by_task.values()
        ]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if "drift" in result:
        d = result["drift"]
        half = d["stream"].index(d["stream"][-1])
        for key in ("frozen", "online"):
            seg = d[key]
            lines.append(
                f"\nDrift {key}: mean acceptance before switch "
                f"{sum(seg[:half]) / max(half, 1):.3f}, after "
                f"{sum(seg[half:]) / max(len(seg) - half, 1):.3f}"
            )
    lines.append(f"\nwall time: {result['wall_s']:.0f} s")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> TableConfig:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=TableConfig.target)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--n-adapt", type=int, default=TableConfig.n_adapt)
    ap.add_argument("--n-eval", type=int, default=TableConfig.n_eval)
    ap.add_argument("--max-new-tokens", type=int, default=TableConfig.max_new_tokens)
    ap.add_argument("--lam", type=float, default=TableConfig.lam)
    ap.add_argument("--lr", type=float, default=TableConfig.lr)
    ap.add_argument("--steps-per-update", type=int, default=TableConfig.steps_per_update)
    ap.add_argument("--out-dir", default=TableConfig.out_dir)
    ap.add_argument("--no-drift", action="store_true")
    ap.add_argument("--no-onnx-row", action="store_true")
    ap.add_argument("--sgd-lr", type=float, default=TableConfig.sgd_lr)
    a = ap.parse_args(argv)
    return TableConfig(
        target=a.target,
        tasks=tuple(a.tasks.split(",")),
        n_adapt=a.n_adapt,
        n_eval=a.n_eval,
        max_new_tokens=a.max_new_tokens,
        lam=a.lam,
        lr=a.lr,
        steps_per_update=a.steps_per_update,
        out_dir=a.out_dir,
        onnx_row=not a.no_onnx_row,
        sgd_lr=a.sgd_lr,
        drift=() if a.no_drift else TableConfig.drift,
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = parse_args(argv)
    torch.manual_seed(0)
    t0, load0 = time.perf_counter(), os.getloadavg()
    setup = load_setup(cfg)
    result: dict = {"config": asdict(cfg), "table": run_table(setup, cfg)}
    if cfg.drift:
        result["drift"] = run_drift(setup, cfg)
    result["wall_s"] = time.perf_counter() - t0
    result["meta"] = run_meta(threads=torch.get_num_threads(), argv=argv, load_avg_start=load0)
    stem = Path(cfg.out_dir) / "distill_table"
    write_report(stem, result, markdown=to_markdown, plot=plot)
    log.info("wrote %s\n%s", stem.with_suffix(".md"), to_markdown(result))


if __name__ == "__main__":
    torch.set_num_threads(1)  # small matmuls: one thread is faster on a shared 2-core CPU
    main()
