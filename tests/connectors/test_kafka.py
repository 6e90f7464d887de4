"""The Kafka source and sink against a real Kafka-compatible broker (Tansu, started by the
``kafka`` fixture on 127.0.0.1). Where Tansu differs from Apache Kafka (no fencing of a
dead transactional producer, aborted records visible to read_committed readers), the test
says so; the checks that need Apache Kafka run when SLIPSTREAM_KAFKA_BOOTSTRAP names one."""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.core.processor import AbstractProcessor
from slipstream.watermark import with_fixed_lag

_names = itertools.count()


def topic_name(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns() % 10**6}"


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, int | None]]) -> None:
    """(partition, value, timestamp ms or None) records, flushed."""
    p = Producer({"bootstrap.servers": bootstrap})
    for partition, value, ts in records:
        if ts is None:
            p.produce(topic, value=value, partition=partition)
        else:
            p.produce(topic, value=value, partition=partition, timestamp=ts)
    assert p.flush(30) == 0


def read_topic(
    bootstrap: str, topic: str, partitions: int, expect: int, quiet_s: float = 1.0
) -> list[bytes]:
    """Every committed record of ``topic`` (read_committed), once ``expect`` arrived and
    nothing more came for ``quiet_s``."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    deadline = time.monotonic() + 240  # generous: a loaded 2-core machine
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(1000, 0.2)
            for m in msgs:
                if m.error() is None:
                    out.append(m.value())
            if msgs:
                last = time.monotonic()
            elif len(out) >= expect and time.monotonic() - last > quiet_s:
                break
    finally:
        c.close()
    return out


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_source_reads_all_partitions_once_with_three_processors(kafka: Any) -> None:
    topic = topic_name("src")
    kafka.create_topic(topic, 4)
    produce(kafka.bootstrap, topic, [(i % 4, str(i).encode(), None) for i in range(8000)])
    dag = DAG()
    src = dag.new_vertex(
        "kafka", sources.kafka(topic, {"bootstrap.servers": kafka.bootstrap})
    ).local_parallelism(3)
    out = dag.new_vertex("out", sinks.list_sink("got")).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    engine = ss.local()
    job = engine.new_job(dag, JobConfig(name="kafka-src"))
    got = engine.get_list("got")
    wait_for(lambda: len(got) >= 8000, "8000 records")
    time.sleep(0.3)  # nothing more may come
    job.cancel()
    assert sorted(int(v) for _, v in got) == list(range(8000))


def test_source_picks_up_a_topic_created_while_running(kafka: Any) -> None:
    # Tansu cannot add partitions to a topic (CreatePartitions); a topic that appears
    # while the job runs goes through the same metadata refresh
    first, later = topic_name("first"), topic_name("later")
    kafka.create_topic(first, 2)
    dag = DAG()
    src = dag.new_vertex(
        "kafka",
        sources.kafka(
            [first, later], {"bootstrap.servers": kafka.bootstrap}, partition_refresh_ms=200
        ),
    ).local_parallelism(2)
    out = dag.new_vertex("out", sinks.list_sink("grow")).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    engine = ss.local()
    job = engine.new_job(dag, JobConfig(name="kafka-grow"))
    got = engine.get_list("grow")
    produce(kafka.bootstrap, first, [(i % 2, b"a", None) for i in range(10)])
    wait_for(lambda: len(got) >= 10, "the first topic's records")
    kafka.create_topic(later, 3)
    produce(kafka.bootstrap, later, [(i % 3, b"b", None) for i in range(30)])
    wait_for(lambda: len(got) >= 40, "the new topic's records")
    job.cancel()
    assert sorted(v for _, v in got) == [b"a"] * 10 + [b"b"] * 30


def test_projection_error_names_topic_partition_offset_or_is_skipped(kafka: Any) -> None:
    topic = topic_name("bad")
    kafka.create_topic(topic, 1)
    produce(
        kafka.bootstrap,
        topic,
        [(0, b'{"n": 1}', None), (0, b"not json", None), (0, b'{"n": 3}', None)],
    )

    def dag_for(on_error: str) -> DAG:
        dag = DAG()
        src = dag.new_vertex(
            "kafka",
            sources.kafka(
                topic,
                {"bootstrap.servers": kafka.bootstrap},
                projection=lambda m: json.loads(m.value())["n"],
                on_error=on_error,
            ),
        ).local_parallelism(1)
        out = dag.new_vertex("out", sinks.list_sink("n-" + on_error))
        dag.edge(Edge.between(src, out))
        return dag

    engine = ss.local()
    with pytest.raises(ss.JobFailedError) as err:
        engine.new_job(dag_for("fail"), JobConfig(name="kafka-fail")).join(60)
    text = str(err.value)
    assert f"topic {topic!r}, partition 0, offset 1" in text and "JSONDecodeError" in text
    job = engine.new_job(dag_for("skip"), JobConfig(name="kafka-skip"))
    got = engine.get_list("n-skip")
    wait_for(lambda: len(got) >= 2, "the good records")
    wait_for(lambda: job.metrics.get("kafka", {}).get("kafka_records_skipped") == 1, "metric")
    job.cancel()
    assert got == [1, 3]


class WatermarkLog(AbstractProcessor):
    """Records the watermarks it receives in a named list (and swallows items)."""

    def init_processor(self, context: Any) -> None:
        self.log = context.get_list("watermarks")

    def process(self, ordinal: int, inbox: Any) -> None:
        inbox.clear()

    def try_process_watermark(self, watermark: Any) -> bool:
        self.log.append(watermark.timestamp)
        return True


def test_event_time_per_partition_is_the_minimum_over_partitions(kafka: Any) -> None:
    topic = topic_name("time")
    kafka.create_topic(topic, 2)
    # partition 0 runs ahead to t=10_000; partition 1 stays at t=1_000..1_009
    produce(kafka.bootstrap, topic, [(0, b"a", 10_000 + i) for i in range(10)])
    produce(kafka.bootstrap, topic, [(1, b"b", 1_000 + i) for i in range(10)])
    dag = DAG()
    src = dag.new_vertex(
        "kafka",
        sources.kafka(
            topic,
            {"bootstrap.servers": kafka.bootstrap},
            policy=lambda: with_fixed_lag(0),
            idle_timeout_ms=None,
        ),
    ).local_parallelism(1)
    log = dag.new_vertex("log", WatermarkLog)
    dag.edge(Edge.between(src, log))
    engine = ss.local()
    job = engine.new_job(dag, JobConfig(name="kafka-time"))
    wms = engine.get_list("watermarks")
    wait_for(lambda: wms and wms[-1] >= 1_009, "the watermark of both partitions")
    time.sleep(0.3)
    job.cancel()
    # one partition ahead never drags the watermark past the other partition's events
    assert max(wms) == 1_009 and wms == sorted(wms)


def test_sink_at_least_once_delivers_everything(kafka: Any) -> None:
    topic = topic_name("alo")
    kafka.create_topic(topic, 3)
    dag = DAG()
    src = dag.new_vertex("items", sources.items(list(range(5000))))
    out = dag.new_vertex(
        "kafka", sinks.kafka(topic, {"bootstrap.servers": kafka.bootstrap}, value_fn=str)
    ).local_parallelism(2)
    dag.edge(Edge.between(src, out))
    cfg = JobConfig(
        name="kafka-alo",
        processing_guarantee=ProcessingGuarantee.AT_LEAST_ONCE,
        snapshot_interval_ms=20,
        snapshot_store=tempfile.mkdtemp(prefix="kafka-test-store-"),
    )
    ss.local().new_job(dag, cfg).join(60)
    got = read_topic(kafka.bootstrap, topic, 3, 5000)
    assert sorted(int(v) for v in got) == list(range(5000))


def test_sink_delivery_error_fails_the_job() -> None:
    from slipstream.devservers import free_port

    # nothing listens there: every record times out undelivered
    conf = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "message.timeout.ms": 500}
    dag = DAG()
    src = dag.new_vertex("items", sources.items([b"a", b"b"]))
    out = dag.new_vertex("kafka-out", sinks.kafka("nowhere", conf))
    dag.edge(Edge.between(src, out))
    cfg = JobConfig(
        name="kafka-undelivered",
        processing_guarantee=ProcessingGuarantee.AT_LEAST_ONCE,
        snapshot_store=tempfile.mkdtemp(prefix="kafka-test-store-"),
        auto_restart=False,
    )
    with pytest.raises(ss.JobFailedError) as err:
        ss.local().new_job(dag, cfg).join(60)
    assert "'kafka-out'" in str(err.value) and "was not delivered" in str(err.value)


def test_sink_rejects_values_that_are_not_bytes_naming_the_item(kafka: Any) -> None:
    topic = topic_name("type")
    kafka.create_topic(topic, 1)
    dag = DAG()
    src = dag.new_vertex("items", sources.items([b"ok", 42]))
    out = dag.new_vertex("kafka-out", sinks.kafka(topic, {"bootstrap.servers": kafka.bootstrap}))
    dag.edge(Edge.between(src, out))
    with pytest.raises(ss.JobFailedError) as err:
        ss.local().new_job(dag, JobConfig(name="kafka-type")).join(60)
    assert "'kafka-out'" in str(err.value) and "int for item 42" in str(err.value)


def test_factories_check_arguments() -> None:
    with pytest.raises(TypeError, match="bootstrap.servers"):
        sources.kafka("t", {})
    with pytest.raises(TypeError, match="topics"):
        sources.kafka([], {"bootstrap.servers": "x"})
    with pytest.raises(ValueError, match="on_error"):
        sources.kafka("t", {"bootstrap.servers": "x"}, on_error="ignore")
    with pytest.raises(TypeError, match="topic"):
        sinks.kafka("", {"bootstrap.servers": "x"})
    with pytest.raises(TypeError, match="value_fn"):
        sinks.kafka("t", {"bootstrap.servers": "x"}, value_fn=3)  # type: ignore[arg-type]


def test_restore_with_another_parallelism_and_offsets_committed_to_the_group(
    kafka: Any, tmp_path: Any
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = topic_name("rescale")
    kafka.create_topic(topic, 4)
    produce(kafka.bootstrap, topic, [(i % 4, str(i).encode(), None) for i in range(2000)])
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{topic}"}

    def run(parallelism: int, until: int) -> Any:
        dag = DAG()
        src = dag.new_vertex(
            "kafka", sources.kafka(topic, conf, commit_offsets=True)
        ).local_parallelism(parallelism)
        out = dag.new_vertex("out", sinks.list_sink("rescaled")).local_parallelism(1)
        dag.edge(Edge.between(src, out))
        cfg = JobConfig(
            name="kafka-rescale",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=50,
            snapshot_store=str(tmp_path / "store"),
            resume=True,
        )
        job = engine.new_job(dag, cfg)
        wait_for(lambda: len(got) >= until, f"{until} records")
        # offsets reach the group after the snapshot holding them commits
        wait_for(lambda: committed() == until, f"group offsets at {until}")
        job.cancel()
        # the next run takes the same store: wait until this job released it
        wait_for(lambda: job.status.is_terminal, "the cancelled job to end")
        return job

    def committed() -> int:
        c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{topic}"})
        try:
            tps = c.committed([TopicPartition(topic, p) for p in range(4)], timeout=30)
        finally:
            c.close()
        return sum(max(tp.offset, 0) for tp in tps)

    engine = ss.local()
    got = engine.get_list("rescaled")
    run(1, 2000)
    produce(kafka.bootstrap, topic, [(i % 4, str(i).encode(), None) for i in range(2000, 3000)])
    run(3, 3000)  # three processors share the partitions the one processor had
    assert sorted(int(v) for _, v in got) == list(range(3000))  # nothing lost or repeated


def test_offsets_cover_records_skipped_at_the_end_of_a_partitions_run(kafka: Any) -> None:
    # the source notes a partition's next offset where the partition's run of records in
    # a batch ends: a skipped record there still counts as read (else a restore would
    # read it again)
    from confluent_kafka import Consumer, TopicPartition

    topic = topic_name("skiplast")
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap, topic, [(0, b'{"n": 1}', None), (0, b'{"n": 2}', None), (0, b"bad", None)])
    produce(kafka.bootstrap, topic, [(1, b"bad", None), (1, b'{"n": 4}', None), (1, b"bad", None)])
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{topic}"}
    dag = DAG()
    src = dag.new_vertex(
        "kafka",
        sources.kafka(
            topic,
            conf,
            projection=lambda m: json.loads(m.value())["n"],
            on_error="skip",
            commit_offsets=True,
        ),
    ).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("skiplast")).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    cfg = JobConfig(
        name="kafka-skiplast",
        processing_guarantee=ProcessingGuarantee.AT_LEAST_ONCE,
        snapshot_interval_ms=50,
        snapshot_store=tempfile.mkdtemp(prefix="kafka-test-store-"),
    )
    engine = ss.local()
    job = engine.new_job(dag, cfg)
    got = engine.get_list("skiplast")

    def committed() -> list[int]:
        c = Consumer(conf)
        try:
            tps = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        finally:
            c.close()
        return [tp.offset for tp in tps]

    wait_for(lambda: committed() == [3, 3], "the group offsets past every record")
    job.cancel()
    assert sorted(got) == [1, 2, 4]


def test_sink_encodes_what_value_fn_returns(kafka: Any) -> None:
    topic = topic_name("valuefn")
    kafka.create_topic(topic, 1)
    items = ["text", b"raw", bytearray(b"array"), None, "\u00e9"]
    dag = DAG()
    src = dag.new_vertex("items", sources.items(items)).local_parallelism(1)
    out = dag.new_vertex(
        "kafka", sinks.kafka(topic, {"bootstrap.servers": kafka.bootstrap}, value_fn=lambda x: x)
    ).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    ss.local().new_job(dag, JobConfig(name="kafka-valuefn")).join(60)
    got = read_topic(kafka.bootstrap, topic, 1, len(items))
    assert got == [b"text", b"raw", b"array", None, "\u00e9".encode()]
    dag = DAG()
    src = dag.new_vertex("items", sources.items(["ok", 7])).local_parallelism(1)
    out = dag.new_vertex(
        "kafka-out",
        sinks.kafka(topic, {"bootstrap.servers": kafka.bootstrap}, value_fn=lambda x: x),
    )
    dag.edge(Edge.between(src, out))
    with pytest.raises(ss.JobFailedError) as err:
        ss.local().new_job(dag, JobConfig(name="kafka-valuefn-bad")).join(60)
    assert "'kafka-out'" in str(err.value) and "int for item 7" in str(err.value)


class _ConsumerMade(Exception):
    """Stops ``init_processor`` once the consumer's configuration is known."""


