"""Kafka throughput: slipstream vs a plain confluent-kafka loop vs Quix Streams vs Bytewax.

    python bench/kafka.py [--records 1000000] [--users 10000] [--bootstrap HOST:PORT]
                          [--clock wall|cpu]

Without ``--bootstrap`` it starts the local Kafka-compatible broker (Tansu, memory only,
``slipstream.devservers``) on 127.0.0.1. One run, same data for every contender:

* K1 stateless: ``--records`` JSON records in 4 partitions; parse, keep ``amount >= 50``
  (about half), produce the kept records as JSON to an output topic.
* K2 windowed: the same records; a 10 s tumbling sum of ``amount`` per user (``--users``
  users) by event time (the record's ``ts``, 2 s allowed lag); one JSON record per window.

Each contender runs in its own process. Its time runs from its start (clients created) to
the moment the output topic holds every expected record, as a consumer in this process
sees it (``count_output``). The slipstream contenders' engine is made before the start,
with a warm-up job (``warm_engine``: imports done, with ``processes`` > 1 the spare
member processes up, as a cluster's members run before its jobs); ``--fresh-engine``
makes it in the timed part. With ``--clock cpu`` the time
is the CPU time (user + system, all threads) the contender's process spent in that span
(read from ``/proc/<pid>/stat`` when the output is complete), which other work on a
loaded machine disturbs much less than wall-clock time; the broker's own CPU time is
not counted. The plain loop uses ``assign()``
and batch ``consume()``, as the slipstream source does. Quix Streams subscribes with a
consumer group, whose join is slow on the local broker (the broker's limitation, not
Quix's): with ``--bootstrap`` pointing at an Apache Kafka the comparison is fairer.
Contenders whose package is missing are reported as such (``pip install quixstreams
bytewax``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datetime import UTC

from benchlib import peak_rss_mb, print_table, wait_for_spares  # noqa: E402

PARTITIONS = 4
WINDOW_MS = 10_000
LAG_MS = 2_000
START_MS = 1_700_000_000_000
END_USER = "__end__"


# -- data ------------------------------------------------------------------------------


def make_records(n: int, users: int, seed: int = 11) -> list[tuple[int, str, dict[str, Any]]]:
    """(partition, key, record); event time spreads over 100 s with up to 1 s disorder,
    then one end marker per partition (far in event time) closes the last windows."""
    rnd = random.Random(seed)
    step = max(1, 100_000 // max(n, 1) or 1)
    out = []
    for i in range(n):
        user = f"u{rnd.randrange(users)}"
        ts = START_MS + (i * 100_000) // max(n, 1) + rnd.randint(0, 1000) + step * 0
        out.append((i % PARTITIONS, user, {"user": user, "amount": rnd.randint(1, 100), "ts": ts}))
    last = max(r["ts"] for _, _, r in out) + 3 * WINDOW_MS
    out.extend(
        (p, END_USER, {"user": END_USER, "amount": 0, "ts": last}) for p in range(PARTITIONS)
    )
    return out


def expected(records: list[tuple[int, str, dict[str, Any]]]) -> tuple[int, int]:
    """(K1 outputs, K2 windows)."""
    k1 = sum(1 for _, _, r in records if r["user"] != END_USER and r["amount"] >= 50)
    k2 = len({(r["user"], r["ts"] // WINDOW_MS) for _, _, r in records if r["user"] != END_USER})
    return k1, k2


def window_record(user: str, start: int, total: int) -> bytes:
    return json.dumps({"user": user, "start": start, "total": total}).encode()


# -- helpers run inside a contender's process ----------------------------------------------


#: the watcher's consumer (:func:`count_output`): how long the broker may hold a fetch
#: that finds nothing new, and how soon a partition whose prefetch queue was full is
#: fetched again (librdkafka's defaults, 500 and 1000 ms, made the watcher see the last
#: records up to a second after they were there)
WATCH_CONFIG = {"fetch.wait.max.ms": 50, "fetch.queue.backoff.ms": 10}


def count_output(
    bootstrap: str,
    topic: str,
    want: int,
    alive: Callable[[], bool],
    timeout: float = 600,
    at_end: Callable[[], None] | None = None,
) -> tuple[float, str]:
    """Consume ``topic`` (in the parent process, so the contender's own process does
    only its work) until ``want`` records arrived; returns the wall-clock time of the
    last one and a digest of the values (sha256 of their sorted list: the same output
    in any order gives the same digest). ``at_end()`` runs as the last one arrives."""
    import hashlib

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"watch-{topic}",
            "enable.auto.commit": False,
            **WATCH_CONFIG,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < want:
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out: {len(values)} of {want} output records")
            if not alive():
                raise SystemExit(
                    f"the contender exited after {len(values)} of {want} output records"
                )
            values.extend(m.value() for m in c.consume(10_000, 0.05) if m.error() is None)
        end = time.time()
        if at_end is not None:
            at_end()
    finally:
        c.close()
    values.sort()
    return end, hashlib.sha256(b"\n".join(values)).hexdigest()[:16]


# -- contenders ----------------------------------------------------------------------------


def plain_consumer_config(group: str, bootstrap: str, backoff_ms: int | None) -> dict[str, Any]:
    """The plain loops' consumer: confluent-kafka's defaults, as a user writes it, or
    with ``fetch.queue.backoff.ms`` set as slipstream's Kafka source sets it (10 ms:
    librdkafka's default of 1000 ms idles a consumer that drains its prefetch queue for
    the rest of the second), so that the engine's client setting is not what a row
    compares."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
    }
    if backoff_ms is not None:
        config["fetch.queue.backoff.ms"] = backoff_ms
    return config


