"""Issue 47: ``omnidraft run``'s flag values are checked at parse time, each error naming its flag,
and what ``run`` writes before it decodes never includes a prompt it then refuses.

Before: ``--temperature nan`` / ``inf`` failed mid-decode blaming a target id; ``--prompt-file
DIR`` and ``--state FILE`` ended in rc 1 ``IsADirectoryError`` / ``FileExistsError``; ``--seed
2**70`` did not name the flag; ``--max-new-tokens 1000000000`` stopped at the KV capacity without
a word; a refused 100k-character prompt was echoed to stdout first.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnidraft_deploy.cli.main import main

FLAG_SETTINGS = settings(max_examples=20, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))  # fmt: skip


def _parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """argparse's error for ``omnidraft <argv>`` (exit status 2), before anything is opened."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@FLAG_SETTINGS
@given(value=st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999", "-1", "-1e-9", "x", ""])
       | st.floats(allow_nan=True, allow_infinity=True).filter(
           lambda v: not math.isfinite(v) or v < 0).map(repr))  # fmt: skip
def test_a_temperature_that_is_no_finite_number_names_the_flag(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    for verb in (["run", "b"], ["generate"], ["bench"]):
        err = _parse_error([*verb, "--mode", "exact", f"--temperature={value}"], capsys)
        assert "argument --temperature" in err, err


@FLAG_SETTINGS
@given(seed=st.integers(1 << 64, 1 << 200) | st.integers(-(1 << 200), -(1 << 63) - 1))
def test_a_seed_torch_cannot_take_names_the_flag(
    capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    assert "argument --seed" in _parse_error(["run", "b", f"--seed={seed}"], capsys)


@pytest.mark.parametrize(("flag", "value"), [("--max-new-tokens", "0"), ("--max-new-tokens", "-5"),
                                             ("--top-p", "nan"), ("--top-p", "1.5")])  # fmt: skip
def test_other_numbers_out_of_range_name_their_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    assert f"argument {flag}" in _parse_error(["run", "b", f"{flag}={value}"], capsys)


def test_a_folder_as_prompt_file_and_a_file_as_state_name_their_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    err = _parse_error(["run", "b", "--prompt-file", str(tmp_path)], capsys)
    assert "argument --prompt-file" in err and "folder" in err, err
    for verb in (["run", "b"], ["validate", "b"], ["serve", "b"], ["profile", "b"]):
        err = _parse_error([*verb, "--state", str(tmp_path / "file")], capsys)
        assert "argument --state" in err and "not a folder" in err, err


@pytest.fixture(scope="module")
def bundle(cli_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flags") / "b"
    shutil.copytree(cli_bundle, out)
    return out


def test_max_new_tokens_beyond_the_kv_capacity_is_said(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(bundle), "--state", str(tmp_path), "--no-server", "--prompt", "Hello",
            "--max-new-tokens", "1000000000"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--max-new-tokens 1000000000" in err and "capacity of 48" in err, err


def test_a_refused_prompt_is_never_echoed(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = "word " * 20_000  # 100k characters, far past the 48-slot capacity
    argv = ["run", str(bundle), "--state", str(tmp_path), "--no-server", "--prompt", prompt]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "capacity of 48" in err, (out[:80], err)
