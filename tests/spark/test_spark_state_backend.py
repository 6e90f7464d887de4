"""The Spark engine refuses a disk-backed keyed state rather than ignoring it (its tasks
keep their state in memory, handed from epoch to epoch): checked before any Spark work."""

from __future__ import annotations

import pytest

from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import rolling_aggregate
from slipstream.spark.engine import check_state_backend


def _key(x: int) -> int:
    return x % 3


def _dag(backend: str | None) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(list(range(10))))
    agg = dag.new_vertex("agg", rolling_aggregate(_key, counting()))
    if backend is not None:
        agg.state_backend(backend)
    out = dag.new_vertex("out", sinks.list_sink("out"))
    dag.edge(Edge.between(src, agg).partitioned(_key))
    dag.edge(Edge.between(agg, out))
    return dag


def test_the_spark_engine_refuses_state_on_disk() -> None:
    check_state_backend(_dag(None), JobConfig())
    check_state_backend(_dag("memory"), JobConfig(state_backend="memory"))
    with pytest.raises(ValueError) as e:
        check_state_backend(_dag("sqlite"), JobConfig(state_backend="sqlite"))
    assert str(e.value) == (
        "state_backend='sqlite' (JobConfig, vertex 'agg') keeps keyed state on the embedded "
        "engine's disk; the Spark engine keeps each task's state in memory. Run the job on "
        "ss.local() for state beyond memory, or use state_backend='memory'"
    )
