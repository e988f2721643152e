"""Merge ``python -m benchmarks.real_pair run`` chunks into ``reports/real_pair/real_pair.{json,md}``
and a plot per task (``render_reports.real_pair_png``), the md and plots rendered from the JSON.

Per configuration and task: tokens/s, speedup vs our ORT target-only and vs ORT GenAI target-only,
acceptance, target tokens per call, drafter cost ratio, predicted (cost model over the run's own
step trace) vs measured speedup, and the outputs' identity with our ORT target-only. Where a
speculative configuration stays below target-only, the limiting cost-model term is named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import report
from benchmarks.render_reports import TASKS, ordered_tasks, real_pair_png
from omnidraft_deploy.catalog.backends import get_backend
from omnidraft_deploy.speculative.cost import CostProfile


def _rate(rows: list[dict[str, Any]], walls: dict[Any, tuple[float, int]]) -> float:
    """Speedup over a baseline's rows on the same prompts: time ratio when both made the same
    number of tokens (greedy), else the tokens/s ratio (sampled rows differ in length). Only
    the prompts the baseline ran count (a peer may be missing from a chunk)."""
    rows = [r for r in rows if r["prompt"] in walls]
    bw = sum(walls[r["prompt"]][0] for r in rows)
    bt = sum(walls[r["prompt"]][1] for r in rows)
    wall, tok = sum(r["wall_s"] for r in rows), sum(r["n_tokens"] for r in rows)
    if not wall or not bw:
        return 0.0
    return bw / wall if bt == tok else (tok / wall) / (bt / bw)


def _agg(rows: list[dict[str, Any]], base: dict[Any, tuple[float, int]],
         peers: dict[str, dict[Any, tuple[float, int]]]) -> dict[str, Any]:  # fmt: skip
    wall = sum(r["wall_s"] for r in rows)
    tok = sum(r["n_tokens"] for r in rows)
    sampled = bool(rows) and rows[0]["method"].endswith("_t07")
    out: dict[str, Any] = {
        "prompts": len(rows), "tokens": tok, "wall_s": wall,
        "tokens_per_s": tok / wall if wall else 0.0,
        "speedup": _rate(rows, base),
        "identical": sampled or all(r["equal_ours_target"] for r in rows),
        "identical_n": len(rows) if sampled else sum(bool(r["equal_ours_target"]) for r in rows),
    }  # fmt: skip
    for peer, walls in peers.items():
        if walls:
            out[f"speedup_vs_{peer}"] = _rate(rows, walls)
    if rows and "proposed" in rows[0] and not rows[0]["method"].endswith("_target"):
        s = {k: sum(float(r.get(k, 0)) for r in rows) for k in
             ("proposed", "accepted", "n_generated", "target_calls", "drafter_calls")}  # fmt: skip
        out["acceptance"] = s["accepted"] / s["proposed"] if s["proposed"] else 0.0
        out["tokens_per_call"] = s["n_generated"] / max(1.0, s["target_calls"])
        out["drafter_calls_per_token"] = s["drafter_calls"] / max(1.0, s["n_generated"])
        # where the measured time went (s), beside the prediction's terms below
        out["seconds"] = {k: sum(float(r.get(k, 0)) for r in rows)
                          for k in ("target_s", "drafter_s", "overhead_s")}  # fmt: skip
    if rows and "predicted_spec_ms" in rows[0]:
        pb = sum(r["predicted_base_ms"] for r in rows)
        ps = sum(r["predicted_spec_ms"] for r in rows)
        out["predicted_speedup"] = pb / ps if ps else 0.0
        out["predicted_ms"] = {"target_only": pb, "speculative": ps,
                               "prefill": sum(float(r.get("prefill_ms", 0)) for r in rows)}  # fmt: skip
        out["steps"] = {k: int(sum(r.get(k, 0) for r in rows)) for k in ("model", "lookup", "none")}
        if "prefill_ms" in rows[0]:  # the prompts' prefill, paid alike with and without drafts
            out["prefill_share"] = sum(r["prefill_ms"] for r in rows) / ps if ps else 0.0
        # which side the prediction missed: both (the machine's speed moved since the profile)
        # or the speculative one alone (a cost the loop pays that the model does not price)
        base_wall = sum(base[r["prompt"]][0] for r in rows if r["prompt"] in base)
        if pb and ps and base_wall:
            out["measured_over_predicted"] = {"target_only": 1e3 * base_wall / pb,
                                              "speculative": 1e3 * wall / ps}  # fmt: skip
        if "cost_tokens" in rows[0]:
            out["cost_terms"] = {k: sum(r[f"cost_{k}"] for r in rows) for k in
                                 ("drafter", "verify_width", "host", "target_1", "tokens")}  # fmt: skip
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """method -> task (and "overall") -> aggregate. Sampled rows (``*_t07``) are compared with
    ``ours_target_t07``, the others with ``ours_target``; peers (GenAI, llama.cpp) by time."""

    def walls(method: str) -> dict[Any, tuple[float, int]]:
        return {r["prompt"]: (r["wall_s"], r["n_tokens"]) for r in rows if r["method"] == method}

    base, base_t07 = walls("ours_target"), walls("ours_target_t07")
    peers = {"genai": walls("genai_target"), "llamacpp": walls("llamacpp_target")}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        b = base_t07 if m.endswith("_t07") else base
        out[m] = {t: _agg([r for r in mine if r["task"] == t], b, peers)
                  for t in ordered_tasks(r["task"] for r in rows) if any(r["task"] == t for r in mine)}  # fmt: skip
        out[m]["overall"] = _agg(mine, b, peers)
    return out


def _drafter_of(method: str) -> str:
    name = method.removeprefix("ours_").removeprefix("hybrid_").removesuffix("_t07")
    name = name.removesuffix("_heur").removesuffix("_fixed")
    return "" if name in ("lookup", "target") else name


def limiting_term(method: str, a: dict[str, Any], prof: CostProfile | None) -> str:
    """Name the cost-model term that holds a configuration below target-only speed."""
    if prof is None or "acceptance" not in a:
        return ""
    c = prof.drafter_ratio
    widen = prof.target(2) / prof.target(1)
    drafted = a.get("steps", {}).get("model", 0) or a.get("drafter_calls_per_token", 0) > 0
    if drafted and c > 0.2:
        return (
            f"drafter cost ratio c = {c:.2f}: a drafted token pays only if accepted with "
            f"probability > {c + widen - 1:.2f}; measured acceptance {a['acceptance']:.2f}"
        )
    return (
        f"acceptance {a.get('acceptance', 0):.2f} x value vs verification width cost "
        f"(target(2)/target(1) = {widen:.2f}); host overhead {prof.overhead_ms:.1f} ms/step"
    )


GOALS = {"code": 1.3, "overall": 1.15}
FLOOR = 0.95


def best_configuration(summ: dict[str, Any]) -> str | None:
    """The speculative configuration with the highest overall speedup among those whose outputs
    are all identical to our ORT target-only (None if there is none)."""
    ok = [m for m, per in summ.items() if m.startswith("ours_") and not m.endswith("_target")
          and per["overall"]["identical"]]  # fmt: skip
    return max(ok, key=lambda m: summ[m]["overall"]["speedup"], default=None)


def term_line(task: str, a: dict[str, Any], prof: CostProfile | None = None) -> str:
    """One task's speedup decomposed into the cost model's terms (per step, in target 1-token
    calls): what each costs, and which one stops the figure where it misses its goal."""
    t = a.get("cost_terms")
    if not t or not t["target_1"]:
        return f"- {task}: {a['speedup']:.2f}x (no step trace)"
    steps = a["steps"]["model"] + a["steps"]["lookup"] + a["steps"]["none"]
    unit = t["target_1"]  # one 1-token target call per step
    parts = {k: t[k] / unit for k in ("drafter", "verify_width", "host")}
    per_step = t["tokens"] / max(steps, 1)
    goal = GOALS.get(task, FLOOR)
    line = (f"- {task}: measured {a['speedup']:.2f}x, predicted {a['predicted_speedup']:.2f}x "
            f"= {per_step:.2f} tokens/step / (1 target call + {parts['drafter']:.2f} drafter + "
            f"{parts['verify_width']:.2f} verification width + {parts['host']:.2f} host); "
            f"acceptance {a.get('acceptance', 0):.2f}")  # fmt: skip
    if "prefill_share" in a:  # what no drafting speeds up dilutes the decode phase's ratio
        decode = per_step / (1 + sum(parts.values()))
        line += (f"; decode phase alone {decode:.2f}x, the prompts' prefill "
                 f"{a['prefill_share']:.0%} of the predicted speculative time")  # fmt: skip
    if "measured_over_predicted" in a:
        mp = a["measured_over_predicted"]
        line += (f"; time measured/predicted: target-only {mp['target_only']:.2f}, speculative "
                 f"{mp['speculative']:.2f}")  # fmt: skip
    if a["speedup"] >= goal:
        return line + f"; goal {goal:.2f}x met"
    worst = max(parts, key=lambda k: parts[k])
    need = goal * (1 + sum(parts.values()))
    miss = f"; goal {goal:.2f}x NOT met: it needs {need:.2f} tokens/step at these costs"
    model_steps = a["steps"]["model"]
    if prof is not None and prof.drafter_ms and model_steps < steps / 2 and per_step < goal:
        c, widen = prof.drafter_ratio, prof.target(2) / prof.target(1)
        return line + (f"{miss}; the policy left the drafter off on {steps - model_steps} of "
                       f"{steps} steps: at c = {c:.2f} a drafted token pays only if accepted "
                       f"with probability > {c + widen - 1:.2f}; measured "
                       f"{a.get('acceptance', 0):.2f} over this row's proposals")  # fmt: skip
    if per_step < goal:  # free drafting, verification and host would still fall short
        return line + (f"{miss}; with every cost term at 0 it would still make {per_step:.2f}x: "
                       "the proposals' acceptance is the limit, not their cost")  # fmt: skip
    return line + (f"{miss}, or the largest cost term ({worst}, {parts[worst]:.2f} target "
                   "calls/step) cut")  # fmt: skip


def write_report(chunk_dir: Path, out_dir: Path, name: str = "real_pair") -> None:
    chunks = [json.loads(p.read_text()) for p in sorted(chunk_dir.glob("*.json"))]
    if not chunks:
        raise FileNotFoundError(f"{chunk_dir}: no chunks; run `python -m benchmarks.real_pair run` "
                                "(or real_pair_bundle run) first")  # fmt: skip
    rows: list[dict[str, Any]] = []
    for i, c in enumerate(chunks):  # prompt ids are per chunk: make them unique
        rows += [dict(r, prompt=(i, r["prompt"])) for r in c["rows"]]
    summ = summarise(rows)
    objs = []
    for m, per in summ.items():
        o = {"name": m, "speedup": {t: round(v["speedup"], 3) for t, v in per.items()},
             "acceptance": round(per["overall"].get("acceptance", 0.0), 3),
             "tokens_per_call": round(per["overall"].get("tokens_per_call", 1.0), 3),
             "identical": per["overall"]["identical"],
             "predicted_speedup": {t: round(v["predicted_speedup"], 3) for t, v in per.items()
                                   if "predicted_speedup" in v}}  # fmt: skip
        objs.append(o)
    payload = {
        "configurations": objs,
        "best_configuration": best_configuration(summ),
        "chunks": [c["meta"] for c in chunks],
        "profiles": chunks[0]["profiles"],
        "summary": summ,
    }
    report.write_report(out_dir / name, payload, markdown=to_markdown,
                        plot=lambda d, png: real_pair_png(d, png.with_suffix(".json")))  # fmt: skip


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _chunk_line(m: dict[str, Any]) -> str:
    """One chunk's run: its command, load, threads, revision and machine."""
    machine = m.get("machine") or {}
    return (f"- chunk `{m['tasks']}`: `{m['command']}`; load average start "
            f"{_fmt(m['load_avg_start'][0])}, end {_fmt(m['load_avg_end'][0])}; ended "
            f"{m['utc_end']} UTC; {m['threads']} ORT threads, {m['max_new_tokens']} new "
            f"tokens, repeats {m['repeats']}; prompt cache {m.get('prompt_cache', 'none')}; "
            f"revision {m.get('revision', '-')}, "
            f"{machine.get('cpu', '-')} ({machine.get('cpus', '-')} CPUs)")  # fmt: skip


