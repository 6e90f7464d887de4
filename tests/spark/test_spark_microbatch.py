"""Micro-batch jobs on the Spark engine: slipstream's own replayable sources driven in
epochs from the driver (``new_job(dag, config, streaming=True)``,
slipstream.spark.streaming.SparkMicroBatchJob).

The DAG is a rate-limited ``generator`` with ``max_items`` feeding a two-stage tumbling
window, so the job runs several epochs: window state and watermarks cross epoch
boundaries, the generator's offset is carried in the snapshot, and the final run
flushes the windows still open. Results are compared with the same DAG on the embedded
engine and with a plain-Python oracle.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WINDOW = 100
LAG = 50
KEYS = 5


def _event(seq: int) -> tuple[int, str]:
    # timestamps rise with seq, so every generator processor's stream is in order
    return (seq * 3, f"k{seq % KEYS}")


def _ts(e: tuple[int, str]) -> int:
    return e[0]


def _key(e: tuple[int, str]) -> str:
    return e[1]


def _result_key(r: Any) -> Any:
    return r.key


def window_dag(max_items: int | None, items_per_second: float | None, sink: str = "windows") -> DAG:
    """generator -> insert_watermarks -> accumulate_by_frame -> combine_to_sliding_window
    -> list sink (tumbling count windows per key)."""
    from slipstream import processors as P
    from slipstream import sinks, sources
    from slipstream.aggregate import counting
    from slipstream.watermark import with_fixed_lag
    from slipstream.window import tumbling_window_def

    wdef = tumbling_window_def(WINDOW)
    dag = DAG()
    src = dag.new_vertex("source", sources.generator(_event, items_per_second, max_items=max_items))
    wm = dag.new_vertex("watermarks", P.insert_watermarks(_ts, lambda: with_fixed_lag(LAG)))
    acc = dag.new_vertex(
        "frames",
        P.accumulate_by_frame(key_fn=_key, timestamp_fn=_ts, window_def=wdef, agg_op=counting()),
    )
    comb = dag.new_vertex(
        "windows", P.combine_to_sliding_window(window_def=wdef, agg_op=counting())
    )
    out = dag.new_vertex("sink", sinks.list_sink(sink)).local_parallelism(1)
    dag.edge(Edge.between(src, wm).isolated())
    dag.edge(Edge.between(wm, acc).partitioned(_key))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(_result_key))
    dag.edge(Edge.between(comb, out).distributed().all_to_one())
    return dag


def _oracle(max_items: int) -> Counter[tuple[Any, ...]]:
    counts: Counter[tuple[int, int, str]] = Counter()
    for seq in range(max_items):
        t, k = _event(seq)
        start = t - t % WINDOW
        counts[(start, start + WINDOW, k)] += 1
    return Counter({(s, e, k, n): 1 for (s, e, k), n in counts.items()})


def _windows(engine: Any, name: str = "windows") -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in engine.get_list(name))


def _local_windows(max_items: int) -> Counter[tuple[Any, ...]]:
    engine = ss.local(cooperative_threads=2)
    engine.new_job(window_dag(max_items, None)).join(60)
    return _windows(engine)


def test_generator_two_stage_window_matches_local(spark_session: Any, tmp_path: Path) -> None:
    max_items = 3000
    engine = ss.spark(spark_session)
    job = engine.new_job(
        window_dag(max_items, 6000),
        ss.JobConfig(name="mb-window"),
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(tmp_path),
    )
    job.join(120)
    assert job.status is ss.JobStatus.COMPLETED
    got = _windows(engine)
    assert got == _local_windows(max_items)
    assert got == _oracle(max_items)
    # several epochs ran (state crossed epoch boundaries), plus the final run
    assert job.epochs_committed >= 3
    m = job.metrics
    assert m["source"]["items_out"] == max_items
    assert m["frames"].get("late_items_dropped", 0) == 0

    # started again from its checkpoint, a finished job completes at once, emitting nothing
    again = engine.new_job(
        window_dag(max_items, 6000),
        ss.JobConfig(name="mb-window"),
        streaming=True,
        checkpoint_location=str(tmp_path),
    )
    again.join(60)
    assert again.status is ss.JobStatus.COMPLETED
    assert again.epochs_committed == 0
    assert _windows(engine) == got


def test_cancel_and_restart_from_checkpoint_is_exactly_once(
    spark_session: Any, tmp_path: Path, caplog: Any
) -> None:
    max_items = 3000
    engine = ss.spark(spark_session)
    config = ss.JobConfig(name="mb-restart")
    first = engine.new_job(
        window_dag(max_items, 3000),
        config,
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(tmp_path),
    )
    deadline = time.monotonic() + 90
    while first.epochs_committed < 2 and not first.status.is_terminal:
        assert time.monotonic() < deadline, "the first job committed no epochs"
        time.sleep(0.02)
    first.cancel()
    with pytest.raises(ss.JobCancelledError):
        first.join(60)
    partial = _windows(engine)
    emitted = first.metrics["source"]["items_out"]
    assert 0 < emitted < max_items  # stopped mid-stream
    assert first.metrics["__job__"]["resumed_from_snapshot"] == 0
    latest = first.last_epoch_id + 1

    with caplog.at_level("WARNING", logger="slipstream.spark.streaming"):
        second = engine.new_job(
            window_dag(max_items, None),
            config,
            streaming=True,
            epoch_ms=200,
            checkpoint_location=str(tmp_path),
        )
    second.join(120)
    assert second.status is ss.JobStatus.COMPLETED
    # the resume is visible: one warning naming the snapshot and the checkpoint, a metric
    assert [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()] == [
        f"job 'mb-restart': resuming from snapshot {latest} (after epoch {latest - 1}) in "
        f"checkpoint_location {tmp_path}"
    ]
    assert second.metrics["__job__"]["resumed_from_snapshot"] == latest
    # the second job continued from the committed offsets: no item lost or repeated
    assert second.metrics["source"]["items_out"] == max_items - emitted
    got = _windows(engine)
    assert partial and not partial - got  # the first job's windows are final ones
    assert got == _oracle(max_items)
    assert got == _local_windows(max_items)


def _wait_for(engine: Any, name: str, count: int, job: Any) -> None:
    deadline = time.monotonic() + 60
    while len(engine.get_list(name)) < count:
        assert not job.status.is_terminal, f"job ended early: {job.status}"
        assert time.monotonic() < deadline, f"only {len(engine.get_list(name))} of {count} lines"
        time.sleep(0.02)


def test_stream_files_never_completes_and_resumes_at_its_offsets(
    spark_session: Any, tmp_path: Path
) -> None:
    from slipstream import sinks, sources

    data = tmp_path / "in"
    data.mkdir()
    (data / "a.txt").write_text("".join(f"a{i}\n" for i in range(200)))
    (data / "b.txt").write_text("".join(f"b{i}\n" for i in range(150)))

    def build() -> DAG:
        dag = DAG()
        src = dag.new_vertex("files", sources.stream_files(str(data), poll_interval_ms=10))
        out = dag.new_vertex("sink", sinks.list_sink("lines")).local_parallelism(1)
        dag.edge(Edge.between(src, out).distributed().all_to_one())
        return dag

    engine = ss.spark(spark_session)
    checkpoint = str(tmp_path / "ckpt")
    config = ss.JobConfig(name="mb-files")
    first = engine.new_job(
        build(), config, streaming=True, epoch_ms=100, checkpoint_location=checkpoint
    )
    _wait_for(engine, "lines", 350, first)
    first.cancel()
    with pytest.raises(ss.JobCancelledError):
        first.join(60)

    # more lines while the job is down: an appended line and a new file
    with (data / "a.txt").open("a") as f:
        f.write("a200\n")
    (data / "c.txt").write_text("".join(f"c{i}\n" for i in range(100)))
    second = engine.new_job(
        build(), config, streaming=True, epoch_ms=100, checkpoint_location=checkpoint
    )
    _wait_for(engine, "lines", 451, second)
    second.cancel()
    with pytest.raises(ss.JobCancelledError):
        second.join(60)
    expected = (
        [f"a{i}" for i in range(201)]
        + [f"b{i}" for i in range(150)]
        + [f"c{i}" for i in range(100)]
    )
    assert Counter(engine.get_list("lines")) == Counter(expected)


def test_microbatch_rejects_bad_options(spark_session: Any, tmp_path: Path) -> None:
    engine = ss.spark(spark_session)
    with pytest.raises(ValueError, match="epoch_ms"):
        engine.new_job(window_dag(10, None), epoch_ms=100)  # epoch_ms needs streaming=True
    with pytest.raises(ValueError, match="epoch_ms"):
        engine.new_job(
            window_dag(10, None), streaming=True, epoch_ms=0, checkpoint_location=str(tmp_path)
        )
    with pytest.raises(ValueError, match="trigger"):
        engine.new_job(
            window_dag(10, None),
            streaming=True,
            trigger={"once": True},
            checkpoint_location=str(tmp_path),
        )


def test_rolled_back_checkpoint_fails_loudly_unless_allowed(
    spark_session: Any, tmp_path: Path
) -> None:
    """As on the embedded engine (docs/fault-tolerance.md, "A rolled-back store"): a
    backup of the checkpoint's state restored after later epochs committed is refused
    naming both snapshots; on main the job resumed from the backup's snapshot and emitted
    the windows after it a second time. allow_rollback=True resumes from it.

    The runs stopped by cancel() read an endless generator, so a job cannot finish
    before its cancel() (with a bounded one it sometimes did on a loaded machine); the
    run that must complete reads a bounded one without a rate (the same vertices and
    edges, so the same DAG for a restore)."""
    import shutil

    from slipstream.state.store import DirectorySnapshotStore

    engine = ss.spark(spark_session)
    checkpoint = tmp_path / "ckpt"
    state, backup = checkpoint / "slipstream-state", tmp_path / "backup"

    def run(config: ss.JobConfig, epochs: int | None) -> Any:
        job = engine.new_job(
            window_dag(None, 3000) if epochs is not None else window_dag(3000, None),
            config,
            streaming=True,
            epoch_ms=200,
            checkpoint_location=str(checkpoint),
        )
        if epochs is None:
            job.join(120)
            return job
        deadline = time.monotonic() + 90
        while job.epochs_committed < epochs:
            assert not job.status.is_terminal, job.status  # an endless source: it runs on
            assert time.monotonic() < deadline, "the job committed no epochs"
            time.sleep(0.02)
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(60)
        return job

    config = ss.JobConfig(name="mb-rollback")
    run(config, 2)
    shutil.copytree(state, backup)
    run(config, 2)
    newest = DirectorySnapshotStore(str(state)).committed_ids()[-1]
    shutil.rmtree(state)
    shutil.copytree(backup, state)
    older = DirectorySnapshotStore(str(state)).committed_ids()[-1]
    assert older < newest
    with pytest.raises(ss.SnapshotStoreRolledBackError) as ei:
        run(config, None)
    text = str(ei.value)
    assert text.startswith(
        f"snapshot store {state} was rolled back: snapshot {newest} of job 'mb-rollback' "
        f"was committed in it (recorded outside the store in "
    ), text
    assert f"but the job would resume from snapshot {older}. " in text, text
    job = run(ss.JobConfig(name="mb-rollback", allow_rollback=True), None)
    assert job.status is ss.JobStatus.COMPLETED
    assert job.metrics["__job__"]["resumed_from_snapshot"] == older
