"""Streaming DAGs on the Spark engine (slipstream.spark.streaming).

Most tests drive the epochs themselves through the in-process RDD stand-in
(spark_fake_rdd), calling the job's ``foreachBatch`` function with one micro-batch per
epoch, so state hand-over, replays and failures are checked fast and exactly. One test
runs a real Structured Streaming query over a directory of files, stops it mid-stream
and restarts it from its checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge
from slipstream.spark.streaming import (
    snapshot_epoch,
    snapshot_no_data,
    snapshot_watermark_pending,
    snapshot_watermarks,
)

from .query_support import feed_and_cancel
from .spark_engine_procs import Boom, Collect, Mapper
from .spark_fake_rdd import FakeSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WINDOW = 1000
LAG = 600


def _library() -> tuple[Any, Any]:
    from slipstream import processors as P
    from slipstream import sinks

    try:
        P.insert_watermarks(lambda e: e, lambda: None)
        sinks.list_sink("x")
    except NotImplementedError:
        pytest.skip("library processors are placeholders")
    return P, sinks


def window_dag(source: Any, sink: str = "windows", mapped: bool = False) -> DAG:
    """stream source -> insert_watermarks -> (distributed, by key) tumbling count -> sink;
    ``mapped`` puts a map behind the inserters (an isolated edge) before the shuffle"""
    P, sinks = _library()
    from slipstream.aggregate import counting
    from slipstream.watermark import with_fixed_lag
    from slipstream.window import tumbling_window_def

    dag = DAG()
    src = dag.new_vertex("source", source)
    wm = dag.new_vertex(
        "watermarks", P.insert_watermarks(_ts, functools.partial(with_fixed_lag, LAG))
    )
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=_key, timestamp_fn=_ts, window_def=tumbling_window_def(WINDOW), agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink(sink)).local_parallelism(1)
    dag.edge(Edge.between(src, wm).isolated())
    if mapped:
        same = dag.new_vertex("mapped", P.map(_same_event))
        dag.edge(Edge.between(wm, same).isolated())
        wm = same
    dag.edge(Edge.between(wm, win).distributed().partitioned(_key))
    dag.edge(Edge.between(win, out).distributed().all_to_one())
    return dag


def _ts(e: tuple[int, str]) -> int:
    return e[0]


def _key(e: tuple[int, str]) -> str:
    return e[1]


def _row_to_event(row: Any) -> tuple[int, str]:
    return (row.ts, row.key) if hasattr(row, "ts") else tuple(row)  # type: ignore[return-value]


def batches(seed: int, n: int, size: int = 150) -> list[list[tuple[int, str]]]:
    """Micro-batches of events: batch ``i`` covers roughly [i*WINDOW, (i+1)*WINDOW) with
    disorder well below LAG, so no event is ever late."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = sorted(i * WINDOW + rng.randrange(WINDOW) for _ in range(size))
        out.append([(t + rng.randrange(LAG // 3), rng.choice("abcd")) for t in base])
    return out


# ------------------------------------------------------------------ epochs without a JVM


class _FakeStreamingDF:
    isStreaming = True


class _Batch:
    """What foreachBatch receives: only ``.rdd`` is used."""

    def __init__(self, rdd: Any) -> None:
        self.rdd = rdd


def _fake_job(
    engine: Any, build: Callable[[Any], DAG], checkpoint: Path, name: str = "stream"
) -> Any:
    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    dag = build(spark_stream_source(_FakeStreamingDF()))
    job = SparkStreamingJob(engine, dag, ss.JobConfig(name=name), str(checkpoint), None)
    job._prepare()
    return job


def _run_epoch(engine: Any, job: Any, events: list[Any], epoch_id: int) -> None:
    job._epoch(_Batch(engine.spark_context.parallelize(events, 1)), epoch_id)


def _batch_windows(events: list[tuple[int, str]]) -> Counter[tuple[Any, ...]]:
    """The same DAG as a batch job on the embedded engine emits every window."""
    from slipstream import sources

    engine = ss.local(cooperative_threads=2)
    engine.new_job(window_dag(sources.items(events))).join(60)
    return Counter(tuple(r) for r in engine.get_list("windows"))


def test_epochs_carry_window_state_and_watermarks(tmp_path: Path) -> None:
    data = batches(1, 6)
    engine = ss.spark(FakeSession())
    job = _fake_job(engine, window_dag, tmp_path)
    per_epoch = []
    for epoch_id, events in enumerate(data):
        _run_epoch(engine, job, events, epoch_id)
        per_epoch.append(len(engine.get_list("windows")))
    got = Counter(tuple(r) for r in engine.get_list("windows"))
    everything = _batch_windows([e for b in data for e in b])
    # no duplicates, and every emitted window is complete (its batch-job value)
    assert max(got.values()) == 1
    assert got - everything == Counter()
    # windows opened in one epoch closed in a later one: all but the last open windows
    top = max(t for b in data for t, _k in b)
    closed = {r for r in everything if r[1] <= top - LAG - WINDOW}
    assert closed <= set(got)
    assert per_epoch[0] == 0 and per_epoch[-1] > per_epoch[1] > 0
    assert job.epochs_committed == 6 and job.last_epoch_id == 5
    assert job.store.committed_ids()[-1] == 6  # one snapshot per epoch
    m = job.metrics
    assert m["source"]["items_out"] == sum(len(b) for b in data)
    assert m["__job__"]["snapshots"] == 6


def _epoch_fields(data: Any) -> tuple[int, bool, bool]:
    return snapshot_epoch(data), snapshot_no_data(data), snapshot_watermark_pending(data)


def test_the_watermark_is_the_micro_batchs_and_its_epoch_emits_what_it_closes(
    tmp_path: Path,
) -> None:
    """The stand-in deals a micro-batch's rows round robin to the 2 source processors.
    Epoch 0: the watermark inserters see maxima 200 and 5000; each holds its watermark
    until the epoch's input ends, then emits it (-400 and 4400, lag 600). Once both are
    in, the windows take the highest, 4400: the micro-batch's maximum minus the lag, as
    in Spark, and emit the windows it closes in this epoch (before, they took the
    minimum, -400, and those windows waited for a no-data epoch or the next epoch).
    Nothing is pending. Epoch 1 starts from 4400: an item of a window it closed is late,
    whichever split it is in."""
    from slipstream.core.late_items import LATE_METRIC

    engine = ss.spark(FakeSession())
    job = _fake_job(engine, window_dag, tmp_path)
    epoch0 = [(100, "a"), (3000, "a"), (200, "a"), (5000, "a")]
    _run_epoch(engine, job, epoch0, 0)
    assert sorted(tuple(r) for r in engine.get_list("windows")) == [
        (0, 1000, "a", 2),
        (3000, 4000, "a", 1),
    ]
    state = job.store.read(1)
    assert _epoch_fields(state) == (0, False, False)
    queue_wms = {
        tuple(w["edges"][0]["wm"])
        for (v, _i), w in snapshot_watermarks(state).items()
        if v == "windows"
    }
    assert queue_wms == {(4400, 4400)}
    assert not job._run_no_data_epoch()  # nothing pending: no epoch, no snapshot
    _run_epoch(engine, job, epoch0, 0)  # Spark replays epoch 0: already committed
    assert job.epochs_skipped == 1 and job.store.committed_ids() == [1]

    _run_epoch(engine, job, [(3500, "b"), (9000, "a"), (4500, "b")], 1)
    assert job.store.committed_ids() == [1, 2] and snapshot_epoch(job.store.read(2)) == 1
    # (3500, "b") belongs to a window that 4400 closed: late, as in Spark
    assert job.metrics["windows"][LATE_METRIC] == 1
    assert not snapshot_watermark_pending(job.store.read(2))  # both at 8400
    assert sorted(tuple(r) for r in engine.get_list("windows")) == [
        (0, 1000, "a", 2),
        (3000, 4000, "a", 1),
        (4000, 5000, "b", 1),
        (5000, 6000, "a", 1),
    ]
    assert (job.epochs_committed, job.no_data_epochs) == (2, 0)
    assert job.metrics["__job__"]["snapshots"] == 2


def _mapped_window_dag(source: Any) -> DAG:
    """window_dag with a map between the inserters and the windows: the windows'
    producers are not inserters, so they coalesce to the minimum of the splits."""
    return window_dag(source, mapped=True)


def _same_event(e: tuple[int, str]) -> tuple[int, str]:
    return e


def test_a_no_data_epoch_emits_what_a_stage_after_the_inserters_held(tmp_path: Path) -> None:
    """With a map between the inserters and the windows (an isolated edge: each map
    processor sees one split's watermark), the windows coalesce to the minimum, -400,
    and a watermark is pending. A no-data epoch (what Spark's no-data batch is to native
    append mode) starts every inserter from 4400 and emits the windows below it; it
    commits a snapshot of its own under the same epoch id."""
    engine = ss.spark(FakeSession())
    job = _fake_job(engine, _mapped_window_dag, tmp_path)
    epoch0 = [(100, "a"), (3000, "a"), (200, "a"), (5000, "a")]
    _run_epoch(engine, job, epoch0, 0)
    assert engine.get_list("windows") == []
    assert _epoch_fields(job.store.read(1)) == (0, False, True)
    assert job._run_no_data_epoch()
    assert sorted(tuple(r) for r in engine.get_list("windows")) == [
        (0, 1000, "a", 2),
        (3000, 4000, "a", 1),
    ]
    assert _epoch_fields(job.store.read(2)) == (0, True, False)
    assert (job.epochs_committed, job.no_data_epochs, job.last_epoch_id) == (1, 1, 0)
    assert not job._run_no_data_epoch()
    assert job.store.committed_ids() == [1, 2]


def test_replayed_committed_epoch_is_skipped(tmp_path: Path) -> None:
    data = batches(2, 4)
    engine = ss.spark(FakeSession())
    job = _fake_job(engine, window_dag, tmp_path)
    for epoch_id in range(3):
        _run_epoch(engine, job, data[epoch_id], epoch_id)
    before = list(engine.get_list("windows"))
    _run_epoch(engine, job, data[2], 2)  # Spark replays epoch 2 after a driver restart
    assert job.epochs_skipped == 1
    assert engine.get_list("windows") == before


def test_epoch_failing_before_commit_replays_to_the_same_result(tmp_path: Path) -> None:
    data = batches(3, 6)
    # uninterrupted
    engine = ss.spark(FakeSession())
    job = _fake_job(engine, window_dag, tmp_path / "a")
    for epoch_id, events in enumerate(data):
        _run_epoch(engine, job, events, epoch_id)
    uninterrupted = Counter(tuple(r) for r in engine.get_list("windows"))

    # the driver fails in epoch 3 after running it, before committing its state
    first = ss.spark(FakeSession())
    job1 = _fake_job(first, window_dag, tmp_path / "b")

    def crash(epoch_id: int) -> None:
        if epoch_id == 3:
            raise RuntimeError("driver lost")

    job1._before_commit = crash
    for epoch_id in range(3):
        _run_epoch(first, job1, data[epoch_id], epoch_id)
    with pytest.raises(ss.JobFailedError, match="driver lost"):
        _run_epoch(first, job1, data[3], 3)
    # a new driver (engine) restarts from the checkpoint; Spark replays epoch 3
    second = ss.spark(FakeSession())
    job2 = _fake_job(second, window_dag, tmp_path / "b")
    for epoch_id in range(3, 6):
        _run_epoch(second, job2, data[epoch_id], epoch_id)
    combined = Counter(tuple(r) for r in first.get_list("windows")) + Counter(
        tuple(r) for r in second.get_list("windows")
    )
    assert combined == uninterrupted
    assert job2.epochs_skipped == 0 and job2.epochs_committed == 3


def test_processor_failure_in_an_epoch_names_the_vertex(tmp_path: Path) -> None:
    def build(source: Any) -> DAG:
        dag = DAG()
        src = dag.new_vertex("source", source)
        bad = dag.new_vertex("fragile", functools.partial(Boom, 13))
        out = dag.new_vertex("sink", functools.partial(Collect, "out"))
        dag.edge(Edge.between(src, bad)).edge(Edge.between(bad, out))
        return dag

    engine = ss.spark(FakeSession())
    job = _fake_job(engine, build, tmp_path)
    _run_epoch(engine, job, [1, 2, 3], 0)
    with pytest.raises(ss.JobFailedError) as info:
        _run_epoch(engine, job, [12, 13, 14], 1)
    assert info.value.vertex == "fragile"
    assert isinstance(info.value.__cause__, ValueError)
    assert sorted(engine.get_list("out")) == [1, 2, 3]  # the failed epoch published nothing
    assert job.store.committed_ids() == [1]


def test_streaming_dag_errors(tmp_path: Path) -> None:
    from slipstream.spark.io import spark_dataframe_sink, spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    engine = ss.spark(FakeSession())
    with pytest.raises(TypeError, match="streaming DataFrame"):
        spark_stream_source(object())
    # a second, non-streaming source
    dag = DAG()
    s1 = dag.new_vertex("stream", spark_stream_source(_FakeStreamingDF()))
    s2 = dag.new_vertex("static", functools.partial(Mapper, str))
    m = dag.new_vertex("merge", functools.partial(Mapper, str))
    dag.edge(Edge.between(s1, m)).edge(Edge.from_(s2).to(m, 1))
    job = SparkStreamingJob(engine, dag, ss.JobConfig(), str(tmp_path), None)
    job._prepare()
    with pytest.raises(ss.JobFailedError, match="'static'.*every source"):
        _run_epoch(engine, job, [1], 0)
    # a DataFrame sink
    dag = DAG()
    s1 = dag.new_vertex("stream", spark_stream_source(_FakeStreamingDF()))
    out = dag.new_vertex("out", spark_dataframe_sink("x"))
    dag.edge(Edge.between(s1, out))
    job = SparkStreamingJob(engine, dag, ss.JobConfig(), str(tmp_path / "2"), None)
    job._prepare()
    with pytest.raises(ss.JobFailedError, match="spark_dataframe_sink"):
        _run_epoch(engine, job, [1], 0)
    # the embedded engine cannot read a streaming DataFrame
    local = ss.local()
    dag = DAG()
    s1 = dag.new_vertex("stream", spark_stream_source(_FakeStreamingDF()))
    out = dag.new_vertex("out", functools.partial(Collect, "x"))
    dag.edge(Edge.between(s1, out))
    with pytest.raises(RuntimeError, match="only on the Spark engine"):
        local.new_job(dag).join(10)


# ------------------------------------------------------------------ a real query


def _query_run(
    spark_session: Any, directory: Path, checkpoint: Path, files: list[tuple[int, list[Any]]]
) -> tuple[Counter[tuple[Any, ...]], Any]:
    """Start the window DAG on ``directory`` with ``checkpoint``, add ``files`` one at a
    time (waiting for each to be processed), stop; returns the windows and the job."""
    from slipstream.spark.io import spark_stream_source

    df = (
        spark_session.readStream.schema("ts long, key string")
        .option("maxFilesPerTrigger", 1)
        .json(str(directory))
    )
    engine = ss.spark(spark_session)
    job = engine.new_job(
        window_dag(spark_stream_source(df, _row_to_event)),
        ss.JobConfig(name="windows"),
        checkpoint_location=str(checkpoint),
    )
    feed_and_cancel(job, directory, files, ("ts", "key"))
    return Counter(tuple(r) for r in engine.get_list("windows")), job


@pytest.mark.timeout(300)
def test_query_stopped_and_restarted_from_checkpoint(spark_session: Any, tmp_path: Path) -> None:
    # four files, one an epoch: two before the stop and two after it (six made twelve
    # epochs of the three runs, 46 s at load 20, for the same assertions)
    data = list(enumerate(batches(4, 4)))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    t0 = time.monotonic()
    uninterrupted, job = _query_run(spark_session, tmp_path / "a", tmp_path / "ca", data)
    assert job.epochs_committed == 4
    assert job.status is ss.JobStatus.CANCELLED
    first, job1 = _query_run(spark_session, tmp_path / "b", tmp_path / "cb", data[:2])
    second, job2 = _query_run(spark_session, tmp_path / "b", tmp_path / "cb", data[2:])
    print(f"three streaming runs: {time.monotonic() - t0:.1f} s")
    assert (job1.epochs_committed, job2.epochs_committed) == (2, 2)
    assert job2.last_epoch_id == 3  # Spark's epoch ids continued from the checkpoint
    assert first + second == uninterrupted  # no loss, no duplicates
    assert max(uninterrupted.values()) == 1
    everything = _batch_windows([e for _i, b in data for e in b])
    assert uninterrupted - everything == Counter()
    assert len(uninterrupted) >= len(everything) - 2 * 4  # all but the open windows


# ------------------------------------------------------------------ limits (issue 8, 4)


def test_list_sink_output_on_the_driver_is_bounded(tmp_path: Path) -> None:
    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    data = batches(5, 6)
    runs = {}
    for limit in (None, 7):
        engine = ss.spark(FakeSession())
        dag = window_dag(spark_stream_source(_FakeStreamingDF()))
        job = SparkStreamingJob(
            engine, dag, ss.JobConfig(), str(tmp_path / str(limit)), None, limit
        )
        job._prepare()
        sizes = []
        for epoch_id, events in enumerate(data):
            _run_epoch(engine, job, events, epoch_id)
            sizes.append(len(engine.get_list("windows")))
        runs[limit] = (list(engine.get_list("windows")), sizes)
    everything, sizes = runs[None]
    assert len(everything) > 7 and sizes[-1] == len(everything)
    kept, sizes = runs[7]
    assert max(sizes) <= 7
    assert kept == everything[-7:]  # the newest items, in order


def _two_sources_dag(a: Any, b: Any) -> DAG:
    dag = DAG()
    sa = dag.new_vertex("a", a)
    sb = dag.new_vertex("b", b)
    out = dag.new_vertex("sink", functools.partial(Collect, "both")).local_parallelism(1)
    dag.edge(Edge.between(sa, out).distributed().all_to_one())
    dag.edge(Edge.from_(sb).to(out, 1).distributed().all_to_one())
    return dag


def _label_a(row: Any) -> tuple[str, Any]:
    return ("a", row.n)


def _label_b(row: Any) -> tuple[str, Any]:
    return ("b", row.word)


@pytest.mark.timeout(300)
def test_several_stream_sources_in_one_query(spark_session: Any, tmp_path: Path) -> None:
    from slipstream.spark.io import spark_stream_source

    da, db = tmp_path / "a", tmp_path / "b"
    da.mkdir()
    db.mkdir()
    # different schemas: each source's rows reach its own vertex as its own Rows
    a = spark_session.readStream.schema("n long").json(str(da))
    b = spark_session.readStream.schema("word string, extra double").json(str(db))
    engine = ss.spark(spark_session)
    job = engine.new_job(
        _two_sources_dag(spark_stream_source(a, _label_a), spark_stream_source(b, _label_b)),
        ss.JobConfig(name="two-sources"),
        checkpoint_location=str(tmp_path / "ck"),
    )
    try:
        for i in range(2):
            for d, rows in (
                (da, [{"n": 10 * i + k} for k in range(3)]),
                (db, [{"word": f"w{i}{k}", "extra": 0.5} for k in range(2)]),
            ):
                tmp = tmp_path / f".tmp-{d.name}-{i}"
                tmp.write_text("\n".join(json.dumps(r) for r in rows))
                os.rename(tmp, d / f"part-{i}.json")
            job.process_all_available(120)
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(60)
    got = sorted(engine.get_list("both"))
    want = sorted(
        [("a", 10 * i + k) for i in range(2) for k in range(3)]
        + [("b", f"w{i}{k}") for i in range(2) for k in range(2)]
    )
    assert got == want


def _as_row(e: tuple[int, str]) -> tuple[str, int]:
    return (e[1], e[0])


def _writer_job(engine: Any, checkpoint: Path, **writer: Any) -> Any:
    from slipstream.spark.io import spark_dataframe_sink, spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(_FakeStreamingDF(), tuple))
    out = dag.new_vertex(
        "out", spark_dataframe_sink("rows", "key string, ts long", _as_row, **writer)
    )
    dag.edge(Edge.between(src, out))
    job = SparkStreamingJob(engine, dag, ss.JobConfig(name="writer"), str(checkpoint), None)
    job._prepare()
    return job


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["parquet", "json", "table"])
def test_dataframe_sink_writes_each_epoch_once_even_when_replayed(
    spark_session: Any, tmp_path: Path, fmt: str
) -> None:
    data = batches(6, 3, size=20)
    if fmt == "table":
        table = f"slipstream_epochs_{os.getpid()}"
        spark_session.sql(
            f"CREATE TABLE {table} (key STRING, ts BIGINT, slipstream_epoch INT) USING parquet "
            f"PARTITIONED BY (slipstream_epoch) LOCATION '{tmp_path / 'table'}'"
        )
        writer: dict[str, Any] = {"table": table}

        def read() -> Any:
            return spark_session.table(table)
    else:
        writer = {"format": fmt, "path": str(tmp_path / "out")}

        def read() -> Any:
            return spark_session.read.format(fmt).load(str(tmp_path / "out"))

    def batch(events: list[tuple[int, str]]) -> Any:
        return spark_session.createDataFrame(events, "ts long, key string")

    try:
        engine = ss.spark(spark_session)
        job1 = _writer_job(engine, tmp_path / "ck", **writer)

        def crash(epoch_id: int) -> None:
            if epoch_id == 1:
                raise RuntimeError("driver lost")

        job1._before_commit = crash
        job1._epoch(batch(data[0]), 0)
        with pytest.raises(ss.JobFailedError, match="driver lost"):
            job1._epoch(batch(data[1]), 1)  # written, not committed
        # a new driver: Spark replays epoch 1, then goes on
        job2 = _writer_job(ss.spark(spark_session), tmp_path / "ck", **writer)
        job2._epoch(batch(data[1]), 1)
        job2._epoch(batch(data[2]), 2)
        rows = read().collect()
        got = Counter((r.key, r.ts, r.slipstream_epoch) for r in rows)
        want = Counter((k, t, i) for i, b in enumerate(data) for t, k in b)
        assert got == want  # every epoch exactly once
    finally:
        if fmt == "table":
            spark_session.sql(f"DROP TABLE IF EXISTS {table}")


def test_dataframe_sink_written_by_a_batch_job(spark_session: Any, tmp_path: Path) -> None:
    from slipstream.spark.io import spark_dataframe_sink

    from .spark_engine_procs import ListSource

    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, [(i, str(i)) for i in range(50)]))
    out = dag.new_vertex(
        "out",
        spark_dataframe_sink("rows", "n long, s string", format="json", path=str(tmp_path / "j")),
    )
    dag.edge(Edge.between(src, out))
    ss.spark(spark_session).new_job(dag).join(120)
    rows = spark_session.read.json(str(tmp_path / "j")).collect()
    assert sorted((r.n, r.s) for r in rows) == [(i, str(i)) for i in range(50)]
