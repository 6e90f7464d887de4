"""The at-least-once data loss of docs/semantics.md §9: a pairing processor under at-least-once.

Sequence on the left input: ``A -- barrier -- B``. Under at-least-once the processor keeps
consuming the left input after its barrier, pairs A with B, forgets both and then takes
the snapshot (empty state). After a restart B is replayed (it came after the barrier) but
A is not: the processor is left waiting for an A that never comes. Under exactly-once the
left input is blocked after its barrier, the snapshot holds A, and the replayed B pairs.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
from slipstream.state.keys import BroadcastKey

B_PAIRED = threading.Event()
JOB: list[Any] = []  # the job under test: its coordinator says which snapshot committed


def _committed_id() -> int:
    ex = JOB[0]._execution if JOB else None
    return ex.coordinator.committed_id if ex is not None else 0


class Left(ss.AbstractProcessor):
    """Emits A, waits for the first snapshot, then emits B."""

    def __init__(self) -> None:
        self.offset = 0
        self.saved = False

    def complete(self) -> bool:
        items = [("A", 1), ("B", 1)]
        if self.offset == 1 and not self.saved:
            return False
        while self.offset < len(items):
            if not self.try_emit(items[self.offset]):
                return False
            self.offset += 1
            if self.offset == 1 and not self.saved:
                return False
        return True

    def save_to_snapshot(self) -> bool:
        self.saved = True
        return self.try_emit_to_snapshot(BroadcastKey("left"), self.offset)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.offset = value
        self.saved = True


class Right(ss.AbstractProcessor):
    """Holds its first barrier until B was paired (or 0.5 s passed), then sends CRASH."""

    def __init__(self) -> None:
        self.offset = 0
        self.waiting_since: float | None = None

    def complete(self) -> bool:
        if self.offset == 0:
            return False  # nothing to send before the first snapshot
        if self.offset == 1:
            if not self.try_emit("CRASH"):
                return False
            self.offset = 2
        return True

    def save_to_snapshot(self) -> bool:
        if self.offset == 0:
            if self.waiting_since is None:
                self.waiting_since = time.monotonic()
            if not B_PAIRED.is_set() and time.monotonic() - self.waiting_since < 0.5:
                return False
            if not self.try_emit_to_snapshot(BroadcastKey("right"), 1):
                return False
            self.offset = 1
            return True
        return self.try_emit_to_snapshot(BroadcastKey("right"), self.offset)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.offset = value


class Pairing(ss.AbstractProcessor):
    """Pairs ("A", id) with ("B", id) in either order; forgets both once paired."""

    def __init__(self) -> None:
        self.waiting: dict[int, str] = {}
        self.leftovers: Any = None

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if item == "CRASH":
            if _committed_id() < 1:
                return False  # crash only once snapshot 1 is safely committed
            if stp.take_failure():
                raise RuntimeError("crash after snapshot 1")
            return True
        side, pid = item
        other = self.waiting.get(pid)
        if other is not None and other != side:
            if not self.try_emit(("pair", pid)):
                return False
            del self.waiting[pid]
            B_PAIRED.set()
        else:
            self.waiting[pid] = side
        return True

    def complete(self) -> bool:
        if self.leftovers is None:
            self.leftovers = iter([("unmatched", (s, p)) for p, s in sorted(self.waiting.items())])
        return self.emit_from(self.leftovers)

    def save_to_snapshot(self) -> bool:
        return self.save_state(self.waiting.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.waiting[key] = value


def run(guarantee: ProcessingGuarantee, tmp: str) -> list[Any]:
    B_PAIRED.clear()
    stp.FAIL_BUDGET[0] = 1
    dag = DAG()
    left = dag.new_vertex("left", Left).local_parallelism(1)
    right = dag.new_vertex("right", Right).local_parallelism(1)
    pairing = dag.new_vertex("pairing", Pairing).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.from_(left).to(pairing, 0)).edge(Edge.from_(right).to(pairing, 1))
    dag.edge(Edge.between(pairing, sink))
    engine = ss.local(cooperative_threads=1)
    JOB.clear()
    job = engine.new_job(
        dag,
        JobConfig(processing_guarantee=guarantee, snapshot_interval_ms=20, snapshot_store=tmp),
    )
    JOB.append(job)
    job.join(30)
    assert job.restarts == 1
    return sorted(engine.get_list("out"))


def test_at_least_once_pairing_loses_the_pair_state(tmp_path: Any) -> None:
    out = run(ProcessingGuarantee.AT_LEAST_ONCE, str(tmp_path))
    # the pair was emitted before the failure, but the replayed B now waits for ever
    assert out == [("pair", 1), ("unmatched", ("B", 1))]


def test_exactly_once_pairing_is_correct(tmp_path: Any) -> None:
    out = run(ProcessingGuarantee.EXACTLY_ONCE, str(tmp_path))
    assert out == [("pair", 1)]


@pytest.fixture(autouse=True)
def _reset_budget() -> Any:
    yield
    stp.FAIL_BUDGET[0] = 0
