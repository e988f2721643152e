"""Offline hybrid-loss distillation of an early-exit drafter against a real target (CPU minutes).

Recipe (``presets.EarlyExitRecipe``; the preset's ``source`` is ``early_exit``):

1. **Windows.** The training split of the offline corpus (``distill.data``) is tokenised with the
   *target's* tokenizer, one stream per task (``pretrain.tokenize_corpus``); ``windows_per_task``
   windows of ``window`` target tokens are cut at evenly spaced offsets.
2. **Target top-k, once.** The target runs each window teacher-forced (``forward_train``); the
   top-``k`` ids and probabilities of its next-token distribution at every position are kept and
   cached as safetensors (``<cache>/distill/topk-<key>``, key = target preset + windows + corpus
   hash): the expensive 0.5B forward passes happen once per corpus, not once per training run.
3. **Rows.** Each window becomes one ``align.build_example`` (context = its first token, committed
   tokens = the rest, the target's top-k at each): exactly the rows the online learner builds from
   traffic, so offline and online training optimise the same ``L_DM + lam * L_Ngram``
   (``losses.hybrid_loss_rows``).
4. **Train.** The truncated drafter (``reference.truncate``) is trained with AdamW, linear warmup
   and cosine decay; only its last ``train_layers`` blocks and the final norm move (the token
   embedding tied to the lm_head, and the earlier blocks, stay frozen: on 2 shared cores a step
   through all 8 blocks took ~75 s). The trained tensors are cached
   (``<cache>/distill/<name>-<key>.safetensors``, key = recipe + both presets + corpus hash).

``load_early_exit`` is what ``resolve.load.load_model`` calls for ``early_exit`` presets.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from omnidraft_deploy.catalog.presets import EarlyExitRecipe, ModelSpec, Source
from omnidraft_deploy.distill.align import (
    DistillExample,
    MapperLike,
    build_example,
    dm_inverse,
    stack_examples,
)
from omnidraft_deploy.distill.data import DataConfig, build_corpus, corpus_hash, split
from omnidraft_deploy.distill.losses import hybrid_loss_rows
from omnidraft_deploy.host.threads import FreeCoreThreads
from omnidraft_deploy.reference.model import Transformer

log = logging.getLogger(__name__)
LoadTarget = Callable[[int], Transformer]  # max_seq_len -> the eager target (``resolve.load``)
DATA = DataConfig()  # the corpus every early-exit drafter is distilled on


@dataclass(frozen=True)
class TopK:
    """Target supervision of ``W`` windows: ``ids (W, T)`` target ids; ``topk_ids / topk_probs
    (W, T - 1, k)``: the target's top-k at positions ``0 .. T-2`` (predicting ids ``1 .. T-1``);
    ``tasks``: the corpus task of each window."""

    ids: Tensor
    topk_ids: Tensor
    topk_probs: Tensor
    tasks: tuple[str, ...]


def recipe_of(spec: ModelSpec) -> EarlyExitRecipe:
    if spec.source is not Source.EARLY_EXIT or spec.early_exit is None:
        raise ValueError(f"preset {spec.name!r} is not an early-exit drafter ({spec.source.value})")
    return spec.early_exit


def cut_windows(
    streams: dict[str, list[int]], per_task: int, window: int
) -> list[tuple[str, list[int]]]:
    """``per_task`` windows of ``window`` ids at evenly spaced offsets of each task's stream."""
    out = []
    for task in sorted(streams):
        s = streams[task]
        if len(s) < window:
            log.warning("%s: stream of %d ids is shorter than one window", task, len(s))
            continue
        n = min(per_task, len(s) // window)
        step = (len(s) - window) // max(1, n - 1) if n > 1 else 0
        out += [(task, s[i * step : i * step + window]) for i in range(n)]
    return out


@torch.inference_mode()
def target_topk(target: Transformer, windows: list[tuple[str, list[int]]], k: int) -> TopK:
    """Run ``target`` on each window (teacher-forced) and keep its top-k (see ``TopK``)."""
    ids, tids, tprobs = [], [], []
    with FreeCoreThreads() as threads:
        for _, w in tqdm(windows, desc="target top-k", unit="window", mininterval=5):
            threads.adjust()
            x = torch.tensor(w, dtype=torch.long)[None]
            logits = target.forward_train(x)[0, :-1].float()  # (T-1, V_t)
            top = torch.softmax(logits, -1).topk(k, -1)
            ids.append(x[0])
            tids.append(top.indices.to(torch.int32))
            tprobs.append(top.values)
    return TopK(torch.stack(ids), torch.stack(tids), torch.stack(tprobs),
                tuple(t for t, _ in windows))  # fmt: skip


def examples_from_topk(
    mapper: MapperLike, topk: TopK, *, seq_len: int, limit_vocab: int | None = None
) -> list[DistillExample]:
    """One training row set per window (context = first id, committed = the rest).

    ``limit_vocab``: target ids at or above it (padded embedding rows) are dropped from the top-k.
    """
    inverse = dm_inverse(mapper.draft_to_target, mapper.target_vocab_size)
    out = []
    for w in range(topk.ids.shape[0]):
        tk_ids, tk_probs = topk.topk_ids[w].long(), topk.topk_probs[w].float()
        if limit_vocab is not None:
            keep = tk_ids < limit_vocab
            tk_ids, tk_probs = torch.where(keep, tk_ids, 0), torch.where(keep, tk_probs, 0.0)
        ids = [int(i) for i in topk.ids[w]]
        out.append(build_example(mapper, ids[:1], ids[1:], tk_ids, tk_probs, seq_len=seq_len,
                                 inverse=inverse))  # fmt: skip
    return out


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to 10% of it."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def batch_hybrid_loss(model: Transformer, batch: dict[str, Tensor], lam: float) -> Tensor:
    """``hybrid_loss_rows`` summed over the rows of a ``stack_examples`` batch (weights are
    batch-normalised there); one ``forward_train`` per row (the model takes batch 1)."""
    total = torch.zeros(())
    for b in range(batch["draft_ids"].shape[0]):
        used = (batch["dm_weight"][b] + batch["ngram_weight"][b]).nonzero()
        if not len(used):
            continue
        n = int(used.max()) + 1  # trailing padding changes nothing under causal attention
        row = {k: v[b : b + 1, :n] for k, v in batch.items()}
        logits = model.forward_train(row["draft_ids"])
        total = total + hybrid_loss_rows(logits, row["topk_draft_ids"], row["topk_probs"],
                                         row["dm_weight"], row["next_draft_ids"],
                                         row["ngram_weight"], lam)  # fmt: skip
    return total


def freeze_embeddings(model: Transformer) -> None:
    """Keep the token embedding (and the lm_head tied to it) fixed during distillation."""
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)


