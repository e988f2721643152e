"""``omnidraft adapt B --target NAME`` on a multi-target bundle (issue 30): one shared drafter
graph, per-target adapted weights in the target's state folder.

The session's three-target tiny bundle (``tests/conftest.py`` ``multi_bundle``) is adapted on one
target through the CLI, as a user types it. Then: only that target's state folder holds weights
and the bundle is unchanged; that target decodes with its adapted drafter while the other two
decode with the shipped one, bit for bit; every target's greedy speculative output still equals
its target-only output (``omnidraft validate``); a damaged or foreign weight file is refused,
naming it; a missing or unknown ``--target`` lists the targets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("safetensors")

TARGETS = ("tiny-llama3-8b", "tiny-qwen2-7b", "tiny-vicuna-7b")  # conftest's MULTI_TARGETS
ADAPTED = TARGETS[1]
PROBE = torch.tensor([1, 5, 9, 14, 30, 2, 7])  # drafter ids


@pytest.fixture(scope="module")
def adapted(multi_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state folder after ``omnidraft adapt --target ADAPTED`` (the bundle is not written)."""
    from omnidraft_deploy.cli.main import main

    state = tmp_path_factory.mktemp("adapt") / "state"
    before = (multi_bundle / "manifest.json").read_bytes()
    argv = ["adapt", str(multi_bundle), "--target", ADAPTED, "--state", str(state),
            "--rounds", "1", "--max-new-tokens", "6", "--lr", "1e-2", "--steps-per-update", "2"]  # fmt: skip
    assert main(argv) == 0
    assert (multi_bundle / "manifest.json").read_bytes() == before
    return state


def _drafter_logits(bundle: Path, name: str, state: Path | None) -> tuple[torch.Tensor, object]:
    from omnidraft_deploy.runtime.bundle import open_bundle

    opened = open_bundle(bundle, target=name, state=state)
    return opened.drafter.forward(PROBE, 0), opened.drafter_weights


def test_adapting_one_target_changes_its_drafter_only(multi_bundle: Path, adapted: Path) -> None:
    from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER
    from omnidraft_deploy.bundle.folder import verify_bundle

    verify_bundle(multi_bundle)  # every listed file's sha256 still holds
    held = sorted(p.relative_to(adapted).as_posix() for p in adapted.rglob(ADAPTED_DRAFTER))
    assert held == [f"targets/{ADAPTED}/{ADAPTED_DRAFTER}"]
    for name in TARGETS:
        shared, none = _drafter_logits(multi_bundle, name, None)
        mine, weights = _drafter_logits(multi_bundle, name, adapted / "targets" / name)
        assert none is None
        if name == ADAPTED:
            assert weights == adapted / "targets" / name / ADAPTED_DRAFTER
            assert (mine - shared).abs().max() > 1e-3  # the adapted drafter drafts differently
        else:  # the shipped drafter, bit for bit
            assert weights is None and torch.equal(mine, shared)


def test_adapt_resumes_from_the_targets_weights(multi_bundle: Path, adapted: Path) -> None:
    """The eager drafter ``adapt`` would continue from == the graph ``run`` decodes with."""
    from omnidraft_deploy.runtime.adapted import adapted_weights, resume
    from omnidraft_deploy.runtime.bundle import open_bundle

    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    folder = adapted / "targets" / ADAPTED
    opened = open_bundle(multi_bundle, target=ADAPTED, state=folder)
    weights = adapted_weights(multi_bundle, opened.manifest, folder)
    assert weights is not None and opened.drafter_weights is not None
    info = opened.manifest.graphs["drafter"]
    seed = opened.manifest.extras["seed"] + 1
    eager = load_model(get_preset(info.preset), seed=seed, max_seq_len=info.max_seq_len)
    resume(eager, weights, opened.drafter_weights)
    with torch.no_grad():
        want = eager.forward_train(PROBE[None])[0]
    torch.testing.assert_close(opened.drafter.forward(PROBE, 0), want, atol=1e-4, rtol=1e-4)


