"""Side-by-side decoding benchmark on the real cross-vocabulary pair (SmolLM2-135M -> Qwen2.5-0.5B).

Methods, all greedy on the same target-vocabulary prompt ids in one process:

- ``ours_target``: our ``reference.model.Transformer`` target alone (``generate_target_only``);
- ``ours_spec_<policy>_k<k>``: our ``SpeculativeDecoder`` (greedy, n-gram cache, draft-length policy);
- ``hf_target``: transformers' ``generate`` with the target alone;
- ``hf_assisted``: transformers' cross-tokenizer assisted generation (``hf_baseline.hf_generate``).

Every method is warmed up once, then each prompt runs every method ``repeats`` times round-robin
(so machine noise hits all methods alike) and the median wall-clock time is kept. Speedups are
given against each implementation's own target-only baseline and against ``hf_target`` in absolute
seconds. Only timing is measured here; ``real_pair_report`` writes it out. An edge module: the
decoding core sees target ids only; tokenizers and transformers stay in ``hf_baseline``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import make_policy
from omnidraft_deploy.speculative.stats import DecodeStats
from omnidraft_deploy.vocab.build import build_mapper
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)

TARGET_PRESET, DRAFTER_PRESET = "qwen2.5-0.5b", "smollm2-135m"
# name -> the method whose output and time it is compared with ("own baseline")
OWN_BASELINE = {
    "ours": "ours_target",
    "hf": "hf_target",
    "genai": "genai_target",
    "llamacpp": "llamacpp_target",
}

RunFn = Callable[[list[int]], tuple[list[int], float, DecodeStats | None]]


@dataclass(frozen=True)
class SpecSetting:
    """One speculative configuration: draft-length policy name and its draft_len."""

    policy: str  # fixed | heuristic | predictor
    draft_len: int

    def __post_init__(self) -> None:
        if self.draft_len < 1:
            raise ValueError(f"draft_len must be >= 1, got {self.draft_len}")

    @property
    def name(self) -> str:
        return f"ours_spec_{self.policy}_k{self.draft_len}"


@dataclass
class RealPair:
    """Both implementations of both models, plus the mapper and the target tokenizer."""

    target: CausalLM
    drafter: CausalLM
    mapper: VocabMapper
    target_tok: Any  # our TokenizerLike (encodes prompts, decodes outputs)
    hf_target: Any = None
    hf_drafter: Any = None
    hf_target_tok: Any = None
    hf_drafter_tok: Any = None


def load_real_pair(*, max_seq_len: int = 512, with_hf: bool = True) -> RealPair:
    """Load the real pair from the cached GGUF assets (raises ``AssetError`` if not cached)."""
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.reference.torch_lm import EagerLM
    from omnidraft_deploy.resolve.load import load_model
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    target = load_model(get_preset(TARGET_PRESET), max_seq_len=max_seq_len)
    drafter = load_model(get_preset(DRAFTER_PRESET), max_seq_len=max_seq_len)
    target_tok, drafter_tok = load_tokenizer("qwen2"), load_tokenizer("smollm2")
    pair = RealPair(EagerLM(target), EagerLM(drafter), build_mapper(drafter_tok, target_tok),
                    target_tok)  # fmt: skip
    if with_hf:
        from omnidraft_deploy import hf_baseline as hb

        pair.hf_target, pair.hf_drafter = (
            hb.load_hf_model(TARGET_PRESET),
            hb.load_hf_model(DRAFTER_PRESET),
        )
        pair.hf_target_tok = hb.load_hf_tokenizer(TARGET_PRESET)
        pair.hf_drafter_tok = hb.load_hf_tokenizer(DRAFTER_PRESET)
    return pair


def decode_config(pair: RealPair, max_new_tokens: int) -> DecodeConfig:
    """Greedy config shared by our methods: the target's EOS ids, padded logits rows masked."""
    return DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=tuple(pair.target_tok.eos_ids),
                        vocab_limit=pair.mapper.target_vocab_size)  # fmt: skip


def make_methods(pair: RealPair, cfg: DecodeConfig, specs: list[SpecSetting],
                 *, with_hf: bool = True) -> dict[str, RunFn]:  # fmt: skip
    """name -> run(prompt_ids) -> (new target ids, wall seconds, stats or None)."""

    def ours_target(ids: list[int]) -> tuple[list[int], float, DecodeStats | None]:
        out, st = generate_target_only(pair.target, ids, cfg)
        return out, st.wall_s, st

    methods: dict[str, RunFn] = {"ours_target": ours_target}
    for s in specs:  # one decoder (policy state + n-gram cache) per setting, kept across prompts
        dec = SpeculativeDecoder(pair.target, pair.drafter, pair.mapper,
                                 make_policy(s.policy, s.draft_len), NGramCache(), config=cfg)  # fmt: skip
        methods[s.name] = _spec_run(dec)
    if with_hf and pair.hf_target is not None:
        from omnidraft_deploy.hf_baseline import hf_generate

        def hf(assisted: bool) -> RunFn:
            extra = ({"drafter": pair.hf_drafter, "target_tok": pair.hf_target_tok,
                      "drafter_tok": pair.hf_drafter_tok} if assisted else {})  # fmt: skip

            def run(ids: list[int]) -> tuple[list[int], float, DecodeStats | None]:
                r = hf_generate(pair.hf_target, ids, max_new_tokens=cfg.max_new_tokens,
                                eos_ids=cfg.eos_ids, **extra)  # fmt: skip
                return r.new_ids, r.wall_s, None

            return run

        methods["hf_target"], methods["hf_assisted"] = hf(False), hf(True)
    return methods