def freeze_all_but_last(model: Transformer, train_layers: int) -> None:
    """Train only the last ``train_layers`` blocks and the final norm: autograd then starts at the
    first trained block, so the frozen prefix costs one forward pass and no backward."""
    n = model.args.n_layers
    for name, p in model.named_parameters():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        p.requires_grad_(
            name == "model.norm.weight" or (layer is not None and layer >= n - train_layers)
        )


SCALES = (1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08)


@torch.no_grad()
def calibrate_scale(
    model: Transformer, examples: list[DistillExample], lam: float
) -> tuple[float, float]:
    """Fold the logit scale ``c`` (from ``SCALES``) that minimises the hybrid loss on ``examples``
    into the final norm's weight (logits are linear in it); returns ``(c, loss)``. Forward only:
    an early exit reads a residual stream whose scale the parent's head was not fitted to (the
    SmolLM2 cut at 8 of 30 layers gives over-confident logits: loss 31 -> 13 at c = 0.2)."""
    batch = stack_examples(examples)
    logits = []
    for row in range(batch["draft_ids"].shape[0]):
        logits.append(model.forward_train(batch["draft_ids"][row : row + 1]))
    z, b = torch.cat(logits), batch  # (B, T, V_d)
    losses = [float(hybrid_loss_rows(z * c, b["topk_draft_ids"], b["topk_probs"], b["dm_weight"],
                                     b["next_draft_ids"], b["ngram_weight"], lam))
              for c in SCALES]  # fmt: skip
    best = SCALES[min(range(len(SCALES)), key=losses.__getitem__)]
    log.info("logit scale: losses %s -> c = %s", [round(x, 3) for x in losses], best)
    model.model.norm.weight.mul_(best)
    return best, min(losses)


def distill(
    student: Transformer, examples: list[DistillExample], recipe: EarlyExitRecipe
) -> list[float]:
    """Calibrate the logit scale, then train ``student`` in place on ``examples``; returns the
    loss before training (scale calibrated) followed by the loss of every step."""
    with FreeCoreThreads() as threads:  # one other busy process must not stall every op
        return _distill(student, examples, recipe, threads)


