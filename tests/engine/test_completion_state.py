"""A completed processor's last output survives a restore (the engine side of the sinks'
completion commits): what a processor offers to the snapshot in ``complete()`` is
recorded with its completion; a restore hands it back to that processor
(``restore_from_snapshot`` + ``finish_snapshot_restore``) and ends it without running it
on input again. A completed job's store ends with a snapshot recording every processor
as completed, so a ``resume`` after a crash at the very end replays nothing."""

from __future__ import annotations

from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.core.snapshot_keys import BroadcastKey
from slipstream.engine.snapshot_store import DirectorySnapshotStore

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
