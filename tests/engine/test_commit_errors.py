"""A sink's commit that fails or hangs never leaves a job running silently (issue 20,
items 1 and 2): a commit that raises fails the job like any processor error (the vertex
named, auto_restart restarting from the last committed snapshot), at the end of a batch
job too, and ``cancel()`` ends a job whose commit hangs."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
from slipstream.sinks.basic import ListSinkP
from slipstream.state.store import DirectorySnapshotStore

EO = ProcessingGuarantee.EXACTLY_ONCE


class RaisingStagingSink(ss.AbstractProcessor):
    """Stages its batches with ``context.stage_on_commit``; the commit (of a periodic
    snapshot, or with ``at_end`` only the last one, at completion) raises."""

    def __init__(self, at_end: bool) -> None:
        self.at_end = at_end
        self.pending: list[Any] = []

    def process(self, ordinal: int, inbox: Any) -> None:
        self.pending.extend(inbox)
        inbox.clear()

    def _commit(self, batch: list[Any]) -> None:
        raise ConnectionError(f"injected: the server refused the commit of {len(batch)} items")

    def save_to_snapshot(self) -> bool:
        batch, self.pending = self.pending, []
        if not self.at_end:
            self.context.stage_on_commit(functools.partial(self._commit, batch))
        return True

    def complete(self) -> bool:
        batch, self.pending = self.pending, []
        self.context.stage_on_commit(functools.partial(self._commit, batch), at_completion=True)
        return True


class LastItemAfterSnapshots(stp.PacedSource):
    """A PacedSource that emits its last item only once it took part in
    ``min_snapshots`` snapshots, and completes with it: the sink then has a batch to
    commit at completion (a PacedSource emits everything and then waits for its
    snapshots, whose commits may publish every batch first, leaving none at the end)."""

    def complete(self) -> bool:
        if self.saved >= self.min_snapshots or not self.mine:
            return super().complete()
        mine, self.mine = self.mine, self.mine[:-1]
        try:
            super().complete()
        finally:
            self.mine = mine
        return False


def _dag(sink: Any, n: int = 200, min_snapshots: int = 1) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(LastItemAfterSnapshots, n, 4000.0, 8, min_snapshots))
    out = dag.new_vertex("sink", sink).local_parallelism(1)
    dag.edge(Edge.between(src.local_parallelism(1), out))
    return dag


@pytest.mark.parametrize("at_end", [False, True], ids=["periodic", "batch-end"])
def test_a_commit_that_raises_fails_the_job_naming_the_sink(tmp_path: Any, at_end: bool) -> None:
    """On main the periodic case killed the store thread (the job ran on, RUNNING, with
    no snapshot and no error) and the batch-end case ended the last worker thread before
    the execution was marked finished: join() never returned."""
    engine = ss.local()
    cfg = JobConfig(
        name="raising", processing_guarantee=EO, snapshot_interval_ms=20,
        snapshot_store=str(tmp_path), auto_restart=False,
    )
    job = engine.new_job(_dag(functools.partial(RaisingStagingSink, at_end)), cfg)
    with pytest.raises(ss.JobFailedError) as ei:
        job.join(60)
    assert job.status is ss.JobStatus.FAILED
    assert ei.value.vertex == "sink" and ei.value.processor_index == 0
    assert "vertex 'sink', processor 0: ConnectionError: injected: the server refused" in str(ei.value)


class FailOnceListSinkP(ListSinkP):
    """``list_sink("out")`` whose first publication after two committed snapshots raises
    (with ``at_end``: its last one, at completion)."""

    FAILED: list[int] = []

    def __init__(self, name: str, at_end: bool) -> None:
        super().__init__(name)
        self.at_end = at_end

    def _publish(self, items: list[Any]) -> None:
        ctx = self.context
        due = ctx.completion_committed if self.at_end else ctx.committed_snapshot_id >= 2
        if not self.FAILED and due:
            self.FAILED.append(ctx.committed_snapshot_id)
            raise ConnectionError("injected: the commit failed once")
        super()._publish(items)


@pytest.mark.parametrize("at_end", [False, True], ids=["periodic", "batch-end"])
def test_a_commit_that_raises_once_restarts_and_the_output_is_exact(tmp_path: Any, at_end: bool) -> None:
    """The restart restores the last committed snapshot (at the end: the final one,
    which records every processor as completed); the restored sink publishes the
    batches that snapshot names and were not published (exactly once)."""
    FailOnceListSinkP.FAILED.clear()
    n = 400
    engine = ss.local()
    cfg = JobConfig(name="once", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=str(tmp_path))
    job = engine.new_job(_dag(functools.partial(FailOnceListSinkP, "out", at_end), n, 3), cfg)
    job.join(60)
    assert FailOnceListSinkP.FAILED and job.restarts == 1
    got = Counter(engine.get_list("out"))
    assert got == Counter(range(n)), (sum((got - Counter(range(n))).values()), len(set(range(n)) - set(got)))


class HangingCommitSink(ss.AbstractProcessor):
    """Its commit (``snapshot_commit_finish``) blocks until ``release`` is set."""

    release = threading.Event()
    hanging = threading.Event()

    def process(self, ordinal: int, inbox: Any) -> None:
        inbox.clear()

    def snapshot_commit_finish(self, success: bool) -> bool:
        self.hanging.set()
        self.release.wait()
        return True


class HangingStagingSink(ss.AbstractProcessor):
    """The short form: its staged commit blocks until ``release`` is set."""

    def process(self, ordinal: int, inbox: Any) -> None:
        inbox.clear()

    def _hang(self) -> None:
        HangingCommitSink.hanging.set()
        HangingCommitSink.release.wait()

    def save_to_snapshot(self) -> bool:
        self.context.stage_on_commit(self._hang)
        return True


@pytest.mark.parametrize("sink", [HangingCommitSink, HangingStagingSink], ids=["callback", "staged"])
def test_cancel_ends_a_job_whose_commit_hangs(tmp_path: Any, sink: Any) -> None:
    """On main the staged commit hung the store thread, and cancel() waited a minute for
    it before the job ended."""
    HangingCommitSink.release.clear()
    HangingCommitSink.hanging.clear()
    engine = ss.local(stop_grace_ms=100)
    cfg = JobConfig(name="hang", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=str(tmp_path))
    job = engine.new_job(_dag(sink, 10**6, 0), cfg)
    try:
        assert HangingCommitSink.hanging.wait(60), "the commit never started"
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(30)
    finally:
        HangingCommitSink.release.set()


def test_at_least_once_unchanged(tmp_path: Any) -> None:
    """At-least-once list sinks write directly (no commit phase), as before."""
    engine = ss.local()
    cfg = JobConfig(
        name="alo", processing_guarantee=ProcessingGuarantee.AT_LEAST_ONCE,
        snapshot_interval_ms=20, snapshot_store=str(tmp_path),
    )
    engine.new_job(_dag(sinks.list_sink("out"), 300), cfg).join(60)
    assert sorted(engine.get_list("out")) == list(range(300))


class HangingStore(DirectorySnapshotStore):
    """Its second snapshot write blocks until ``release`` is set (a hung NFS mount)."""

    release = threading.Event()
    hanging = threading.Event()
    writes = 0

    def commit(self, data: Any) -> None:  # the manifest of snapshot data.snapshot_id
        self.writes += 1
        if self.writes == 2:
            self.hanging.set()
            self.release.wait()
        super().commit(data)


def test_cancel_ends_a_job_whose_snapshot_write_hangs(tmp_path: Any) -> None:
    """cancel() waited up to a minute for the snapshot being written."""
    HangingStore.release.clear()
    HangingStore.hanging.clear()
    store = HangingStore(str(tmp_path / "store"))
    engine = ss.local(stop_grace_ms=100)
    cfg = JobConfig(name="hung-store", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=store)
    job = engine.new_job(_dag(sinks.list_sink("out"), 10**6, 0), cfg)
    try:
        assert HangingStore.hanging.wait(60), "the second snapshot was never written"
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(30)
    finally:
        HangingStore.release.set()


class TerminalFailingStore(DirectorySnapshotStore):
    """The terminal snapshot (suspend) cannot be written (a full disk)."""

    job: Any = None

    def commit(self, data: Any) -> None:  # the manifest of snapshot data.snapshot_id
        req = self.job._execution.coordinator.requested_snapshot() if self.job else None
        if req is not None and req.is_terminal and req.snapshot_id == data.snapshot_id:
            raise OSError(28, "No space left on device")
        super().commit(data)


def test_a_suspend_whose_terminal_snapshot_fails_fails_the_job_and_resume_is_exact(tmp_path: Any) -> None:
    """On 04c31f3 suspend() returned and the job was COMPLETED with 196 of 2,000 items
    written (the execution's end took the failed terminal snapshot for the job's end);
    a resume=True then started afresh (the store was marked completed): 196 duplicates."""
    n = 2000
    store = TerminalFailingStore(str(tmp_path / "store"))
    engine = ss.local()
    cfg = JobConfig(name="suspend-fails", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=store)
    dag = _dag(sinks.list_sink("out"), n, 2)
    job = store.job = engine.new_job(dag, cfg)
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 2, what="two snapshots")
    with pytest.raises(ss.JobFailedError) as ei:
        job.suspend(60)
    assert "the terminal snapshot" in str(ei.value) and "No space left on device" in str(ei.value)
    assert job.status is ss.JobStatus.FAILED
    first = list(engine.get_list("out"))
    assert len(first) < n
    again = JobConfig(
        name="suspend-fails", processing_guarantee=EO, snapshot_interval_ms=20,
        snapshot_store=str(tmp_path / "store"), resume=True,
    )
    engine.new_job(dag, again).join(60)
    got = sorted(engine.get_list("out"))
    assert got == list(range(n)), (len(got), len(set(got)))
