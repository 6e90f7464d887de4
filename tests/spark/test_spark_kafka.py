"""Kafka on Spark (issue 23, item 4): a micro-batch job (``streaming=True``) reads
Kafka with ``sources.kafka`` and writes Kafka with ``sinks.kafka``, exactly once.

The source's offsets are each epoch's snapshot state (a partition read by one source
processor); the sink holds an epoch's records in the epoch's snapshot and writes them in
one Kafka transaction per processor, with a marker (the snapshot id, committed as the
offset of the marker group) only once the driver has committed that snapshot's manifest;
a replayed epoch finds the marker and writes nothing again. The output topic is read
``read_committed`` and compared with a plain-Python oracle of the rolling count.

The broker the suite starts (Tansu) neither fences a dead producer nor hides an aborted
transaction's records from ``read_committed`` consumers: nothing here depends on either,
since the sink sends nothing before its epoch's snapshot is committed."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import JobCancelledError, JobFailedError

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = 7


def _produce(bootstrap: str, topic: str, values: range, partitions: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    for i in values:
        p.produce(topic, value=f"k{i % KEYS}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


def _oracle(n: int) -> Counter[str]:
    """The rolling count's output over records 0..n-1: key k's counts 1..n_k."""
    per = Counter(f"k{i % KEYS}" for i in range(n))
    return Counter(f"{k}:{c}" for k, total in per.items() for c in range(1, total + 1))


class _Reader:
    """A read_committed consumer of the whole output topic, kept across reads."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{topic}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.values: list[str] = []

    def until(self, n: int, job: Any = None, timeout: float = 240.0) -> list[str]:
        """Read until ``n`` records arrived (then a quiet second, so that any
        duplicate shows too); fails if ``job`` ends first."""
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while True:
            msgs = self.consumer.consume(1000, 0.2)
            for m in msgs:
                assert m.error() is None, m.error()
                self.values.append(m.value().decode())
            if msgs:
                last = time.monotonic()
            elif len(self.values) >= n and time.monotonic() - last > 1.0:
                return self.values
            if job is not None and job.status.is_terminal and len(self.values) < n:
                raise AssertionError(f"job ended ({job.status}) with {len(self.values)} of {n}")
            assert time.monotonic() < deadline, f"only {len(self.values)} of {n} records"

    def close(self) -> None:
        self.consumer.close()


def _pipeline(bootstrap: str, src: str, out: str, offsets: str) -> ss.Pipeline:
    """Kafka -> rolling count per key -> Kafka (``key:count``); every record's
    (partition, offset) also goes to the list sink ``offsets``."""
    conf = {"bootstrap.servers": bootstrap}
    p = ss.Pipeline()
    read = p.read_from(
        sources.kafka(
            src, conf, projection=lambda m: (m.partition(), m.offset(), m.value().decode())
        )
    ).set_name("kafka-in")
    read.map(lambda r: (r[0], r[1])).write_to(sinks.list_sink(offsets))
    read.map(lambda r: r[2]).group_by(lambda k: k).rolling_aggregate(counting()).map(
        lambda kv: f"{kv[0]}:{kv[1]}"
    ).write_to(sinks.kafka(out, conf)).set_name("kafka-out")
    return p


def _config(name: str) -> JobConfig:
    return JobConfig(name=name, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE)


def _stop(job: Any) -> None:
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(120)


def _until_then_stop(reader: _Reader, n: int, job: Any) -> list[str]:
    """``reader.until(n, job)``, then cancel ``job`` whatever the read gave."""
    try:
        return reader.until(n, job)
    finally:
        _stop(job)


def _names(tag: str) -> tuple[str, str, str]:
    n = time.monotonic_ns() % 10**7
    return f"sk-in-{tag}-{n}", f"sk-out-{tag}-{n}", f"sk-offsets-{tag}-{n}"


