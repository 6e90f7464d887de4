"""Keyed state beyond memory (issue 22, item 3): the same job on ``state_backend="memory"``
and ``"sqlite"``, each in a process of its own under an address-space limit.

    python bench/disk_state.py [--keys 20000000] [--items N] [--limit-mb 1200]
                               [--backends memory,sqlite] [--pattern new|uniform|skewed]
                               [--threads 2] [--guarantee none|exactly_once]

The job (as bench/state_scale.py's, Pipeline API)::

    p.read_from(sources.generator(fn, None, max_items=ITEMS))
     .group_by(itemgetter(0)).rolling_aggregate(counting()).write_to(sinks.noop())

over K keys: ``new`` is ``(seq, 1)`` (every item a new key: ITEMS = K by default, the
state ends with K keys), ``uniform`` is ``(seq % K, 1)`` (ITEMS = 2K: each key twice),
``skewed`` creates every key once and then sends the rest of the items to 1% of them
(ITEMS = K + 5M). Each backend runs in a child process with ``RLIMIT_AS`` at
``--limit-mb`` (``0``: no limit) and ``MALLOC_ARENA_MAX=2`` (so that threads' malloc
arenas do not reserve address space they never use); a row reports whether the job
completed or failed (MemoryError), its throughput (items / wall time of ``join``, and
items / CPU seconds of the process, which depends less on the machine's load), the
child's peak RSS and address space and the size of the state's files at their largest
(sampled every 0.5 s).
``--guarantee exactly_once`` takes snapshots every ``--interval-ms`` into a temporary
store (its size is the store's business: a full snapshot of a large state is large).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def child(a: argparse.Namespace) -> None:
    """One run (in its own process, under the limit); prints one JSON line."""
    if a.limit_mb:
        lim = a.limit_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    sys.path.insert(0, SRC)
    import operator

    import slipstream as ss
    from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
    from slipstream.aggregate import counting

    k, items = a.keys, a.items
    if a.pattern == "new":
        fn: Any = _New()
    elif a.pattern == "uniform":
        fn = _Uniform(k)
    else:
        fn = _Skewed(k)
    work = tempfile.mkdtemp(prefix="disk-state-bench-")
    p = ss.Pipeline()
    (
        p.read_from(sources.generator(fn, None, max_items=items))
        .group_by(operator.itemgetter(0))
        .rolling_aggregate(counting())
        .write_to(sinks.noop())
    )
    guarantee = ProcessingGuarantee(a.guarantee)
    cfg = JobConfig(
        name="disk-state",
        state_backend=a.backend,
        processing_guarantee=guarantee,
        snapshot_interval_ms=a.interval_ms,
        auto_restart=False,
    )
    state_dir = os.path.join(work, "state")
    peak_disk = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            peak_disk[0] = max(peak_disk[0], _dir_bytes(state_dir))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out: dict[str, Any] = {"backend": a.backend, "keys": k, "items": items}
    t0 = time.perf_counter()
    c0 = time.process_time()
    try:
        engine = ss.local(cooperative_threads=a.threads, work_dir=work)
        job = engine.new_job(p, cfg)
        job.join()
        out["outcome"] = "completed"
    except BaseException as e:  # noqa: BLE001 - MemoryError, or the job's error naming it
        text = f"{type(e).__name__}: {e}"
        out["outcome"] = "MemoryError" if "MemoryError" in text else text[:200]
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    stop.set()
    out["wall_s"] = round(wall, 2)
    done = out["outcome"] == "completed"
    out["items_per_s"] = round(items / wall) if done else None
    out["items_per_cpu_s"] = round(items / cpu) if done else None
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["peak_state_files_mb"] = round(peak_disk[0] / 1e6)
    with open("/proc/self/status") as fh:
        vm = [x for x in fh if x.startswith("VmPeak:")]
    out["vm_peak_mb"] = round(int(vm[0].split()[1]) / 1024) if vm else None
    out["snapshots"] = None
    try:
        out["snapshots"] = job.metrics["__job__"].get("snapshots")
    except Exception:  # noqa: BLE001 - the job did not start
        pass
    print(json.dumps(out), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    os._exit(0)  # no teardown of a job that failed on memory


class _New:
    def __call__(self, seq: int) -> tuple[int, int]:
        return (seq, 1)


class _Uniform:
    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, seq: int) -> tuple[int, int]:
        return (seq % self.k, 1)


class _Skewed:
    def __init__(self, k: int) -> None:
        self.k = k
        self.h = max(1, k // 100)

    def __call__(self, seq: int) -> tuple[int, int]:
        if seq < self.k:
            return (seq, 1)
        return ((seq % self.h) * (self.k // self.h), 1)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", type=int, default=20_000_000)
    ap.add_argument("--items", type=int, default=None)
    ap.add_argument("--limit-mb", type=int, default=1200, help="RLIMIT_AS of each run (0: none)")
    ap.add_argument("--backends", default="memory,sqlite")
    ap.add_argument("--pattern", default="new", choices=("new", "uniform", "skewed"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--guarantee", default="none", choices=("none", "exactly_once"))
    ap.add_argument("--interval-ms", type=int, default=10_000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.items is None:
        a.items = {"new": a.keys, "uniform": 2 * a.keys, "skewed": a.keys + 5_000_000}[a.pattern]
    if a.child:
        child(a)
        return
    print(
        f"# {a.pattern}: {a.keys:,} keys, {a.items:,} items, RLIMIT_AS "
        f"{a.limit_mb or 'none'} MB, {a.threads} threads, guarantee {a.guarantee}; "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print(
        "| backend | outcome | items/s | items/CPU-s | wall s | peak RSS MB "
        "| peak address space MB | state files MB (peak) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for backend in a.backends.split(","):
        argv = [sys.executable, os.path.abspath(__file__), "--child", "--backend", backend]
        for name in ("keys", "items", "limit_mb", "pattern", "threads", "guarantee"):
            argv += [f"--{name.replace('_', '-')}", str(getattr(a, name))]
        argv += ["--interval-ms", str(a.interval_ms)]
        env = dict(os.environ, MALLOC_ARENA_MAX="2")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
        if line is None:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"| {backend} | died (exit {proc.returncode}): {tail[:80]} |" + " - |" * 6)
            continue
        r = json.loads(line)
        ips = f"{r['items_per_s']:,}" if r["items_per_s"] else "-"
        ipc = f"{r['items_per_cpu_s']:,}" if r["items_per_cpu_s"] else "-"
        print(
            f"| {backend} | {r['outcome']} | {ips} | {ipc} | {r['wall_s']} | {r['peak_rss_mb']} | "
            f"{r['vm_peak_mb']} | {r['peak_state_files_mb']} |",
            flush=True,
        )
    print(f"# load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