def to_markdown(d: dict[str, Any]) -> str:
    """The report from its JSON: per chunk its run, the cost profile, the cost-model terms of
    every speculative configuration, and one table per task."""
    summ, metas = d["summary"], d["chunks"]
    profs = {n: CostProfile.from_json(json.dumps(v)) for n, v in d["profiles"].items()}
    quant = metas[0].get("target_quant", "int8")
    target = metas[0].get("target", "qwen2.5-0.5b")
    graph = get_backend(metas[0].get("target_backend", "onnx")).graph
    lines = [f"# real_pair: {target} target as {graph} ({quant} graph)", ""]
    lines += [_chunk_line(m) for m in metas]
    stat = "means" if "--profile-stat mean" in metas[0].get("command", "") else "medians"
    lines += ["", f"## Cost profile (ms, {stat} of interleaved calls, first chunk)", "",
              "| graph | T=1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 |", "|---|" + "---|" * 9]  # fmt: skip
    p0 = profs[""]
    lines.append("| target | " + " | ".join(f"{x:.1f}" for x in p0.target_ms) + " |")
    for n, p in profs.items():
        if n:
            lines.append(f"| drafter {n} | " + " | ".join(f"{x:.1f}" for x in p.drafter_ms)
                         + f" | ratio c = {p.drafter_ratio:.2f} |")  # fmt: skip
    lines += ["", f"host overhead {p0.overhead_ms:.2f} ms/step, lookup {p0.lookup_ms:.3f} ms, "
              f"prefill {p0.prefill_ms_per_token:.2f} ms/token", ""]  # fmt: skip
    best = best_configuration(summ)
    spec = [m for m in summ if m.startswith("ours_") and not m.endswith("_target")]
    for m in sorted(spec, key=lambda m: m != best):
        tag = " (best overall with identical outputs)" if m == best else ""
        lines += [f"## Cost-model terms: {m}{tag}", ""]
        prof = profs.get(_drafter_of(m))
        lines += [term_line(t, summ[m][t], prof) for t in ("overall", *TASKS) if t in summ[m]]
        lines.append("")
    for t in ("overall", *TASKS):
        lines += [f"## {t}", "", "| configuration | tok/s | speedup vs our ORT target-only | vs "
                  "ORT GenAI target-only | vs llama.cpp | acceptance | target tokens/call | drafter cost ratio | "
                  "predicted speedup | predicted/measured | identical | steps model/lookup/none |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for m, per in summ.items():
            a = per.get(t)
            if a is None:
                continue
            prof = profs.get(_drafter_of(m)) if m.startswith("ours_") else None
            ratio = prof.drafter_ratio if prof is not None and _drafter_of(m) else None
            pred = a.get("predicted_speedup")
            err = pred / a["speedup"] if pred and a["speedup"] else None
            st = a.get("steps")
            lines.append(
                f"| {m} | {a['tokens_per_s']:.2f} | {a['speedup']:.2f}x | "
                f"{_fmt(a.get('speedup_vs_genai'))} | {_fmt(a.get('speedup_vs_llamacpp'))} | "
                f"{_fmt(a.get('acceptance'), '.3f')} | "
                f"{_fmt(a.get('tokens_per_call'))} | {_fmt(ratio)} | {_fmt(pred)} | {_fmt(err)} | "
                f"{a['identical_n']}/{a['prompts']} | "
                f"{'-' if st is None else '/'.join(str(st[k]) for k in ('model', 'lookup', 'none'))} |"
            )
        lines.append("")
        for m, per in summ.items():
            a = per.get(t)
            if a and m.startswith("ours_") and not m.endswith("_target") and a["speedup"] < 1.0:
                lines.append(
                    f"- {m} below 1.0x on {t}: {limiting_term(m, a, profs.get(_drafter_of(m)))}"
                )
        lines.append("")
    return "\n".join(lines) + "\n"
