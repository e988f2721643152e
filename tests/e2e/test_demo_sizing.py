"""What ``make demo`` leaves out of its export is asked for by flags and said on stderr, never
silent (issue 28): ``--reference-prompts N`` records the eager target on N of the shipped prompts
(spread over the tasks) and ``validate`` then checks those N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnidraft_deploy.catalog.prompts import load_prompts, spread
from omnidraft_deploy.cli.main import export_main, main

pytest.importorskip("onnxruntime")


def test_spread_takes_one_prompt_per_task_for_four() -> None:
    prompts = load_prompts()
    assert len(prompts) == 12
    assert [p.task for p in spread(prompts, 4)] == ["math", "code", "chat", "summarisation"]
    assert spread(prompts, None) == prompts == spread(prompts, 40)
    assert spread(prompts, 1) == prompts[:1]
    with pytest.raises(ValueError, match="at least 1"):
        spread(prompts, 0)


def test_demo_flags_are_said_and_validate_checks_what_was_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMNIDRAFT_STATE", str(tmp_path / "state"))
    out = tmp_path / "demo"
    args = ["--backend", "onnx", "--out", str(out), "--max-seq-len", "64", "--draft-len", "3",
            "--reference-prompts", "4"]  # fmt: skip
    assert export_main(args) == 0
    err = capsys.readouterr().err
    assert "on 4 of the 12 shipped prompts (--reference-prompts)" in err
    doc = json.loads((out / "expected.json").read_text())
    assert [p["task"] for p in doc["prompts"]] == ["math", "code", "chat", "summarisation"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["graphs"]["target"]["parity"]  # the export's own check still ran
    assert main(["validate", str(out), "--max-new-tokens", "4"]) == 0
    assert "speculative == runtime 4/4 -> PASS" in capsys.readouterr().out
