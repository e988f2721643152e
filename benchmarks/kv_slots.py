"""What a static KV cache of 512 / 2,048 / 4,096 slots costs per decode step: our target graph
and ONNX Runtime GenAI's, same weights, short and filled contexts (issue 28).

    .venv/bin/python -m benchmarks.kv_slots prepare                 # graphs + GenAI build (slow)
    .venv/bin/python -m benchmarks.kv_slots time --threads 2        # the timed run (quiet machine)

``prepare`` (cached under ``.bench/kv_slots/``; GenAI's build under ``.bench/runtime_speed/``):
per slot count S, the target graph of ``--model`` exported by the exporter a bundle uses
(``exporters.onnx.graph.export_onnx``, fused, ``--precision``) from the model loaded with
``max_seq_len = S``, as ``omnidraft-export --max-seq-len S`` writes it: the batch-invariant
attention (``exporters.onnx.invariant``) where the recipe allows, and the
``GroupQueryAttention`` form (our drafters', and GenAI's layout) beside it. The graphs differ
only in their rotary tables (S rows); the host allocates S cache slots (``graph_contract``).
GenAI's model is built once: its cache is ``max_length`` slots, set per generator
(``past_present_share_buffer``), so S is ``max_length`` there.

``time``: one worker process per (engine, S); per context C (``--contexts``; ``full`` = S -
steps - 8) a C-token prompt is prefilled once (untimed, chunks of 256), then for ``--rounds``
rounds, the engines alternating, ``--steps`` greedy 1-token decode steps from C are timed one
by one (median ms a step; the prompt's last token is fed again before each round's steps). Our
engine is the runtime's ``OrtModel`` (IOBinding, huge pages, spin in call), GenAI's
``generate_next_token``. Intra-op threads explicit (``--threads``). Also recorded: each
worker's peak RSS and its greedy tokens (ours must not change with S). Writes
``reports/kv_slots/kv_slots.{json,md,png}``. Figures are what this run shows; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common.peers import GenAI
from benchmarks.common.report import meta_lines, pyplot, run_meta, save_figure, write_report

log = logging.getLogger("kv_slots")
WORK = Path(".bench/kv_slots")
FORMS = ("invariant", "gqa")  # our target's attention; GroupQueryAttention (drafters, GenAI)


def graph_dir(model: str, precision: str, form: str, slots: int) -> Path:
    return WORK / f"{model}-{precision}-{form}-{slots}"


def export_graph(model: str, precision: str, form: str, slots: int) -> dict[str, Any]:
    """Our fused graph of ``model`` at ``slots`` KV slots (cached), export seconds."""
    import dataclasses

    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import can_be_invariant, export_onnx

    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    out = graph_dir(model, precision, form, slots)
    if (out / "graph_info.json").is_file():
        return json.loads((out / "export.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    spec, recipe = get_preset(model), get_recipe("onnx", precision)
    t0 = time.perf_counter()
    m = load_model(spec, max_seq_len=slots)
    invariant = form == "invariant"
    if invariant and not can_be_invariant(m.args, recipe):
        raise ValueError(f"{model}/{precision}: no batch-invariant graph at {slots} slots")
    info = graph_info(m, spec, file="target.onnx", quantization=precision, seq_len=None)
    export_onnx(m, out / info.file, info=info, recipe=recipe, fused=True, invariant=invariant)
    facts = {"seconds": round(time.perf_counter() - t0, 1), "max_seq_len": info.max_seq_len}
    (out / "export.json").write_text(json.dumps(facts))
    (out / "graph_info.json").write_text(json.dumps(dataclasses.asdict(info)))
    return facts


def kv_mib(model: str, slots: int) -> float:
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.context import kv_bytes_per_slot

    return round(kv_bytes_per_slot(get_preset(model)) * slots / 2**20, 1)


# ---- engines (worker processes) ------------------------------------------------------------


PREFILL_CHUNK = 256  # prompt tokens a call: a 4,000-token prefill's logits would be 2.5 GB


class GenAISlots(GenAI):
    """GenAI with a cache of ``slots`` (its search ``max_length``). A prompt already in the cache
    is not prefilled again: the generator is rewound to its last token, which is fed again."""

    def __init__(self, folder: Path, threads: int, slots: int) -> None:
        super().__init__(folder, threads)
        self.slots = slots
        self._prompt: list[int] | None = None
        self._gen: Any = None

    def _ready(self, prompt: list[int]) -> Any:
        if prompt == self._prompt:
            self._gen.rewind_to(len(prompt) - 1)
            self._gen.append_tokens(prompt[-1:])
            return self._gen
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.slots, do_sample=False)
        gen = self.og.Generator(self.model, params)
        for s in range(0, len(prompt), PREFILL_CHUNK):
            gen.append_tokens(prompt[s : s + PREFILL_CHUNK])
        self._prompt, self._gen = prompt, gen
        return gen

    def steps(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        gen = self._ready(prompt)
        gen.generate_next_token()  # picks from the prompt's logits (no forward): untimed
        out, times = [int(gen.get_next_tokens()[0])], []
        for _ in range(n):
            t0 = time.perf_counter()
            gen.generate_next_token()  # one forward of the last token + greedy pick
            out.append(int(gen.get_next_tokens()[0]))
            times.append(time.perf_counter() - t0)
        return out, times


class OursSlots:
    """Our runtime's ``OrtModel`` on the graph in ``folder`` (its ``graph_info.json``). A prompt
    already in the cache is not prefilled again: its last token is fed again at its position."""

    def __init__(self, folder: Path, threads: int) -> None:
        from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

        from omnidraft_deploy.bundle.sections import GraphInfo

        info = GraphInfo(**json.loads((folder / "graph_info.json").read_text()))
        self.model = OrtModel(folder / info.file, info, threads=threads)
        self._prompt: list[int] | None = None

    def steps(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        import torch

        start = len(prompt) - 1 if prompt == self._prompt else 0
        for s in range(start, len(prompt), PREFILL_CHUNK):
            logits = self.model.forward(torch.tensor(prompt[s : s + PREFILL_CHUNK]), s)
        self._prompt = prompt
        out, times = [int(logits[-1].argmax())], []
        for i in range(n):
            t0 = time.perf_counter()
            logits = self.model.forward(torch.tensor(out[-1:]), len(prompt) + i)
            out.append(int(logits[-1].argmax()))
            times.append(time.perf_counter() - t0)
        return out, times


def _worker(kind: str, path: str, slots: int, threads: int, conn: Any) -> None:
    engine: Any = (GenAISlots(Path(path), threads, slots) if kind == "genai"
                   else OursSlots(Path(path), threads))  # fmt: skip
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        conn.send(engine.steps(*msg))
    conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # MiB


def engines(args: argparse.Namespace) -> dict[tuple[str, int], tuple[str, Path]]:
    from benchmarks.runtime_speed import WORK as RS_WORK

    found: dict[tuple[str, int], tuple[str, Path]] = {}
    for s in args.slots:
        for form in args.forms:
            found[(f"ours ({form})", s)] = ("ours", graph_dir(args.model, args.precision, form, s))
        genai = RS_WORK / "genai" / f"{args.model}-{args.precision}"
        if (genai / "genai_config.json").is_file():  # built by ``prepare`` (real models only)
            found[("ort-genai", s)] = ("genai", genai)
    return found


def contexts_for(args: argparse.Namespace, slots: int) -> list[tuple[str, int]]:
    return [(c, slots - args.steps - 8 if c == "full" else int(c)) for c in args.contexts]


def time_all(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    workers = {}
    for key, (kind, path) in engines(args).items():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(kind, str(path), key[1], args.threads, child))
        proc.start()
        assert parent.recv() == "ready"
        workers[key] = (proc, parent)
    cells: dict[str, dict[str, Any]] = {}
    # contexts outer, rounds inner: a worker sees one prompt round after round and prefills it
    # once; engines alternate within every round
    for label, c in sorted({lc for s in args.slots for lc in contexts_for(args, s)}):
        log.info("context %s (%d tokens): %d rounds", label, c, args.rounds)
        prompt = [(i * 7919) % 1000 + 100 for i in range(c)]
        for _ in range(args.rounds):
            for (name, s), (_, conn) in workers.items():
                if (label, c) not in contexts_for(args, s):
                    continue
                conn.send((prompt, args.steps))
                tokens, times = conn.recv()
                cell = cells.setdefault(f"{name}|{s}|{c}", {"ms": [], "tokens": tokens})
                cell["ms"].append(1e3 * statistics.median(times))
    rss = {}
    for (name, s), (proc, conn) in workers.items():
        conn.send(None)
        rss[f"{name}|{s}"] = round(conn.recv(), 1)
        proc.join()
    rows = []
    for cell_key, cell in cells.items():
        name, slots, ctx_len = cell_key.split("|")
        rows.append({"engine": name, "slots": int(slots), "context": int(ctx_len),
                     "ms_per_step": round(statistics.median(cell["ms"]), 2),
                     "ms_rounds": [round(x, 2) for x in cell["ms"]], "tokens": cell["tokens"],
                     "peak_rss_mib": rss[f"{name}|{slots}"]})  # fmt: skip
    return {"rows": rows, "kv_mib": {s: kv_mib(args.model, s) for s in args.slots}}


# ---- report -------------------------------------------------------------------------------


def to_markdown(r: dict[str, Any]) -> str:
    rows = r["rows"]
    shorts = sorted({x["context"] for x in rows if x["context"] in r["short_contexts"]})
    lines = [f"# Decode ms per step by KV slots: {r['model']} {r['precision']}, ours vs ORT GenAI",
             "", *meta_lines(r["meta"]),
             f"Medians over {r['rounds']} round-robin rounds of the median of {r['steps']} timed "
             "1-token steps; `full` = a context of S - steps - 8 tokens. KV MiB: fp32 K + V of "
             "the target at S slots.", "",
             "| engine | slots S | KV MiB | " + " | ".join(f"ctx {c}" for c in shorts)
             + " | ctx full (tokens) | peak RSS MiB |",
             "|---|---|---|" + "---|" * len(shorts) + "---|---|"]  # fmt: skip
    for name in dict.fromkeys(x["engine"] for x in rows):
        for s in sorted({x["slots"] for x in rows}):
            mine = {x["context"]: x for x in rows if x["engine"] == name and x["slots"] == s}
            if not mine:
                continue
            full = max(mine)
            cells = " | ".join(str(mine[c]["ms_per_step"]) if c in mine else "-" for c in shorts)
            rss = next(iter(mine.values()))["peak_rss_mib"]
            lines.append(f"| {name} | {s} | {r['kv_mib'][str(s)]} | {cells} | "
                         f"{mine[full]['ms_per_step']} ({full}) | {rss} |")  # fmt: skip
    lines += ["", "Greedy tokens: " + same_tokens(rows)]
    return "\n".join(lines) + "\n"


def same_tokens(rows: list[dict[str, Any]]) -> str:
    """Whether each engine's tokens at a context are the same at every S."""
    out = []
    for name in dict.fromkeys(x["engine"] for x in rows):
        for c in sorted({x["context"] for x in rows if x["engine"] == name}):
            toks = [x["tokens"] for x in rows if x["engine"] == name and x["context"] == c]
            if len(toks) > 1:
                out.append(f"{name} ctx {c}: {'same' if all(t == toks[0] for t in toks) else 'DIFFER'}"
                           f" at every S")  # fmt: skip
    return "; ".join(out) or "-"


