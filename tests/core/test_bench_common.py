"""The benchmarks' common part: round-robin timer, report writer (no timing
asserted: these check the order of calls, the rows, the wiring and what a report records)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks.common import report, timer
from benchmarks.common.pair import prompt_texts
from omnidraft_deploy.speculative.cost import CostProfile

PROFILE = CostProfile(target_ms=(10.0, 11.0, 12.0, 13.0), drafter_ms=(1.0, 1.1, 1.2, 1.3))


def test_interleaved_alternates_the_functions() -> None:
    calls: list[str] = []
    out = timer.interleaved({k: (lambda k=k: calls.append(k) or len(calls)) for k in "abc"}, 2)
    assert calls == ["a", "b", "c", "a", "b", "c"]
    assert out == {"a": [1, 4], "b": [2, 5], "c": [3, 6]}
    with pytest.raises(ValueError, match="rounds"):
        timer.interleaved({"a": lambda: 0}, 0)


def test_side_by_side_rows_name_their_own_baseline() -> None:
    """Every method family has a baseline, ORT GenAI's rows included (they once raised KeyError);
    the run sets the torch threads it was given and restores them, and records the load."""
    before, seen = torch.get_num_threads(), []

    def method(ids: list[int]) -> timer.Run:
        seen.append(torch.get_num_threads())
        return [1, 2], 0.01, None

    names = ("ours_target", "ours_lookup", "genai_target", "hf_target", "hf_assisted")
    res = timer.run_side_by_side({n: method for n in names}, [("code", [5, 6]), ("math", [7])],
                                 threads=1, repeats=2, warmup=False)  # fmt: skip
    base = {r["method"]: r["own_baseline"] for r in res.rows}
    assert base == {"ours_target": "ours_target", "ours_lookup": "ours_target",
                    "genai_target": "genai_target", "hf_target": "hf_target",
                    "hf_assisted": "hf_target"}  # fmt: skip
    assert all(r["equal_own_baseline"] and r["wall_all_s"] == [0.01, 0.01] for r in res.rows)
    assert [r["task"] for r in res.rows] == ["code"] * 5 + ["math"] * 5
    assert res.outputs["genai_target"] == [[1, 2], [1, 2]]
    assert seen == [1] * 20 and torch.get_num_threads() == before
    assert res.meta["threads"] == 1 and len(res.meta["load_avg_start"]) == 3
    assert res.meta["utc_start"] <= res.meta["utc_end"]


def test_a_term_line_names_the_decode_phase_and_the_prefill_share() -> None:
    """A best configuration's overall line: the decode phase's ratio from the cost terms (tokens
    a step over the step's cost in 1-token calls) beside the prompts' share of the time."""
    from benchmarks.real_pair_report import term_line

    agg = {"speedup": 1.36, "predicted_speedup": 1.5, "acceptance": 0.6, "prefill_share": 0.15,
           "steps": {"model": 10, "lookup": 0, "none": 0},
           "cost_terms": {"target_1": 400.0, "drafter": 160.0, "verify_width": 128.0, "host": 16.0,
                          "tokens": 28.0}}  # fmt: skip
    line = term_line("overall", agg)
    assert "2.80 tokens/step / (1 target call + 0.40 drafter + 0.32 verification width" in line
    assert "decode phase alone 1.59x, the prompts' prefill 15% of the predicted" in line
    assert "decode phase" not in term_line("overall", {k: v for k, v in agg.items()
                                                       if k != "prefill_share"})  # fmt: skip


def test_an_aggregate_says_which_side_the_prediction_missed() -> None:
    """Target-only and speculative time against their predictions, over the same prompts: both
    off says the machine's speed moved since the profile; the speculative side alone, a cost the
    model does not price."""
    from benchmarks.real_pair_report import _agg, term_line

    rows = [{"prompt": i, "method": "ours_x", "wall_s": 1.1, "n_tokens": 8,
             "equal_ours_target": True, "predicted_base_ms": 2000.0,
             "predicted_spec_ms": 1000.0, "proposed": 4, "accepted": 2, "target_s": 0.8,
             "drafter_s": 0.25} for i in range(2)]  # fmt: skip
    base = {0: (1.8, 8), 1: (2.2, 8), 7: (9.0, 8)}  # prompt 7: not in these rows
    agg = _agg(rows, base, {})
    assert agg["measured_over_predicted"] == {"target_only": 1.0, "speculative": 1.1}
    assert agg["predicted_ms"] == {"target_only": 4000.0, "speculative": 2000.0, "prefill": 0.0}
    assert agg["seconds"] == {"target_s": 1.6, "drafter_s": 0.5, "overhead_s": 0.0}
    agg |= {"acceptance": 0.6, "steps": {"model": 2, "lookup": 0, "none": 0},
            "cost_terms": {"target_1": 80.0, "drafter": 8.0, "verify_width": 8.0, "host": 0.0,
                           "tokens": 6.0}}  # fmt: skip
    assert "time measured/predicted: target-only 1.00, speculative 1.10" in term_line("x", agg)


def test_the_real_pair_prompt_set() -> None:
    plain, more = prompt_texts(), prompt_texts(code_edit=True)
    assert len(plain) == 24 and {p["task"] for p in plain} == {"math", "code", "chat",
                                                               "summarisation"}  # fmt: skip
    assert more[:24] == plain and {p["task"] for p in more[24:]} == {"code_edit"}


def test_a_report_is_rendered_from_its_json(tmp_path: Path) -> None:
    """The md sees what the JSON holds (tuples come back as lists), and every report's meta
    names its command, revision, machine, threads and load."""
    meta = report.run_meta(threads=2, argv=["run", "--tasks", "code math"],
                           load_avg_start=(9.0, 8.0, 7.0))  # fmt: skip
    assert meta["command"].startswith("python -m ") and meta["command"].endswith(
        "run --tasks 'code math'"
    )
    assert meta["revision"] and meta["machine"]["cpus"] == os.cpu_count()
    assert meta["load_avg_start"] == [9.0, 8.0, 7.0] and len(meta["load_avg_end"]) == 3
    seen: list[object] = []

    def markdown(d: dict[str, object]) -> str:
        seen.append(d["pair"])
        return "\n".join(report.meta_lines(d["meta"]))  # type: ignore[arg-type]

    src = report.write_report(tmp_path / "x" / "bench", {"meta": meta, "pair": (1, 2)},
                              markdown=markdown, plot=lambda d, png: png.write_text("png"))  # fmt: skip
    assert src == tmp_path / "x" / "bench.json" and json.loads(src.read_text())["pair"] == [1, 2]
    assert seen == [[1, 2]]
    md = (tmp_path / "x" / "bench.md").read_text()
    assert meta["command"] in md and meta["revision"] in md and "9.00 8.00 7.00" in md
    assert f"{os.cpu_count()} CPUs" in md and "threads: 2" in md and "flags " in md
    assert (tmp_path / "x" / "bench.png").read_text() == "png"


def test_the_machine_record_names_the_kernel_flags() -> None:
    from benchmarks.common import machine

    m = machine.machine()
    assert m["cpu"] and m["cpus"] == os.cpu_count()
    assert m["flags"] is None or set(m["flags"]) <= set(machine.WATCHED_FLAGS)
    line = machine.describe({"cpu": "AMD EPYC 9R45", "cpus": 2, "flags": ["avx512f", "avx512_vnni"]})
    assert line == "AMD EPYC 9R45, 2 CPUs, flags avx512f avx512_vnni"
    assert machine.describe({"cpu": "X", "cpus": 2}).endswith("flags not recorded")


def _pair_report(root: Path, name: str, command: str, speedup: float, target_s: float) -> None:
    """A committed ``real_pair_bundle`` report, reduced to what ``run_spread`` reads."""
    row = {"speedup": speedup, "tokens_per_s": 30.0, "wall_s": 1.0, "tokens": 64,
           "identical_n": 20, "prompts": 20}  # fmt: skip
    data = {"chunks": [{"command": command, "utc_start": f"2026-11-28 {name[-2:]}:00:00"}],
            "best_configuration": "ours_hybrid",
            "summary": {"ours_hybrid": {"overall": row},
                        "ours_target": {"overall": {**row, "wall_s": target_s}}},
            "profiles": {"": {"target_ms": [30.0 + i for i in range(9)]}}}  # fmt: skip
    (root / name).mkdir(parents=True)
    (root / name / f"{name}.json").write_text(json.dumps(data))


def test_runs_become_rows_of_one_index_and_the_spread_keeps_one_protocol(tmp_path: Path) -> None:
    from benchmarks import run_spread

    base = "python -m benchmarks.real_pair_bundle run --per-task 4 --max-new-tokens 64"
    _pair_report(tmp_path, "rp_s12", f"{base} --prompt-cache system --kd-bundle b/kd", 1.6, 2.8)
    _pair_report(tmp_path, "rp_s10", f"{base} --prompt-cache system --profile-stat mean", 1.3, 2.3)
    _pair_report(tmp_path, "rp_s11", f"{base} --reps 5", 1.5, 2.6)  # no prompt cache
    (tmp_path / "rp_s10" / "rp_s10_lossless.json").write_text('{"prompts": [{"passed": true}]}')
    index: dict = {"runs": []}
    for name in ("rp_s12", "rp_s11", "rp_s10", "rp_s12"):  # the second rp_s12 replaces the first
        index = run_spread.add(index, tmp_path / name / f"{name}.json")
    runs = index["runs"]
    assert [r["run"] for r in runs] == ["rp_s10", "rp_s11", "rp_s12"]  # by start time
    assert [r["run"] for r in run_spread.spread_rows(index)] == ["rp_s10", "rp_s12"]
    assert runs[2]["drafter_bundle"] == "b/kd" and runs[0]["profile_stat"] == "mean"
    assert runs[2]["target_only_ms_per_token"] == pytest.approx(1e3 * 2.8 / 64, abs=0.05)
    assert (runs[2]["profile_t1_ms"], runs[2]["profile_t9_ms"]) == (30.0, 38.0)
    assert runs[0]["lossless"] == {"prompts": [{"passed": True}]}
    assert runs[2]["methods"]["ours_hybrid"]["overall"]["speedup"] == 1.6  # the figures survive
    md = run_spread.markdown({"meta": {}, **index})
    assert "best row 1.30x-1.60x" in md and "| rp_s12 |" in md and "1.6x" in md
    assert run_spread.option("a --name x --prompt-cache=system", "--prompt-cache") == "system"
    with pytest.raises(ValueError, match="not a real_pair_bundle report"):
        (tmp_path / "other.json").write_text("{}")
        run_spread.add(index, tmp_path / "other.json")