def _topics(kafka: Any, tag: str, n: int) -> tuple[str, str, str]:
    """Fresh input and output topics (2 partitions each) and an offsets list for the
    test tagged ``tag`` (``_names``); the input topic holds records 0..n-1."""
    src, out, offsets = _names(tag)
    kafka.create_topic(src, 2)
    kafka.create_topic(out, 2)
    _produce(kafka.bootstrap, src, range(n), 2)
    return src, out, offsets


def _new_job(
    engine: Any,
    kafka: Any,
    topics: tuple[str, str, str],
    name: str,
    checkpoint: str,
    epoch_ms: int = 200,
    **options: Any,
) -> Any:
    """Start ``_pipeline`` over ``topics`` (``_topics``) as an exactly-once micro-batch
    job named ``name`` on ``checkpoint``; a second call on the same checkpoint resumes."""
    return engine.new_job(
        _pipeline(kafka.bootstrap, *topics),
        _config(name),
        streaming=True,
        epoch_ms=epoch_ms,
        checkpoint_location=checkpoint,
        **options,
    )


def test_kafka_to_rolling_count_to_kafka_exactly_once(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """Over several epochs the output topic holds exactly the oracle's records, and
    every input record was read once."""
    n = 3000
    src, out, offsets = topics = _topics(kafka, "a", n)
    engine = ss.spark(spark_session)
    job = _new_job(engine, kafka, topics, "spark-kafka-eo", str(tmp_path / "ckpt"))
    reader = _Reader(kafka.bootstrap, out, 2)
    try:
        got = reader.until(n, job)
        _produce(kafka.bootstrap, src, range(n, 2 * n), 2)  # a later batch of input
        got = reader.until(2 * n, job)
    finally:
        reader.close()
        _stop(job)
    assert Counter(got) == _oracle(2 * n)
    assert job.epochs_committed >= 2
    read = engine.get_list(offsets)
    assert len(read) == len(set(read)) == 2 * n
    assert job.metrics["kafka-in"]["items_out"] == 2 * 2 * n  # two edges, each record once


def test_restart_from_the_checkpoint_mid_stream_loses_and_duplicates_nothing(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """Cancelled while input arrives, a new job on the same checkpoint continues: the
    output topic holds exactly the oracle's records; the new job reads no record before
    the committed offsets again (per partition, its first offset is where the first
    job's committed epochs stopped, and no (partition, offset) is read twice)."""
    n = 2000
    src, out, offsets = topics = _topics(kafka, "b", n)
    engine = ss.spark(spark_session)
    checkpoint = str(tmp_path / "ckpt")
    reader = _Reader(kafka.bootstrap, out, 2)
    try:
        first = _new_job(engine, kafka, topics, "spark-kafka-restart", checkpoint)
        reader.until(n, first)
        _produce(kafka.bootstrap, src, range(n, 2 * n), 2)
        _stop(first)  # the epoch in progress (if any) is abandoned
        read_first = list(engine.get_list(offsets))
        engine.get_list(offsets).clear()
        second = _new_job(engine, kafka, topics, "spark-kafka-restart", checkpoint)
        assert second.resumed_from_snapshot >= 1
        got = _until_then_stop(reader, 2 * n, second)
    finally:
        reader.close()
    assert Counter(got) == _oracle(2 * n)
    read_second = list(engine.get_list(offsets))
    assert not set(read_first) & set(read_second)
    assert sorted(read_first + read_second) == sorted((i % 2, i // 2) for i in range(2 * n))
    for partition in (0, 1):
        before = [o for p, o in read_first if p == partition]
        after = [o for p, o in read_second if p == partition]
        if after:
            assert min(after) == (max(before) + 1 if before else 0)
    assert (
        first.metrics["kafka-in"]["items_out"] + second.metrics["kafka-in"]["items_out"]
        == 2 * 2 * n
    )


def _records_sent(bootstrap: str, topic: str, partitions: int) -> int:
    """How many records reached ``topic`` (high watermarks: committed or not)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{topic}"})
    try:
        return sum(
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        )
    finally:
        c.close()


def test_a_replayed_epoch_writes_nothing_again(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """The driver fails before the commit of the first epoch by whose end records
    reached the output topic (an epoch whose sink tasks wrote the previous epoch's
    transactions; on main, the epoch that sent its own records as they came): the new
    job replays that epoch from the same snapshot and writes none of those records
    again."""
    n = 1500
    src, out, offsets = topics = _topics(kafka, "c", n)
    engine = ss.spark(spark_session)
    checkpoint = str(tmp_path / "ckpt")
    failed: list[int] = []

    def fail_once_output_is_sent(epoch_id: int) -> None:
        if not failed and _records_sent(kafka.bootstrap, out, 2) > 0:
            failed.append(epoch_id)
            raise RuntimeError("injected driver failure before the commit")

    reader = _Reader(kafka.bootstrap, out, 2)
    try:
        first = _new_job(engine, kafka, topics, "spark-kafka-replay", checkpoint)
        first._before_commit = fail_once_output_is_sent
        with pytest.raises(JobFailedError, match="injected driver failure"):
            first.join(240)
        assert first.epochs_committed == failed[0]  # the epochs before it committed
        second = _new_job(engine, kafka, topics, "spark-kafka-replay", checkpoint)
        got = _until_then_stop(reader, n, second)
    finally:
        reader.close()
    assert Counter(got) == _oracle(n)


WINDOW = 100


def _event(seq: int) -> tuple[int, str]:
    return seq, f"k{seq % KEYS}"


def test_the_final_run_writes_the_last_windows_once(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """A finite source (a generator) into tumbling windows into Kafka: the epochs' windows
    and those the final run flushes (written by the sink itself, under its final
    marker) are in the topic exactly once, and the job completes."""
    from slipstream.window import tumbling_window_def

    out = _names("d")[1]
    kafka.create_topic(out, 1)
    n = 1500  # 3,000 items took ~5 epochs of 200 ms; the test needs two or more
    p = ss.Pipeline()
    p.read_from(sources.generator(_event, 3000, max_items=n)).with_timestamps(
        lambda e: e[0], 0
    ).group_by(lambda e: e[1]).window(tumbling_window_def(WINDOW)).aggregate(counting()).map(
        lambda r: f"{r.key}:{r.start}:{r.value}"
    ).write_to(sinks.kafka(out, {"bootstrap.servers": kafka.bootstrap}))
    job = ss.spark(spark_session).new_job(
        p,
        _config("spark-kafka-final"),
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(tmp_path / "ckpt"),
    )
    job.join(300)
    oracle = Counter(f"k{i % KEYS}:{i // WINDOW * WINDOW}" for i in range(n))
    expected = Counter(f"{kw}:{c}" for kw, c in oracle.items())
    reader = _Reader(kafka.bootstrap, out, 1)
    try:
        got = reader.until(sum(expected.values()))
    finally:
        reader.close()
    assert Counter(got) == expected
    assert job.epochs_committed >= 2


def test_structured_streaming_into_kafka_writes_the_last_batch(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """A Structured Streaming job (text files, one per micro-batch, availableNow) into
    the Kafka sink: each batch's transactions are written by the commit step right after
    the epoch's commit, so when the query ends the last batch's output is in the topic
    too (no later epoch would restore it)."""
    from slipstream.spark.io import spark_stream_source

    out = _names("e")[1]
    kafka.create_topic(out, 1)
    data = tmp_path / "in"
    data.mkdir()
    n = 600
    for f in range(3):
        (data / f"part-{f}.txt").write_text(
            "".join(f"k{i % KEYS}\n" for i in range(f * n // 3, (f + 1) * n // 3))
        )
    df = spark_session.readStream.option("maxFilesPerTrigger", 1).text(str(data))
    p = ss.Pipeline()
    p.read_from(spark_stream_source(df, lambda row: row.value)).group_by(
        lambda k: k
    ).rolling_aggregate(counting()).map(lambda kv: f"{kv[0]}:{kv[1]}").write_to(
        sinks.kafka(out, {"bootstrap.servers": kafka.bootstrap})
    )
    job = ss.spark(spark_session).new_job(
        p,
        _config("spark-kafka-ss"),
        checkpoint_location=str(tmp_path / "ckpt"),
        trigger={"availableNow": True},
    )
    job.join(300)
    assert job.status is ss.JobStatus.COMPLETED
    assert job.epochs_committed == 3
    reader = _Reader(kafka.bootstrap, out, 1)
    try:
        got = reader.until(n)
    finally:
        reader.close()
    assert Counter(got) == _oracle(n)


def test_a_failed_commit_step_loses_nothing(
    spark_session: Any, kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver fails right after an epoch's commit, before its commit step writes the
    transactions (as a driver that dies there): the epoch stays committed, and a new job
    on the checkpoint writes its records from the restored snapshot, once."""
    from importlib import import_module

    streaming = import_module("slipstream.spark.streaming")  # ss.spark is the factory

    n = 1000
    src, out, offsets = topics = _topics(kafka, "f", n)
    engine = ss.spark(spark_session)
    checkpoint = str(tmp_path / "ckpt")
    real = streaming.commit_epoch_output

    def fail_when_output_waits(sc: Any, tasks: Any, results: Any, store: Any, sid: int) -> int:
        if any(r.get("commit_pending") for r in results):
            raise RuntimeError("injected driver failure after the commit")
        return real(sc, tasks, results, store, sid)

    monkeypatch.setattr(streaming, "commit_epoch_output", fail_when_output_waits)
    first = _new_job(engine, kafka, topics, "spark-kafka-commit-step", checkpoint)
    with pytest.raises(JobFailedError, match="injected driver failure after the commit"):
        first.join(240)
    assert first.epochs_committed >= 1
    assert _records_sent(kafka.bootstrap, out, 2) == 0
    monkeypatch.setattr(streaming, "commit_epoch_output", real)
    reader = _Reader(kafka.bootstrap, out, 2)
    try:
        second = _new_job(engine, kafka, topics, "spark-kafka-commit-step", checkpoint)
        got = _until_then_stop(reader, n, second)
    finally:
        reader.close()
    assert Counter(got) == _oracle(n)


def test_epoch_max_items_bounds_what_an_epoch_reads(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """With ``epoch_max_items`` an epoch's source processor stops reading once it
    emitted that many records (checked between polls: one poll, at most 1,000 records,
    more), long before ``epoch_ms``: 6,000 records in 2 partitions take several epochs
    of at most 2 x (1,000 + 1,000) records, and the output is exact."""
    n = 6000
    src, out, offsets = topics = _topics(kafka, "g", n)
    engine = ss.spark(spark_session)
    read = engine.get_list(offsets)
    seen: list[int] = []  # the records read by the epochs committed so far, per epoch

    def count(_epoch_id: int) -> None:
        seen.append(len(read))

    job = _new_job(
        engine,
        kafka,
        topics,
        "spark-kafka-bounded",
        str(tmp_path / "ckpt"),
        epoch_ms=3000,
        epoch_max_items=1000,
    )
    job._before_commit = count
    reader = _Reader(kafka.bootstrap, out, 2)
    try:
        got = reader.until(n, job)
    finally:
        reader.close()
        _stop(job)
    assert Counter(got) == _oracle(n)
    per_epoch = [b - a for a, b in zip([0, *seen], [*seen, len(read)], strict=True)]
    assert sum(per_epoch) == n
    assert max(per_epoch) <= 2 * (1000 + 1000), per_epoch
    assert len([c for c in per_epoch if c]) >= 2, per_epoch
