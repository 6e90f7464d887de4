"""Calling a slow service per item: throughput against the in-flight limit.

Every item makes one simulated remote call of 10 ms (``asyncio.sleep`` for the asyncio
mode, ``time.sleep`` on the thread pool for the threads mode, ``time.sleep`` inline for
the synchronous ``map_using_service``). One processor calls the service, so the ideal
throughput is ``max_concurrent / 10 ms`` items/s. Each variant runs in a fresh
interpreter. Items per variant: ``min(--items, 400 * limit)`` so that the low limits do
not take minutes (a limit of 1 would need 1000 s for 100k items).

    python bench/services.py [--items 100000] [--limits 1,4,16,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import peak_rss_mb, print_table, run_variant  # noqa: E402

import slipstream as ss  # noqa: E402
from slipstream import DAG, Edge, sinks, sources  # noqa: E402
from slipstream import processors as P  # noqa: E402

CALL_S = 0.010


def make_service(context: object) -> str:
    return "service"


async def call_async(service: str, item: int) -> int:
    await asyncio.sleep(CALL_S)
    return item * 2


def call_blocking(service: str, item: int) -> int:
    time.sleep(CALL_S)
    return item * 2


def run(variant: str, items: int) -> dict[str, object]:
    kind, _, limit_s = variant.partition("-")
    limit = int(limit_s) if limit_s else 1
    factory = P.service_factory(make_service)
    if kind == "sync":
        proc = P.map_using_service(factory, call_blocking)
    else:
        fn = call_async if kind == "asyncio" else call_blocking
        proc = P.map_using_service_async(factory, fn, max_concurrent=limit, ordered=True)
    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(items))).local_parallelism(1)
    svc = dag.new_vertex("svc", proc).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, svc)).edge(Edge.between(svc, out))
    engine = ss.local()
    t0 = time.perf_counter()
    engine.new_job(dag).join(3600)
    seconds = time.perf_counter() - t0
    got = engine.get_list("out")
    assert len(got) == items and got[:3] == [0, 2, 4], "ordered output"
    return {"name": variant, "items": items, "seconds": seconds, "peak_mb": peak_rss_mb()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--limits", default="1,4,16,64,256")
    ap.add_argument("--run-variant")
    args = ap.parse_args()
    if args.run_variant:
        print(json.dumps(run(args.run_variant, args.items)))
        return
    limits = [int(x) for x in args.limits.split(",")]
    rows = []
    n = min(args.items, 400)
    rows.append(run_variant(__file__, "sync", ["--items", str(n)]))
    for mode in ("asyncio", "threads"):
        for limit in limits:
            if mode == "threads" and limit > 64:
                continue  # one OS thread per call in flight: 64 is plenty
            n = min(args.items, 400 * limit)
            rows.append(run_variant(__file__, f"{mode}-{limit}", ["--items", str(n)]))
    print_table(
        "10 ms calls, one processor (ideal: limit x 100 items/s); items per row as listed",
        rows,
        baseline="sync",
    )
    print(f"{'':<34}items per row: " + ", ".join(f"{r['name']}={r['items']}" for r in rows))


if __name__ == "__main__":
    main()
