"""A completed processor's last output survives a restore (the engine side of the sinks'
completion commits): what a processor offers to the snapshot in ``complete()`` is
recorded with its completion; a restore hands it back to that processor
(``restore_from_snapshot`` + ``finish_snapshot_restore``) and ends it without running it
on input again. A completed job's store ends with a snapshot recording every processor
as completed, so a ``resume`` after a crash at the very end replays nothing."""

from __future__ import annotations

import functools
import os
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.core.snapshot_keys import BroadcastKey
from slipstream.engine.snapshot_store import MANIFEST, DirectorySnapshotStore, SnapshotData

EO = ProcessingGuarantee.EXACTLY_ONCE


class LastBatchSink(ss.AbstractProcessor):
    """Stages what it got after its last snapshot to be "committed" (appended to the list
    ``committed``) at its completion, and offers that batch as its completion state; a
    restore as completed commits it again (idempotently: a set of items)."""

    def init_processor(self, context: Any) -> None:
        self.pending: list[Any] = []
        self.calls = context.get_list("calls")
        self.committed = context.get_list("committed")

    def process(self, ordinal: int, inbox: Any) -> None:
        self.calls.append("process")
        self.pending.extend(inbox)
        inbox.clear()

    def _commit(self, batch: list[Any]) -> None:
        self.committed.extend(x for x in batch if x not in set(self.committed))

    def save_to_snapshot(self) -> bool:
        batch, self.pending = self.pending, []
        self.context.stage_on_commit(lambda: self._commit(batch))
        return True

    def complete(self) -> bool:
        batch, self.pending = self.pending, []
        if self.context.stage_on_commit(lambda: self._commit(batch), at_completion=True):
            self.outbox.offer_to_snapshot(BroadcastKey(("last", self.context.global_processor_index)), batch)
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.calls.append(("restore", key.name[1], len(value)))
        if key.name[1] == self.context.global_processor_index:
            self.pending = list(value)

    def finish_snapshot_restore(self) -> bool:
        self.calls.append("finish")
        self._commit(self.pending)
        self.pending = []
        return True


def _dag(n: int) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(n))).local_parallelism(1)
    out = dag.new_vertex("out", LastBatchSink).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    return dag


def test_completed_job_ends_with_a_snapshot_of_every_processor_completed(tmp_path: Any) -> None:
    engine = ss.local()
    store = str(tmp_path / "store")
    cfg = JobConfig(name="final", processing_guarantee=EO, snapshot_interval_ms=10_000, snapshot_store=store)
    job = engine.new_job(_dag(100), cfg)
    job.join(60)
    assert sorted(engine.get_list("committed")) == list(range(100))
    last = DirectorySnapshotStore(store).latest()
    assert last is not None
    assert {n: vs.completed for n, vs in last.vertices.items()} == {"src": {0}, "out": {0}}
    assert last.vertices["out"].final == {0}
    assert [v for _k, v in last.vertices["out"].entries[0]] == [list(range(100))]
    assert DirectorySnapshotStore(store).owner().completed  # type: ignore[union-attr]


def test_restore_hands_the_completion_state_to_the_completed_processor(tmp_path: Any) -> None:
    engine = ss.local()
    cfg = JobConfig(name="first", processing_guarantee=EO, snapshot_interval_ms=10_000, snapshot_store=str(tmp_path / "a"))
    job = engine.new_job(_dag(50), cfg)
    job.join(60)
    snapshot = job.export_snapshot()
    assert snapshot is not None
    # as after a crash between the snapshot and the commit: nothing was committed
    other = ss.local()
    cfg2 = JobConfig(name="second", processing_guarantee=EO, snapshot_interval_ms=10_000, snapshot_store=str(tmp_path / "b"))
    other.new_job(_dag(50), cfg2, restore_from=snapshot).join(60)
    assert sorted(other.get_list("committed")) == list(range(50))
    # restored and finished, never run on input again
    assert list(other.get_list("calls")) == [("restore", 0, 50), "finish"]


def test_a_completed_processor_without_completion_state_is_not_restored(tmp_path: Any) -> None:
    engine = ss.local()
    cfg = JobConfig(name="plain", processing_guarantee=EO, snapshot_interval_ms=10_000, snapshot_store=str(tmp_path / "a"))
    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(20)))
    out = dag.new_vertex("out", sinks.list_sink("got"))
    dag.edge(Edge.between(src, out))
    job = engine.new_job(dag, cfg)
    job.join(60)
    snapshot = job.export_snapshot()
    assert snapshot is not None and not snapshot.vertices["out"].final
    other = ss.local()
    cfg2 = JobConfig(name="plain2", processing_guarantee=EO, snapshot_store=str(tmp_path / "b"))
    other.new_job(dag, cfg2, restore_from=snapshot).join(60)
    assert list(other.get_list("got")) == []  # completed: nothing runs again


