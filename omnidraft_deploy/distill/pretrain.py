"""Pre-train small real-vocabulary models on CPU in minutes, cached as safetensors.

The ``trained-*`` presets (``source`` ``pretrain`` in the one registry, ``presets.py``, which also
holds their schedules): a drafter (Llama-2 SentencePiece, 32000 ids, 4.5M params, 2 layers x 128)
and targets (Llama-3, 128256 ids; Qwen2, 152064 rows; 26-31M params, 4 layers x 192) learn the
same offline corpus (``distill.data``), so drafter/target acceptance is meaningful (random targets
give ~0). Load them with ``resolve.load.load_model``, the one loader.

Compact-vocabulary training: the corpus uses a few thousand ids of each vocabulary, so the model is
trained on the compact vocabulary of ids seen in the corpus (plus BOS/EOS) and expanded to the full
vocabulary afterwards: used rows are copied; unused embedding rows are zero (they never occur as
input in-distribution); unused ``lm_head`` rows are the mean of the rarest used rows, so an unused
id's logit is the mean of those rare tokens' logits. Greedy decoding then never picks an unused id
unless a rare one is already the argmax; the softmax mass that lands on unused ids is reported by
``unused_mass`` (top-k distillation renormalises over the mapped top-k and is unaffected).

Sequence-level KD (``PretrainSchedule.kd``, ``distill.seqkd``): a drafter may also learn its
target's greedy continuations of corpus prompts (a share ``kd.frac`` of its steps); the target is
trained first when not cached, and its cache file name enters the drafter's key.

Cache: ``<cache_root>/pretrained/<name>-<key>.safetensors`` holding the compact model and
``used_ids``; ``key`` = sha256 of the config and of the corpus texts (``data.corpus_hash``), plus
the KD settings and the teacher's cache file name for a distilled drafter. A ``.json`` beside it
records the time of each phase (``kd_generate_s``, ``train_s``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm import tqdm

from omnidraft_deploy.catalog.presets import (
    Family,
    ModelSpec,
    PretrainSchedule,
    Role,
    SeqKD,
    Source,
)
from omnidraft_deploy.distill.data import TASKS, DataConfig, build_corpus, corpus_hash, split
from omnidraft_deploy.host.threads import FreeCoreThreads
from omnidraft_deploy.reference.model import ModelArgs, Transformer, build_model

if TYPE_CHECKING:
    from omnidraft_deploy.distill.seqkd import TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainConfig:
    name: str
    role: Role
    family: Family
    tokenizer: str
    vocab_size: int  # rows of the full model (real vocabulary)
    dim: int = 256
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 4
    intermediate_size: int = 768
    rope_theta: float = 10000.0
    seq_len: int = 128  # packed training window (tokens)
    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 50
    seed: int = 0
    tasks: tuple[str, ...] = TASKS
    data: DataConfig = field(default_factory=DataConfig)
    # not in repr: a plain model's cache key stays as it was; _cache_file adds it when set
    kd: SeqKD | None = field(default=None, repr=False)

    def spec(self, vocab_size: int | None = None) -> ModelSpec:
        return ModelSpec(
            self.name,
            self.role,
            self.family,
            self.tokenizer,
            vocab_size or self.vocab_size,
            self.dim,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.intermediate_size,
            rope_theta=self.rope_theta,
            tie_embeddings=True,
            max_seq_len=1024,
            source=Source.PRETRAIN,
            pretrain=PretrainSchedule(
                self.steps, self.lr, self.warmup, self.seq_len, self.seed, kd=self.kd
            ),
        )


def pretrain_config(spec: ModelSpec) -> PretrainConfig:
    """The training config of a ``pretrain``-source preset (``presets``: one registry)."""
    sched = spec.pretrain
    if spec.source is not Source.PRETRAIN or sched is None:
        raise ValueError(f"preset {spec.name!r} is not trained here (source {spec.source.value})")
    return PretrainConfig(
        spec.name, spec.role, spec.family, spec.tokenizer, spec.vocab_size, dim=spec.dim,
        n_layers=spec.n_layers, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
        intermediate_size=spec.intermediate_size, rope_theta=spec.rope_theta,
        seq_len=sched.seq_len, steps=sched.steps, lr=sched.lr, warmup=sched.warmup, seed=sched.seed,
        kd=sched.kd,
    )  # fmt: skip


def tokenize_corpus(tok: object, corpus: dict[str, list[str]]) -> dict[str, list[int]]:
    """One token stream per task: ``[BOS] doc EOS [BOS] doc EOS ...`` (``TokenizerLike``)."""
    bos, eos = getattr(tok, "bos_id"), getattr(tok, "eos_ids")[0]  # noqa: B009
    streams: dict[str, list[int]] = {}
    for task, docs in corpus.items():
        ids: list[int] = []
        for doc in docs:
            ids += ([bos] if bos is not None else []) + getattr(tok, "encode")(doc) + [eos]  # noqa: B009
        streams[task] = ids
    return streams


def _lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_compact(cfg: PretrainConfig, streams: dict[str, Tensor]) -> Transformer:
    """Train on compact-id streams (task sampled uniformly per step, random windows); with KD the
    ``"kd"`` stream (teacher text) is drawn with probability ``cfg.kd.frac`` instead."""
    vocab = int(max(int(s.max()) for s in streams.values())) + 1
    model = build_model(cfg.spec(vocab), seed=cfg.seed, max_seq_len=cfg.seq_len + 1).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(cfg.seed)
    tasks = [t for t in cfg.tasks if len(streams[t]) > cfg.seq_len + 1]
    ema = None
    with FreeCoreThreads() as threads:  # one other busy process must not stall every op
        for step in (bar := tqdm(range(cfg.steps), desc=f"pretrain {cfg.name}", mininterval=5)):
            threads.adjust()
            kd = cfg.kd is not None and rng.random() < cfg.kd.frac
            s = streams["kd"] if kd else streams[rng.choice(tasks)]
            start = rng.randrange(len(s) - cfg.seq_len - 1)
            window = s[start : start + cfg.seq_len + 1].unsqueeze(0)
            value = train_step(model, opt, window, _lr_at(step, cfg))
            ema = value if ema is None else 0.98 * ema + 0.02 * value
            bar.set_postfix(loss=f"{ema:.3f}", threads=threads.threads)
    return model.eval()


def train_step(model: Transformer, opt: torch.optim.Optimizer, window: Tensor, lr: float) -> float:
    """One next-token step on ``window: (1, T + 1)`` compact ids at learning rate ``lr``; the
    loss before the step."""
    for g in opt.param_groups:
        g["lr"] = lr
    logits = model.forward_train(window[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits[0], window[0, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def expand_vocab(
    compact: Transformer,
    used_ids: Tensor,
    cfg: PretrainConfig,
    counts: Tensor | None = None,
    max_seq_len: int = 1024,
) -> Transformer:
    """Full-vocabulary model from a compact one (see the module docstring for unused rows).

    ``used_ids: (n,)`` full id of each compact id; ``counts: (n,)`` corpus frequency of each;
    ``max_seq_len``: KV-cache slots of the returned model.
    """
    full = Transformer(
        dataclasses.replace(compact.args, vocab_size=cfg.vocab_size, max_seq_len=max_seq_len)
    )
    state = {
        k: v
        for k, v in compact.state_dict().items()
        if "embed_tokens" not in k and "lm_head" not in k
    }
    full.load_state_dict(state, strict=False)
    n_used = len(used_ids)
    rare = (
        torch.arange(n_used) if counts is None else counts.argsort()[: max(1, n_used // 10)]
    )  # rarest 10% of used ids
    pairs = [(full.model.embed_tokens.weight, compact.model.embed_tokens.weight)]
    if not full.args.tie_embeddings:
        pairs.append((full.lm_head.weight, compact.lm_head.weight))
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src[rare].mean(0).expand_as(dst))
            dst[used_ids] = src
    return full.eval()


def _cache_file(cfg: PretrainConfig, train_docs: dict[str, list[str]], cache_dir: Path) -> Path:
    material = repr(cfg) + corpus_hash(train_docs)
    if cfg.kd is not None:  # the teacher's own file name: a retrained teacher retrains this too
        material += repr(cfg.kd) + _cache_file(_teacher_config(cfg), train_docs, cache_dir).name
    key = hashlib.sha256(material.encode()).hexdigest()[:16]
    return cache_dir / "pretrained" / f"{cfg.name}-{key}.safetensors"


def _teacher_config(cfg: PretrainConfig) -> PretrainConfig:
    from omnidraft_deploy.catalog.presets import get_preset  # noqa: PLC0415

    assert cfg.kd is not None
    teacher = pretrain_config(get_preset(cfg.kd.teacher))
    if teacher.data != cfg.data:
        raise ValueError(
            f"{cfg.name}: teacher {teacher.name} learns another corpus ({teacher.data})"
        )
    return teacher


def compact_streams(streams: dict[str, list[int]]) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Remap to compact ids; returns (streams, used_ids (n,), counts (n,))."""
    allids = torch.cat([torch.tensor(v, dtype=torch.long) for v in streams.values()])
    used_ids, counts = torch.unique(allids, return_counts=True)
    lut = {int(t): i for i, t in enumerate(used_ids)}
    compact = {k: torch.tensor([lut[t] for t in v], dtype=torch.long) for k, v in streams.items()}
    return compact, used_ids, counts


