"""Issue 47: ``omnidraft run`` and ``omnidraft validate`` agree, accepting or refusing, on mutated
manifests, with and without a hash record in ``--state``.

Before, ``run`` trusted ``verified_files.json`` over the manifest's ``size`` claims and exited 0 on
a bundle that ``validate`` refused ("drafter.ort: size 16880824 B != 16881824 B in manifest").
Here the verbs themselves run (``cli.main.main``, in-process) on a copy of the session's real
tiny bundle (``cli_bundle``: ONNX graphs, Llama-3 / Llama-2 tokenizers, ``expected.json``), aged
past the record's racy window, after manifest-only mutations of the fuzz corpus
(``bundle_mutations``: files untouched, so the record vouches for every file): ``validate``,
``run`` with a fresh ``--state`` and ``run`` with the record of the unmutated bundle. The three
must all refuse (exit 2, the same error) or all open the bundle. The bundle-level version of the
same agreement covers every case of the opener fuzz (``test_fuzz_formats``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from bundle_mutations import extras, manifest_field, unlist, unlist_required
from conftest import LONG, record, scale

from omnidraft_deploy.cli.main import main

pytest.importorskip("onnxruntime")


def size_claim(root: Path, doc: dict, rng: random.Random) -> None:
    rel = rng.choice(sorted(doc["files"]))
    doc["files"][rel]["size"] += rng.choice([-1000, -1, 1, 1000])


def quant_label(root: Path, doc: dict, rng: random.Random) -> None:
    role = rng.choice(["drafter", "target"])
    doc["graphs"][role]["quantization"] = rng.choice(["int8", "int4", "w8a8"])


def unlist_special(root: Path, doc: dict, rng: random.Random) -> None:
    del doc["files"][f"{rng.choice(['drafter', 'target'])}_tokenizer/special_tokens.json"]


MUTATIONS = {f.__name__: f for f in (size_claim, quant_label, unlist_special, manifest_field,
                                     extras, unlist, unlist_required)}  # fmt: skip
NAMED = [["size_claim"], ["quant_label"], ["unlist_special"]]  # the three, always run
RANDOM_CASES = scale(3, 60)


class Verbs:
    def __init__(self, base: Path, bundle: Path) -> None:
        from omnidraft_deploy.bundle.folder import verify_bundle

        self.base, self.root = base, base / "b"
        shutil.copytree(bundle, self.root)
        old = time.time() - 3600
        for p in self.root.rglob("*"):
            os.utime(p, (old, old))
        self.doc0 = json.loads((self.root / "manifest.json").read_text())
        self.recorded = base / "recorded"
        self.recorded.mkdir()
        verify_bundle(self.root, state=self.recorded)
        self.record = {p.name: p.read_bytes() for p in self.recorded.iterdir()}

    def outcomes(self, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
        """Verb -> "opened" or the error it exited 2 with (its program name cut)."""
        for p in self.recorded.iterdir():
            p.unlink()
        for name, data in self.record.items():
            (self.recorded / name).write_bytes(data)
        fresh = self.base / "fresh"
        shutil.rmtree(fresh, ignore_errors=True)
        run = ["run", str(self.root), "--no-server", "--prompt", "Hi", "--max-new-tokens", "1"]
        verbs = {"validate": ["validate", str(self.root), "--state", str(self.base / "v"),
                              "--max-new-tokens", "1"],
                 "run": [*run, "--state", str(fresh)],
                 "run, hash record": [*run, "--state", str(self.recorded)]}  # fmt: skip
        out = {}
        for verb, argv in verbs.items():
            status = main(argv)
            err = capsys.readouterr().err.strip().splitlines()
            assert status in (0, 1, 2), (verb, status)
            out[verb] = "opened" if status != 2 else err[-1].split(": error: ", 1)[-1]
        return out


@pytest.fixture(scope="module")
def verbs(cli_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Verbs:
    return Verbs(tmp_path_factory.mktemp("agree"), cli_bundle)


def _cases() -> list[tuple[list[str], int]]:
    picks = random.Random(47)
    drawn = [[picks.choice(sorted(MUTATIONS)) for _ in range(picks.randint(1, 2))]
             for _ in range(RANDOM_CASES)]  # fmt: skip
    return [(names, i) for i, names in enumerate([*NAMED, *drawn])]


@pytest.mark.parametrize(("names", "salt"), _cases(), ids=lambda x: str(x))
def test_run_and_validate_agree_on_a_mutated_manifest(
    verbs: Verbs, capsys: pytest.CaptureFixture[str], names: list[str], salt: int
) -> None:
    doc: dict[str, Any] = json.loads(json.dumps(verbs.doc0))
    rng = random.Random(salt)
    applied = []
    for name in names:
        try:
            MUTATIONS[name](verbs.root, doc, rng)
            applied.append(name)
        except (KeyError, TypeError, OSError):
            pass
    (verbs.root / "manifest.json").write_text(json.dumps(doc))
    try:
        ways = verbs.outcomes(capsys)
    finally:
        (verbs.root / "manifest.json").write_text(json.dumps(verbs.doc0))
    assert len(set(ways.values())) == 1, f"after {applied}: {ways}"
    opened = ways["validate"] == "opened"
    record("run vs validate (cli/main.py, real tiny bundle)", part="long" if LONG else "quick",
           inputs=1, accepted=int(opened), rejected=int(not opened), disagreements=0,
           crashes=0)  # fmt: skip
    if applied and applied[0] in ("size_claim", "quant_label"):
        assert ways["run, hash record"] != "opened", ways
