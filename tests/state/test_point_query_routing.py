"""A point query reads only the chain of the processor that owns the key (issue 25:
``job.state(vertex, key)`` and the dashboard's key search): the key is routed as a live
item with that key is (the vertex's inbound edge partitioner, here a custom one, on
the job's shape), and the answer is what a read of every chain gives. Where the owner
cannot be known (a vertex no partitioned edge feeds) every chain is read."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import JobCancelledError
from slipstream.core.partition import key_routing
from slipstream.pipeline.keyed import rolling_aggregate
from slipstream.state.store import DirectorySnapshotStore

KEYS = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]


def event(seq: int) -> str:
    return KEYS[seq % len(KEYS)]


def ident(x: Any) -> Any:
    return x


def by_length(key: Any, count: int) -> int:
    """A custom partitioner unlike the default one: by the key's length."""
    return (len(key) * 37) % count


def counts_dag() -> DAG:
    dag = DAG()
    src = dag.new_vertex("events", sources.generator(event, 20000.0)).local_parallelism(1)
    counts = dag.new_vertex("counts", rolling_aggregate(ident, counting())).local_parallelism(3)
    out = dag.new_vertex("out", sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(src, counts).partitioned(ident, by_length).distributed())
    dag.edge(Edge.between(counts, out))
    return dag


def test_a_point_query_reads_only_the_owners_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = str(tmp_path / "store")
    asked: list[Any] = []  # the chains each read of the test's thread names
    me = threading.get_ident()
    real = DirectorySnapshotStore.read

    def spy(self: Any, snapshot_id: int, processors: Any = None, **kw: Any) -> Any:
        if threading.get_ident() == me:
            asked.append(None if processors is None else sorted(processors))
        return real(self, snapshot_id, processors, **kw)

    monkeypatch.setattr(DirectorySnapshotStore, "read", spy)
    engine = ss.local()
    job = engine.new_job(
        counts_dag(),
        JobConfig(
            name="routed",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=20,
            snapshot_store=DirectorySnapshotStore(directory, keep=100_000),
        ),
    )
    owner = key_routing(by_length, 1, 3).owner
    assert len({owner(k) for k in KEYS}) == 3
    try:
        deadline = time.monotonic() + 120
        while True:  # a snapshot that holds every key
            assert not job.status.is_terminal and time.monotonic() < deadline, job.status
            ids = DirectorySnapshotStore(directory).committed_ids_read_only()
            if ids and len({r.key for r in ss.state.read(directory, "counts", ids[-1])}) == 6:
                break
            time.sleep(0.01)
        from slipstream.state.reader import point_query

        for key in KEYS:
            asked.clear()
            sid, rows = point_query(job, "counts", key)
            assert asked == [[("counts", owner(key))]], key
            assert rows == ss.state.read(directory, "counts", sid, key=key)
            assert rows == ss.state.read(job, "counts", sid, key=key)  # the job's store
            assert [(r.key, r.processor) for r in rows] == [(key, owner(key))]
        asked.clear()
        assert job.state("counts", "nobody") == []
        assert asked == [[("counts", owner("nobody"))]]
        # the source's offsets: no partitioned edge feeds it, every chain is read
        asked.clear()
        (offset,) = job.state("events", ("generator", 0))
        assert offset.kind == "offset" and asked == [[("events", 0)]]
        # a snapshot another job wrote (as one a job restores from): its shape is not
        # known, every chain is read
        monkeypatch.setattr(job, "execution_id", "another")
        asked.clear()
        assert [r.key for r in job.state("counts", "a")] == ["a"]
        assert asked == [[("counts", 0), ("counts", 1), ("counts", 2)]]
        assert job.status is ss.JobStatus.RUNNING
    finally:
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
        engine.shutdown()


class Idle(ss.AbstractProcessor):
    """A processor that is only planned, never run."""


def test_the_owner_is_known_only_where_every_key_is_on_its_routed_processor() -> None:
    """Where a point query may read one chain (``_key_owner``): a vertex only
    partitioned edges feed, in a snapshot of this job whose chains (flags of member
    processes, if any) hold only their own keys; anything else reads every chain."""
    from types import SimpleNamespace

    from slipstream.execution.plan import build_vertex_plans
    from slipstream.state.reader import _key_owner

    def owner_in(dag: DAG, members: int = 1, extra: Any = None, execution: str = "e") -> Any:
        plans = build_vertex_plans(dag, JobConfig(), members, 3, None, "x")
        total = plans["counts"].total_parallelism
        job = SimpleNamespace(dag=dag, _execution=SimpleNamespace(plans=plans), execution_id="e")
        store = SimpleNamespace(read_header=lambda sid: {"execution": execution})
        vm = SimpleNamespace(total_parallelism=total, chains={i: [] for i in range(total)})
        manifest = SimpleNamespace(vertices={"counts": vm}, extra=extra or {})
        return _key_owner(job, store, "counts", "ccc", 1, manifest)

    def keyed(*more: str) -> DAG:
        dag = DAG()
        src = dag.new_vertex("events", Idle).local_parallelism(1)
        counts = dag.new_vertex("counts", Idle).local_parallelism(3)
        dag.edge(Edge.between(src, counts).partitioned(ident, by_length).distributed())
        if "broadcast" in more:
            side = dag.new_vertex("side", Idle).local_parallelism(1)
            dag.edge(Edge.from_(side).to(counts, 1).broadcast().distributed())
        return dag

    assert owner_in(keyed()) == {key_routing(by_length, 1, 3).owner("ccc")}
    assert owner_in(keyed("broadcast")) is None  # a join's build side: on every processor
    assert owner_in(keyed(), execution="another job") is None
    assert owner_in(keyed(), members=2) is None  # member processes without flags
    flags = {"counts": {"shape": [2, 3], "chains": {str(i): [False, False] for i in range(6)}}}
    assert owner_in(keyed(), 2, {"member_chains": flags}) == {
        key_routing(by_length, 2, 3).owner("ccc")
    }
    flags["counts"]["chains"]["4"] = [True, False]  # a chain holds another's keys
    assert owner_in(keyed(), 2, {"member_chains": flags}) is None
