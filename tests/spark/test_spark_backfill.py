"""Backfill on Spark, continue live (issue 25, item 4): the streaming job's own Pipeline,
built over history files, runs as a batch job on Spark (``ss.state.backfill``), whose
stateful vertices save their state at the end of the history into a snapshot; the same
Pipeline built over Kafka then runs embedded from that snapshot (``restore_from=``) and
from the offsets where the history ends. For a rolling count and for a tumbling window,
the history's output (from Spark) plus the live job's equals one uninterrupted embedded
run over history + live records of the topic, and the live job consumes exactly the
records after the cutoff (none before it is read again). A Spark micro-batch job
continues from a backfill too (its checkpoint's ``slipstream-state`` is the store)."""

from __future__ import annotations

import operator
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting, summing
from slipstream.core.errors import JobCancelledError
from slipstream.window import KeyedWindowResult, tumbling_window_def

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WINDOW = 100


def parse(line: str) -> tuple[str, int, int]:
    """``key,timestamp,value`` -> a tuple (the same text in the files and the topic)."""
    k, t, v = line.split(",")
    return k, int(t), int(v)


def record(i: int) -> str:
    return f"k{i % 7},{i * 10},{i % 5}"


def rolling(source: Any, sink: Any) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(source).set_name("events").map(parse).group_by(
        operator.itemgetter(0)
    ).rolling_aggregate(counting()).write_to(sink)
    return p


def windowed(source: Any, sink: Any) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(source).set_name("events").map(parse).with_timestamps(
        operator.itemgetter(1), 0
    ).group_by(operator.itemgetter(0)).window(tumbling_window_def(WINDOW)).aggregate(
        summing(operator.itemgetter(2))
    ).write_to(sink)
    return p


