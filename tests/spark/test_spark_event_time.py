"""Event time of Structured Streaming jobs as Spark users expect it (issue 23): the 1 s
windows a slipstream job emits over a ``spark_stream_source`` equal those of native
Structured Streaming in append mode (``withWatermark`` + ``groupBy(window)`` +
``count``), none missing at the end of a ``trigger(availableNow=True)`` run, with one
or two files per micro-batch, and across a restart from the checkpoint.

The files are split into several contiguous partitions (a small
``spark.sql.files.maxPartitionBytes``), as Spark splits large files, so the source
processors of an epoch hold older and newer parts of the micro-batch. Native Spark takes
the batch's maximum event time; before the fix slipstream's watermark was the minimum
over the splits, and the last epoch's later windows were never emitted.
"""

from __future__ import annotations

import functools
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LAG = 600
FILES = 4
EVENTS_PER_FILE = 1500
SPAN = 5000  # event time covered by one file (ms)

Windows = Counter[tuple[int, str]]


def _write_files(directory: Path) -> Windows:
    """Time-ordered files (file i covers [i*SPAN, (i+1)*SPAN)), read oldest first: no
    event is ever late, in slipstream or in Spark. Returns the windows append mode emits
    by the end: those whose end is at or below the last watermark, the maximum event
    time minus the lag (Spark's no-data batch emits the ones the last micro-batch
    closes)."""
    rng = random.Random(23)
    directory.mkdir()
    everything: list[tuple[int, str]] = []
    for i in range(FILES):
        ts = sorted(i * SPAN + rng.randrange(SPAN) for _ in range(EVENTS_PER_FILE))
        events = [(t, f"k{rng.randrange(8)}") for t in ts]
        everything.extend(events)
        tmp = directory.parent / f".tmp-{i}"
        tmp.write_text("\n".join(json.dumps({"ts": t, "key": k}) for t, k in events))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))
        os.rename(tmp, directory / f"part-{i}.json")
    watermark = max(t for t, _k in everything) - LAG
    return Counter(
        (t // 1000 * 1000, k) for t, k in everything if t // 1000 * 1000 + 1000 <= watermark
    )


@pytest.fixture(scope="module")
def events(tmp_path_factory: Any) -> tuple[Path, Windows]:
    directory = tmp_path_factory.mktemp("event-time") / "events"
    return directory, _write_files(directory)


@pytest.fixture
def split_files(spark_session: Any) -> Iterator[None]:
    """Each file in several partitions, each a contiguous run of its lines."""
    key = "spark.sql.files.maxPartitionBytes"
    before = spark_session.conf.get(key, None)
    spark_session.conf.set(key, "16384")
    try:
        yield
    finally:
        if before is None:
            spark_session.conf.unset(key)
        else:
            spark_session.conf.set(key, before)


def _stream(spark_session: Any, directory: Path, files_per_batch: int) -> Any:
    return (
        spark_session.readStream.schema("ts long, key string")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(directory))
    )


_native_cache: dict[int, Windows] = {}


