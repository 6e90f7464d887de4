"""The driver's fixed cost per Spark epoch (issue 23; docs/performance.md, "The driver's
share of an epoch"), in process without a JVM: a small epoch state travels in the tasks'
closures (no broadcast to create and unpersist per epoch), a large one is still
broadcast; and compile names (so makes the JVM RDD of) only the vertex RDDs it
persists, not every vertex pipelined into the next one's task."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import rolling_aggregate

from .spark_fake_rdd import FakeContext, FakeRDD, FakeSession

streaming = importlib.import_module("slipstream.spark.streaming")

pytestmark = pytest.mark.spark


class _Counting(FakeContext):
    def __init__(self) -> None:
        super().__init__()
        self.broadcasts: list[Any] = []

    def broadcast(self, value: Any) -> Any:
        self.broadcasts.append(value)
        return super().broadcast(value)


def test_a_small_state_is_not_broadcast_a_large_one_is() -> None:
    sc = _Counting()
    small = {"store": {"directory": "/x", "key": b"k" * 32}, "chains": {"count": [[0, [], False]]}}
    assert streaming.ship_state(sc, small) is small
    assert sc.broadcasts == []
    large = {"restore": {("count", 0): [f"e{i:0100d}" for i in range(1000)]}}  # ~100 KB
    shipped = streaming.ship_state(sc, large)
    assert sc.broadcasts == [large]
    assert shipped.value == large


def _key(e: tuple[str, int]) -> str:
    return e[0]


def _event(row: Any) -> tuple[str, int]:
    return tuple(row)  # type: ignore[return-value]


class _FakeStreamingDF:
    isStreaming = True


class _Batch:
    def __init__(self, rdd: Any) -> None:
        self.rdd = rdd


def test_epochs_broadcast_nothing_and_count_exactly(tmp_path: Path) -> None:
    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    session = FakeSession()
    session.sparkContext = _Counting()
    engine = ss.spark(session)
    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(_FakeStreamingDF(), _event))
    count = dag.new_vertex("count", rolling_aggregate(_key, counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, count).distributed().partitioned(_key))
    dag.edge(Edge.between(count, out).distributed().all_to_one())
    job = SparkStreamingJob(engine, dag, ss.JobConfig(name="fixed"), str(tmp_path), None)
    job._prepare()
    batches = [[(f"k{(i * 7 + j) % 5}", j) for j in range(40)] for i in range(3)]
    for epoch_id, events in enumerate(batches):
        job._epoch(_Batch(session.sparkContext.parallelize(events, 2)), epoch_id)
    assert session.sparkContext.broadcasts == []  # the state went in the closures
    assert job.epochs_committed == 3
    # per item, as the embedded engine: the running count of each key after each item
    want: Counter[tuple[str, int]] = Counter()
    seen: Counter[str] = Counter()
    for events in batches:
        for k, _n in events:
            seen[k] += 1
            want[(k, seen[k])] += 1
    assert Counter(tuple(r) for r in engine.get_list("counts")) == want


def _double(x: int) -> int:
    return 2 * x


def test_only_persisted_vertices_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    named: list[str] = []

    def set_name(self: FakeRDD, name: str) -> FakeRDD:
        named.append(name)
        return self

    monkeypatch.setattr(FakeRDD, "setName", set_name)
    engine = ss.spark(FakeSession())
    dag = DAG()
    src = dag.new_vertex("source", sources.items(list(range(20))))
    double = dag.new_vertex("double", P.map(_double))
    a = dag.new_vertex("a", sinks.list_sink("a"))
    b = dag.new_vertex("b", sinks.list_sink("b"))
    dag.edge(Edge.between(src, double))
    dag.edge(Edge.from_(double, 0).to(a)).edge(Edge.from_(double, 1).to(b))
    engine.new_job(dag).join(60)
    assert sorted(engine.get_list("a")) == sorted(engine.get_list("b")) == list(range(0, 40, 2))
    # 'double' feeds two vertices, so it is persisted (and named); the others are
    # pipelined into their consumers' tasks and make no JVM RDD of their own
    assert named == ["slipstream vertex 'double'"]