def plain_k1(bootstrap: str, src: str, out: str, n_in: int, backoff_ms: int | None = None) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    c = Consumer(plain_consumer_config("plain", bootstrap, backoff_ms))
    c.assign([TopicPartition(src, p, 0) for p in range(PARTITIONS)])
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    loads, dumps, produce = json.loads, json.dumps, prod.produce
    seen = 0
    while seen < n_in:
        msgs = c.consume(1000, 0.1)
        seen += len(msgs)
        for m in msgs:
            r = loads(m.value())
            if r["amount"] >= 50 and r["user"] != END_USER:
                while True:
                    try:
                        produce(out, dumps(r).encode())
                        break
                    except BufferError:
                        prod.poll(0.01)
        prod.poll(0)
    prod.flush(60)
    c.close()


def plain_k2(bootstrap: str, src: str, out: str, n_in: int, backoff_ms: int | None = None) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    c = Consumer(plain_consumer_config("plain2", bootstrap, backoff_ms))
    c.assign([TopicPartition(src, p, 0) for p in range(PARTITIONS)])
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sums: dict[int, dict[str, int]] = {}  # window start -> user -> sum
    top = [-(1 << 62)] * PARTITIONS
    emitted_to = -(1 << 62)
    seen = 0
    loads = json.loads
    while seen < n_in:
        msgs = c.consume(1000, 0.1)
        seen += len(msgs)
        for m in msgs:
            r = loads(m.value())
            ts = r["ts"]
            p = m.partition()
            if ts > top[p]:
                top[p] = ts
            if r["user"] == END_USER:
                continue
            start = ts - ts % WINDOW_MS
            if start + WINDOW_MS <= emitted_to:
                continue  # late
            w = sums.get(start)
            if w is None:
                w = sums[start] = {}
            w[r["user"]] = w.get(r["user"], 0) + r["amount"]
        wm = min(top) - LAG_MS
        for start in sorted(s for s in sums if s + WINDOW_MS <= wm):
            for user, total in sums.pop(start).items():
                while True:
                    try:
                        prod.produce(out, window_record(user, start, total))
                        break
                    except BufferError:
                        prod.poll(0.01)
            emitted_to = start + WINDOW_MS
        prod.poll(0)
    prod.flush(60)
    c.close()


