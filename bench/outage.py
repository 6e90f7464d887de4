"""A sink's server going away: how soon the job says so, how soon it is back, and when
it gives up (issue 20's timing bounds, measured on real servers, never asserted in tests).

    python bench/outage.py [--outage 5] [--budget 20] [--rate 2000] [--only pg,kafka]

Scenarios, each on private servers on 127.0.0.1 (a PostgreSQL cluster, a Kafka-compatible
broker behind a TCP proxy):

    pg-short   a generator (``--rate`` items/s) -> SQL sink, exactly-once, snapshots every
               200 ms; PostgreSQL is stopped (``pg_ctl stop -m immediate``) inside a
               ``COMMIT PREPARED`` and started again ``--outage`` seconds later
    pg-long    the same, PostgreSQL stays down: the job must fail at ``--budget``
               (``JobConfig(sink_outage_timeout=)``)
    kafka-short / kafka-long
               a generator -> Kafka sink (transactional); the proxy in front of the
               broker resets every connection for ``--outage`` seconds / for good

Columns: seconds from the outage's start to the first WARNING that names the sink (target
<= 30 s); to the moment the sink has caught up with everything the source emitted by the
end of the outage (target <= outage + 10 s); to the job's failure (target: the budget,
plus the last attempt's timeout); and whether the output is exact (every item once).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "connectors"))

from outage_support import set_trap, trapped_connect  # noqa: E402

import slipstream as ss  # noqa: E402
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources  # noqa: E402
from slipstream.devservers import kafka_broker, postgres_server  # noqa: E402


class Warned(logging.Handler):
    def __init__(self, word: str) -> None:
        super().__init__(logging.WARNING)
        self.word = word
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.at is None and self.word in record.getMessage():
            self.at = time.monotonic()


def _generator_job(fn: Any, sink: Any, name: str, rate: float, budget: float) -> Any:
    dag = DAG()
    src = dag.new_vertex("items", sources.generator(fn, rate)).local_parallelism(1)
    out = dag.new_vertex("out", sink).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    cfg = JobConfig(
        name=name,
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=200,
        snapshot_store=tempfile.mkdtemp(prefix="outage-bench-"),
        sink_outage_timeout=budget,
    )
    return ss.local().new_job(dag, cfg)


def _wait(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _emitted(job: Any) -> int:
    return int(job.metrics.get("items", {}).get("items_out", 0))


def run_pg(outage: float | None, budget: float, rate: float) -> dict[str, Any]:
    import psycopg

    with postgres_server() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t (k bigint)")
        name = f"pg-{'long' if outage is None else 'short'}"
        started = threading.Event()
        stopped_at: list[float] = []

        def stop() -> None:
            stopped_at.append(time.monotonic())
            started.set()
            pg.stop("immediate")

        set_trap(name, stop)
        warned = Warned("'out'")
        logging.getLogger("slipstream").addHandler(warned)
        sink = sinks.sql(
            functools.partial(trapped_connect, pg.dsn, name), "INSERT INTO t (k) VALUES (%s)"
        )
        job = _generator_job(lambda i: (i,), sink, name, rate, budget)
        row: dict[str, Any] = {"scenario": name}
        try:
            started.wait(120)
            t0 = stopped_at[0]
            if outage is None:
                try:
                    job.join(budget + 120)
                except ss.JobFailedError as e:
                    row["failed_s"] = time.monotonic() - t0
                    row["error"] = str(e).splitlines()[0][:160]
            else:
                _wait(lambda: time.monotonic() - t0 >= outage, outage + 1)
                pg.start()
                target = _emitted(job)
                ok = _wait(lambda: _rows(pg.dsn)[0] >= target, 240)
                row["caught_up_s"] = time.monotonic() - t0 if ok else None
                job.cancel()
                try:
                    job.join(120)
                except ss.JobCancelledError:
                    pass
                n, distinct = _rows(pg.dsn)
                row["exact"] = n == distinct and _contiguous(pg.dsn, n)
        finally:
            logging.getLogger("slipstream").removeHandler(warned)
        row["warned_s"] = None if warned.at is None else warned.at - stopped_at[0]
        return row


def _rows(dsn: str) -> tuple[int, int]:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=2) as c:
            r = c.execute("SELECT count(*), count(DISTINCT k) FROM t").fetchone()
    except psycopg.OperationalError:
        return (-1, -1)
    assert r is not None
    return int(r[0]), int(r[1])


def _contiguous(dsn: str, n: int) -> bool:
    import psycopg

    with psycopg.connect(dsn) as c:
        r = c.execute("SELECT min(k), max(k) FROM t").fetchone()
    assert r is not None
    return n == 0 or (r[0] == 0 and r[1] == n - 1)


def run_kafka(outage: float | None, budget: float, rate: float) -> dict[str, Any]:
    from outage_support import TcpProxy

    name = f"kafka-{'long' if outage is None else 'short'}"
    proxy = TcpProxy()
    row: dict[str, Any] = {"scenario": name}
    with kafka_broker(advertised_port=proxy.port) as broker:
        proxy.target_port = broker.listen_port
        broker.create_topic("out", 1)
        warned = Warned("'out'")
        logging.getLogger("slipstream").addHandler(warned)
        sink = sinks.kafka(
            "out", {"bootstrap.servers": broker.bootstrap}, value_fn=lambda i: str(i).encode()
        )
        job = _generator_job(lambda i: i, sink, name, rate, budget)
        try:
            _wait(lambda: job.metrics["__job__"]["snapshots"] >= 3, 120)
            proxy.cut()
            t0 = time.monotonic()
            if outage is None:
                try:
                    job.join(budget + 120)
                except ss.JobFailedError as e:
                    row["failed_s"] = time.monotonic() - t0
                    row["error"] = str(e).splitlines()[0][:160]
            else:
                _wait(lambda: time.monotonic() - t0 >= outage, outage + 1)
                proxy.heal()
                target = _emitted(job)
                ok = _wait(lambda: _kafka_count(broker.bootstrap) >= target, 240)
                row["caught_up_s"] = time.monotonic() - t0 if ok else None
                job.cancel()
                try:
                    job.join(120)
                except ss.JobCancelledError:
                    pass
        finally:
            proxy.heal()
            logging.getLogger("slipstream").removeHandler(warned)
        row["warned_s"] = None if warned.at is None else warned.at - t0
    proxy.close()
    return row


def _kafka_count(bootstrap: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "outage-bench"})
    try:
        _, high = c.get_watermark_offsets(TopicPartition("out", 0), timeout=5)
    finally:
        c.close()
    return int(high)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--outage", type=float, default=5.0)
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--only", default="pg,kafka")
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    # the engine's warnings reach the handlers that time them, not the console
    logging.getLogger("slipstream").setLevel(logging.WARNING)
    logging.getLogger("slipstream").propagate = False
    rows = []
    only = a.only.split(",")
    if "pg" in only:
        rows.append(run_pg(a.outage, a.budget, a.rate))
        rows.append(run_pg(None, a.budget, a.rate))
    if "kafka" in only:
        rows.append(run_kafka(a.outage, a.budget, a.rate))
        rows.append(run_kafka(None, a.budget, a.rate))
    print(f"outage {a.outage:g} s, budget (sink_outage_timeout) {a.budget:g} s, {a.rate:g} items/s")
    print(f"{'scenario':<12} {'warned':>8} {'caught up':>10} {'failed':>8}  exact  error")
    def f(r: dict[str, Any], k: str) -> str:
        v = r.get(k)
        return "-" if v is None else f"{v:.1f} s"

    for r in rows:
        exact = r.get("exact")
        print(
            f"{r['scenario']:<12} {f(r, 'warned_s'):>8} {f(r, 'caught_up_s'):>10} {f(r, 'failed_s'):>8}  "
            f"{'-' if exact is None else ('yes' if exact else 'NO'):<5}  {r.get('error', '')}"
        )


if __name__ == "__main__":
    main()
