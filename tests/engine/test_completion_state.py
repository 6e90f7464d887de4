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
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sources
from slipstream.sinks.basic import ListSinkP
from slipstream.state.keys import BroadcastKey
from slipstream.state.store import MANIFEST, DirectorySnapshotStore

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


class DirectListSink(ss.AbstractProcessor):
    """Appends every item to the list ``got`` at once; no snapshot state at all."""

    def init_processor(self, context: Any) -> None:
        self.got = context.get_list("got")

    def process(self, ordinal: int, inbox: Any) -> None:
        self.got.extend(inbox)
        inbox.clear()


def test_a_completed_processor_without_completion_state_is_not_restored(tmp_path: Any) -> None:
    engine = ss.local()
    cfg = JobConfig(name="plain", processing_guarantee=EO, snapshot_interval_ms=10_000, snapshot_store=str(tmp_path / "a"))
    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(20)))
    out = dag.new_vertex("out", DirectListSink)
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
    manifest exists, and with ``one_more`` once it saved one more snapshot) the rest in
    the call that completes. So the rest reaches the sink after every barrier."""

    def __init__(self, n: int, store: str, one_more: bool = False) -> None:
        self.n = n
        self.manifest = os.path.join(store, MANIFEST)
        self.i = 0
        self.waiting_for = 1 if one_more else 0  # snapshots to save after the manifest

    def complete(self) -> bool:
        while self.i < self.n:
            if self.i >= self.n // 2 and (not os.path.exists(self.manifest) or self.waiting_for):
                return False
            if not self.try_emit(self.i):
                return False
            self.i += 1
        return True

    def save_to_snapshot(self) -> bool:
        if not self.try_emit_to_snapshot(BroadcastKey("i"), self.i):
            return False
        if self.waiting_for and os.path.exists(self.manifest):
            self.waiting_for -= 1
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.i = value


SINKS_DONE: list[int] = []


class DoneListSink(ListSinkP):
    """``list_sink("out")`` that notes in ``SINKS_DONE`` when it called ``complete()``."""

    def complete(self) -> bool:
        done = super().complete()
        SINKS_DONE.append(self.context.global_processor_index)
        return done


class EndFailingStore(DirectorySnapshotStore):
    """Writes fail (a full disk) for the first ``failing`` snapshots that record the
    source as completed, with ``every_one`` those that record every processor as completed
    (-1: all of them, and then the completed mark as well: the process is as good as
    dead before it). ``broken_writes`` counts the writes it let fail or pass."""

    failing = -1
    every_one = True
    broken_writes = 0

    def commit(self, data: Any) -> None:  # the manifest of snapshot data.snapshot_id
        if self.every_one:
            breaks = all(len(vs.completed) == vs.total_parallelism for vs in data.vertices.values())
        else:
            breaks = bool(data.vertices["src"].completed)
        if breaks:
            self.broken_writes += 1
            if self.failing:
                self.failing -= 1 if self.failing > 0 else 0
                raise OSError(28, "No space left on device")
        super().commit(data)

    def mark_completed(self) -> None:
        if self.failing:
            raise OSError(28, "No space left on device")
        super().mark_completed()


def _half_dag(n: int, store: str, one_more: bool = False) -> DAG:
    SINKS_DONE.clear()
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(HalfThenRest, n, store, one_more))
    src.local_parallelism(1)
    out = dag.new_vertex("out", functools.partial(DoneListSink, "out")).local_parallelism(2)
    dag.edge(Edge.between(src, out).partitioned(lambda x: x))
    return dag


def _end_cfg(store: Any, guarantee: ProcessingGuarantee = EO, **kw: Any) -> JobConfig:
    kw.setdefault("snapshot_interval_ms", 10)
    return JobConfig(name="end", processing_guarantee=guarantee, snapshot_store=store, **kw)


def _one_snapshot_then_the_end(engine: Any, n: int, store: Any, max_failures: int = 1) -> Any:
    """The job with one snapshot, requested while the source waits after the first half,
    and no other before its end (the timer's interval is a minute): the sinks cannot
    save one after the rest reached them (they would save it, the rest with it)."""
    store_dir = store.directory
    job = engine.new_job(_half_dag(n, store_dir), _end_cfg(store, snapshot_interval_ms=60_000, max_snapshot_failures=max_failures))
    stp.wait_for(lambda: job.metrics["src"]["items_out"] >= n // 2, what="the first half")
    job._execution.coordinator.request()  # type: ignore[union-attr]
    return job


def _resume_is_exact(engine: Any, n: int, store_dir: str) -> None:
    engine.new_job(_half_dag(n, store_dir), _end_cfg(store_dir, resume=True)).join(60)
    got = Counter(engine.get_list("out"))
    assert not got - Counter(range(n)), f"{sum((got - Counter(range(n))).values())} written twice"
    assert got == Counter(range(n)), f"{len(set(range(n)) - set(got))} lost"


def test_a_final_snapshot_that_cannot_be_written_commits_nothing_and_resume_is_exact(
    tmp_path: Any,
) -> None:
    """Exactly-once: the store breaks at the job's end (its final snapshot and the
    completed mark cannot be written). Committing the output staged at the end without
    a durable record of it made a later resume replay it (a duplicate); the job must
    fail instead, with nothing of that output committed, and a resume write it once."""
    n = 200
    store = EndFailingStore(str(tmp_path / "store"))
    engine = ss.local()
    job = _one_snapshot_then_the_end(engine, n, store)
    error: BaseException | None = None
    try:
        job.join(60)
    except ss.JobFailedError as e:
        error = e
    first = Counter(engine.get_list("out"))
    _resume_is_exact(engine, n, store.directory)
    assert error is not None, "the job completed without its final snapshot"
    assert "final snapshot" in str(error) and store.directory in str(error)
    assert "No space left on device" in str(error) and error.vertex is None  # type: ignore[attr-defined]
    assert job.restarts == 0  # a restart cannot fix the store
    # never the rest: only what snapshot 1 committed, which the sinks publish on their
    # tasklets once they see the commit; if the execution failed before they did, the
    # resume published it (checked above)
    assert first in (Counter(range(n // 2)), Counter())


def test_the_final_snapshot_is_retried_as_snapshots_are_then_the_job_fails(tmp_path: Any) -> None:
    """The store breaks as the source completes: whether snapshots of the job or its
    final snapshot fail, the job fails after max_snapshot_failures (3) in a row, with
    nothing committed that no snapshot records, and a resume is exact."""
    n = 200
    store = EndFailingStore(str(tmp_path / "store"))
    store.every_one = False
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store.directory), _end_cfg(store))
    with pytest.raises(ss.JobFailedError, match="3 consecutive snapshots could not be written") as ei:
        job.join(60)
    assert store.directory in str(ei.value) and "No space left" in str(ei.value)
    assert store.broken_writes == 3 and job.metrics["__job__"]["snapshot_failures_total"] == 3
    assert sum(Counter(engine.get_list("out")).values()) < n
    _resume_is_exact(engine, n, store.directory)


def test_a_final_snapshot_write_that_fails_twice_is_retried(tmp_path: Any) -> None:
    n = 200
    store = EndFailingStore(str(tmp_path / "store"))
    store.failing = 2
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store.directory), _end_cfg(store))
    job.join(60)
    assert Counter(engine.get_list("out")) == Counter(range(n))
    assert store.broken_writes == 3
    assert job.metrics["__job__"]["snapshot_failures_total"] == 2
    assert job.metrics["__job__"]["snapshot_failures"] == 0
    last = DirectorySnapshotStore(store.directory).latest()
    assert last is not None
    assert {name: vs.completed for name, vs in last.vertices.items()} == {"src": {0}, "out": {0, 1}}
    assert DirectorySnapshotStore(store.directory).owner().completed  # type: ignore[union-attr]


def test_at_least_once_completes_without_its_final_snapshot(tmp_path: Any) -> None:
    """Unchanged under at-least-once (a replay is allowed): a warning, the job completes."""
    n = 200
    store = EndFailingStore(str(tmp_path / "store"))
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store.directory), _end_cfg(store, ProcessingGuarantee.AT_LEAST_ONCE))
    job.join(60)
    assert Counter(engine.get_list("out")) == Counter(range(n))
    assert store.broken_writes >= 1


def test_cancel_while_the_final_snapshot_is_retried_commits_nothing(tmp_path: Any) -> None:
    """The retry waits for the snapshot interval (a minute here) or the job's stop."""
    n = 200
    store = EndFailingStore(str(tmp_path / "store"))
    engine = ss.local()
    job = _one_snapshot_then_the_end(engine, n, store, max_failures=3)
    stp.wait_for(lambda: store.broken_writes >= 1 and job.snapshot_error is not None, what="a failed final snapshot")
    assert "No space left" in (job.snapshot_error or "")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)  # long before the next try
    assert Counter(engine.get_list("out")) == Counter(range(n // 2))


class LastPeriodicFailingStore(DirectorySnapshotStore):
    """The first snapshot commits; every later periodic one fails, once the sinks
    called complete() (so the execution's last snapshot fails after everything ran).
    The final snapshot (every processor recorded as completed) commits; the completed
    mark fails (as if the process died there)."""

    def commit(self, data: Any) -> None:  # the manifest of snapshot data.snapshot_id
        final = all(len(vs.completed) == vs.total_parallelism for vs in data.vertices.values())
        if not final and self.committed_ids():
            stp.wait_for(lambda: len(SINKS_DONE) == 2, what="the sinks' completion")
            raise OSError(28, "No space left on device")
        super().commit(data)

    def mark_completed(self) -> None:
        raise OSError(28, "No space left on device")


def test_after_a_failed_last_snapshot_the_final_snapshot_records_the_end(tmp_path: Any) -> None:
    """The execution's last snapshot failed, the job ended, the store could not be marked
    completed. The output used to be committed without a final snapshot (it was skipped
    after a failed one), so a resume replayed the snapshot before: duplicates."""
    n = 200
    store = LastPeriodicFailingStore(str(tmp_path / "store"))
    engine = ss.local()
    job = engine.new_job(_half_dag(n, store.directory, one_more=True), _end_cfg(store, max_snapshot_failures=50))
    job.join(60)
    assert job.metrics["__job__"]["snapshot_failures_total"] >= 1
    assert Counter(engine.get_list("out")) == Counter(range(n))
    _resume_is_exact(engine, n, store.directory)