#: the engine's ``processes`` for the slipstream contenders (``--processes``; the
#: bench/processes.py rows run them with 2)
PROCESSES = 1
#: ``--fresh-engine``: the slipstream contenders make their engine in the timed part
#: (with ``processes`` > 1 the forkserver's start and the members' forks included), not
#: before it as a warm-up job's (see :func:`warm_engine`)
FRESH_ENGINE = False
#: the engine the slipstream contenders run on (``None``: a new one, in the timed part)
_ENGINE: Any = None


def warm_engine(processes: int) -> Any:
    """A new engine of ``processes`` after a warm-up job of 10 items, with its spare
    member processes up: the slipstream contenders' job then starts as bench/processes.py's
    other rows' jobs do (the imports done, the forkserver running, the members up before
    the job, as a cluster's), so that its time is the job's, its members' set-up included
    (their Kafka clients made, the partitions assigned), not the engine's start."""
    import slipstream as ss
    from slipstream import DAG, Edge, sinks, sources

    dag = DAG()
    s = dag.new_vertex("warm", sources.generator(str, None, max_items=10))
    o = dag.new_vertex("sink", sinks.list_sink("warm-up"))
    dag.edge(Edge.between(s, o))
    engine = ss.local(processes=processes)
    engine.new_job(dag, ss.JobConfig(name="bench-warm-up")).join()
    engine.get_list("warm-up").clear()
    wait_for_spares(engine, processes)
    return engine


def _engine() -> Any:
    import slipstream as ss

    return _ENGINE if _ENGINE is not None else ss.local(processes=PROCESSES)


def k1_dag(bootstrap: str, src: str, out: str) -> Any:
    """K1 as a slipstream DAG: parse, keep ``amount >= 50``, produce as JSON."""
    from slipstream import DAG, Edge, sinks, sources
    from slipstream import processors as P

    conf = {"bootstrap.servers": bootstrap}
    dag = DAG()
    s = dag.new_vertex("in", sources.kafka(src, conf, projection=lambda m: json.loads(m.value())))
    keep = dag.new_vertex("keep", P.filter(lambda r: r["amount"] >= 50 and r["user"] != END_USER))
    o = dag.new_vertex("out", sinks.kafka(out, conf, value_fn=json.dumps))
    dag.edge(Edge.between(s, keep)).edge(Edge.between(keep, o))
    return dag


def slipstream_k1(bootstrap: str, src: str, out: str, n_in: int) -> None:
    import slipstream as ss

    job = _engine().new_job(k1_dag(bootstrap, src, out), ss.JobConfig(name="bench-k1"))
    _RUNNING.append(job)  # runs on the engine's threads until the process is killed


def k2_dag(bootstrap: str, src: str, out: str) -> Any:
    """K2 as a slipstream DAG: a 10 s tumbling sum of ``amount`` per user by event
    time, one JSON record per window."""
    from slipstream import DAG, Edge, sinks, sources
    from slipstream import processors as P
    from slipstream.aggregate import summing
    from slipstream.watermark import with_fixed_lag
    from slipstream.window import tumbling_window_def

    conf = {"bootstrap.servers": bootstrap}
    dag = DAG()
    s = dag.new_vertex(
        "in",
        sources.kafka(
            src,
            conf,
            projection=lambda m: json.loads(m.value()),
            timestamp_fn=lambda r: r["ts"],
            policy=lambda: with_fixed_lag(LAG_MS),
        ),
    )
    real = dag.new_vertex("real", P.filter(lambda r: r["user"] != END_USER))
    win = dag.new_vertex(
        "window",
        P.aggregate_to_sliding_window(
            key_fn=lambda r: r["user"],
            timestamp_fn=lambda r: r["ts"],
            window_def=tumbling_window_def(WINDOW_MS),
            agg_op=summing(lambda r: r["amount"]),
        ),
    )
    o = dag.new_vertex(
        "out", sinks.kafka(out, conf, value_fn=lambda w: window_record(w.key, w.start, w.value))
    )
    # distributed: with several members (processes) a user's records from every
    # partition must meet on one window processor (one member: a local edge)
    dag.edge(Edge.between(s, real))
    dag.edge(Edge.between(real, win).distributed().partitioned(lambda r: r["user"]))
    dag.edge(Edge.between(win, o))
    return dag