def _native(spark_session: Any, directory: Path, files_per_batch: int, checkpoint: Path) -> Windows:
    """Native append mode's windows (start in ms, key) -> count."""
    if files_per_batch in _native_cache:
        return _native_cache[files_per_batch]
    from pyspark.sql import functions as F  # noqa: N812

    rows: list[Any] = []
    query = (
        _stream(spark_session, directory, files_per_batch)
        .withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", f"{LAG} milliseconds")
        .groupBy(F.window("t", "1 second"), "key")
        .count()
        .select(F.unix_millis(F.col("window.start")).alias("start"), "key", "count")
        .writeStream.outputMode("append")
        .foreachBatch(lambda df, _epoch: rows.extend(df.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    got: Windows = Counter()
    for r in rows:
        got[(r.start, r.key)] += r["count"]
    _native_cache[files_per_batch] = got
    return got


def _ts(e: tuple[int, str]) -> int:
    return e[0]


def _key(e: tuple[int, str]) -> str:
    return e[1]


def _event(row: Any) -> tuple[int, str]:
    return (row.ts, row.key)


def _dag(df: Any) -> DAG:
    """stream -> insert_watermarks -> (distributed, by key) 1 s tumbling count -> sink"""
    from slipstream.spark.io import spark_stream_source

    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(df, _event))
    wm = dag.new_vertex(
        "watermarks", P.insert_watermarks(_ts, functools.partial(with_fixed_lag, LAG))
    )
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=_key, timestamp_fn=_ts, window_def=tumbling_window_def(1000), agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink("windows")).local_parallelism(1)
    dag.edge(Edge.between(src, wm).isolated())
    dag.edge(Edge.between(wm, win).distributed().partitioned(_key))
    dag.edge(Edge.between(win, out).distributed().all_to_one())
    return dag


def _pipeline(df: Any) -> Any:
    """The same job in the Pipeline API (watermarks fused into stage 1 of the window)."""
    p = ss.Pipeline()
    (
        p.read_from(sources.spark_stream(df, _event))
        .with_timestamps(_ts, LAG)
        .group_by(_key)
        .window(tumbling_window_def(1000))
        .aggregate(counting())
        .write_to(sinks.list_sink("windows"))
    )
    return p


def _windows(engine: Any) -> Windows:
    got: Windows = Counter()
    for r in engine.get_list("windows"):
        got[(r.start, r.key)] += r.value
        assert r.end == r.start + 1000
    return got


def _run(spark_session: Any, job_or_pipeline: Any, checkpoint: Path, name: str) -> tuple[Any, Any]:
    engine = ss.spark(spark_session)
    job = engine.new_job(
        job_or_pipeline,
        ss.JobConfig(name=name),
        checkpoint_location=str(checkpoint),
        trigger={"availableNow": True},
    )
    return engine, job


#: no-data epochs at the end of the run. The DAG's windows read the inserters directly
#: and take the micro-batch's watermark in each epoch; the Pipeline fuses the timestamps
#: into the window's first stage, whose partial frames of one split go out at that
#: split's watermark, so its second stage takes the minimum and a no-data epoch emits
#: what the last batch closes (as Spark's no-data batch does)
NO_DATA_EPOCHS = {"dag": 0, "pipeline": 1}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("files_per_batch", [1, 2])
@pytest.mark.parametrize("shape", ["dag", "pipeline"])
def test_windows_equal_native_append_mode(
    spark_session: Any,
    events: tuple[Path, Windows],
    tmp_path: Path,
    split_files: None,
    shape: str,
    files_per_batch: int,
) -> None:
    directory, expected = events
    native = _native(spark_session, directory, files_per_batch, tmp_path / "native")
    assert native == expected  # what append mode emits by the end of availableNow
    df = _stream(spark_session, directory, files_per_batch)
    build = _dag if shape == "dag" else _pipeline
    engine, job = _run(spark_session, build(df), tmp_path / "slipstream", f"w-{shape}")
    job.join(300)
    assert job.status is ss.JobStatus.COMPLETED
    got = _windows(engine)
    assert native - got == Counter(), "windows native emits and slipstream does not"
    assert got - native == Counter(), "windows slipstream emits and native does not"
    assert job.epochs_committed == FILES // files_per_batch
    # the splits of the last micro-batch ended at different watermarks
    assert job.no_data_epochs == NO_DATA_EPOCHS[shape], job.no_data_epochs


@pytest.mark.timeout(600)
def test_a_restart_in_the_middle_gives_the_same_windows(
    spark_session: Any, events: tuple[Path, Windows], tmp_path: Path, split_files: None
) -> None:
    """Stop the query in its third epoch (after two committed, before the third's
    commit), start it again from the checkpoint: together both runs emit native's
    windows, each once."""
    from slipstream.spark.streaming import SparkStreamingJob

    directory, _expected = events
    native = _native(spark_session, directory, 1, tmp_path / "native")
    checkpoint = tmp_path / "slipstream"
    engine1 = ss.spark(spark_session)
    job1 = SparkStreamingJob(
        engine1,
        _dag(_stream(spark_session, directory, 1)),
        ss.JobConfig(name="restarted"),
        str(checkpoint),
        {"availableNow": True},
    )

    def stop_in_epoch_2(epoch_id: int) -> None:
        if epoch_id == 2:  # the driver stops the job: the epoch is abandoned
            threading.Thread(target=job1.cancel, daemon=True).start()
            deadline = time.monotonic() + 60
            while not job1._cancel_requested and time.monotonic() < deadline:
                time.sleep(0.001)
            raise RuntimeError("stopped in epoch 2")

    job1._before_commit = stop_in_epoch_2
    job1._start()
    with pytest.raises(ss.JobCancelledError):
        job1.join(300)
    first = _windows(engine1)

    engine2, job2 = _run(
        spark_session, _dag(_stream(spark_session, directory, 1)), checkpoint, "restarted"
    )
    job2.join(300)
    assert job2.status is ss.JobStatus.COMPLETED
    second = _windows(engine2)
    assert first + second == native  # none missing, none twice
    assert (job1.epochs_committed, job1.no_data_epochs) == (2, 0)
    assert job2.resumed_from_snapshot == 2
    assert job2.epochs_committed == FILES - 2 and job2.last_epoch_id == FILES - 1


def _same(e: tuple[int, str]) -> tuple[int, str]:
    return e


def _window_row(w: Any) -> tuple[int, str, int]:
    return (w.start, w.key, w.value)


@pytest.mark.timeout(300)
def test_a_no_data_epoch_writes_a_partition_of_its_own(spark_session: Any, tmp_path: Path) -> None:
    """A writing DataFrame sink puts each epoch's rows in partition ``slipstream_epoch=n``,
    ``n`` counting the committed epochs, no-data ones included: the no-data epoch after
    Spark's epoch 0 writes partition 1 (rewritten when it is replayed after a failure
    before its commit), and Spark's epoch 1 partition 2, which leaves it alone."""
    from slipstream.spark.io import spark_dataframe_sink, spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    class _Streaming:
        isStreaming = True

    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(_Streaming(), _event))
    wm = dag.new_vertex(
        "watermarks", P.insert_watermarks(_ts, functools.partial(with_fixed_lag, LAG))
    )
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=_key, timestamp_fn=_ts, window_def=tumbling_window_def(1000), agg_op=counting()
        ),
    )
    out = dag.new_vertex(
        "out",
        spark_dataframe_sink(
            "windows", "start long, key string, value long", _window_row, path=str(tmp_path / "w")
        ),
    )
    # a map behind the inserters (an isolated edge): the windows' producers are not
    # inserters, so they take the minimum of the splits and a no-data epoch emits the rest
    same = dag.new_vertex("same", P.map(_same))
    dag.edge(Edge.between(src, wm).isolated())
    dag.edge(Edge.between(wm, same).isolated())
    dag.edge(Edge.between(same, win).distributed().partitioned(_key))
    dag.edge(Edge.between(win, out))
    job = SparkStreamingJob(
        ss.spark(spark_session), dag, ss.JobConfig(name="partitions"), str(tmp_path / "ck"), None
    )
    job._prepare()
    calls = []

    def fail_the_first_no_data_epoch(epoch_id: int) -> None:
        calls.append(epoch_id)
        if len(calls) == 2:
            raise RuntimeError("driver lost")

    job._before_commit = fail_the_first_no_data_epoch

    def two_halves(start: int, end: int) -> Any:
        """A micro-batch in two partitions, the older and the newer half of its rows:
        the processors' splits."""
        rows = [(t, "ab"[t // 100 % 2]) for t in range(start, end, 100)]
        rdd = spark_session.sparkContext.parallelize(rows, 2)
        return spark_session.createDataFrame(rdd, "ts long, key string")

    job._epoch(two_halves(0, 4000), 0)  # splits end at 1300 and 3300: [0, 1000) closes
    with pytest.raises(RuntimeError, match="driver lost"):
        job._run_no_data_epoch()  # written, not committed
    assert job._run_no_data_epoch()  # replayed: 3300 closes [1000, 2000) and [2000, 3000)
    job._epoch(two_halves(4000, 6000), 1)  # 4300 and 5300: [3000, 4000) closes
    assert job.store.committed_ids() == [1, 2, 3]
    rows = spark_session.read.parquet(str(tmp_path / "w")).collect()
    got = Counter((r.slipstream_epoch, r.start, r.key, r.value) for r in rows)
    want = Counter(
        (part, start, key, 5)
        for part, starts in [(0, [0]), (1, [1000, 2000]), (2, [3000])]
        for start in starts
        for key in "ab"
    )
    assert got == want
