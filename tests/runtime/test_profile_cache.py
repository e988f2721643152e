"""``run`` measures a bundle's cost profile once per bundle and machine and caches it (issue 26).

The first run on a state folder measures (call latencies + the host overhead of a real decode);
later runs load it; a profile measured elsewhere (another fingerprint) or a damaged file is
measured again, never trusted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from omnidraft_deploy.speculative.cost import PROFILE_FILE, CostProfile

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair

    out = tmp_path_factory.mktemp("profile") / "bundle"
    return export_pair(ExportConfig(target="tiny-llama3-8b", drafter="tiny-llama-68m",
                                    backend="onnx", quantization="fp32", out_dir=out,
                                    max_seq_len=96, draft_len=3))  # fmt: skip


def test_run_profiles_once_per_bundle_and_machine(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnidraft_deploy.runtime import profile as rp
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.run import run_bundle

    measured: list[int] = []
    real = rp.measure_bundle

    def counting(b, **kw):  # type: ignore[no-untyped-def]
        measured.append(1)
        return real(b, **kw)

    monkeypatch.setattr(rp, "measure_bundle", counting)
    state, ids = tmp_path / "state", [5, 6, 7, 8, 9]
    first, _ = run_bundle(open_bundle(bundle, state=state), ids, max_new_tokens=4, state=state)
    prof = CostProfile.load(state / PROFILE_FILE)
    assert len(measured) == 1 and len(prof.fingerprint) == 16 and prof.overhead_ms > 0
    again, _ = run_bundle(open_bundle(bundle, state=state), ids, max_new_tokens=4, state=state)
    assert len(measured) == 1 and again == first  # cached: no second measurement
    elsewhere = dataclasses.replace(prof, fingerprint="0" * 16)  # another machine or bundle
    (state / PROFILE_FILE).write_text(elsewhere.to_json())
    run_bundle(open_bundle(bundle, state=state), ids, max_new_tokens=4, state=state)
    assert len(measured) == 2
    (state / PROFILE_FILE).write_text("{not a profile")
    run_bundle(open_bundle(bundle, state=state), ids, max_new_tokens=4, state=state)
    assert len(measured) == 3
    assert CostProfile.load(state / PROFILE_FILE).fingerprint == prof.fingerprint


def test_far_context_is_capped(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target is timed deep into a prompt at 3/4 of max_seq_len, at most ``FAR_SLOTS``
    (a 4,096-slot bundle timed its calls after a 3,072-token prefill: minutes)."""
    from omnidraft_deploy.runtime import profile as rp
    from omnidraft_deploy.runtime.bundle import open_bundle

    opened = open_bundle(bundle)
    assert rp.measure_bundle(opened, k_max=3, reps=1)["drafter"].far_context == 72  # 3/4 of 96
    monkeypatch.setattr(rp, "FAR_SLOTS", 50)
    prof = rp.measure_bundle(opened, k_max=3, reps=1)["drafter"]
    assert (prof.context, prof.far_context) == (24, 50) and len(prof.target_ms_far) == 4