def _distill(
    student: Transformer, examples: list[DistillExample], recipe: EarlyExitRecipe,
    threads: FreeCoreThreads,
) -> list[float]:  # fmt: skip
    freeze_all_but_last(student, recipe.train_layers)
    rng0 = random.Random(recipe.seed + 1)
    probe = rng0.sample(examples, min(4, len(examples)))
    _, start = calibrate_scale(student, probe, recipe.lam)
    student.train()
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng, losses, ema = random.Random(recipe.seed), [start], None
    for step in (bar := tqdm(range(recipe.steps), desc="distill early-exit", mininterval=5)):
        threads.adjust()
        batch = stack_examples(rng.sample(examples, min(recipe.batch_size, len(examples))))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, recipe.steps, recipe.lr, recipe.warmup)
        loss = batch_hybrid_loss(student, batch, recipe.lam)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        ema = losses[-1] if ema is None else 0.7 * ema + 0.3 * losses[-1]
        bar.set_postfix(loss=f"{ema:.3f}")
    student.eval()
    return losses


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _save_atomic(tensors: dict[str, Tensor], path: Path, meta: dict[str, str]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
    tmp.replace(path)


def mapper_for(drafter: ModelSpec, target: ModelSpec) -> MapperLike:
    from omnidraft_deploy.vocab.pair import load_pair_vocab

    return load_pair_vocab(target, drafter).mapper


def cached_topk(
    target: ModelSpec, recipe: EarlyExitRecipe, cache_dir: Path, load_target: LoadTarget
) -> TopK:
    """The target's top-k over the recipe's corpus windows, computed once and cached;
    ``load_target(max_seq_len)`` gives the eager target, called only on a cache miss."""
    from safetensors.torch import load_file

    from omnidraft_deploy.distill.pretrain import tokenize_corpus
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    train_docs, _ = split(build_corpus(DATA), DATA.heldout_frac)
    key = _key(target, recipe.windows_per_task, recipe.window, recipe.topk, corpus_hash(train_docs))
    path = cache_dir / "distill" / f"topk-{target.name}-{key}.safetensors"
    if path.is_file():
        t = load_file(str(path))
        tasks = tuple(json.loads(path.with_suffix(".json").read_text())["tasks"])
        return TopK(t["ids"], t["topk_ids"], t["topk_probs"], tasks)
    streams = tokenize_corpus(load_tokenizer(target.tokenizer), train_docs)
    windows = cut_windows(streams, recipe.windows_per_task, recipe.window)
    t0 = time.perf_counter()
    topk = target_topk(load_target(recipe.window), windows, recipe.topk)
    path.with_suffix(".json").parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(
        {"tasks": list(topk.tasks), "seconds": time.perf_counter() - t0}))  # fmt: skip
    _save_atomic({"ids": topk.ids, "topk_ids": topk.topk_ids, "topk_probs": topk.topk_probs},
                 path, {"target": target.name})  # fmt: skip
    return topk


def distilled_path(spec: ModelSpec, cache: Path) -> Path:
    """Cache file of the distilled tensors (a ``.json`` beside it records the training run)."""
    from omnidraft_deploy.catalog.presets import get_preset

    recipe = recipe_of(spec)
    parent, target = get_preset(recipe.parent), get_preset(recipe.target)
    train_docs, _ = split(build_corpus(DATA), DATA.heldout_frac)
    key = _key(spec.n_layers, recipe, parent, target, corpus_hash(train_docs))
    return cache / "distill" / f"{spec.name}-{key}.safetensors"


def load_early_exit(
    spec: ModelSpec,
    model: Transformer,
    *,
    load_target: LoadTarget,
    cache_dir: Path | None = None,
    train_if_missing: bool = True,
) -> Transformer:
    """The offline-distilled early-exit drafter of ``spec``: ``model`` (the parent's first layers,
    ``resolve.load.truncated``) with its distilled weights, distilling and caching them if
    needed (the target comes from ``load_target(max_seq_len)``, only then).

    Callers go through ``resolve.load.load_model``, the one loader: it passes the models in, so
    this module never imports the loader (the arrow runs from the loader down to distill).
    """
    from safetensors.torch import load_file

    from omnidraft_deploy.catalog.assets import cache_root
    from omnidraft_deploy.catalog.presets import get_preset

    recipe, cache = recipe_of(spec), Path(cache_dir or cache_root())
    target = get_preset(recipe.target)
    path = distilled_path(spec, cache)
    if path.is_file():
        model.load_state_dict(load_file(str(path)), strict=False)
        return model
    if not train_if_missing:
        raise FileNotFoundError(
            f"{path}: no cached distilled {spec.name}; call with train_if_missing"
        )
    t0 = time.perf_counter()
    mapper = mapper_for(spec, target)
    topk = cached_topk(target, recipe, cache, load_target)
    examples = examples_from_topk(mapper, topk, seq_len=2 * recipe.window,
                                  limit_vocab=mapper.target_vocab_size)  # fmt: skip
    losses = distill(model, examples, recipe)
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    _save_atomic(trained, path, {"recipe": repr(recipe)})
    meta = {"recipe": repr(recipe), "train_s": time.perf_counter() - t0, "losses": losses}
    path.with_suffix(".json").write_text(json.dumps(meta))
    for p in model.parameters():
        p.requires_grad_(True)
    return model