# -- the final snapshot cannot be written ----------------------------------------------------
class HalfThenRest(ss.AbstractProcessor):
    """Emits ``range(n)``: the first half, then (once a snapshot committed: the store's
    manifest exists) the rest in the call that completes. So the rest reaches the sink
    after every barrier: only the job's final snapshot can record it."""

    def __init__(self, n: int, store: str) -> None:
        self.n = n
        self.manifest = os.path.join(store, MANIFEST)
        self.i = 0

    def complete(self) -> bool:
        while self.i < self.n:
            if self.i >= self.n // 2 and not os.path.exists(self.manifest):
                return False
            if not self.try_emit(self.i):
                return False
            self.i += 1
        return True

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot(BroadcastKey("i"), self.i)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.i = value


class EndFailingStore(DirectorySnapshotStore):
    """Writes fail (a full disk) for the first ``failing`` snapshots that record every
    processor as completed (-1: all of them, and then the completed mark as well: the
    process is as good as dead before it)."""

    failing = -1
    final_attempts = 0

    def write(self, data: SnapshotData) -> None:
        if all(len(vs.completed) == vs.total_parallelism for vs in data.vertices.values()):
            self.final_attempts += 1
            if self.failing:
                self.failing -= 1 if self.failing > 0 else 0
                raise OSError(28, "No space left on device")
        super().write(data)

    def mark_completed(self) -> None:
        if self.failing:
            raise OSError(28, "No space left on device")
        super().mark_completed()


def _half_dag(n: int, store: str) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(HalfThenRest, n, store)).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(2)
    dag.edge(Edge.between(src, out).partitioned(lambda x: x))
    return dag


def _end_cfg(store: Any, guarantee: ProcessingGuarantee = EO, **kw: Any) -> JobConfig:
    return JobConfig(
        name="end", processing_guarantee=guarantee, snapshot_interval_ms=10, snapshot_store=store, **kw
    )


def test_a_final_snapshot_that_cannot_be_written_commits_nothing_and_resume_is_exact(
    tmp_path: Any,
) -> None:
    """Exactly-once: the store breaks at the job's end (its final snapshot and the
    completed mark cannot be written). Committing the output staged at the end without
    a durable record of it made a later resume replay it (a duplicate); the job must
    fail instead, with nothing of that output committed, and a resume write it once."""
    n = 200
    store_dir = str(tmp_path / "store")
    store = EndFailingStore(store_dir)
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store_dir), _end_cfg(store))
    error: BaseException | None = None
    try:
        job.join(60)
    except ss.JobFailedError as e:
        error = e
    first = Counter(engine.get_list("out"))
    resumed = engine.new_job(_half_dag(n, store_dir), _end_cfg(store_dir, resume=True))
    resumed.join(60)
    got = Counter(engine.get_list("out"))
    assert not got - Counter(range(n)), f"{sum((got - Counter(range(n))).values())} written twice"
    assert got == Counter(range(n))
    # the failed job: a clear error naming the store and the cause, retried as often as
    # snapshots are (max_snapshot_failures), its last output left uncommitted
    assert error is not None, "the job completed without its final snapshot"
    assert "final snapshot" in str(error) and store_dir in str(error)
    assert "No space left on device" in str(error) and error.vertex is None  # type: ignore[attr-defined]
    assert store.final_attempts == 3 and job.restarts == 0
    assert job.metrics["__job__"]["snapshot_failures_total"] >= 3
    assert sum(first.values()) < n and not first - Counter(range(n))
    assert DirectorySnapshotStore(store_dir).owner().completed  # type: ignore[union-attr]


def test_a_final_snapshot_write_that_fails_once_is_retried(tmp_path: Any) -> None:
    n = 200
    store_dir = str(tmp_path / "store")
    store = EndFailingStore(store_dir)
    store.failing = 1
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store_dir), _end_cfg(store))
    job.join(60)
    assert Counter(engine.get_list("out")) == Counter(range(n))
    assert store.final_attempts == 2
    last = DirectorySnapshotStore(store_dir).latest()
    assert last is not None
    assert {name: vs.completed for name, vs in last.vertices.items()} == {"src": {0}, "out": {0, 1}}
    assert DirectorySnapshotStore(store_dir).owner().completed  # type: ignore[union-attr]
    assert job.metrics["__job__"]["snapshot_failures"] == 0


def test_at_least_once_completes_without_its_final_snapshot(tmp_path: Any) -> None:
    """Unchanged under at-least-once (a replay is allowed): a warning, the job completes."""
    n = 200
    store_dir = str(tmp_path / "store")
    store = EndFailingStore(store_dir)
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store_dir), _end_cfg(store, ProcessingGuarantee.AT_LEAST_ONCE))
    job.join(60)
    assert Counter(engine.get_list("out")) == Counter(range(n))
    assert store.final_attempts == 1


def test_cancel_while_the_final_snapshot_is_retried_commits_nothing(tmp_path: Any) -> None:
    n = 200
    store_dir = str(tmp_path / "store")
    store = EndFailingStore(store_dir)
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store_dir), _end_cfg(store, max_snapshot_failures=10**6))
    stp.wait_for(lambda: store.final_attempts >= 2, what="final snapshot retries")
    assert "No space left" in (job.snapshot_error or "")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(60)
    assert sum(Counter(engine.get_list("out")).values()) < n  # the tail stays uncommitted
