"""The commit phase (Jet's ``snapshotCommitPrepare`` / ``snapshotCommitFinish``): the
coordinator only publishes each snapshot's outcome; every processor commits on its own
tasklet, a completed one after a snapshot that records its completion committed."""

from __future__ import annotations

import functools
import threading
from typing import Any

import snapshot_test_procs as stp

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee
from slipstream.core.commit import AT_COMPLETION, PreparedCommits
from slipstream.state.keys import BroadcastKey

EO = ProcessingGuarantee.EXACTLY_ONCE


class TwoPhaseSink(ss.AbstractProcessor):
    """Holds what arrives, prepares it per snapshot (naming it in the snapshot) and
    appends it to the list ``out`` in ``snapshot_commit_finish``; logs every callback
    of the commit phase with the thread it ran on."""

    def init_processor(self, context: Any) -> None:
        self.pending: list[Any] = []
        self.prepared: PreparedCommits[list[Any]] = PreparedCommits()
        self.out = context.get_list("out")
        self.log = context.get_list("log")

    def process(self, ordinal: int, inbox: Any) -> None:
        self.pending.extend(inbox)
        inbox.clear()

    def _name_prepared(self) -> bool:
        key = BroadcastKey(("prepared", self.context.global_processor_index))
        return self.outbox.offer_to_snapshot(key, [tuple(b) for b in self.prepared.items()])

    def save_to_snapshot(self) -> bool:
        self.log.append(("save", self.context.current_snapshot_id))
        return True

    def snapshot_commit_prepare(self) -> bool:
        sid = self.context.current_snapshot_id
        self.log.append(("prepare", sid, threading.current_thread().name))
        batch, self.pending = self.pending, []
        self.prepared.add(sid, batch)
        return self._name_prepared()

    def complete(self) -> bool:
        batch, self.pending = self.pending, []
        self.prepared.add(AT_COMPLETION, batch)
        self.log.append(("complete",))
        return self._name_prepared()

    def snapshot_commit_finish(self, success: bool) -> bool:
        ctx = self.context
        self.log.append(
            ("finish", success, ctx.committed_snapshot_id, ctx.completion_committed,
             threading.current_thread().name)
        )
        if success:
            for batch in self.prepared.due(ctx):
                self.out.extend(batch)
                self.prepared.remove(batch)
        return True


def _dag(n: int, sink: Any, min_snapshots: int = 2) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, n, 4000.0, 8, min_snapshots))
    out = dag.new_vertex("sink", sink).local_parallelism(1)
    dag.edge(Edge.between(src.local_parallelism(1), out))
    return dag


def test_commit_phase_runs_on_the_processors_tasklet(tmp_path: Any) -> None:
    engine = ss.local()
    cfg = JobConfig(name="phase", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=str(tmp_path))
    engine.new_job(_dag(300, TwoPhaseSink), cfg).join(60)
    assert sorted(engine.get_list("out")) == list(range(300))
    log = list(engine.get_list("log"))
    saves = [e[1] for e in log if e[0] == "save"]
    prepares = [e[1] for e in log if e[0] == "prepare"]
    assert len(saves) >= 2 and prepares == saves  # each save is followed by its prepare
    finishes = [e for e in log if e[0] == "finish"]
    # on the worker that runs the sink, never on the coordinator's threads
    threads = {e[2] for e in log if e[0] == "prepare"} | {e[4] for e in finishes}
    assert all("-worker-" in name for name in threads), threads
    # commits come in snapshot order; the completion commit is the last call
    committed = [e[2] for e in finishes if e[1]]
    assert committed == sorted(committed) and committed[0] >= 1
    assert finishes[-1][1:4] == (True, committed[-1], True)
    assert [e for e in finishes if e[3]] == [finishes[-1]]
    assert log.index(("complete",)) < log.index(finishes[-1])


class StagingSink(ss.AbstractProcessor):
    """The short form: ``context.stage_on_commit`` closures that note their thread."""

    def init_processor(self, context: Any) -> None:
        self.pending: list[Any] = []
        self.out = context.get_list("out")
        self.threads = context.get_list("threads")

    def process(self, ordinal: int, inbox: Any) -> None:
        self.pending.extend(inbox)
        inbox.clear()

    def _publish(self, batch: list[Any]) -> None:
        self.threads.append(threading.current_thread().name)
        self.out.extend(batch)

    def _stage(self, at_completion: bool) -> None:
        batch, self.pending = self.pending, []
        if not self.context.stage_on_commit(functools.partial(self._publish, batch), at_completion):
            self._publish(batch)

    def save_to_snapshot(self) -> bool:
        self._stage(False)
        return True

    def complete(self) -> bool:
        self._stage(True)
        return True


def test_stage_on_commit_actions_run_on_the_processors_tasklet(tmp_path: Any) -> None:
    """Before the commit phase they ran on the coordinator's store thread, under its
    lock, where an exception killed the thread and left the job running for ever."""
    engine = ss.local()
    cfg = JobConfig(name="staging", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=str(tmp_path))
    engine.new_job(_dag(300, StagingSink), cfg).join(60)
    assert sorted(engine.get_list("out")) == list(range(300))
    threads = set(engine.get_list("threads"))
    assert threads and all("-worker-" in name for name in threads), threads


def test_without_a_guarantee_there_is_no_commit_phase() -> None:
    engine = ss.local()
    engine.new_job(_dag(50, TwoPhaseSink, 0), JobConfig(name="plain")).join(60)
    # complete() prepared everything under AT_COMPLETION; no commit phase ever runs it
    assert list(engine.get_list("out")) == []
    assert [e[0] for e in engine.get_list("log")] == ["complete"]
    engine2 = ss.local()
    engine2.new_job(_dag(50, StagingSink, 0), JobConfig(name="plain2")).join(60)
    assert sorted(engine2.get_list("out")) == list(range(50))  # stage_on_commit -> False