def slipstream_k2(bootstrap: str, src: str, out: str, n_in: int) -> None:
    import slipstream as ss

    job = _engine().new_job(k2_dag(bootstrap, src, out), ss.JobConfig(name="bench-k2"))
    _RUNNING.append(job)  # runs on the engine's threads until the process is killed


_RUNNING: list[Any] = []


def quix_app(bootstrap: str) -> Any:
    from quixstreams import Application

    return Application(
        broker_address=bootstrap,
        consumer_group=f"bench-quix-{time.monotonic_ns()}",
        auto_offset_reset="earliest",
        state_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"quix-{os.getpid()}"),
        use_changelog_topics=False,  # the local broker reports no retention.ms to derive them from
    )


def quix_k1(bootstrap: str, src: str, out: str, n_in: int) -> None:
    app = quix_app(bootstrap)
    sdf = app.dataframe(app.topic(src, value_deserializer="json"))
    sdf = sdf.filter(lambda r: r["amount"] >= 50 and r["user"] != END_USER)
    sdf.to_topic(app.topic(out, value_serializer="json"))
    app.run()


def quix_k2(bootstrap: str, src: str, out: str, n_in: int) -> None:
    from quixstreams.models import TimestampType  # noqa: F401  (checks the version)

    app = quix_app(bootstrap)
    topic = app.topic(
        src,
        value_deserializer="json",
        timestamp_extractor=lambda value, headers, ts, ts_type: value["ts"],
    )
    sdf = app.dataframe(topic)
    sdf = sdf.filter(lambda r: r["user"] != END_USER)
    sdf = sdf.apply(lambda r: r["amount"])
    sdf = sdf.tumbling_window(duration_ms=WINDOW_MS, grace_ms=LAG_MS).sum().final()
    sdf = sdf.apply(lambda w: {"start": w["start"], "total": w["value"]})
    sdf.to_topic(app.topic(out, value_serializer="json"))
    app.run()


def bytewax_k1(bootstrap: str, src: str, out: str, n_in: int) -> None:
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.testing import run_main

    flow = Dataflow("k1")
    inp = op.input("in", flow, KafkaSource([bootstrap], [src], tail=False))
    parsed = op.map("parse", inp, lambda m: json.loads(m.value))
    kept = op.filter("keep", parsed, lambda r: r["amount"] >= 50 and r["user"] != END_USER)
    msgs = op.map("ser", kept, lambda r: KafkaSinkMessage(None, json.dumps(r).encode()))
    op.output("out", msgs, KafkaSink([bootstrap], out))
    run_main(flow)


def bytewax_k2(bootstrap: str, src: str, out: str, n_in: int) -> None:
    from datetime import datetime, timedelta

    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower
    from bytewax.testing import run_main

    flow = Dataflow("k2")
    inp = op.input("in", flow, KafkaSource([bootstrap], [src], tail=False))
    parsed = op.map("parse", inp, lambda m: json.loads(m.value))
    real = op.filter("real", parsed, lambda r: r["user"] != END_USER)
    keyed = op.key_on("key", real, lambda r: r["user"])
    clock = EventClock(
        lambda r: datetime.fromtimestamp(r["ts"] / 1000, tz=UTC),
        wait_for_system_duration=timedelta(milliseconds=LAG_MS),
    )
    windower = TumblingWindower(
        length=timedelta(milliseconds=WINDOW_MS),
        align_to=datetime.fromtimestamp(0, tz=UTC),
    )
    sums = win.fold_window(
        "sum",
        keyed,
        clock,
        windower,
        lambda: 0,
        lambda acc, r: acc + r["amount"],
        lambda a, b: a + b,
    )
    msgs = op.map(
        "ser",
        sums.down,
        lambda kv: KafkaSinkMessage(
            kv[0].encode(), json.dumps({"w": kv[1][0], "total": kv[1][1]}).encode()
        ),
    )
    op.output("out", msgs, KafkaSink([bootstrap], out))
    run_main(flow)