def load_pretrained(
    spec: ModelSpec,
    *,
    max_seq_len: int = 1024,
    cache_dir: Path | None = None,
    train_if_missing: bool = True,
) -> Transformer:
    """The full-vocabulary model of a ``pretrain``-source preset, training and caching it if needed.

    Callers go through ``resolve.load.load_model``, the one loader.
    """
    from omnidraft_deploy.catalog.assets import cache_root  # noqa: PLC0415

    cfg = pretrain_config(spec)
    train_docs, _ = split(build_corpus(cfg.data), cfg.data.heldout_frac)
    compact, used, counts = compact_model(
        cfg, train_docs, Path(cache_dir or cache_root()), train_if_missing=train_if_missing
    )
    return expand_vocab(compact, used, cfg, counts, max_seq_len)


def compact_model(
    cfg: PretrainConfig,
    train_docs: dict[str, list[str]],
    cache_dir: Path,
    *,
    train_if_missing: bool = True,
) -> tuple[Transformer, Tensor, Tensor]:
    """(compact model, used_ids (n,), counts (n,)) from the cache, or trained and cached now."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    path = _cache_file(cfg, train_docs, cache_dir)
    if path.is_file():
        tensors = load_file(str(path))
        used, counts = tensors.pop("__used_ids__"), tensors.pop("__counts__")
        compact = Transformer(ModelArgs.from_spec(cfg.spec(len(used)), cfg.seq_len + 1))
        compact.load_state_dict(tensors, strict=False)
        return compact.eval(), used, counts
    if not train_if_missing:
        raise FileNotFoundError(
            f"{path}: no cached pre-trained {cfg.name}; call with train_if_missing"
        )
    compact, used, counts, meta = _train(cfg, train_docs, cache_dir)
    state = {
        k: v.contiguous()
        for k, v in compact.state_dict().items()
        if not (cfg_tied(compact) and k == "lm_head.weight")
    }  # tied: stored once
    state.update({"__used_ids__": used, "__counts__": counts})
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(tmp), metadata={"config": repr(cfg)})
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return compact, used, counts


def _train(
    cfg: PretrainConfig, train_docs: dict[str, list[str]], cache_dir: Path
) -> tuple[Transformer, Tensor, Tensor, dict[str, object]]:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer  # noqa: PLC0415

    tok = load_tokenizer(cfg.tokenizer)
    meta: dict[str, object] = {"config": repr(cfg), "kd": repr(cfg.kd)}
    streams = tokenize_corpus(tok, train_docs)
    if cfg.kd is not None:
        streams["kd"] = _kd_stream(cfg, tok, train_docs, cache_dir, meta)
    compact_ids, used, counts = compact_streams(streams)
    log.info("%s: %d tokens, %d distinct ids", cfg.name, sum(map(len, streams.values())), len(used))
    t0 = time.perf_counter()
    compact = train_compact(cfg, compact_ids)
    meta.update(n_used=len(used), train_s=round(time.perf_counter() - t0, 1))
    log.info("%s: trained %d steps in %.0f s", cfg.name, cfg.steps, meta["train_s"])
    return compact, used, counts, meta


def _kd_stream(
    cfg: PretrainConfig,
    tok: TextTokenizer,
    train_docs: dict[str, list[str]],
    cache_dir: Path,
    meta: dict[str, object],
) -> list[int]:
    """The drafter-token stream of the teacher's continuations (``distill.seqkd``)."""
    from omnidraft_deploy.distill.seqkd import (  # noqa: PLC0415
        corpus_prompts,
        kd_stream,
        teacher_texts,
    )
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer  # noqa: PLC0415

    assert cfg.kd is not None
    tcfg = _teacher_config(cfg)
    teacher, used, _ = compact_model(tcfg, train_docs, cache_dir)  # trained first if missing
    t0 = time.perf_counter()
    ttok = load_tokenizer(tcfg.tokenizer)
    prompts = corpus_prompts(train_docs, ttok, cfg.kd.prompts, seed=cfg.seed)
    texts = teacher_texts(teacher, used, ttok, prompts, cfg.kd.new_tokens)
    ids = kd_stream(texts, tok)
    meta.update(
        kd_texts=len(texts), kd_tokens=len(ids), kd_generate_s=round(time.perf_counter() - t0, 1)
    )
    log.info("%s: %d teacher texts (%d tokens) from %s in %.0f s", cfg.name, len(texts), len(ids),
             tcfg.name, meta["kd_generate_s"])  # fmt: skip
    return ids


def cfg_tied(model: Transformer) -> bool:
    return model.args.tie_embeddings


def unused_mass(model: Transformer, token_ids: Tensor, used_ids: Tensor) -> float:
    """Mean softmax mass on ids outside ``used_ids`` over a ``(1, T)`` sequence (diagnostic)."""
    with torch.no_grad():
        probs = torch.softmax(model.forward_train(token_ids)[0].float(), -1)  # (T, V)
    return float(1.0 - probs[:, used_ids].sum(-1).mean())
