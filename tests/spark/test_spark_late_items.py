"""Late items on the Spark engine (issue 21, item 1), as on the embedded engine: a batch
job holds its watermarks and keeps every item; with ``batch_watermarks=True`` (or in a
micro-batch streaming job) late items are dropped, counted and reported by a WARNING on
the driver."""

from __future__ import annotations

import logging
from collections import Counter
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

N = 3000
WD = tumbling_window_def(1000)


def event(seq: int) -> tuple[int, int]:
    """(key, ts) with up to 1.5 s of disorder."""
    return (seq % 3, 10 * seq + (seq * 7919) % 1500)


def ts_of(e: tuple[int, int]) -> int:
    return e[1]


def key_of(e: tuple[int, int]) -> int:
    return e[0]


def lagged() -> Any:
    return with_fixed_lag(100)


def window_dag(source: Any) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", source)
    wm = dag.new_vertex("watermarks", P.insert_watermarks(ts_of, lagged))
    win = dag.new_vertex(
        "window",
        P.aggregate_to_sliding_window(
            key_fn=key_of, timestamp_fn=ts_of, window_def=WD, agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, wm).isolated())
    dag.edge(Edge.between(wm, win).distributed().partitioned(key_of))
    dag.edge(Edge.between(win, out).distributed().all_to_one())
    return dag


def late_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if "late item" in r.getMessage()]


def test_a_batch_job_keeps_late_items_or_reports_them(spark_session: Any, caplog: Any) -> None:
    events = [event(i) for i in range(N)]
    oracle = Counter((t - t % 1000, k) for k, t in events)
    engine = ss.spark(spark_session, local_parallelism=2)
    with caplog.at_level(logging.WARNING):
        job = engine.new_job(window_dag(sources.items(events)), ss.JobConfig(name="kept"))
        job.join(180)
    assert job.metrics["window"]["late_items_dropped"] == 0
    assert Counter({(r.start, r.key): r.value for r in engine.get_list("out")}) == oracle
    assert late_lines(caplog) == []

    flowing = ss.JobConfig(name="flowing", batch_watermarks=True)
    engine = ss.spark(spark_session, local_parallelism=2)
    with caplog.at_level(logging.WARNING):
        job = engine.new_job(window_dag(sources.items(events)), flowing)
        job.join(180)
    late = job.metrics["window"]["late_items_dropped"]
    assert late > 0 and sum(r.value for r in engine.get_list("out")) == N - late
    assert late_lines(caplog) == [
        f"job 'flowing' dropped {late} late items in all (vertex 'window': {late}): they "
        "arrived behind the watermark. To keep them, allow more lag: allowed_lag_ms in "
        "with_timestamps() (Core API: the lag of the watermark policy given to "
        "P.insert_watermarks), or leave JobConfig(batch_watermarks=False) in this batch "
        "job. See docs/troubleshooting.md"
    ]


def test_a_micro_batch_job_warns_on_the_driver(
    spark_session: Any, tmp_path: Path, caplog: Any
) -> None:
    engine = ss.spark(spark_session, local_parallelism=2)
    with caplog.at_level(logging.WARNING):
        job = engine.new_job(
            window_dag(sources.generator(event, 6000, max_items=N)),
            ss.JobConfig(name="ticks"),
            streaming=True,
            epoch_ms=200,
            checkpoint_location=str(tmp_path),
        )
        job.join(180)
    late = job.metrics["window"]["late_items_dropped"]
    assert late > 0
    lines = late_lines(caplog)
    assert lines[0].startswith("job 'ticks' dropped ") and " so far " in lines[0]
    assert lines[-1].startswith(f"job 'ticks' dropped {late} late items in all ")
