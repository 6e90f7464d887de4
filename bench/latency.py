"""What an idle streaming job costs, and how late the first item after a lull arrives.

    python bench/latency.py [--jobs 1,4] [--rates 10,0] [--seconds 5]
                            [--lulls 0.01,0.1,0.5,2] [--samples 20] [--src DIR] [--rounds 1]
                            [--idle-spin-ms MS]

Two measurements, each in a fresh process:

* ``idle``: ``N`` jobs (each of ``--jobs``) ``sources.generator(fn, R)`` -> ``sinks.noop()``
  on one ``ss.local()``, for each rate ``R`` of ``--rates`` (0: a source that never
  emits, a job with nothing to do); after a second of warm-up, the process's CPU time
  (all threads) over ``--seconds`` wall seconds, as a share of one core, in total and
  per job. The workers wake up between items to look for input: this is what that
  costs.
* ``lulls``: one job whose source emits what the benchmark hands it (a timestamp) and
  whose sink notes how long after that it arrived. Before each item the benchmark
  waits ``L`` seconds (a lull: the job had nothing to do), for each ``L`` of ``--lulls``,
  ``--samples`` times; the table gives the p50 and p99 of the first item's latency per
  lull. An idle worker sleeps between its looks for input, so the first item after a
  lull waits for the end of the current sleep: the longer the sleeps an idle worker
  allows itself, the less the idle job costs and the later that item.

``--idle-spin-ms MS`` adds ``idle`` rows of jobs with ``JobConfig(idle_spin_ms=MS)``
(tree ``spin MS``): their workers poll for ``MS`` after each item before they sleep.

``--src DIR`` runs everything once more on another slipstream source tree (an older
checkout's ``src``, put first on ``PYTHONPATH``), interleaved: a before/after comparison
in one run. Say the machine's load when you quote the figures (the script prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

import slipstream as ss

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")

#: what the lull job's source emits next (timestamps); what its sink measured
FEED: deque[float] = deque()
LATENCIES: list[float] = []
ARRIVED = threading.Event()


def _seq(n: int) -> int:
    return n


class FeedSource(ss.AbstractProcessor):
    """Emits the timestamps the benchmark appends to ``FEED``; never completes."""

    def complete(self) -> bool:
        while FEED:
            if not self.try_emit(FEED[0]):
                return False
            FEED.popleft()
        return False


class LatencySink(ss.AbstractProcessor):
    """Notes how long ago each timestamp was handed to the source."""

    def process(self, ordinal: int, inbox: Any) -> None:
        now = time.perf_counter()
        for sent in inbox:
            LATENCIES.append(now - sent)
        inbox.clear()
        ARRIVED.set()


def idle(jobs: int, rate: float, seconds: float, spin_ms: float = 0.0) -> dict[str, Any]:
    from slipstream import DAG, Edge, sinks, sources

    engine = ss.local()
    for i in range(jobs):
        dag = DAG()
        ticks = sources.generator(_seq, rate) if rate else FeedSource
        src = dag.new_vertex("ticks", ticks).local_parallelism(1)
        out = dag.new_vertex("sink", sinks.noop()).local_parallelism(1)
        dag.edge(Edge.between(src, out))
        config = ss.JobConfig(name=f"idle-{i}", idle_spin_ms=spin_ms) if spin_ms else None
        engine.new_job(dag, config or ss.JobConfig(name=f"idle-{i}"))
    time.sleep(1.0)  # start-up is not idleness
    c0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    engine.shutdown()
    return {"cpu_share": cpu / wall, "per_job": cpu / wall / jobs}


def lulls(lull_s: list[float], samples: int) -> dict[str, Any]:
    from slipstream import DAG, Edge

    engine = ss.local()
    dag = DAG()
    src = dag.new_vertex("feed", FeedSource).local_parallelism(1)
    out = dag.new_vertex("sink", LatencySink).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    engine.new_job(dag, ss.JobConfig(name="lulls"))
    out_rows: dict[str, Any] = {}
    for lull in lull_s:
        LATENCIES.clear()
        for _ in range(samples):
            ARRIVED.clear()
            time.sleep(lull)
            FEED.append(time.perf_counter())
            if not ARRIVED.wait(30):
                raise SystemExit("an item did not arrive within 30 s")
        ms = sorted(x * 1000 for x in LATENCIES)
        out_rows[str(lull)] = {
            "p50_ms": ms[len(ms) // 2],
            "p99_ms": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
            "max_ms": ms[-1],
        }
    engine.shutdown()
    return out_rows


def run_child(src: str, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=src)
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(f"{args} on {src} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="1,4", help="idle jobs per measurement (comma separated)")
    ap.add_argument("--rates", default="10,0", help="items/s of the idle jobs (0: none)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--lulls", default="0.01,0.1,0.5,2", help="seconds (comma separated)")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--src", default=None, help="another source tree to compare with")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--idle-spin-ms", type=float, default=0.0, help="idle rows with this spin too")
    ap.add_argument("--child", choices=["idle", "lulls"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "idle":
        print(json.dumps(idle(int(a.jobs), float(a.rates), a.seconds, a.idle_spin_ms)))
        return
    if a.child == "lulls":
        print(json.dumps(lulls([float(x) for x in a.lulls.split(",")], a.samples)))
        return
    trees = {"this tree": SRC}
    if a.src:
        trees["--src"] = os.path.abspath(a.src)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    idle_rows: dict[tuple[str, float, int], list[dict[str, Any]]] = {}
    lull_rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(a.rounds):
        for name, src in trees.items():
            for rate in (float(x) for x in a.rates.split(",")):
                for n in (int(x) for x in a.jobs.split(",")):
                    args = ["--jobs", str(n), "--rates", str(rate), "--seconds", str(a.seconds)]
                    r = run_child(src, ["--child", "idle", *args])
                    idle_rows.setdefault((name, rate, n), []).append(r)
            r = run_child(src, ["--child", "lulls", "--lulls", a.lulls, "--samples", str(a.samples)])
            lull_rows.setdefault(name, []).append(r)
        if a.idle_spin_ms:  # this tree's jobs with JobConfig(idle_spin_ms=...)
            for rate in (float(x) for x in a.rates.split(",")):
                for n in (int(x) for x in a.jobs.split(",")):
                    args = ["--jobs", str(n), "--rates", str(rate), "--seconds", str(a.seconds)]
                    args += ["--idle-spin-ms", str(a.idle_spin_ms)]
                    r = run_child(SRC, ["--child", "idle", *args])
                    idle_rows.setdefault((f"spin {a.idle_spin_ms:g} ms", rate, n), []).append(r)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"\nidle jobs (generator -> noop), CPU over {a.seconds:g} s, best round")
    print(f"{'tree':<12}{'items/s':>8}{'jobs':>6}{'% of a core':>14}{'% per job':>12}")
    for (name, rate, n), rs in idle_rows.items():
        best = min(rs, key=lambda r: r["cpu_share"])
        print(
            f"{name:<12}{rate:>8g}{n:>6}{best['cpu_share'] * 100:>14.2f}"
            f"{best['per_job'] * 100:>12.2f}"
        )
    print(f"\nfirst item after a lull, latency in ms ({a.samples} samples per lull; last round)")
    print(f"{'tree':<12}{'lull s':>8}{'p50':>9}{'p99':>9}{'max':>9}")
    for name, rs in lull_rows.items():
        for lull, row in rs[-1].items():
            print(f"{name:<12}{lull:>8}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['max_ms']:>9.2f}")


if __name__ == "__main__":
    main()