def _spec_run(dec: SpeculativeDecoder) -> RunFn:
    def run(ids: list[int]) -> tuple[list[int], float, DecodeStats | None]:
        out, st = dec.generate(ids)
        return out, st.wall_s, st

    return run


def own_baseline(method: str) -> str:
    return OWN_BASELINE[method.split("_", 1)[0]]


@dataclass
class PairResult:
    """rows: one dict per (prompt, method) with the median-time run's figures."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def run_side_by_side(methods: dict[str, RunFn], prompts: list[tuple[str, list[int]]],
                     *, repeats: int = 3, warmup: bool = True) -> PairResult:  # fmt: skip
    """Time every method on every prompt (``(task, target ids)``), median of ``repeats`` runs."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup:
        for fn in tqdm(methods.values(), desc="warm-up", unit="method"):
            fn(prompts[0][1])
    result = PairResult()
    for i, (task, ids) in enumerate(tqdm(prompts, desc="real pair", unit="prompt")):
        runs: dict[str, list[tuple[list[int], float, DecodeStats | None]]] = {
            m: [] for m in methods
        }
        for _ in range(repeats):
            for name, fn in methods.items():
                runs[name].append(fn(ids))
        outputs = {m: r[0][0] for m, r in runs.items()}
        for name, rs in runs.items():
            result.rows.append(_row(i, task, name, rs, outputs))
    return result


def _row(i: int, task: str, name: str, rs: list[tuple[list[int], float, DecodeStats | None]],
         outputs: dict[str, list[int]]) -> dict[str, Any]:  # fmt: skip
    times = [r[1] for r in rs]
    med = statistics.median(times)
    ids, _, st = min(rs, key=lambda r: abs(r[1] - med))
    base = own_baseline(name)
    row: dict[str, Any] = {
        "prompt": i, "task": task, "method": name, "n_tokens": len(ids), "wall_s": med,
        "wall_all_s": times, "stable_output": all(r[0] == rs[0][0] for r in rs),
        "equal_own_baseline": ids == outputs.get(base), "own_baseline": base,
        "equal_ours_target": ids == outputs.get("ours_target"),
        "equal_hf_target": ids == outputs.get("hf_target"),
    }  # fmt: skip
    if st is not None:
        row.update({k: float(v) for k, v in st.summary().items()})
        row.update(proposed=st.proposed, accepted=st.accepted, accept_counts=st.accept_counts,
                   draft_len_trace=st.draft_len_trace)  # fmt: skip
        row.update(getattr(st, "extra", {}))  # e.g. the cost model's prediction (ort_pair)
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """method -> totals over ``rows``: seconds, tokens/s, speedups, identity, acceptance."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    wall = {m: sum(r["wall_s"] for r in rs) for m, rs in by_method.items()}
    out: dict[str, dict[str, Any]] = {}
    for m, rs in by_method.items():
        n_tok = sum(r["n_tokens"] for r in rs)
        base = own_baseline(m)
        t: dict[str, Any] = {
            "prompts": len(rs), "wall_s": wall[m], "tokens": n_tok,
            "tokens_per_s": n_tok / wall[m] if wall[m] else 0.0,
            "speedup_vs_own_target": wall.get(base, 0.0) / wall[m] if wall[m] else 0.0,
            "speedup_vs_hf_target": wall.get("hf_target", 0.0) / wall[m] if wall[m] else 0.0,
            "identical_to_own_target": sum(bool(r["equal_own_baseline"]) for r in rs),
            "identical_to_hf_target": sum(bool(r["equal_hf_target"]) for r in rs),
        }  # fmt: skip
        if "target_calls" in rs[0] and "proposed" in rs[0]:
            t.update(_spec_totals(rs))
        out[m] = t
    return out


def _spec_totals(rs: list[dict[str, Any]]) -> dict[str, float]:
    def s(k: str) -> float:
        return float(sum(r[k] for r in rs))

    wall = max(s("wall_s"), 1e-9)
    return {
        "acceptance_rate": s("accepted") / max(s("proposed"), 1.0),
        "tokens_per_target_call": s("n_generated") / max(s("target_calls"), 1.0),
        "mean_drafted_per_step": s("drafter_calls") / max(s("target_calls"), 1.0),
        "merged_proposed": s("merged_proposed"),
        "merged_accepted": s("merged_accepted"),
        "target_frac": s("target_s") / wall,
        "drafter_frac": s("drafter_s") / wall,
        "overhead_frac": s("overhead_s") / wall,
    }


def per_task(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    tasks: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        tasks.setdefault(r["task"], []).append(r)
    return {t: summarise(rs) for t, rs in tasks.items()}


@torch.inference_mode()
def forward_latency(lm: CausalLM, *, n_tokens: int, context: int = 64, reps: int = 10) -> float:
    """Median seconds of one cached ``forward`` of ``n_tokens`` at position ``context``."""
    lm.forward(torch.zeros(context, dtype=torch.long), 0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        lm.forward(torch.zeros(n_tokens, dtype=torch.long), context)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def latency_profile(pair: RealPair, *, max_tokens: int = 7, reps: int = 10) -> dict[str, Any]:
    """Per-call latency (ms) of our drafter and target for 1..max_tokens fed tokens.

    The ratio drafter(1) / target(1) bounds what speculation can gain: k drafted tokens cost
    ``k * drafter(1)`` before the target's ``target(k + 1)`` verification call.
    """
    prof: dict[str, Any] = {}
    for role, lm in (("drafter", pair.drafter), ("target", pair.target)):
        prof[role] = {n: 1e3 * forward_latency(lm, n_tokens=n, reps=reps)
                      for n in range(1, max_tokens + 1)}  # fmt: skip
    prof["drafter_to_target_ratio"] = prof["drafter"][1] / prof["target"][1]
    return prof
