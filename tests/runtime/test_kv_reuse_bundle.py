"""Prefix reuse on real exported graphs: a prompt that begins with what the caches hold is not
prefilled again, and decodes to exactly what a cold start gives (``speculative.kv_reuse``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def opened(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair
    from omnidraft_deploy.runtime.bundle import open_bundle

    out = tmp_path_factory.mktemp("kv_reuse") / "bundle"
    cfg = ExportConfig(target="tiny-llama3-8b", drafter="tiny-llama-68m", backend="onnx",
                       out_dir=out, max_seq_len=96, draft_len=4)  # fmt: skip
    return open_bundle(export_pair(cfg))


def _decoder(b: Any) -> Any:
    from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
    from omnidraft_deploy.speculative.draft_len import FixedDraftLen

    cfg = DecodeConfig(max_new_tokens=12, vocab_limit=b.mapper.target_vocab_size, eos_ids=())
    return SpeculativeDecoder(b.target, b.drafter, b.mapper, FixedDraftLen(3), config=cfg)


def test_a_shared_start_is_reused_and_changes_nothing(opened: Any) -> None:
    from omnidraft_deploy.speculative.decoder import generate_target_only
    from omnidraft_deploy.speculative.kv_reuse import reusable

    system, first, second = [5, 17, 23, 42, 8, 99, 3], [61, 7, 12], [70, 33, 2, 14]
    dec = _decoder(opened)
    dec.keep_cached([])
    dec.generate(system + first)
    assert len(opened.target.cached) >= len(system + first)  # the caches hold that text now
    context = opened.mapper.drafter_context(system + second)
    assert reusable(opened.drafter, context) > 0  # the drafter's spelling of the system part
    warm, warm_stats = dec.generate(system + second)
    assert warm_stats.prompt_reused == len(system)
    dec.keep_cached([])
    cold, cold_stats = dec.generate(system + second)
    assert cold_stats.prompt_reused == 0
    assert warm == cold
    # target-only: the same, and it equals the speculative output (greedy)
    reused = generate_target_only(opened.target, system + second, dec.cfg)
    assert reused[1].prompt_reused == len(system + second) - 1  # all but the last token cached
    assert reused[0] == cold


def test_keep_bounds_reuse_and_a_failed_call_forgets_its_positions(opened: Any) -> None:
    from omnidraft_deploy.speculative.kv_reuse import keep, reusable

    prompt = [4, 9, 16, 25, 36, 49]
    opened.target.forward(torch.tensor(prompt), 0)
    assert reusable(opened.target, prompt + [1]) == len(prompt)
    keep(opened.target, 2)
    assert reusable(opened.target, prompt + [1]) == 2
    cap = opened.target.max_seq_len
    with pytest.raises(ValueError, match="outside"):
        opened.target.forward(torch.tensor([1, 2]), cap - 1)  # refused before any write
    with pytest.raises(Exception):  # noqa: B017 (ORT's own error type): an id past the vocabulary
        opened.target.forward(torch.tensor([10**6]), 1)
    assert reusable(opened.target, prompt + [1]) == 1  # position 1 on is unknown now


def test_run_stats_baseline_starts_where_the_speculative_run_did(
    opened: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run --stats`` (served or not) times target-only after the speculative run on the same
    graphs: the baseline must find cached what the speculative run found, not the whole prompt
    that run just decoded (which would flatter the baseline)."""
    import io

    from omnidraft_deploy.runtime import run
    from omnidraft_deploy.runtime.session import generate, open_session

    from omnidraft_deploy.request.protocol import RunRequest

    seen: list[tuple[int, int]] = []
    real_run, real_base = run.run_bundle, run.target_only

    def spec(*args: Any, **kw: Any) -> Any:
        out = real_run(*args, **kw)
        seen.append((out[1].prompt_reused, -1))
        return out

    def base(*args: Any, **kw: Any) -> Any:
        out = real_base(*args, **kw)
        seen[-1] = (seen[-1][0], out[1].prompt_reused)
        return out

    monkeypatch.setattr(run, "run_bundle", spec)
    monkeypatch.setattr(run, "target_only", base)
    session = open_session(opened.root, state=tmp_path / "state", served=True)
    request = RunRequest(bundle=str(opened.root), target=None, provider=None, prompt="a b c d",
                         chat=False, mode="greedy", temperature=0.0, top_p=None,
                         max_new_tokens=6, seed=0, stats="summary")  # fmt: skip
    for _ in range(2):  # the second finds the whole prompt cached: both sides reuse it
        generate(session, request, io.StringIO(), io.StringIO())
    assert seen[0] == (0, 0)
    assert seen[1][0] > 0 and seen[1][0] == seen[1][1]
