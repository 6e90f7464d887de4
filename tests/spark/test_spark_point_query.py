"""``job.state(vertex, key)`` on a Spark streaming job (issue 25, item 1: a point query
on a running job, on every engine): answered from the last epoch committed to the
job's checkpoint store, as ``ss.state.read`` of that store answers, epoch after epoch.
A batch job, which keeps no state, says so. Runs the Spark engine without a JVM
(``FakeSession``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import slipstream as ss
from slipstream import sources
from slipstream.core.errors import SnapshotError

from .spark_fake_rdd import FakeSession
from .test_spark_executor_state import _job, _run, _store, epochs, rolling_dag

pytestmark = [pytest.mark.spark]


def test_a_spark_streaming_job_answers_point_queries_from_its_last_epoch(tmp_path: Path) -> None:
    engine = ss.spark(FakeSession(default_parallelism=2))
    job = _job(engine, tmp_path)
    with pytest.raises(SnapshotError, match="has committed no snapshot yet"):
        job.state("count", "k1")
    data = epochs(3, 2, size=200)
    seen: Counter[str] = Counter()
    for epoch_id, events in enumerate(data):
        _run(engine, job, events, epoch_id)
        seen.update(k for k, _n in events)
        key = events[0][0]
        rows = job.state("count", key)
        assert [(r.key, r.value, r.kind) for r in rows] == [(key, seen[key], "keyed")]
        assert rows == ss.state.read(_store(tmp_path), "count", key=key)
        assert job.state("count", "nobody") == []
    assert {r.key: r.value for r in job.state("count")} == dict(seen)


def test_a_spark_batch_job_has_no_state_to_query() -> None:
    engine = ss.spark(FakeSession(default_parallelism=2))
    job = engine.new_job(rolling_dag(sources.items([("a", 1)])))
    job.join(60)
    with pytest.raises(SnapshotError, match=f"job {job.name!r} takes no snapshots"):
        job.state("count", "a")