CONTENDERS: dict[str, tuple[str, Callable[..., None]]] = {
    "K1 plain confluent-kafka loop": ("confluent_kafka", plain_k1),
    "K1 plain confluent-kafka loop, fetch backoff 10 ms": (
        "confluent_kafka",
        functools.partial(plain_k1, backoff_ms=10),
    ),
    "K1 slipstream": ("slipstream", slipstream_k1),
    "K1 Quix Streams": ("quixstreams", quix_k1),
    "K1 Bytewax": ("bytewax", bytewax_k1),
    "K2 plain confluent-kafka loop": ("confluent_kafka", plain_k2),
    "K2 plain confluent-kafka loop, fetch backoff 10 ms": (
        "confluent_kafka",
        functools.partial(plain_k2, backoff_ms=10),
    ),
    "K2 slipstream": ("slipstream", slipstream_k2),
    "K2 Quix Streams": ("quixstreams", quix_k2),
    "K2 Bytewax": ("bytewax", bytewax_k2),
}


def run_one(name: str, bootstrap: str, src: str, out: str, n_in: int) -> None:
    """In the contender's own process: print the wall-clock start, run until killed."""
    global _ENGINE
    _, fn = CONTENDERS[name]

    def report_memory() -> None:
        while True:
            time.sleep(0.5)
            print(json.dumps({"peak_mb": peak_rss_mb()}), flush=True)

    if fn in (slipstream_k1, slipstream_k2) and not FRESH_ENGINE:
        _ENGINE = warm_engine(PROCESSES)
    threading.Thread(target=report_memory, daemon=True).start()
    print(json.dumps({"start": time.time(), "cpu": _process_cpu(os.getpid())}), flush=True)
    fn(bootstrap, src, out, n_in)  # Quix and Bytewax run here until killed
    if PROCESSES > 1 and _RUNNING:
        # the member processes' ids, so that measure() reads their CPU time and peak
        # memory too (they are not this process's children: the forkserver's)
        ex = _RUNNING[0]._execution
        print(json.dumps({"member_pids": [p.pid for p in ex._procs]}), flush=True)
    while True:
        time.sleep(1)


