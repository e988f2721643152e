"""Torch threads of the product's own computations (``host.threads``, issue 28): one per free
core, counted from the CPUs' busy time minus this process's own, restored after; and every loop
that trains or calibrates enters it (pretraining, offline and online distillation, calibration)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from omnidraft_deploy.host import threads as threads_mod
from omnidraft_deploy.host.threads import THREADS_ENV, FreeCoreThreads, cpu_busy_s


class FakeClock:
    """Wall time, the CPUs' busy seconds and this process's CPU seconds, advanced by hand."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = 100.0, 50.0, 1.0

    def advance(self, seconds: float, *, others: float, own: float) -> None:
        """``seconds`` pass while others use ``others`` cores and we use ``own`` cores."""
        self.wall += seconds
        self.busy += seconds * (others + own)
        self.own += seconds * own


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setattr(threads_mod, "cpu_busy_s", lambda cpus: fake.busy)
    monkeypatch.setattr(threads_mod.time, "monotonic", lambda: fake.wall)
    monkeypatch.setattr(threads_mod.time, "process_time", lambda: fake.own)
    monkeypatch.setattr(threads_mod.time, "sleep", lambda s: fake.advance(s, others=1.0, own=0))
    monkeypatch.setattr(threads_mod, "_usable_cpus", lambda: {0, 1})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield fake
    torch.set_num_threads(before)


def test_a_busy_core_leaves_one_thread_and_its_end_gives_two_back(clock: FakeClock) -> None:
    with FreeCoreThreads(recheck_s=2.0) as threads:  # the first look: others hold one core
        assert threads.threads == 1 and torch.get_num_threads() == 1
        clock.advance(1.0, others=0.0, own=1.0)
        assert threads.adjust() == 1  # not yet recheck_s since the last look: kept
        clock.advance(1.5, others=0.0, own=1.0)  # the busy process ended
        assert threads.adjust() == 2 and torch.get_num_threads() == 2
        clock.advance(3.0, others=0.9, own=1.1)  # it is back (our two threads get ~1.1 cores)
        assert threads.adjust() == 1
    assert torch.get_num_threads() == 2  # restored


def test_own_work_is_not_counted_and_reentry_does_not_sample_again(clock: FakeClock) -> None:
    t = FreeCoreThreads()
    with t:
        assert t.threads == 1
    clock.advance(5.0, others=0.0, own=2.0)  # between updates we decoded on both cores
    with t:  # no sleep: the 5 s since the last look are the window
        assert t.threads == 2
    assert clock.wall == pytest.approx(100.0 + threads_mod.FIRST_LOOK_S + 5.0)


def test_half_a_core_of_others_takes_a_core(clock: FakeClock) -> None:
    with FreeCoreThreads(recheck_s=1.0) as t:
        clock.advance(2.0, others=0.4, own=1.6)
        assert t.adjust() == 2
        clock.advance(2.0, others=0.6, own=1.4)
        assert t.adjust() == 1


def test_env_fixes_the_count_and_a_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "1")
    with FreeCoreThreads() as t:
        assert t.threads == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    monkeypatch.setenv(THREADS_ENV, "two")
    with pytest.raises(ValueError, match=THREADS_ENV), FreeCoreThreads():
        pass


def test_cpu_busy_s_reads_this_machine() -> None:
    import os

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat (not Linux): torch's own setting is kept")
    cpus = os.sched_getaffinity(0)
    first = cpu_busy_s(cpus)
    sum(i * i for i in range(300_000))
    second = cpu_busy_s(cpus)
    assert first is not None and second is not None and 0 < first <= second
    assert cpu_busy_s(set()) == 0.0


@pytest.fixture
def entries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every entry into ``FreeCoreThreads`` (fixed at one thread: no sampling)."""
    seen: list[int] = []
    real = FreeCoreThreads.__enter__

    def enter(self: FreeCoreThreads) -> FreeCoreThreads:
        seen.append(1)
        return real(self)

    monkeypatch.setenv(THREADS_ENV, "1")
    monkeypatch.setattr(FreeCoreThreads, "__enter__", enter)
    return seen


def test_pretraining_runs_under_it(entries: list[int]) -> None:
    from omnidraft_deploy.catalog.presets import Family, Role
    from omnidraft_deploy.distill.data import TASKS
    from omnidraft_deploy.distill.pretrain import PretrainConfig, train_compact

    cfg = PretrainConfig("toy", Role.TARGET, Family.LLAMA, "llama2", 64, dim=32, n_heads=2,
                         n_kv_heads=2, intermediate_size=64, seq_len=8, steps=2)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    train_compact(cfg, {t: torch.randint(0, 40, (64,), generator=gen) for t in TASKS})
    assert entries == [1]


def test_online_updates_run_under_it(entries: list[int]) -> None:
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.distill.online import OnlineDistiller
    from omnidraft_deploy.reference.model import build_model
    from omnidraft_deploy.testing import toy_pair
    from omnidraft_deploy.vocab.mapper import VocabMapper

    mapper = VocabMapper.from_tokenizers(*toy_pair())
    spec = dataclasses.replace(get_preset("tiny-llama-68m"), vocab_size=mapper.draft_vocab_size,
                               dim=32, n_layers=1, intermediate_size=64)  # fmt: skip
    dist = OnlineDistiller(build_model(spec, seed=0, max_seq_len=64), mapper, batch_size=2)
    for i in range(4):
        dist.observe([1, 2], [i % 10], torch.tensor([[i % 10, 1]]), torch.tensor([[0.7, 0.3]]))
    dist.update()
    dist.update()
    assert entries == [1, 1]


def test_calibration_forwards_run_under_it(entries: list[int]) -> None:
    from omnidraft_deploy.exporters.quant.calibration import forward_prompts

    calls: list[Any] = []
    forward_prompts(lambda ids, pos: calls.append(torch.get_num_threads()), [[1, 2], [3]], [])
    assert entries == [1] and calls == [1, 1]


def test_offline_distillation_runs_under_it(entries: list[int]) -> None:
    from omnidraft_deploy.catalog.presets import EarlyExitRecipe
    from omnidraft_deploy.distill.offline import distill, examples_from_topk, target_topk
    from omnidraft_deploy.reference.model import build_model
    from omnidraft_deploy.testing import toy_pair, toy_spec
    from omnidraft_deploy.vocab.mapper import VocabMapper

    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = build_model(toy_spec(tt.vocab_size), seed=1)
    topk = target_topk(target, [("toy", tt.encode("ab ca bc abc")[:6])], 4)
    drafter = build_model(toy_spec(dt.vocab_size), seed=2)
    distill(drafter, examples_from_topk(mapper, topk, seq_len=24),
            EarlyExitRecipe("p", "t", steps=2, batch_size=1, warmup=1))  # fmt: skip
    assert entries == [1, 1]
