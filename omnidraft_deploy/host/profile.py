"""``omnidraft profile BUNDLE``: measure the cost model's latencies on the runtime that will run them.

Per-call latency of the target graph for T = 1..k_max+1 fed tokens, of each drafter graph for
T = 1..3, a prefill of ``context`` tokens by each graph (the last row only, as the decoder's
prefills run: ``protocols.last_logits``), and the host cost of one step (logit checks +
greedy verification) and of one lookup proposal. Calls are interleaved across repeats (every
(graph, T) once per round, the order rotated each round) so machine noise hits all alike; medians
are kept. The result (``speculative.cost.CostProfile``) is written as ``cost_profile.json`` to the
bundle's session folder (``state.state_dir``: never into the hashed bundle; ``runtime/profile.py``
opens the bundle), where ``load_profile`` finds it for the decoder.

ONNX Runtime threading is explicit (``ort_session``): intra-op threads = physical cores (2 here),
one inter-op thread, and spin-waiting only inside a call (``onnx_host.Spin.IN_CALL``), because a
pool left spinning after its call burns the cores other sessions and processes need (an
oversubscribed run here fell to 0.17 tok/s).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.protocols import CausalLM, last_logits
from omnidraft_deploy.speculative.cost import PROFILE_FILE, CostProfile
from omnidraft_deploy.speculative.lookup import LookupProposer
from omnidraft_deploy.speculative.verify import accept_greedy, greedy_ids

Progress = Callable[[Iterable[int]], Iterable[int]]


def physical_cores() -> int:
    """Physical cores (not hyper-threads) of this machine, from sysfs; os.cpu_count() fallback."""
    ids = set()
    for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/core_id"):
        pkg = (p.parent / "physical_package_id").read_text().strip()
        ids.add((pkg, p.read_text().strip()))
    return len(ids) or os.cpu_count() or 1


def ort_session(path: Path, *, threads: int | None = None) -> Any:
    """CPU ORT session with explicit threading (module docstring)."""
    from omnidraft_deploy.host.onnx_host import Spin, cpu_session

    return cpu_session(path, threads=threads or physical_cores(), spinning=Spin.IN_CALL)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0)


def _call(lm: CausalLM, ids: torch.Tensor, pos: int) -> float:
    return _timed(lambda: lm.forward(ids, pos))


def _prefill(lm: CausalLM, ids: torch.Tensor) -> float:
    """ms of a prefill of ``ids`` as the decoder runs it: the last row's logits only."""
    return _timed(lambda: last_logits(lm, ids, 0))


@torch.inference_mode()
def measure(target: CausalLM, drafters: dict[str, CausalLM], *, k_max: int = 8,
            context: int = 64, far_context: int | None = None, reps: int = 5,
            progress: Progress = lambda r: r,
            stat: Callable[[list[float]], float] = statistics.median) -> dict[str, CostProfile]:  # fmt: skip
    """drafter name -> profile (the target's latencies shared); ``""``: no drafter (lookup).

    ``far_context``: also time the target's calls with that many cached tokens (the profile's
    ``target_ms_far``: cost grows with the KV length); None: ``default_far_context``. ``stat``:
    how each call's repetitions are summarised (the median; ``statistics.fmean`` where a
    decode's sum of calls is to be predicted on a machine that alternates between speeds:
    ``benchmarks/state_trace.py``)."""
    far = default_far_context(target, context, k_max) if far_context is None else far_context
    if far and far + k_max + 1 > target.max_seq_len:
        raise ValueError(f"far_context {far} + {k_max + 1} tokens exceeds the target's "
                         f"max_seq_len {target.max_seq_len}")  # fmt: skip
    ids = (torch.arange(max(context, far) + k_max + 1) * 7919 % 5000 + 100).long()
    models: dict[str, CausalLM] = {"": target, **drafters}
    for lm in models.values():
        last_logits(lm, ids[:context], 0)  # fill the KV cache; the timed calls read it
    if far:
        last_logits(target, ids[:far], 0)  # near calls rewrite slots >= context only
    jobs = [("", t) for t in range(1, k_max + 2)] + [(n, t) for n in drafters for t in (1, 2, 3)]
    jobs += [("far", t) for t in range(1, k_max + 2)] if far else []
    jobs.append(("prefill", context))
    jobs += [(f"prefill:{n}", context) for n in drafters]
    times: dict[tuple[str, int], list[float]] = {j: [] for j in jobs}
    logits = target.forward(ids[context : context + 5], context)
    host, look = [], LookupProposer()
    look.reset(ids.tolist() * 4)
    for r in progress(range(reps)):
        for name, t in jobs[r % len(jobs) :] + jobs[: r % len(jobs)]:
            if name.startswith("prefill"):
                lm = models[name.partition(":")[2]]
                times[(name, t)].append(_prefill(lm, ids[:t]) / t)
            elif name == "far":
                times[(name, t)].append(_call(target, ids[far : far + t], far))
            else:
                times[(name, t)].append(_call(models[name], ids[context : context + t], context))
        host.append(_timed(lambda: _host_step(logits)))
    lookup_ms = statistics.median(_timed(lambda: look.propose(k_max)) for _ in range(50))

    def summary(name: str, widths: Iterable[int]) -> tuple[float, ...]:
        return tuple(stat(times[(name, t)]) for t in widths)

    target_ms = summary("", range(1, k_max + 2))
    prefill = stat(times[("prefill", context)])
    common: dict[str, Any] = {"target_ms": target_ms, "lookup_ms": lookup_ms,
                              "overhead_ms": statistics.median(host),
                              "prefill_ms_per_token": prefill, "context": context}  # fmt: skip
    if far:
        common |= {"far_context": far, "target_ms_far": summary("far", range(1, k_max + 2))}
    out = {"": CostProfile(**common)}
    for name in drafters:
        dpre = stat(times[(f"prefill:{name}", context)])
        out[name] = CostProfile(drafter_ms=summary(name, (1, 2, 3)),
                                drafter_prefill_ms_per_token=dpre, **common)  # fmt: skip
    return out


def default_far_context(target: CausalLM, context: int, k_max: int) -> int:
    """A second KV length for the profile: 3/4 of the target's ``max_seq_len`` (where the longest
    prompts decode), or 0 (none) when that is not well past ``context``."""
    far = (3 * target.max_seq_len) // 4
    far = min(far, target.max_seq_len - k_max - 1)
    return far if far >= 2 * context else 0


def _host_step(logits: torch.Tensor) -> None:
    """The host maths of a greedy verification step besides the calls (one numpy pass: the
    finite check and argmax of ``verify.greedy_ids``, then the acceptance walk). A lower bound:
    ``runtime.profile.measure_host_overhead`` times the whole step inside a real decode."""
    accept_greedy([1, 2, 3, 4], greedy_ids(logits))


def profile_path(state: Path) -> Path:
    return state / PROFILE_FILE


def save_profile(profile: CostProfile, state: Path) -> Path:
    path = profile_path(state)
    write_text_atomic(path, profile.to_json())
    return path


def load_profile(state: Path) -> CostProfile | None:
    """The profile ``omnidraft profile`` wrote to a session folder, or None when there is none
    (a malformed file raises ValueError naming it)."""
    path = profile_path(state)
    return CostProfile.load(path) if path.is_file() else None