def plot(r: dict[str, Any], png: Path) -> None:
    plt = pyplot()
    shorts = sorted({x["context"] for x in r["rows"] if x["context"] in r["short_contexts"]})
    fig, axes = plt.subplots(1, len(shorts), figsize=(4.2 * len(shorts), 3.6), squeeze=False)
    for ax, c in zip(axes[0], shorts, strict=True):
        for name in dict.fromkeys(x["engine"] for x in r["rows"]):
            pts = sorted((x["slots"], x["ms_per_step"]) for x in r["rows"]
                         if x["engine"] == name and x["context"] == c)  # fmt: skip
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"context {c}")
        ax.set_xlabel("KV slots (max_seq_len)")
        ax.set_ylabel("ms per decode step")
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["prepare", "time"])
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--precision", default="int8")
    p.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")],
                   default=[512, 2048, 4096])  # fmt: skip
    p.add_argument("--forms", type=lambda s: s.split(","), default=list(FORMS))
    p.add_argument("--contexts", type=lambda s: s.split(","), default=["64", "448", "full"])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("reports/kv_slots/kv_slots"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.command == "prepare":
        from benchmarks.runtime_speed import MODELS, build_genai

        facts = {f"{f}-{s}": export_graph(args.model, args.precision, f, s)
                 for s in args.slots for f in args.forms}  # fmt: skip
        if args.model in MODELS:  # GenAI's builder takes the real models' HF folders
            facts["genai"] = build_genai(args.model, args.precision)
        print(json.dumps(facts, indent=2))
        return
    load0 = os.getloadavg()
    result = time_all(args)
    result |= {"model": args.model, "precision": args.precision, "steps": args.steps,
               "rounds": args.rounds, "short_contexts": [int(c) for c in args.contexts
                                                         if c != "full"]}  # fmt: skip
    result["meta"] = run_meta(threads=args.threads, load_avg_start=load0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(write_report(args.out, result, markdown=to_markdown, plot=plot))


if __name__ == "__main__":
    main()
