"""Member processes (issue 24): jobs with ``ss.local(processes=N)`` against the plain
single-threaded loop on the same data, with the same output digest.

    python bench/processes.py [--only wc,rsf,win,k1,k2,latency] [--processes 1,2]
                              [--repeat 3] [--words 5000000] [--files 8] [--events 2000000]
                              [--win-events 2000000] [--records 1000000]
                              [--latency-rate 1000] [--latency-seconds 10]
                              [--idle-spin-ms 10]

Rows (each job's definition is the one of the bench named, imported from it, not
copied; every engine row uses documented API only):

* ``wc``: word count over ``bench/wordcount.py``'s corpus (Zipf-like over 50,000 words,
  ``--files`` files of equal size, 8 unless told): the dict loop (benchlib.count_words) vs examples/wordcount.py's
  ``build_pipeline`` (with ``str.split``) and its Core API ``build_dag``. With a process
  count N > 1 also ``plain loop, N procs by hand`` (``count_words_split``): the same loop
  in N forked processes, each over the files ``read_files`` gives a member, merged here;
  what the machine gives N processes without the engine, so the ceiling of its scaling.
* ``rsf``: the CSV running sum with a user's ``AbstractProcessor`` (bench/wordcount.py's
  ``rsf_dag``: read_files -> distributed partitioned -> ``CsvRunningSum`` -> map sink)
  over ``--events`` ``key,value`` lines cut into 8 files (so that the processors of both
  members read), vs the loop that reads the same files into a dict (``rsf_plain``).
  Digest: the final sums.
* ``win``: tumbling 1 s windows, the sum per key (bench/windowing.py's
  ``window_pipeline``, a Pipeline: with_timestamps(lag 100 ms) -> group_by -> window ->
  aggregate(summing)) over ``--win-events`` events of windowing.py's ``HashedEvent``
  shape (1,000 keys, 10,000 events per second of event time, disorder < 100 ms), which
  ``sources.generator(..., max_items=N)`` computes from the sequence number, split over
  all processors of all members; the plain loop (``plain_windows``) computes the same
  events from the same sequence numbers as it goes. Digest: the sorted window results.
* ``k1``, ``k2``: bench/kafka.py's K1 (parse, filter, produce) and K2 (10 s tumbling sum
  per user by event time) on the local Kafka-compatible broker (Tansu, memory only,
  started here), ``--records`` records in 4 partitions, each contender in its own
  process (kafka.measure: the time runs until the output topic holds every expected
  record); the plain confluent-kafka loops of bench/kafka.py are the baselines (with the
  client's defaults, as a user writes them; the row ``plain loop, backoff 10 ms`` is the
  same loop with ``fetch.queue.backoff.ms`` 10, the setting slipstream's Kafka source
  makes since 32c16de: the ratios are against the first, compare the second too). The
  slipstream contender's job runs on an engine made before its time starts, as the other
  rows' (kafka.warm_engine: a warm-up job of 10 items, the spare members up; with
  ``--fresh-engine`` the engine is made in the timed part). Digest: the sorted output
  values.
* ``latency``: items arriving one at a time: ``sources.generator`` at ``--latency-rate``
  items per second for ``--latency-seconds``, each stamped with the wall-clock time the
  generator made it (when it was due), through a distributed partitioned edge (half of the items cross to the other
  member with processes=2) into a user's sink processor that notes how long after its
  due time each arrived (in the processor; its notes go to the coordinator once the
  input ended, not with a member's report per item); p50 / p99 / max of all items after the first second, of the
  round with the median p99 of ``--repeat`` interleaved rounds. Its last row is the
  floor of a cross-process hop on this machine without the engine
  (``socketpair_floor``: a stamp every ``2 / --latency-rate`` s, the rate at which the
  job's items cross, to a child process waiting in ``select``; ``floor, child spins``:
  the child polls its socket without blocking, as a spinning worker does). The rows ``spin,
  processes=N`` are the same job with ``JobConfig(idle_spin_ms=--idle-spin-ms)`` (the
  workers poll for that long after their last progress before they sleep); ``total cpu
  s`` is the CPU time of all the job's processes together (the coordinator's and every
  member's). ``--only latency-list``
  adds rows of the same job with ``sinks.list_sink`` in place of the processor, measured
  where the user reads it: when each item appears in ``engine.get_list`` of this process
  (a thread polls it every 0.2 ms; with member processes the items come with the
  members' reports).

Each non-Kafka row runs in a fresh interpreter (benchlib.run_variant) after a warm-up
job of 10 lines on the same engine (the forkserver is running, the imports are done and,
with processes > 1, the engine's spare member processes are up, as a cluster's members
run before its jobs: a row's figure is the job, its members' set-up included;
``--fresh-engine``: on a new engine made in the timed part, the forks of its member
processes included);
rounds are interleaved and the best of ``--repeat`` is kept. A row whose digest differs
from its plain loop's stops the run. Ratios are the plain loop's (or processes=1's)
figure over the row's: above 1.00x the row is faster. Two figures per row: the wall time,
and the CPU time of the busiest process (the plain loop's own; with processes=1 the
job's process; with processes=N the largest of the coordinator's and each member's). On a
machine whose cores are busy with other work (the load is printed; report ``uptime``)
the processes compete with that work and the wall time says little: the busiest
process's CPU time is about what the wall time would be with a core per process (it
leaves out what crossing between the processes waits for). ``peak MB``: the peak
resident set of the row's process plus, with member processes, each member's (summed:
an upper bound of what they held at once; the largest of the rounds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import select
import socket
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import windowing  # noqa: E402
import wordcount  # noqa: E402
from benchlib import (  # noqa: E402
    cache_path,
    count_words,
    load_example,
    peak_rss_mb,
    run_variant,
    wait_for_spares,
    write_corpus,
)

import slipstream as ss  # noqa: E402
from slipstream import DAG, Edge, sources  # noqa: E402
from slipstream.core.pickling import cloudpickle  # noqa: E402

example = load_example("wordcount")
# loaded from their paths (or from the bench directory, not on a member's path when
# another script started the forkserver): their functions travel by value
for _module in (example, wordcount, windowing):
    cloudpickle.register_pickle_by_value(_module)

JOBS = {
    "wc": "word count",
    "rsf": "CSV running sum, user's AbstractProcessor",
    "win": "tumbling windows 1 s",
    "k1": "Kafka K1 (parse, filter, produce)",
    "k2": "Kafka K2 (10 s tumbling sum per user)",
}
RSF_FILES = 8
WIN_KEYS = 1000
WIN_EVENT_RATE = 10_000


def digest_of(rows: list[Any]) -> str:
    return hashlib.sha256(repr(sorted(rows)).encode()).hexdigest()[:16]


MEMBERS_RSS_MB = 0.0  # the members' peak RSS summed, of the last run_engine
TOTAL_CPU = 0.0  # every process's CPU seconds together, of the last run_engine


def run_engine(
    job_def: Any, processes: int, name: str = "bench-processes", idle_spin_ms: float = 0.0
) -> tuple[Any, float]:
    """Run ``job_def`` to its end; the engine and the busiest process's CPU seconds
    (this one's, or with member processes the busiest member's, from ``job.metrics``)."""
    global MEMBERS_RSS_MB, TOTAL_CPU
    c0 = time.process_time()
    engine = WARM_ENGINE if WARM_ENGINE is not None else ss.local(processes=processes)
    job = engine.new_job(job_def, ss.JobConfig(name=name, idle_spin_ms=idle_spin_ms))
    job.join()
    cpu = TOTAL_CPU = time.process_time() - c0
    if processes > 1:
        figures = job.metrics["__job__"]
        cpu = max(cpu, figures["member_cpu_ms_max"] / 1000)
        TOTAL_CPU += figures["member_cpu_ms_total"] / 1000
        MEMBERS_RSS_MB = figures["member_peak_rss_kb_total"] / 1024
    return engine, cpu


def _count_share(directory: str, index: int, count: int, conn: Any) -> None:
    """A child of :func:`count_words_split`: its share of the files counted by the plain
    loop, then its CPU seconds (the pickling of the counts included)."""
    c0 = time.process_time()
    counts = count_words(directory, index, count)
    conn.send_bytes(pickle.dumps(counts, pickle.HIGHEST_PROTOCOL))
    conn.send_bytes(pickle.dumps(time.process_time() - c0))
    conn.close()


def count_words_split(directory: str, processes: int) -> tuple[dict[str, int], float]:
    """The plain loop split by hand over ``processes`` forked processes (each counts the
    files ``i, i + processes, ...``, as ``read_files`` splits them; this process merges
    their dicts): what the machine gives two processes with no engine at all, the
    ceiling of the engine's scaling. Returns the counts and the busiest process's CPU
    seconds (a child's counting and pickling, or this process's merge)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # a fresh interpreter: no other threads
    c0 = time.process_time()
    procs, conns = [], []
    for i in range(processes):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_count_share, args=(directory, i, processes, child))
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    counts: dict[str, int] = {}
    get = counts.get
    busiest = 0.0
    for conn in conns:
        share = pickle.loads(conn.recv_bytes())
        busiest = max(busiest, pickle.loads(conn.recv_bytes()))
        for w, n in share.items():
            counts[w] = get(w, 0) + n
    for p in procs:
        p.join()
    return counts, max(busiest, time.process_time() - c0)


