"""The driver's fixed cost per Spark epoch (issue 23; docs/performance.md, "The driver's
share of an epoch"), in process without a JVM: a small epoch state travels in the tasks'
closures (no broadcast to create and unpersist per epoch; the epochs of
tests/spark/test_spark_executor_state.py broadcast nothing), a large one is still
broadcast; compile names (so makes the JVM RDD of) only the vertex RDDs it
persists, not every vertex pipelined into the next one's task; and a processor takes
an input record of a Spark task in one call (docs/performance.md, "count-10k's
per-item path")."""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.core.processor import AbstractProcessor
from slipstream.spark.task import MAX_RECORD_ITEMS

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


class _TakesWhatFits(AbstractProcessor):
    """Forwards its items while the outbox takes them and records how many each
    ``process()`` call took (in the task's list ``takes``, which reaches the driver)."""

    def process(self, ordinal: int, inbox: Any) -> None:
        taken = 0
        while inbox and self.try_emit(inbox[0]):
            inbox.popleft()
            taken += 1
        self.context.get_list("takes").append(taken)


def test_a_processor_takes_an_input_record_in_one_call() -> None:
    # records carry up to MAX_RECORD_ITEMS items (two members here: each source
    # processor sends one full record); with the engine's 2048-item outbox a consumer
    # took one in 8 calls, each dropping its items from the inbox by copying the rest
    # (a rolling count's per-item path, issue 23)
    engine = ss.spark(FakeSession())
    dag = DAG()
    src = dag.new_vertex(
        "source", sources.items(list(range(2 * MAX_RECORD_ITEMS)))
    ).local_parallelism(1)
    fwd = dag.new_vertex("forward", _TakesWhatFits).local_parallelism(1)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, fwd))
    dag.edge(Edge.between(fwd, out))
    engine.new_job(dag).join(60)
    assert sorted(engine.get_list("out")) == list(range(2 * MAX_RECORD_ITEMS))
    assert max(engine.get_list("takes")) == MAX_RECORD_ITEMS


def _line(text: str) -> str:
    return text


@pytest.mark.timeout(300)
def test_the_drivers_py4j_calls_per_epoch_do_not_grow_with_the_epochs(
    spark_session: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's round trips to the JVM in an epoch stay the same however many epochs
    the job ran: the Spark job ids of the job's group (one per data epoch so far) are
    read as one string, not one py4j call per id (twice an epoch: ~4 calls more in each
    epoch than in the one before). Counted in the thread that runs the epochs, between
    two epochs' commit hooks; the fewest of the last epochs against the fewest of the
    first (a py4j call of another kind here and there does not count twice)."""
    import threading

    from py4j import clientserver

    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    directory = tmp_path / "in"
    directory.mkdir()
    for i in range(14):
        path = directory / f"part-{i:03d}.txt"
        path.write_text("\n".join(f"k{(i * 7 + j) % 5}" for j in range(20)))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    calls: list[int] = [0]
    lookups: list[str] = []
    epoch_thread: list[int] = []
    send = clientserver.ClientServerConnection.send_command

    def counted(self: Any, command: str) -> Any:
        if threading.get_ident() in epoch_thread:
            calls[0] += 1
            if command.startswith("r\nu\n") and _from_slipstream():
                lookups.append(command.split("\n")[2])
        return send(self, command)

    monkeypatch.setattr(clientserver.ClientServerConnection, "send_command", counted)
    df = spark_session.readStream.option("maxFilesPerTrigger", 1).text(str(directory))
    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(df, _line))
    count = dag.new_vertex("count", P.accumulate_by_key(_line, counting()))
    dag.edge(Edge.between(src, count).distributed().partitioned(_line))
    job = SparkStreamingJob(
        ss.spark(spark_session),
        dag,
        ss.JobConfig(name="py4j-per-epoch"),
        str(tmp_path / "checkpoint"),
        {"availableNow": True},
    )
    marks: list[int] = []

    def at_commit(_epoch_id: int) -> None:
        if not epoch_thread:
            epoch_thread.append(threading.get_ident())
        marks.append(calls[0])

    job._before_commit = at_commit
    job._start()
    job.join(300)
    per_epoch = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    assert len(per_epoch) >= 12
    assert min(per_epoch[-4:]) <= min(per_epoch[1:5]) + 2, per_epoch
    # slipstream's own code names JVM classes by their full names (slipstream.spark.jvm):
    # no py4j walk of a package path, each segment a failed class lookup on the JVM,
    # after the job's first epoch (PySpark's own lookups are not counted)
    assert lookups == [], lookups


def _from_slipstream() -> bool:
    """Whether the py4j call being made comes straight from slipstream's code (the
    innermost frame outside py4j is one of slipstream's)."""
    import sys

    frame = sys._getframe(2)
    while frame is not None and f"{os.sep}py4j{os.sep}" in frame.f_code.co_filename:
        frame = frame.f_back
    return frame is not None and f"{os.sep}slipstream{os.sep}" in frame.f_code.co_filename