def _process_peak_mb(pid: int) -> float:
    """Process ``pid``'s peak resident set (VmHWM) in MB (Linux)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used (Linux)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    name: str,
    bootstrap: str,
    src: str,
    out: str,
    n_in: int,
    want: int,
    clock: str = "wall",
    processes: int = 1,
    fresh_engine: bool = False,
) -> dict[str, Any]:
    """Run contender ``name`` in its own process until ``out`` holds ``want`` records.
    ``seconds`` is the wall or CPU time (``clock``); also: ``cpu_seconds`` of the
    contender's process, ``busiest_cpu_seconds`` (with ``processes`` > 1, the largest of
    the contender's and each member process's CPU time), ``peak_mb`` (with member
    processes, the contender's plus each member's peak, summed) and the output's
    ``digest``."""
    import subprocess

    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(out, PARTITIONS, 1)]).values():
        f.result(30)
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--run-variant",
            name,
            "--args",
            json.dumps([bootstrap, src, out, n_in]),
            "--processes",
            str(processes),
            *(["--fresh-engine"] if fresh_engine else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    members: list[int] = []
    member_cpu: list[float] = []
    member_mb = 0.0
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        start = first["start"]
        while processes > 1 and not members:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("the contender exited before its members started")
            members = json.loads(line).get("member_pids", [])
        figures: dict[str, Any] = {}

        def at_end() -> None:  # the processes' CPU as the output is complete
            figures["cpu"] = _process_cpu(proc.pid) - first["cpu"]
            figures["member_cpu"] = [_process_cpu(pid) for pid in members]
            figures["member_mb"] = sum(_process_peak_mb(pid) for pid in members)

        end, digest = count_output(bootstrap, out, want, lambda: proc.poll() is None, at_end=at_end)
        cpu, member_cpu, member_mb = figures["cpu"], figures["member_cpu"], figures["member_mb"]
    finally:
        proc.kill()
        rest, _ = proc.communicate(timeout=30)
    peaks = [json.loads(line)["peak_mb"] for line in rest.splitlines() if "peak_mb" in line]
    seconds = cpu if clock == "cpu" else end - start
    return {
        "name": name,
        "seconds": seconds,
        "wall_seconds": end - start,
        "cpu_seconds": cpu,
        "busiest_cpu_seconds": max([cpu, *member_cpu]),
        "items": n_in,
        "peak_mb": max(peaks, default=0) + member_mb,
        "digest": digest,
    }


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap is not None:
        yield bootstrap
        return
    from slipstream import devservers

    with devservers.kafka_broker() as b:
        yield b.bootstrap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--bootstrap")
    ap.add_argument("--only", help="comma-separated contender names (default: all)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the contender process's CPU time instead of wall-clock time",
    )
    ap.add_argument("--run-variant", help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    ap.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument(
        "--fresh-engine",
        action="store_true",
        help="the slipstream contenders make their engine in the timed part, not before "
        "it in a warm-up job",
    )
    a = ap.parse_args()
    if a.run_variant:
        global PROCESSES, FRESH_ENGINE
        PROCESSES, FRESH_ENGINE = a.processes, a.fresh_engine
        bootstrap, src, out, n_in = json.loads(a.args)
        run_one(a.run_variant, bootstrap, src, out, n_in)
        return

    import importlib.util

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    with broker(a.bootstrap) as bootstrap:
        src = f"bench-in-{os.getpid()}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(src, PARTITIONS, 1)]).values():
            f.result(30)
        records = make_records(a.records, a.users)
        prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        t0 = time.perf_counter()
        for p, key, r in records:
            while True:
                try:
                    prod.produce(
                        src, json.dumps(r).encode(), key.encode(), partition=p, timestamp=r["ts"]
                    )
                    break
                except BufferError:
                    prod.poll(0.01)
        prod.flush(120)
        print(f"wrote {len(records):,} records to {src!r} in {time.perf_counter() - t0:.1f} s")
        k1, k2 = expected(records)
        print(f"expected outputs: K1 {k1:,} records, K2 {k2:,} windows")
        rows: dict[str, list[dict[str, Any]]] = {"K1": [], "K2": []}
        only = set(a.only.split(",")) if a.only else None
        for i, (name, (module, _)) in enumerate(CONTENDERS.items()):
            if only and name not in only:
                continue
            if importlib.util.find_spec(module) is None:
                print(f"{name}: not installed (pip install {module})")
                continue
            want = k1 if name.startswith("K1") else k2
            try:
                row = measure(
                    name,
                    bootstrap,
                    src,
                    f"bench-out-{i}-{os.getpid()}",
                    len(records),
                    want,
                    a.clock,
                    fresh_engine=a.fresh_engine,
                )
            except (SystemExit, Exception) as e:
                print(f"{name}: failed: {str(e)[-500:]}")
                continue
            print(f"{name}: {row['seconds']:.2f} s ({a.clock}; wall {row['wall_seconds']:.2f} s)")
            rows[name[:2]].append(row)
        for task, title in (
            ("K1", "K1 stateless: parse, filter, produce"),
            ("K2", "K2 10 s tumbling sum per user"),
        ):
            base = f"{task} plain confluent-kafka loop"
            if any(r["name"] == base for r in rows[task]):
                print_table(
                    f"{title} ({len(records):,} records in, {a.clock} clock)", rows[task], base
                )


if __name__ == "__main__":
    main()