#: the engine of the warm-up job, which the row's job then runs on (``None``:
#: ``--fresh-engine``, a new engine in the timed part)
WARM_ENGINE: Any = None


def warm_up(processes: int, fresh_engine: bool = False) -> None:
    """A 10-line word count on the row's engine settings. Unless ``fresh_engine``, the
    row's job then runs on the same engine, once its spare member processes are up
    (engine/member_spares.py: forked after the warm-up job ended, as a cluster's members
    run before a job)."""
    global WARM_ENGINE
    WARM_ENGINE = None
    with tempfile.TemporaryDirectory() as warm:
        with open(os.path.join(warm, "w.txt"), "w", encoding="utf-8") as fh:
            fh.write("warm up the engine\n" * 10)
        engine, _ = run_engine(example.build_pipeline(warm, "*.txt", str.split), processes)
    if fresh_engine:
        return
    engine.get_list("counts").clear()
    wait_for_spares(engine, processes)
    WARM_ENGINE = engine


# -- latency -------------------------------------------------------------------------------


def stamped(seq: int) -> tuple[int, float]:
    """``fn(seq)`` of the rate-limited generator: ``(seq, the wall-clock time it was
    made)``. The generator makes an item when it is due (its share of the rate, on its
    own clock since its first call), so this is its due time unless the generator's
    worker was late; a stamp from a global schedule (start + seq / rate) would be off by
    each processor's offset in the schedule (processor i's first item is seq i)."""
    return seq, time.time()


