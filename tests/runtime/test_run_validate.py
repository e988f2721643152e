"""``omnidraft run`` and ``omnidraft validate`` decode one bundle the same way.

Both verbs build their speculative decoder from the bundle alone (graphs, vocabulary map with the
drafter's BOS, n-gram cache, draft length), so per prompt they must commit the same tokens with
the same acceptance. With the random tiny twins nearly nothing is accepted, so the slow case uses
the trained demo pair (``make demo``'s), where drafts are accepted and any difference in the
drafter's context (e.g. a missing BOS) changes the acceptance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

PAIRS = [
    pytest.param(("tiny-llama3-8b", "tiny-llama-68m"), id="tiny"),
    pytest.param(
        ("trained-llama3-demo", "trained-llama2-demo"), id="trained", marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize("pair", PAIRS)
def test_run_and_validate_agree(pair: tuple[str, str], tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.run import run_bundle
    from omnidraft_deploy.runtime.validate import validate_bundle

    from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only

    target, drafter = pair
    cfg = ExportConfig(target=target, drafter=drafter, backend="onnx",
                       out_dir=tmp_path / "bundle", max_seq_len=96, draft_len=4)  # fmt: skip
    bundle = export_pair(cfg)
    report = validate_bundle(bundle, max_new_tokens=16)  # the prompts of expected.json
    assert report["passed"], report
    rows = json.loads((bundle / "expected.json").read_text())["prompts"]
    i = next(i for i, r in enumerate(rows) if r["task"] == "math")
    prompt = rows[i]["prompt_ids"]
    opened = open_bundle(bundle)
    out, stats = run_bundle(opened, prompt, max_new_tokens=16)  # first run: the shipped cache
    assert stats.acceptance_rate == report["rows"][i]["acceptance_rate"]
    decode = DecodeConfig(max_new_tokens=16, vocab_limit=opened.mapper.target_vocab_size,
                          eos_ids=opened.mapper.target_eos)  # fmt: skip
    assert out == generate_target_only(opened.target, prompt, decode)[0]
    if target.startswith("trained"):
        assert stats.acceptance_rate > 0.1  # drafts are accepted (0.22-0.29 seen on math prompts)
