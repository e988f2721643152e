"""Load time and memory of n-gram cache files: the linear reader vs the entry-by-entry one.

Builds random caches (2-5 drafter ids per n-gram, Llama-2 -> Llama-3 vocabularies, LFU canonical
order), encodes them with ``ngram.format.to_bytes`` and times ``from_bytes`` (vectorised varints,
bulk build, GC paused) against the previous reader (``_read_entries`` + ``NGramCache.from_items``,
GC on), side by side in one run, with the load average. Writes reports/ngram_load/ngram_load.json
and the .md rendered from it.

    .venv/bin/python -m benchmarks.ngram_load --sizes 250000 1000000 2000000 --old-max 250000
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time
from pathlib import Path
from typing import Any

from benchmarks.common.report import meta_lines, run_meta, write_report
from omnidraft_deploy.ngram import format as odng
from omnidraft_deploy.ngram.cache import NGramCache


def make_bytes(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    keys: set[tuple[int, ...]] = set()
    while len(keys) < n:
        keys.add(tuple(rng.randrange(32000) for _ in range(rng.randint(2, 5))))
    uses = sorted(rng.randint(1, 50) for _ in range(n))
    cache = NGramCache.from_checked_rows(
        list(keys), [rng.randrange(128256) for _ in range(n)], uses, max_entries=n, policy="lfu"
    )
    return odng.to_bytes(cache, draft_vocab_size=32000, target_vocab_size=128256)


def old_reader(data: bytes) -> NGramCache:
    header = odng._read_header(data, "<bench>")
    rows = odng._read_entries(data, header, "<bench>")
    return NGramCache.from_items(rows, max_entries=max(8192, header.n_entries), policy="lfu")


def timed(fn, data: bytes) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    cache = fn(data)
    return time.perf_counter() - t0, len(cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000, 2_000_000])
    ap.add_argument("--old-max", type=int, default=250_000, help="largest size for the old reader")
    ap.add_argument("--out", default="reports/ngram_load/ngram_load")
    args = ap.parse_args()
    load0, rows = os.getloadavg(), []
    for n in args.sizes:
        data = make_bytes(n)
        load = os.getloadavg()[0]
        new_s, got = timed(lambda d: odng.from_bytes(d)[0], data)
        old_s = timed(old_reader, data)[0] if n <= args.old_max else None
        rows.append({"entries": got, "mb": round(len(data) / 1e6, 1), "new_s": round(new_s, 2),
                     "old_s": None if old_s is None else round(old_s, 2),
                     "load_1min": round(load, 2)})  # fmt: skip
        print(rows[-1], flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    payload = {"meta": run_meta(threads=None, load_avg_start=load0), "peak_rss_mb": round(peak),
               "rows": rows}  # fmt: skip
    write_report(Path(args.out), payload, markdown=to_markdown)


def to_markdown(d: dict[str, Any]) -> str:
    lines = ["# n-gram cache load time", "", *meta_lines(d["meta"]),
             f"Peak RSS of the whole run {d['peak_rss_mb']} MB.", "",
             "| entries | file MB | linear reader s | previous reader s | load avg (1 min) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in d["rows"]:
        old = "-" if r["old_s"] is None else r["old_s"]
        lines.append(f"| {r['entries']:,} | {r['mb']} | {r['new_s']} | {old} | {r['load_1min']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