def item_seq(item: tuple[int, float]) -> int:
    return item[0]


class LatencySink(ss.AbstractProcessor):
    """Notes ``(seq, seconds since it was made)`` for each item, in the processor, and
    adds its notes to the list ``latency`` once its input ended (with member processes
    the coordinator gathers the members' lists then). Not an append per item to the
    named list: in a member process that is sink output, which the member reports to
    the coordinator as soon as its worker goes idle (up to 500 reports a second per
    member at this rate, each waking the member's report thread and the coordinator's
    process): the row would measure the bench's own note-taking competing with the item
    for the two cores (docs/performance.md, "A lone item across processes: where the
    time goes"). ``--only latency-list`` measures that copy where the user reads it."""

    def init_processor(self, context: ss.Context) -> None:
        self.out = context.get_list("latency")
        self.seen: list[tuple[int, float]] = []

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.seen.append((item[0], time.time() - item[1]))
        return True

    def complete(self) -> bool:
        self.out.extend(self.seen)
        self.seen = []
        return True


def latency_dag(rate: float, seconds: float) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", sources.generator(stamped, rate, max_items=int(rate * seconds)))
    out = dag.new_vertex("sink", LatencySink)
    dag.edge(Edge.between(src, out).distributed().partitioned(item_seq))
    return dag


