"""Memory of a process that runs many jobs one after the other (engine/ended.py).

    python bench/ended_state.py [--jobs 20] [--keys 500k] [--engine shared|per-job]
                                [--source items|generator] [--runs 1] [--src DIR]

Runs ``--jobs`` batch jobs in one process, each with a keyed state of ``--keys`` keys
(``group_by(identity).map_stateful``: a small list per key), with the garbage collector's
automatic collection left on and no ``gc.collect()`` call, and prints the process's peak
RSS (ru_maxrss) and its RSS after the last job. ``--engine shared`` submits every job to
one ``ss.local()`` (a long-lived service), ``per-job`` makes and drops an engine for each
job (a test suite). ``--source items`` reads ``sources.items(range(KEYS))`` (the input,
a list, is part of the job's DAG and of the caller's pipeline), ``generator`` makes the
same items (``sources.generator``: no input held). Each ``--runs`` run is a fresh
process (its peak is its own); pass ``--src DIR`` to run another checkout's slipstream
(an A/B of two commits).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import count  # noqa: E402


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _identity(seq: int) -> int:
    return seq


def run_jobs(jobs: int, keys: int, engine_mode: str, source_kind: str) -> dict[str, Any]:
    """In this process: the jobs, then the figures."""
    import slipstream as ss
    from slipstream import sinks, sources

    def source() -> Any:
        if source_kind == "generator":  # holds no input
            return sources.generator(_identity, None, max_items=keys)
        return sources.items(range(keys))  # the input, a list, in the job's DAG

    def create() -> list[int]:
        return [0]

    def add(state: list[int], key: int, item: int) -> None:
        state[0] += item

    def pipeline() -> ss.Pipeline:
        p = ss.Pipeline()
        (
            p.read_from(source())
            .group_by(lambda x: x)
            .map_stateful(create, add)
            .write_to(sinks.noop())
        )
        return p

    start = time.perf_counter()
    shared = ss.local() if engine_mode == "shared" else None
    for _ in range(jobs):
        engine = shared if shared is not None else ss.local()
        engine.new_job(pipeline()).join()
        del engine
    return {
        "jobs": jobs,
        "keys": keys,
        "engine": engine_mode,
        "source": source_kind,
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "end_rss_mb": _rss_kb() // 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--keys", default="500k")
    ap.add_argument("--engine", choices=("shared", "per-job"), default="shared")
    ap.add_argument("--source", choices=("items", "generator"), default="items")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--src", default=None, help="the src directory of the slipstream to run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    keys = count(args.keys)
    if args.child:
        print(json.dumps(run_jobs(args.jobs, keys, args.engine, args.source)))
        return
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.path.abspath(args.src)
    for _ in range(args.runs):
        cmd = [sys.executable, __file__, "--child", "--jobs", str(args.jobs)]
        cmd += ["--keys", str(keys), "--engine", args.engine, "--source", args.source]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["src"] = args.src or "(this checkout)"
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
