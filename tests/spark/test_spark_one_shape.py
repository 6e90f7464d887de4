"""One compiled shape per pipeline (issue 21, item 8): the same windowed Pipeline has the
same vertices, vertex names and metric keys on the embedded engine (one member and one
thread, two threads, two members), on Spark in batch and in micro-batches, with the same
results. On main the embedded engine with one member and one thread compiled the window
to one stage ('with_timestamps', 'window') and every other engine to two."""

from __future__ import annotations

import operator
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import summing
from slipstream.window import KeyedWindowResult, tumbling_window_def

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 3000
VERTICES = ["source", "with_timestamps+window-accumulate", "window-combine", "sink"]


def event(seq: int) -> tuple[int, int, int]:
    """(key, timestamp, value), timestamps rising with ``seq``."""
    return (seq % 5, seq * 3, seq % 7)


def pipeline(items_per_second: float | None = None) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.generator(event, items_per_second, max_items=N)).with_timestamps(
        operator.itemgetter(1), 0
    ).group_by(operator.itemgetter(0)).window(tumbling_window_def(100)).aggregate(
        summing(operator.itemgetter(2))
    ).write_to(sinks.list_sink("w"))
    return p


def oracle() -> Counter[KeyedWindowResult]:
    sums: Counter[tuple[int, int]] = Counter()
    for k, t, v in map(event, range(N)):
        sums[(t - t % 100, k)] += v
    return Counter(KeyedWindowResult(s, s + 100, k, v) for (s, k), v in sums.items())


def shape(job: Any) -> tuple[list[str], dict[str, list[str]]]:
    return [v.name for v in job.dag.vertices], {
        v: sorted(m) for v, m in job.metrics.items() if v != "__job__"
    }


def test_same_vertices_and_metric_keys_on_every_engine(spark_session: Any, tmp_path: Path) -> None:
    shapes = {}
    for members, threads in [(1, 1), (1, 2), (2, 1)]:
        engine = ss.local(members=members, cooperative_threads=threads)
        job = engine.new_job(pipeline(), ss.JobConfig(name="one-shape"))
        job.join(60)
        assert Counter(engine.get_list("w")) == oracle()
        shapes[f"embedded {members}x{threads}"] = shape(job)
    spark = ss.spark(spark_session)
    job = spark.new_job(pipeline(), ss.JobConfig(name="one-shape"))
    job.join(300)
    assert Counter(spark.get_list("w")) == oracle()
    shapes["spark batch"] = shape(job)
    spark = ss.spark(spark_session)
    job = spark.new_job(
        pipeline(6000),
        ss.JobConfig(name="one-shape-mb"),
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(tmp_path / "mb"),
    )
    job.join(300)
    assert Counter(spark.get_list("w")) == oracle()
    shapes["spark micro-batch"] = shape(job)
    names, keys = shapes["embedded 1x1"]
    assert names == VERTICES
    for where, got in shapes.items():
        assert got == (names, keys), where


def test_a_spark_checkpoint_resumes_on_the_embedded_engine(spark_session: Any, tmp_path: Path) -> None:
    """A micro-batch job stopped mid-stream continues on the embedded engine from its
    checkpoint (the same store format and now the same vertices): together the two
    runs give every window once. Same parallelism on both (one processor per vertex):
    a generator restored with another parallelism replays from its lowest offset
    (at-least-once, as its docstring says)."""
    import time

    spark = ss.spark(spark_session, members=1, local_parallelism=1)
    first = spark.new_job(
        pipeline(1000),  # 3 s of data: the cancel comes mid-stream on a loaded machine too
        ss.JobConfig(name="handover"),
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(tmp_path),
    )
    deadline = time.monotonic() + 120
    while first.epochs_committed < 2 and not first.status.is_terminal:
        assert time.monotonic() < deadline, "no epoch committed"
        time.sleep(0.02)
    first.cancel()
    with pytest.raises(ss.JobCancelledError):
        first.join(60)
    assert 0 < first.metrics["source"]["items_out"] < N
    # one generator processor on each side: the embedded default follows the interpreter
    # (one thread with the GIL, one per CPU without), so it is pinned
    assert first.watch()["parallelism"]["source"] == 1
    local = ss.local(cooperative_threads=1)
    local.new_job(
        pipeline(),
        ss.JobConfig(name="handover", snapshot_store=str(tmp_path / "local")),
        restore_from=str(tmp_path / "slipstream-state"),
    ).join(60)
    assert Counter(spark.get_list("w")) + Counter(local.get_list("w")) == oracle()