def socketpair_floor(rate: float, seconds: float, spin: bool = False) -> list[float]:
    """The floor of a hop between two processes on this machine, without the engine: a
    child waits in ``select`` on one end of a socketpair (as an idle member's worker
    does; with ``spin``, polls it without blocking, ``os.sched_yield`` between polls, as
    a worker in its ``idle_spin_ms`` window does) and notes how long after it was sent
    each stamp arrived; this process sends one stamp every ``1 / rate`` s (the rate at
    which the latency job's items cross). Returns the ms of the stamps sent after the
    first second."""
    a, b = socket.socketpair()
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    out.close()
    pid = os.fork()  # this fresh interpreter runs no thread yet
    if pid == 0:
        a.close()
        arrived: list[tuple[float, float]] = []
        rest = b""
        while True:
            if spin:
                os.sched_yield()
            else:
                select.select([b], [], [], 0.01)
            try:
                data = b.recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                break
            now = time.time()
            *stamps, rest = (rest + data).split(b";")
            arrived += [(float(s), now) for s in stamps]
        with open(out.name, "w", encoding="utf-8") as fh:
            json.dump(arrived, fh)
        os._exit(0)
    b.close()
    start = time.perf_counter()
    first = time.time()
    for i in range(int(rate * seconds)):
        wait = start + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        a.send(f"{time.time()!r};".encode())
    a.close()
    os.waitpid(pid, 0)
    with open(out.name, encoding="utf-8") as fh:
        arrived = json.load(fh)
    os.unlink(out.name)
    return sorted((now - sent) * 1000 for sent, now in arrived if sent >= first + 1.0)


def list_sink_latency(processes: int, rate: float, seconds: float) -> tuple[list[float], float]:
    """The latency job with ``sinks.list_sink`` in place of the processor: ms from an
    item's making to its appearing in ``engine.get_list`` of this process (a thread polls
    the list every 0.2 ms), of the items after the first second; and the job's busiest
    process's CPU seconds."""
    dag = DAG()
    src = dag.new_vertex("source", sources.generator(stamped, rate, max_items=int(rate * seconds)))
    out = dag.new_vertex("sink", ss.sinks.list_sink("latency"))
    dag.edge(Edge.between(src, out).distributed().partitioned(item_seq))
    engine = ss.local(processes=processes)
    seen: list[tuple[int, float]] = []
    stop = threading.Event()

    def poll() -> None:
        lst = engine.get_list("latency")
        k = 0
        while not stop.is_set():
            n = len(lst)
            if n > k:
                now = time.time()
                seen.extend((item[0], now - item[1]) for item in lst[k:n])
                k = n
            time.sleep(0.0002)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    c0 = time.process_time()
    job = engine.new_job(dag, ss.JobConfig(name="latency-list"))
    job.join()
    cpu = time.process_time() - c0
    if processes > 1:
        cpu = max(cpu, job.metrics["__job__"]["member_cpu_ms_max"] / 1000)
    while len(seen) < int(rate * seconds):
        time.sleep(0.01)
    stop.set()
    poller.join()
    return sorted(lat * 1000 for seq, lat in seen if seq >= rate), cpu


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


# -- one row, in a fresh interpreter -------------------------------------------------------


