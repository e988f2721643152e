"""Pre-train small real-vocabulary models on CPU in minutes, cached as safetensors.

The ``trained-*`` presets (``source`` ``pretrain`` in the one registry, ``presets.py``, which also
holds their schedules): a drafter (Llama-2 SentencePiece, 32000 ids, 4.5M params, 2 layers x 128)
and targets (Llama-3, 128256 ids; Qwen2, 152064 rows; 26-31M params, 4 layers x 192) learn the
same offline corpus (``distill.data``), so drafter/target acceptance is meaningful (random targets
give ~0). Load them with ``reference.load.load_model``, the one loader.

Compact-vocabulary training: the corpus uses a few thousand ids of each vocabulary, so the model is
trained on the compact vocabulary of ids seen in the corpus (plus BOS/EOS) and expanded to the full
vocabulary afterwards: used rows are copied; unused embedding rows are zero (they never occur as
input in-distribution); unused ``lm_head`` rows are the mean of the rarest used rows, so an unused
id's logit is the mean of those rare tokens' logits. Greedy decoding then never picks an unused id
unless a rare one is already the argmax; the softmax mass that lands on unused ids is reported by
``unused_mass`` (top-k distillation renormalises over the mapped top-k and is unaffected).

Cache: ``<cache_root>/pretrained/<name>-<key>.safetensors`` holding the compact model and
``used_ids``; ``key`` = sha256 of the config and of the corpus texts (``data.corpus_hash``).
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

import torch
from torch import Tensor
from tqdm import tqdm

from omnidraft_deploy.distill.data import TASKS, DataConfig, build_corpus, corpus_hash, split
from omnidraft_deploy.presets import Family, ModelSpec, PretrainSchedule, Role, Source
from omnidraft_deploy.reference.model import ModelArgs, Transformer, build_model

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
            pretrain=PretrainSchedule(self.steps, self.lr, self.warmup, self.seq_len, self.seed),
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
    """Train on compact-id streams (task sampled uniformly per step, random windows)."""
    vocab = int(max(int(s.max()) for s in streams.values())) + 1
    model = build_model(cfg.spec(vocab), seed=cfg.seed, max_seq_len=cfg.seq_len + 1).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(cfg.seed)
    tasks = [t for t in cfg.tasks if len(streams[t]) > cfg.seq_len + 1]
    ema = None
    for step in (bar := tqdm(range(cfg.steps), desc=f"pretrain {cfg.name}", mininterval=5)):
        s = streams[rng.choice(tasks)]
        start = rng.randrange(len(s) - cfg.seq_len - 1)
        window = s[start : start + cfg.seq_len + 1].unsqueeze(0)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        logits = model.forward_train(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits[0], window[0, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = float(loss) if ema is None else 0.98 * ema + 0.02 * float(loss)
        bar.set_postfix(loss=f"{ema:.3f}")
    return model.eval()


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


def _cache_file(cfg: PretrainConfig, data_hash: str, cache_dir: Path) -> Path:
    key = hashlib.sha256((repr(cfg) + data_hash).encode()).hexdigest()[:16]
    return cache_dir / "pretrained" / f"{cfg.name}-{key}.safetensors"


def _compact_streams(streams: dict[str, list[int]]) -> tuple[dict[str, Tensor], Tensor, Tensor]:
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

    Callers go through ``reference.load.load_model``, the one loader.
    """
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    from omnidraft_deploy.assets import cache_root  # noqa: PLC0415
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer  # noqa: PLC0415

    cfg, name = pretrain_config(spec), spec.name
    train_docs, _ = split(build_corpus(cfg.data), cfg.data.heldout_frac)
    path = _cache_file(cfg, corpus_hash(train_docs), Path(cache_dir or cache_root()))
    if path.is_file():
        tensors = load_file(str(path))
        used, counts = tensors.pop("__used_ids__"), tensors.pop("__counts__")
        compact = Transformer(ModelArgs.from_spec(cfg.spec(len(used)), cfg.seq_len + 1))
        compact.load_state_dict(tensors, strict=False)
        return expand_vocab(compact.eval(), used, cfg, counts, max_seq_len)
    if not train_if_missing:
        raise FileNotFoundError(f"{path}: no cached pre-trained {name}; call with train_if_missing")
    t0 = time.perf_counter()
    streams = tokenize_corpus(load_tokenizer(cfg.tokenizer), train_docs)
    compact_streams, used, counts = _compact_streams(streams)
    log.info("%s: %d tokens, %d distinct ids", name, sum(map(len, streams.values())), len(used))
    compact = train_compact(cfg, compact_streams)
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
    meta = {"config": repr(cfg), "n_used": len(used), "train_s": time.perf_counter() - t0}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return expand_vocab(compact, used, cfg, counts, max_seq_len)


def cfg_tied(model: Transformer) -> bool:
    return model.args.tie_embeddings


def unused_mass(model: Transformer, token_ids: Tensor, used_ids: Tensor) -> float:
    """Mean softmax mass on ids outside ``used_ids`` over a ``(1, T)`` sequence (diagnostic)."""
    with torch.no_grad():
        probs = torch.softmax(model.forward_train(token_ids)[0].float(), -1)  # (T, V)
    return float(1.0 - probs[:, used_ids].sum(-1).mean())
