"""The PostgreSQL and Kafka connectors inside Spark tasks: a batch job reads and writes
PostgreSQL on Spark, and a micro-batch job carries the Kafka source's offsets from epoch
to epoch (and across a restart from its checkpoint) through the snapshot path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_postgres_source_and_sink_in_spark_tasks(spark_session: Any, postgres: Any) -> None:
    dsn = postgres.dsn
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE spark_in (k int, v text)")
        c.execute("CREATE TABLE spark_out (k int, v text)")
        c.execute("INSERT INTO spark_in SELECT i, 'v' || i FROM generate_series(1, 5000) i")
    dag = DAG()
    src = dag.new_vertex(
        "rows", sources.sql(lambda: psycopg.connect(dsn), "SELECT k, v FROM spark_in", split_by="k")
    )
    out = dag.new_vertex(
        "db", sinks.sql(lambda: psycopg.connect(dsn), "INSERT INTO spark_out VALUES (%s, %s)")
    )
    dag.edge(Edge.between(src, out).partitioned(lambda r: r[0]))
    ss.spark(spark_session).new_job(dag, JobConfig(name="spark-sql")).join(300)
    with psycopg.connect(dsn) as c:
        rows = sorted(tuple(r) for r in c.execute("SELECT k, v FROM spark_out").fetchall())
    assert rows == [(i, f"v{i}") for i in range(1, 5001)]


def _produce(bootstrap: str, topic: str, values: range) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    for i in values:
        p.produce(topic, value=str(i).encode(), partition=i % 3)
    assert p.flush(30) == 0


def test_kafka_source_offsets_cross_epochs_and_a_restart(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = f"spark-kafka-{time.monotonic_ns() % 10**6}"
    kafka.create_topic(topic, 3)
    _produce(kafka.bootstrap, topic, range(0, 3000))
    conf = {"bootstrap.servers": kafka.bootstrap}

    def build() -> DAG:
        dag = DAG()
        src = dag.new_vertex(
            "kafka", sources.kafka(topic, conf, projection=lambda m: int(m.value()))
        )
        out = dag.new_vertex("sink", sinks.list_sink("kafka-values")).local_parallelism(1)
        dag.edge(Edge.between(src, out).distributed().all_to_one())
        return dag

    engine = ss.spark(spark_session)
    got = engine.get_list("kafka-values")
    config = JobConfig(name="spark-kafka")
    checkpoint = str(tmp_path / "ckpt")

    def run_until(n: int) -> None:
        job = engine.new_job(
            build(), config, streaming=True, epoch_ms=200, checkpoint_location=checkpoint
        )
        deadline = time.monotonic() + 180
        while len(got) < n:
            assert not job.status.is_terminal, f"job ended: {job.status}"
            assert time.monotonic() < deadline, f"only {len(got)} of {n} records"
            time.sleep(0.05)
        time.sleep(0.5)  # a further epoch must not repeat anything
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(120)

    run_until(3000)
    assert sorted(got) == list(range(3000))
    _produce(kafka.bootstrap, topic, range(3000, 4000))
    run_until(4000)  # resumes at the checkpoint's offsets: only the new records
    assert sorted(got) == list(range(4000))