def _consumer_config(monkeypatch: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The configuration the Kafka source's processor gives its consumer."""
    import confluent_kafka

    seen: dict[str, Any] = {}

    def made(conf: dict[str, Any]) -> None:
        seen.update(conf)
        raise _ConsumerMade

    monkeypatch.setattr(confluent_kafka, "Consumer", made)

    class Ctx:
        job_name = "j"
        vertex_name = "in"

    with pytest.raises(_ConsumerMade):
        sources.kafka("t", config)().init_processor(Ctx())  # type: ignore[arg-type]
    return seen


def test_source_fetches_again_soon_after_its_prefetch_queue_was_full(monkeypatch: Any) -> None:
    # librdkafka's default fetch.queue.backoff.ms (1000) left a source that drains its
    # queue faster than that idle for the rest of the second (docs/performance.md)
    conf = _consumer_config(monkeypatch, {"bootstrap.servers": "x"})
    assert conf["fetch.queue.backoff.ms"] == 10
    assert conf["queued.max.messages.kbytes"] == 16384  # memory stays bounded as before
    # the user's setting wins
    conf = _consumer_config(monkeypatch, {"bootstrap.servers": "x", "fetch.queue.backoff.ms": 500})
    assert conf["fetch.queue.backoff.ms"] == 500
