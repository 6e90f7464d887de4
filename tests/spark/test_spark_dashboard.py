"""The dashboard watches Spark jobs too: a micro-batch job reports per epoch (the epoch
as the snapshot, counters, watermarks at the epoch's end) through the same endpoints."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge
from slipstream.dashboard import DashboardServer

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _event(seq: int) -> tuple[int, int]:
    return (seq * 2, seq % 3)


def _ts(e: tuple[int, int]) -> int:
    return e[0]


def _key(e: tuple[int, int]) -> int:
    return e[1]


def _dag() -> DAG:
    from slipstream import processors as P
    from slipstream import sinks, sources
    from slipstream.aggregate import counting
    from slipstream.watermark import with_fixed_lag
    from slipstream.window import tumbling_window_def

    dag = DAG()
    # 1 s of items (300 ms epochs): what the test waits for comes in the first epochs
    src = dag.new_vertex("source", sources.generator(_event, 3000, max_items=3000)).local_parallelism(1)
    wm = dag.new_vertex("watermarks", P.insert_watermarks(_ts, lambda: with_fixed_lag(10))).local_parallelism(1)
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=_key, timestamp_fn=_ts, window_def=tumbling_window_def(100), agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(src, wm)).edge(Edge.between(wm, win).partitioned(_key))
    dag.edge(Edge.between(win, out))
    return dag


def test_micro_batch_job_on_the_dashboard(spark_session: Any, tmp_path: Path) -> None:
    # one member: the DAG windows behind a member-local partitioned edge (single stage)
    engine = ss.spark(spark_session, members=1)
    server = DashboardServer(lambda: engine.jobs, 0)
    try:
        job = engine.new_job(
            _dag(), ss.JobConfig(name="spark-watched"), streaming=True, epoch_ms=300,
            checkpoint_location=str(tmp_path),
        )
        seen: dict[str, Any] = {}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with urllib.request.urlopen(server.url + "api/jobs", timeout=10) as r:
                jobs = [j for j in json.load(r)["jobs"] if j["name"] == "spark-watched"]
            if jobs and jobs[0]["snapshot"] is not None:
                j = jobs[0]
                v = {x["name"]: x for x in j["vertices"]}
                if v["sink"]["items_in"] > 0 and v["windows"]["watermark"] is not None:
                    seen = j
                    break
            time.sleep(0.2)
        assert seen, "no epoch showed up on the dashboard"
        assert seen["engine"] == "spark"
        assert seen["snapshot"]["epoch"] >= 0 and seen["snapshot"]["bytes"] > 0
        # Spark's own view: the job group's stages with their task counts
        assert seen["stages"] and all(0 <= st["tasks_done"] <= st["tasks_total"] for st in seen["stages"])
        assert any(st["tasks_total"] > 0 for st in seen["stages"])
        with urllib.request.urlopen(server.url + "metrics", timeout=10) as r:
            assert "slipstream_spark_stage_tasks{" in r.read().decode()
        v = {x["name"]: x for x in seen["vertices"]}
        assert v["windows"]["parallelism"] >= 1 and v["source"]["items_out"] > 0
        with urllib.request.urlopen(server.url, timeout=10) as r:
            page = r.read().decode()
        assert 'data-vertex="windows"' in page and "<svg" in page
        job.join(180)
    finally:
        server.close()
