"""Member processes (issue 24): word count with ``ss.local(processes=N)`` against the plain
single-threaded loop on the same files.

    python bench/processes.py [--words 5000000] [--processes 1,2] [--repeat 3] [--dag]

The corpus is ``bench/wordcount.py``'s (Zipf-like over 50,000 words, 8 files, cached in
the private bench directory). Rows: ``plain`` (the dict loop of bench/wordcount.py),
``pipeline, processes=N`` (examples/wordcount.py's ``build_pipeline`` with ``str.split``,
documented API only) and with ``--dag`` the example's Core API DAG. Each variant runs in
a fresh interpreter (benchlib.run_variant), after a warm-up job of 10 lines with the same
engine settings (so the forkserver is running and the imports are done: the figure is the
job, start-up of its member processes included); rounds are interleaved and the best of
``--repeat`` is kept. Each row's output digest (sha256 of the sorted counts) must equal
the plain loop's, or the run stops. Ratios are the plain loop's (or processes=1's) figure
over the row's: above 1.00x the row is faster. Two figures per row: the wall time, and the
CPU time of the busiest process (the plain loop's own; with processes=1 the job's
process; with processes=N the busiest member's, ``job.metrics["__job__"]
["member_cpu_ms_max"]``, or the coordinator's if larger). On a machine whose cores are
busy with other work (the load is printed; report ``uptime``) the processes compete with
that work and the wall time says little: the busiest process's CPU time is about what
the wall time would be with a core per process. ``peak MB``: the peak resident set of the
variant's process plus, with member processes, each member's (summed: an upper bound of
what they held at once; the largest of the rounds).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    cache_path,
    count_words,
    load_example,
    peak_rss_mb,
    run_variant,
    write_corpus,
)

import slipstream as ss  # noqa: E402
from slipstream.core.pickling import cloudpickle  # noqa: E402

example = load_example("wordcount")
# the example is loaded from its path, so a member process cannot import it by name:
# its functions travel by value
cloudpickle.register_pickle_by_value(example)


def digest(counts: dict[str, int]) -> str:
    return hashlib.sha256(repr(sorted(counts.items())).encode()).hexdigest()[:16]


def engine_job(directory: str, processes: int, dag: bool) -> Any:
    if dag:
        return example.build_dag(directory, "*.txt", str.split)
    return example.build_pipeline(directory, "*.txt", str.split)


MEMBERS_RSS_MB = 0.0  # the members' peak RSS summed, of the last run_engine


def run_engine(directory: str, processes: int, dag: bool) -> tuple[dict[str, int], float]:
    """The counts and the busiest process's CPU seconds (this one's, or with member
    processes the busiest member's, from ``job.metrics``)."""
    global MEMBERS_RSS_MB
    c0 = time.process_time()
    engine = ss.local(processes=processes)
    job = engine.new_job(engine_job(directory, processes, dag), ss.JobConfig(name="bench-processes"))
    job.join()
    cpu = time.process_time() - c0
    if processes > 1:
        figures = job.metrics["__job__"]
        cpu = max(cpu, figures["member_cpu_ms_max"] / 1000)
        MEMBERS_RSS_MB = figures["member_peak_rss_kb_total"] / 1024
    return dict(engine.get_list("counts")), cpu


def run_one(variant: str, a: argparse.Namespace) -> None:
    """In the fresh interpreter: warm up, time the variant, print one JSON line."""
    import json

    if variant == "plain":
        t0, c0 = time.perf_counter(), time.process_time()
        counts = count_words(a.dir)
        cpu = time.process_time() - c0
    else:
        kind, n = variant.split(":")
        processes = int(n)
        with tempfile.TemporaryDirectory() as warm:
            with open(os.path.join(warm, "w.txt"), "w", encoding="utf-8") as fh:
                fh.write("warm up the engine\n" * 10)
            run_engine(warm, processes, kind == "dag")
        t0 = time.perf_counter()
        counts, cpu = run_engine(a.dir, processes, kind == "dag")
    seconds = time.perf_counter() - t0
    rss = peak_rss_mb() + MEMBERS_RSS_MB
    print(json.dumps({"seconds": seconds, "cpu": cpu, "digest": digest(counts), "rss": rss}))


def label(variant: str) -> str:
    if variant == "plain":
        return "plain dict loop"
    kind, n = variant.split(":")
    return f"{'Core API DAG' if kind == 'dag' else 'pipeline'}, processes={n}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=5_000_000)
    ap.add_argument("--processes", default="1,2", help="comma-separated process counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dag", action="store_true", help="also the Core API DAG")
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-variant", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dir is None:
        a.dir = cache_path(f"corpus-{a.words}")
    if a.run_variant:
        run_one(a.run_variant, a)
        return
    write_corpus(a.dir, a.words)  # reused when present
    counts = [int(n) for n in a.processes.split(",")]
    variants = ["plain"] + [f"pipeline:{n}" for n in counts]
    if a.dag:
        variants += [f"dag:{n}" for n in counts]
    load = os.getloadavg()
    print(
        f"{a.words:,} words, {len(os.sched_getaffinity(0))} usable cores, load "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min) at the start"
    )
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    rss: dict[str, float] = {}
    want: str | None = None
    for _ in range(a.repeat):  # interleaved rounds
        for v in variants:
            r = run_variant(__file__, v, ["--words", str(a.words), "--dir", a.dir])
            if want is None:
                want = r["digest"]
            if r["digest"] != want:
                raise SystemExit(f"{label(v)}: output digest {r['digest']} != the plain loop's {want}")
            best[v] = min(best.get(v, float("inf")), r["seconds"])
            best_cpu[v] = min(best_cpu.get(v, float("inf")), r["cpu"])
            rss[v] = max(rss.get(v, 0.0), r["rss"])
    load = os.getloadavg()
    base, base_cpu = best["plain"], best_cpu["plain"]
    print(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end; output digest {want}")
    header = (
        f"{'variant':<28}{'wall s':>8}{'vs plain':>10}{'vs p=1':>8}"
        f"{'busiest cpu s':>15}{'vs plain':>10}{'vs p=1':>8}{'peak MB':>9}"
    )
    print(header)
    print("-" * len(header))
    for v in variants:
        one = f"{v.split(':')[0]}:1" if v != "plain" else None
        row = f"{label(v):<28}{best[v]:>8.2f}{base / best[v]:>9.2f}x"
        row += f"{best[one] / best[v]:>7.2f}x" if one in best else f"{'':>8}"
        row += f"{best_cpu[v]:>15.2f}{base_cpu / best_cpu[v]:>9.2f}x"
        row += f"{best_cpu[one] / best_cpu[v]:>7.2f}x" if one in best_cpu else f"{'':>8}"
        print(f"{row}{rss[v]:>9.0f}")


if __name__ == "__main__":
    main()