def test_every_target_stays_lossless_after_adaptation(multi_bundle: Path, adapted: Path) -> None:
    from omnidraft_deploy.cli.main import main

    assert main(["validate", str(multi_bundle), "--max-new-tokens", "8",
                 "--state", str(adapted)]) == 0  # fmt: skip
    for name in TARGETS:
        report = json.loads((adapted / "targets" / name / "validation.json").read_text())
        n = report["prompts"]
        assert report["passed"] and report["speculative_equal"] == n >= 10, report
        assert (report["drafter_weights"] is not None) == (name == ADAPTED)


def _damaged(data: bytes) -> bytes:
    out = bytearray(data)
    out[-3] ^= 0xFF  # the last tensor's data
    return bytes(out)


def _relabelled(data: bytes, **meta: str) -> bytes:
    from safetensors.torch import load, save

    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])["__metadata__"]
    return save(load(data), metadata={**header, **meta})


@pytest.mark.parametrize(
    ("target", "edit", "problem"),
    [
        (ADAPTED, _damaged, "data_sha256 mismatch"),
        (ADAPTED, lambda d: b"\x00" * 64, "not a safetensors file"),
        (ADAPTED, lambda d: d[: len(d) // 2], "damaged safetensors data"),
        (ADAPTED, lambda d: _relabelled(d, **{"omnidraft.format": "x"}), "foreign file"),
        (ADAPTED, lambda d: _relabelled(d, drafter_sha256="0" * 64), "another drafter graph"),
        (TARGETS[0], lambda d: d, f"adapted on target '{ADAPTED}'"),  # another target's file
    ],
)
def test_a_damaged_or_foreign_weight_file_is_refused_naming_it(
    multi_bundle: Path, adapted: Path, tmp_path: Path, target: str, edit: object, problem: str
) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle

    from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER
    from omnidraft_deploy.bundle.manifest import BundleError

    folder = tmp_path / target
    folder.mkdir()
    data = (adapted / "targets" / ADAPTED / ADAPTED_DRAFTER).read_bytes()
    (folder / ADAPTED_DRAFTER).write_bytes(edit(data))  # type: ignore[operator]
    with pytest.raises(BundleError, match=problem) as e:
        open_bundle(multi_bundle, target=target, state=folder)
    assert e.value.path == str(folder / ADAPTED_DRAFTER)


def test_a_tensor_the_graph_lacks_is_refused(
    multi_bundle: Path, adapted: Path, tmp_path: Path
) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle
    from safetensors.torch import load

    from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER, write_drafter_weights
    from omnidraft_deploy.bundle.manifest import BundleError

    src = adapted / "targets" / ADAPTED / ADAPTED_DRAFTER
    tensors = load(src.read_bytes())
    name = sorted(tensors)[0]
    tensors[name] = tensors[name][:1]  # another shape
    sha = json.loads((multi_bundle / "manifest.json").read_text())["files"]["drafter.onnx"]
    write_drafter_weights(tmp_path / ADAPTED_DRAFTER, tensors, params={n: n for n in tensors},
                          target=ADAPTED, drafter_sha256=sha["sha256"])  # fmt: skip
    with pytest.raises(BundleError, match=f"tensor '{name}' has shape") as e:
        open_bundle(multi_bundle, target=ADAPTED, state=tmp_path)
    assert e.value.path == str(tmp_path / ADAPTED_DRAFTER)


def test_adapt_needs_a_known_target(
    multi_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnidraft_deploy.cli.main import main

    base = ["adapt", str(multi_bundle), "--state", str(tmp_path), "--rounds", "1"]
    for extra in ([], ["--target", "tiny-qwen2.5-14b"]):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert all(name in err for name in TARGETS), err
    assert not list(tmp_path.rglob("*.safetensors"))
