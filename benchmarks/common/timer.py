"""The round-robin timer: every method on every prompt, interleaved, with threads and load recorded.

A method is a ``RunFn``: target-vocabulary prompt ids -> (new target ids, wall seconds, stats or
None). ``run_side_by_side`` warms every method up once, then runs each prompt through every method
``repeats`` times in turn (``interleaved``: machine noise hits all methods alike), keeps the run
nearest the median time, and compares every output with its own implementation's target-only
output (``own_baseline``). torch's intra-op threads are set explicitly for the whole run and
restored after; the load average and UTC time are recorded at its start and end (``PairResult``'s
``meta``). ``target_run`` / ``decoder_run`` make the methods of our target alone and of a
``SpeculativeDecoder``. Nothing is asserted here: the figures go to a report.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch
from tqdm import tqdm

from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.speculative.cost import CostProfile, cost_terms, predicted_times
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
    torch_threads,
)
from omnidraft_deploy.speculative.hybrid import HybridProposer
from omnidraft_deploy.speculative.kv_reuse import keep
from omnidraft_deploy.speculative.stats import DecodeStats

Run = tuple[list[int], float, DecodeStats | None]  # new target ids, wall seconds, stats
RunFn = Callable[[list[int]], Run]
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
# method family (the name's prefix) -> the method whose output and time it is compared with
OWN_BASELINE = {
    "ours": "ours_target",
    "hf": "hf_target",
    "genai": "genai_target",
    "llamacpp": "llamacpp_target",
}


def own_baseline(method: str) -> str:
    return OWN_BASELINE[method.split("_", 1)[0]]


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def interleaved(fns: dict[K, Callable[[], T]], rounds: int) -> dict[K, list[T]]:
    """Call every function once per round, in turn (never one function ``rounds`` times in a
    row): key -> its ``rounds`` results."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    out: dict[K, list[T]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name].append(fn())
    return out


@dataclass
class PairResult:
    """rows: one dict per (prompt, method) with the median-time run's figures; meta: the run's
    threads, load average and UTC time at start and end; outputs: method -> the median-time
    run's new ids per prompt (kept out of the rows, which go to the reports)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, list[list[int]]] = field(default_factory=dict)


def run_side_by_side(methods: dict[str, RunFn], prompts: list[tuple[str, list[int]]], *,
                     threads: int, repeats: int = 3, warmup: bool = True) -> PairResult:  # fmt: skip
    """Time every method on every prompt (``(task, target ids)``), median of ``repeats`` runs,
    with ``threads`` torch intra-op threads (decoders whose config sets ``host_threads`` still
    use theirs inside ``generate``)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    result = PairResult(meta={"threads": threads, "load_avg_start": os.getloadavg(),
                              "utc_start": utc_now()})  # fmt: skip
    with torch_threads(threads):
        if warmup:
            for fn in tqdm(methods.values(), desc="warm-up", unit="method"):
                fn(prompts[0][1])
        for i, (task, ids) in enumerate(tqdm(prompts, desc="side by side", unit="prompt")):
            runs = interleaved({m: partial(fn, ids) for m, fn in methods.items()}, repeats)
            outputs = {m: r[0][0] for m, r in runs.items()}
            for name, rs in runs.items():
                result.rows.append(_row(i, task, name, rs, outputs))
                result.outputs.setdefault(name, []).append(_median_run(rs)[0])
    result.meta |= {"load_avg_end": os.getloadavg(), "utc_end": utc_now()}
    return result


def _median_run(rs: list[Run]) -> Run:
    """The run whose time is nearest the median (the median run itself for odd counts)."""
    med = statistics.median(r[1] for r in rs)
    return min(rs, key=lambda r: abs(r[1] - med))


def _row(i: int, task: str, name: str, rs: list[Run],
         outputs: dict[str, list[int]]) -> dict[str, Any]:  # fmt: skip
    times = [r[1] for r in rs]
    med = statistics.median(times)
    ids, _, st = _median_run(rs)
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
        row.update(getattr(st, "extra", {}))  # the cost model's prediction (``decoder_run``)
    return row


@dataclass
class TracedStats(DecodeStats):
    extra: dict[str, Any] = field(default_factory=dict)


def _generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed)


def target_run(target: CausalLM, cfg: DecodeConfig, *, seed: int | None = None,
               warm: Sequence[int] = ()) -> RunFn:  # fmt: skip
    """Our target alone (``generate_target_only``); ``seed``: a fresh generator per call;
    ``warm``: the prompt start every call may find in the cache (``kv_reuse``; a served session's
    system turn), else each prompt is prefilled whole, as if new to the session."""

    def run(ids: list[int]) -> Run:
        keep(target, len(warm))
        out, st = generate_target_only(target, ids, cfg, _generator(seed))
        return out, st.wall_s, st

    return run


def decoder_run(dec: SpeculativeDecoder, *, profile: CostProfile | None = None,
                seed: int | None = None, warm: Sequence[int] = ()) -> RunFn:  # fmt: skip
    """A decoder's ``generate``; ``seed``: a fresh generator per call (sampled rows); ``warm``:
    as ``target_run``'s, for both graphs. With ``profile`` and a hybrid proposer, each run also
    carries the cost model's prediction for its own step trace (``predicted_base_ms`` /
    ``predicted_spec_ms``, step sources, cost terms)."""

    def run(ids: list[int]) -> Run:
        dec.keep_cached(list(warm))
        out, st = dec.generate(ids, generator=_generator(seed))
        if profile is None:
            return out, st.wall_s, st
        traced = TracedStats(**dataclasses.asdict(st))
        if isinstance(dec.drafter, HybridProposer):
            trace = dec.drafter.trace
            base, spec = predicted_times(profile, trace, len(ids), st.prompt_reused)
            sources = {s: sum(r.source == s for r in trace) for s in ("model", "lookup", "none")}
            terms = {f"cost_{k}": v for k, v in cost_terms(profile, trace, len(ids)).items()}
            prefill = (len(ids) - st.prompt_reused) * profile.prefill_ms_per_token  # both pay it
            traced.extra = {"predicted_base_ms": base, "predicted_spec_ms": spec, **sources,
                            **terms, "prefill_ms": prefill}  # fmt: skip
        return out, st.wall_s, traced

    return run


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