def write_history(directory: Path, lines: list[str], files: int = 3) -> None:
    """The history as an archive of ``files`` text files (a day per file, say)."""
    directory.mkdir()
    per = -(-len(lines) // files)
    for n in range(files):
        part = lines[n * per : (n + 1) * per]
        (directory / f"part-{n}.txt").write_text("".join(x + "\n" for x in part))


def produce(kafka: Any, topic: str, lines: list[str], partitions: int) -> dict[int, int]:
    """Send ``lines`` (line ``i`` to partition ``i % partitions``); the records each
    partition received."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    per: Counter[int] = Counter()
    for i, line in enumerate(lines):
        producer.produce(topic, value=line.encode(), partition=i % partitions)
        per[i % partitions] += 1
    assert producer.flush(30) == 0
    return dict(per)


def cancel_once_listed(job: Any, out: Any, want: int, name: str) -> None:
    """Wait until ``out`` (list sink ``name``) holds ``want`` items, failing if ``job``
    ends first or after 120 s; then cancel ``job``."""
    deadline = time.monotonic() + 120
    while len(out) < want:
        assert not job.status.is_terminal, job.status
        assert time.monotonic() < deadline, f"{name}: {len(out)} of {want} items"
        time.sleep(0.01)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(60)


def run_until(
    engine: Any, pipeline: ss.Pipeline, name: str, want: int, store: Path, restore: Any = None
) -> tuple[list[Any], Any]:
    """Run ``pipeline`` embedded until list ``name`` holds ``want`` items, then cancel."""
    config = JobConfig(
        name=f"job-{name}",
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_store=store,
        snapshot_interval_ms=200,  # a list sink's output is released at each commit
    )
    out = engine.get_list(name)
    job = engine.new_job(pipeline, config, restore_from=restore)
    cancel_once_listed(job, out, want, name)
    return list(out), job


def kafka_source(topic: str, bootstrap: str, seen: list[tuple[int, int]]) -> Any:
    def projection(message: Any) -> str:
        seen.append((message.partition(), message.offset()))
        return str(message.value().decode())

    return sources.kafka(topic, {"bootstrap.servers": bootstrap}, projection=projection)


def backfill_then_live(
    build: Callable[[Any, Any], ss.Pipeline],
    spark_session: Any,
    kafka: Any,
    tmp_path: Path,
    history: list[str],
    live: list[str],
    partitions: int,
    want_whole: int,
    want_live: int,
) -> tuple[list[Any], list[Any], list[Any], list[tuple[int, int]], dict[int, int], Any]:
    """The flow and one uninterrupted run: (history output from Spark, live output,
    uninterrupted output, Kafka records the live job read, cutoff offsets, backfill)."""
    topic = f"backfill-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    kafka.create_topic(topic, partitions)
    cutoff = produce(kafka, topic, history, partitions)
    produce(kafka, topic, live, partitions)
    # live lines continue the partition cycle: line i of history + live goes to i % n
    assert len(history) % partitions == 0
    files = tmp_path / "history"
    write_history(files, history)
    tag = topic.replace("-", "_")
    spark = ss.spark(spark_session)
    seen: list[tuple[int, int]] = []
    live_pipeline = build(kafka_source(topic, kafka.bootstrap, seen), sinks.list_sink(f"live{tag}"))
    result = ss.state.backfill(
        build(sources.read_files(files), sinks.list_sink(f"hist{tag}")),
        live_pipeline,
        tmp_path / "seed",
        engine=spark,
        offsets={"events": {(topic, p): n for p, n in cutoff.items()}},
        timeout=300,
    )
    # one compiled shape: the DAG Spark ran has the live job's vertices, in order
    assert [v.name for v in result.job.dag.vertices] == [
        v.name for v in live_pipeline.to_dag().vertices
    ]
    hist_out = list(spark.get_list(f"hist{tag}"))
    live_out, _ = run_until(
        ss.local(), live_pipeline, f"live{tag}", want_live, tmp_path / "live", tmp_path / "seed"
    )
    whole_out, _ = run_until(
        ss.local(),
        build(kafka_source(topic, kafka.bootstrap, []), sinks.list_sink(f"whole{tag}")),
        f"whole{tag}",
        want_whole,
        tmp_path / "whole",
    )
    return hist_out, live_out, whole_out, seen, cutoff, result


def test_rolling_count_backfilled_on_spark_continues_live_on_kafka(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    lines = [record(i) for i in range(400)]
    history, live = lines[:300], lines[300:]
    hist_out, live_out, whole_out, seen, cutoff, result = backfill_then_live(
        rolling, spark_session, kafka, tmp_path, history, live, 2, len(lines), len(live)
    )
    assert result.entries == {"rolling_aggregate": 7}
    state = {r.key: r.value for r in ss.state.read(tmp_path / "seed", "rolling_aggregate")}
    assert state == Counter(parse(x)[0] for x in history)
    # one count per record: every key counts 1..n over history + live
    expected = Counter((k, n) for k, total in Counter(parse(x)[0] for x in lines).items()
                       for n in range(1, total + 1))  # fmt: skip
    assert Counter(whole_out) == expected
    assert len(hist_out) == len(history) and len(live_out) == len(live)
    assert Counter(hist_out) + Counter(live_out) == Counter(whole_out)
    # the live job read the live records and none of the history's
    assert sorted(seen) == sorted(
        (p, cutoff[p] + j) for p in cutoff for j in range(len(live) // len(cutoff))
    )


def window_oracle(lines: list[str], last_end: int) -> Counter[KeyedWindowResult]:
    sums: Counter[tuple[int, str]] = Counter()
    for k, t, v in map(parse, lines):
        sums[(t - t % WINDOW, k)] += v
    return Counter(
        KeyedWindowResult(s, s + WINDOW, k, v)
        for (s, k), v in sums.items()
        if s + WINDOW <= last_end
    )


def test_tumbling_window_backfilled_on_spark_continues_live_on_kafka(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """One partition (the window's watermark follows the topic's order); the cutoff at
    t=2950 falls inside the window [2900, 3000), whose frame the snapshot carries. The
    last record (t=3990) is the watermark that closes every window before 3900."""
    lines = [record(i) for i in range(400)]
    history, live = lines[:296], lines[296:]
    expected = window_oracle(lines, 3900)
    hist_out, live_out, whole_out, seen, cutoff, result = backfill_then_live(
        windowed, spark_session, kafka, tmp_path, history, live, 1,
        want_whole=sum(expected.values()), want_live=sum(expected.values()),
    )  # fmt: skip
    assert Counter(whole_out) == expected
    # a batch job sees no watermark: Spark emitted no window over history, the
    # snapshot holds every frame and the live job emits every window once
    assert hist_out == []
    assert Counter(hist_out) + Counter(live_out) == expected
    frames = {
        (r.key, r.detail["frame_end"])
        for r in ss.state.read(tmp_path / "seed", "window-combine")
        if r.kind == "window"
    }
    assert (("k1", 3000) in frames) and result.entries["window-combine"] == len(frames)
    assert sorted(seen) == [(0, cutoff[0] + j) for j in range(len(live))]


def test_spark_micro_batch_job_continues_from_a_backfill(
    spark_session: Any, kafka: Any, tmp_path: Path
) -> None:
    """Spark restores a backfilled store too: written as ``<checkpoint>/slipstream-state``,
    it is the snapshot a micro-batch job (``streaming=True``) with that
    ``checkpoint_location`` resumes from. Over Kafka from the offsets where the history
    ends, the history's output plus the job's are the counts of one run over all the
    records, and the job's source emitted only the live records."""
    lines = [record(i) for i in range(400)]
    history, live = lines[:300], lines[300:]
    topic = f"backfill-mb-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    kafka.create_topic(topic, 2)
    cutoff = produce(kafka, topic, history, 2)
    produce(kafka, topic, live, 2)
    files = tmp_path / "history"
    write_history(files, history)
    spark = ss.spark(spark_session)
    tag = topic.replace("-", "_")

    def from_kafka() -> ss.Pipeline:
        source = sources.kafka(
            topic, {"bootstrap.servers": kafka.bootstrap}, projection=lambda m: m.value().decode()
        )
        return rolling(source, sinks.list_sink(f"live{tag}"))

    checkpoint = tmp_path / "checkpoint"
    ss.state.backfill(
        rolling(sources.read_files(files), sinks.list_sink(f"hist{tag}")),
        from_kafka(),
        checkpoint / "slipstream-state",
        engine=spark,
        offsets={"events": {(topic, p): n for p, n in cutoff.items()}},
        timeout=300,
    )
    job = spark.new_job(
        from_kafka(),
        JobConfig(name="live-on-spark"),
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(checkpoint),
    )
    out = spark.get_list(f"live{tag}")
    cancel_once_listed(job, out, len(live), f"live{tag}")
    assert job.metrics["__job__"]["resumed_from_snapshot"] == 1
    assert job.metrics["events"]["items_out"] == len(live)
    expected = Counter(
        (k, n) for k, total in Counter(parse(x)[0] for x in lines).items()
        for n in range(1, total + 1)
    )  # fmt: skip
    assert Counter(spark.get_list(f"hist{tag}")) + Counter(out) == expected