def run_one(variant: str, a: argparse.Namespace) -> None:
    """``job:impl[:processes]``: time it, print one JSON line."""
    job, impl, *rest = variant.split(":")
    processes = int(rest[0]) if rest else 1
    if impl not in ("plain", "floor", "floorspin"):
        warm_up(processes, a.fresh_engine)
    extra: dict[str, Any] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    cpu = 0.0
    if job == "wc":
        if impl == "plain" and processes > 1:
            split, cpu = count_words_split(a.dir, processes)
            rows: list[Any] = list(split.items())
        elif impl == "plain":
            rows = list(count_words(a.dir).items())
        else:
            build = example.build_dag if impl == "dag" else example.build_pipeline
            engine, cpu = run_engine(build(a.dir, "*.txt", str.split), processes)
            rows = list(engine.get_list("counts"))
    elif job == "rsf":
        if impl == "plain":
            rows = list(wordcount.rsf_plain(a.rsf_dir).items())
        else:
            engine, cpu = run_engine(wordcount.rsf_dag(a.rsf_dir), processes)
            rows = list(engine.get_map("sums").items())
    elif job == "win":
        fn = windowing.HashedEvent(WIN_KEYS, WIN_EVENT_RATE)
        wd = windowing.WINDOWS["tumbling"]
        if impl == "plain":
            events = (fn(s) for s in range(a.win_events))
            rows = windowing.plain_windows(events, wd, windowing.LAG_MS)  # type: ignore[arg-type]
        else:
            source = sources.generator(fn, None, max_items=a.win_events)
            p = windowing.window_pipeline(source, wd, ss.sinks.list_sink("windows"))
            engine, cpu = run_engine(p, processes)
            rows = [tuple(r) for r in engine.get_list("windows")]
    elif job == "latency" and impl == "list":
        ms, cpu = list_sink_latency(processes, a.latency_rate, a.latency_seconds)
        extra = {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": ms[-1]}
        rows = []
    elif job == "latency" and impl in ("floor", "floorspin"):
        ms = socketpair_floor(a.latency_rate / 2, a.latency_seconds, impl == "floorspin")
        extra = {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": ms[-1]}
        rows = []
    elif job == "latency":
        spin = a.idle_spin_ms if impl == "spin" else 0.0
        dag = latency_dag(a.latency_rate, a.latency_seconds)
        engine, cpu = run_engine(dag, processes, idle_spin_ms=spin)
        warm = a.latency_rate  # the first second's items
        ms = sorted(lat * 1000 for seq, lat in engine.get_list("latency") if seq >= warm)
        expected = int(a.latency_rate * a.latency_seconds) - int(warm)
        if len(ms) != expected:
            raise SystemExit(f"latency: {len(ms)} items arrived, {expected} expected")
        extra = {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": ms[-1]}
        extra["total_cpu"] = TOTAL_CPU
        rows = []
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    seconds = time.perf_counter() - t0
    if impl == "plain" and processes == 1:
        cpu = time.process_time() - c0
    rss = peak_rss_mb() + (MEMBERS_RSS_MB if processes > 1 else 0.0)
    if impl == "plain" and processes > 1:  # the children's: the largest, once per child
        import resource

        rss += processes * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps({"seconds": seconds, "cpu": cpu, "digest": digest_of(rows), "rss": rss, **extra})
    )


# -- the table -----------------------------------------------------------------------------


def label(variant: str) -> str:
    job, impl, *rest = variant.split(":")
    if impl == "plain":
        return f"plain loop, {rest[0]} procs by hand" if rest else "plain loop"
    if impl == "plainfast":
        return "plain loop, backoff 10 ms"
    what = {"dag": "Core API DAG", "pipeline": "Pipeline", "slipstream": "DAG"}.get(impl, impl)
    return f"{what}, processes={rest[0]}"


def print_rows(title: str, variants: list[str], r: dict[str, dict[str, Any]], digest: str) -> None:
    print(f"\n{title} (output digest {digest})")
    header = (
        f"{'variant':<30}{'wall s':>8}{'vs plain':>10}{'vs p=1':>8}"
        f"{'busiest cpu s':>15}{'vs plain':>10}{'vs p=1':>8}{'peak MB':>9}"
    )
    print(header)
    print("-" * len(header))
    plain = next(v for v in variants if ":plain" in v)
    base, base_cpu = r[plain]["seconds"], r[plain]["cpu"]
    for v in variants:
        if v not in r:
            print(f"{label(v):<30}{r.get(v + ':missing', 'not run')}")
            continue
        job, impl, *rest = v.split(":")
        one = r.get(f"{job}:{impl}:1") if rest else None
        if impl == "plain" and rest:
            one = r[plain]  # the hand-split loop's scaling: against the loop itself
        s, c = r[v]["seconds"], r[v]["cpu"]
        row = f"{label(v):<30}{s:>8.2f}{base / s:>9.2f}x"
        row += f"{one['seconds'] / s:>7.2f}x" if one else f"{'':>8}"
        row += f"{c:>15.2f}{base_cpu / c:>9.2f}x"
        row += f"{one['cpu'] / c:>7.2f}x" if one else f"{'':>8}"
        print(f"{row}{r[v]['rss']:>9.0f}")


def keep_best(best: dict[str, dict[str, Any]], v: str, row: dict[str, Any]) -> None:
    """The best wall and CPU time of the rounds, the largest peak memory."""
    old = best.get(v)
    if old is None:
        best[v] = dict(row)
        return
    old["seconds"] = min(old["seconds"], row["seconds"])
    old["cpu"] = min(old["cpu"], row["cpu"])
    old["rss"] = max(old["rss"], row["rss"])


def kafka_rows(a: argparse.Namespace, counts: list[int], jobs: list[str]) -> None:
    """K1 / K2: bench/kafka.py's contenders in their own processes, on one broker."""
    import kafka
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    with kafka.broker(None) as bootstrap:
        src = f"bench-processes-in-{os.getpid()}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(src, kafka.PARTITIONS, 1)]).values():
            f.result(30)
        records = kafka.make_records(a.records, a.users)
        prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for p, key, rec in records:
            while True:
                try:
                    prod.produce(
                        src,
                        json.dumps(rec).encode(),
                        key.encode(),
                        partition=p,
                        timestamp=rec["ts"],
                    )
                    break
                except BufferError:
                    prod.poll(0.01)
        prod.flush(120)
        del prod, admin  # before the broker stops (a live client would log its loss)
        want = dict(zip(("k1", "k2"), kafka.expected(records), strict=True))
        print(
            f"\nKafka: {len(records):,} records in {kafka.PARTITIONS} partitions; expected "
            f"K1 {want['k1']:,} records, K2 {want['k2']:,} windows",
            flush=True,
        )
        runs = 0
        for job in jobs:
            variants = [f"{job}:plain", f"{job}:plainfast"] + [
                f"{job}:slipstream:{n}" for n in counts
            ]
            best: dict[str, dict[str, Any]] = {}
            digest: str | None = None
            for _ in range(a.repeat):
                for v in variants:
                    _, impl, *rest = v.split(":")
                    name = f"{job.upper()} " + {
                        "plain": "plain confluent-kafka loop",
                        "plainfast": "plain confluent-kafka loop, fetch backoff 10 ms",
                    }.get(impl, "slipstream")
                    runs += 1
                    m = kafka.measure(
                        name,
                        bootstrap,
                        src,
                        f"bench-processes-out-{runs}-{os.getpid()}",
                        len(records),
                        want[job],
                        "wall",
                        int(rest[0]) if rest else 1,
                        a.fresh_engine,
                    )
                    row = {
                        "seconds": m["wall_seconds"],
                        "cpu": m["busiest_cpu_seconds"],
                        "rss": m["peak_mb"],
                        "digest": m["digest"],
                    }
                    if digest is None:
                        digest = row["digest"]
                    if row["digest"] != digest:
                        raise SystemExit(
                            f"{JOBS[job]}, {label(v)}: output digest {row['digest']} != the "
                            f"plain loop's {digest}"
                        )
                    keep_best(best, v, row)
            assert digest is not None
            print_rows(JOBS[job], variants, best, digest)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="wc,rsf,win,k1,k2,latency")
    ap.add_argument("--processes", default="1,2", help="comma-separated process counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--words", type=int, default=5_000_000)
    ap.add_argument(
        "--files",
        type=int,
        default=8,
        help="files of the word count corpus (the hand-split "
        "loop splits by file: with fewer files than processes it uses fewer processes)",
    )
    ap.add_argument("--events", type=int, default=2_000_000, help="lines of the CSV running sum")
    ap.add_argument("--win-events", type=int, default=2_000_000)
    ap.add_argument("--records", type=int, default=1_000_000, help="Kafka records")
    ap.add_argument("--users", type=int, default=10_000, help="K2's users")
    ap.add_argument("--latency-rate", type=float, default=1000.0, help="items/s")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument(
        "--idle-spin-ms",
        type=float,
        default=10.0,
        help="JobConfig.idle_spin_ms of the latency rows 'spin' (0: no such rows)",
    )
    ap.add_argument(
        "--fresh-engine",
        action="store_true",
        help="each row's job on a new engine made in the timed part (its member processes "
        "forked for it), not on the warm-up job's engine with its spare members up",
    )
    # the Core API DAG rows always run now; the option of the first version is kept
    ap.add_argument("--dag", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rsf-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-variant", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dir is None:
        a.dir = cache_path(f"corpus-{a.words}" + (f"-{a.files}" if a.files != 8 else ""))
    if a.rsf_dir is None:
        a.rsf_dir = cache_path(f"rsf-{a.events}-{RSF_FILES}")
    if a.run_variant:
        run_one(a.run_variant, a)
        return
    only = a.only.split(",")
    counts = [int(n) for n in a.processes.split(",")]
    load = os.getloadavg()
    print(
        f"{len(os.sched_getaffinity(0))} usable cores, load {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (1/5/15 min) at the start; best of {a.repeat} rounds"
    )
    args = [
        "--words", str(a.words), "--dir", a.dir, "--rsf-dir", a.rsf_dir,
        "--win-events", str(a.win_events), "--latency-rate", str(a.latency_rate),
        "--latency-seconds", str(a.latency_seconds), "--idle-spin-ms", str(a.idle_spin_ms),
    ] + (["--fresh-engine"] if a.fresh_engine else [])  # fmt: skip
    groups: dict[str, list[str]] = {}
    if "wc" in only:
        write_corpus(a.dir, a.words, a.files)  # reused when present
        groups["wc"] = (
            ["wc:plain"]
            + [f"wc:plain:{n}" for n in counts if n > 1]
            + [f"wc:{k}:{n}" for k in ("pipeline", "dag") for n in counts]
        )
    if "rsf" in only:
        wordcount.write_rsf_file(a.rsf_dir, a.events, RSF_FILES)
        groups["rsf"] = ["rsf:plain"] + [f"rsf:dag:{n}" for n in counts]
    if "win" in only:
        groups["win"] = ["win:plain"] + [f"win:pipeline:{n}" for n in counts]
    for job, variants in groups.items():
        best: dict[str, dict[str, Any]] = {}
        digest: str | None = None
        for _ in range(a.repeat):  # interleaved rounds
            for v in variants:
                r = run_variant(__file__, v, args)
                if digest is None:
                    digest = r["digest"]
                if r["digest"] != digest:
                    raise SystemExit(
                        f"{JOBS[job]}, {label(v)}: output digest {r['digest']} != the plain "
                        f"loop's {digest}"
                    )
                keep_best(best, v, r)
        assert digest is not None
        size = {"wc": f"{a.words:,} words in {a.files} files", "rsf": f"{a.events:,} lines in {RSF_FILES} files",
                "win": f"{a.win_events:,} events"}[job]  # fmt: skip
        print_rows(f"{JOBS[job]}, {size}", variants, best, digest)
    kafka_jobs = [j for j in ("k1", "k2") if j in only]
    if kafka_jobs:
        kafka_rows(a, counts, kafka_jobs)
    if "latency" in only or "latency-list" in only:
        print(
            f"\nlatency: {a.latency_rate:,.0f} items/s for {a.latency_seconds:g} s, one at a "
            "time, through a distributed edge; ms from the item made to the sink, after the first second"
        )
        print(
            f"(of {a.repeat} interleaved rounds, the round with the median p99; the floor: two "
            "processes and a socketpair, no engine, half the rate: the items that cross)"
        )
        print(
            f"{'':<20}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'busiest cpu s':>15}"
            f"{'total cpu s':>13}{'peak MB':>9}"
        )
        runs: dict[str, list[dict[str, Any]]] = {}
        variants = [f"latency:dag:{n}" for n in counts]
        if a.idle_spin_ms:
            variants += [f"latency:spin:{n}" for n in counts]
        variants.append("latency:floor:2")
        if a.idle_spin_ms:
            variants.append("latency:floorspin:2")
        if "latency-list" in only:
            variants += [f"latency:list:{n}" for n in counts]
        for _ in range(a.repeat):
            for v in variants:
                runs.setdefault(v, []).append(run_variant(__file__, v, args))
        for v in variants:
            ordered = sorted(runs[v], key=lambda r: r["p99"])
            r = ordered[(len(ordered) - 1) // 2]
            name = "floor (socketpair)" if ":floor" in v else f"processes={v.rsplit(':', 1)[1]}"
            if ":floorspin" in v:
                name = "floor, child spins"
            if ":list:" in v:
                name = f"list sink, p={v.rsplit(':', 1)[1]}"
            if ":spin:" in v:
                name = f"spin, {name}"
            cpu = f"{r['cpu']:>15.2f}" if ":floor" not in v else f"{'':>15}"
            total = f"{r['total_cpu']:>13.2f}" if "total_cpu" in r else f"{'':>13}"
            print(
                f"{name:<20}{r['p50']:>8.2f}{r['p99']:>8.2f}{r['max']:>8.2f}{cpu}{total}"
                f"{r['rss']:>9.0f}"
            )
    load = os.getloadavg()
    print(f"\nload {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
