"""Snapshot coordination for one execution of a job, and restore routing.

Every ``snapshot_interval_ms`` the coordinator asks the sources for snapshot N (sources
notice it between ``complete()`` calls, save their state and emit barrier N). Each
tasklet reports its saved entries and, after forwarding the barrier, that it is done.
Snapshot N commits when every tasklet has saved it or had already finished (a finished
tasklet is recorded as *completed*: on restore it only sends end-of-stream, which is
right because downstream aligned on its end-of-stream instead of a barrier and so
consumed all of its output before saving). Commit = the store write, then the actions
sinks staged for that snapshot (two-phase sinks publish on commit).
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cloudpickle

from slipstream.core.dag import DAG, RoutingPolicy
from slipstream.core.errors import SnapshotError
from slipstream.core.items import SnapshotBarrier
from slipstream.core.partition import DEFAULT_PARTITION_COUNT, default_partitioner, partition_table
from slipstream.core.snapshot_keys import is_broadcast, routing_key
from slipstream.engine.snapshot_store import DirectorySnapshotStore, SnapshotData, VertexState

if TYPE_CHECKING:
    from slipstream.engine.plan import VertexPlan
    from slipstream.engine.tasklet import ProcessorTasklet

log = logging.getLogger("slipstream.snapshot")


class SnapshotCoordinator:
    def __init__(
        self,
        job_name: str,
        store: DirectorySnapshotStore,
        interval_ms: int,
        first_id: int,
        vertex_parallelism: dict[str, int],
        on_commit: Callable[[SnapshotData], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.job_name = job_name
        self.store = store
        self.interval_s = interval_ms / 1000.0
        self.next_id = first_id
        self.committed_id = first_id - 1
        self.vertex_parallelism = vertex_parallelism
        self._on_commit = on_commit
        self._on_error = on_error
        self._lock = threading.Lock()
        self._tasklets: list[ProcessorTasklet] = []
        self._completed: set[int] = set()  # id() of tasklets that finished
        self._requested: SnapshotBarrier | None = None
        self._reported: set[int] = set()
        self._entries: dict[tuple[str, int], list[Any]] = {}
        self._staged: list[tuple[int, Callable[[], None]]] = []
        self._staged_at_completion: dict[tuple[str, int], list[Callable[[], None]]] = {}
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.snapshots_committed = 0
        # for watchers (dashboard, CLI): id, duration, size and time of the last commit
        self.last_commit: dict[str, Any] | None = None
        self._started_at = 0.0
        self.terminal_committed = False
        # store write failures: consecutive ones hold the sources (back-pressure) until a
        # snapshot commits again; the job fails after too many (see _Execution)
        self.consecutive_failures = 0
        self.failed_snapshots = 0
        self.last_error: BaseException | None = None
        self._commit_event = threading.Condition(self._lock)

    # -- wiring --------------------------------------------------------------------------
    def attach(self, tasklets: list[ProcessorTasklet]) -> None:
        self._tasklets = list(tasklets)

    def start_timer(self) -> None:
        self._timer = threading.Thread(
            target=self._run_timer, name=f"slipstream-{self.job_name}-snapshots", daemon=True
        )
        self._timer.start()

    def stop(self) -> None:
        """No snapshot starts after this returns, and one being committed has ended
        (the job's end must not race with a store write)."""
        self._stop.set()
        with self._lock:
            pass

    def _run_timer(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.request()

    # -- the tasklet side (SnapshotSink protocol) ------------------------------------------
    def requested_snapshot(self) -> SnapshotBarrier | None:
        return self._requested

    @property
    def hold_sources(self) -> bool:
        """Sources stop emitting while the last snapshot failed: output staged for
        commit cannot be published, so it must not keep growing."""
        return self.consecutive_failures > 0

    def add_entries(self, tasklet: ProcessorTasklet, snapshot_id: int, entries: list[Any]) -> None:
        # serialise now (as Jet does): the processor may mutate its state after saving
        try:
            entries = pickle.loads(cloudpickle.dumps(entries))
        except Exception as e:  # noqa: BLE001
            raise SnapshotError(
                f"{tasklet.vertex_name}#{tasklet.index}: snapshot state cannot be pickled: {e}"
            ) from e
        with self._lock:
            self._entries.setdefault((tasklet.vertex_name, tasklet.index), []).extend(entries)

    def processor_done(self, tasklet: ProcessorTasklet, barrier: SnapshotBarrier) -> None:
        with self._lock:
            if self._requested is None or barrier.snapshot_id != self._requested.snapshot_id:
                raise SnapshotError(
                    f"{tasklet.vertex_name}#{tasklet.index} saved snapshot "
                    f"{barrier.snapshot_id} that was not requested"
                )
            self._reported.add(id(tasklet))
            self._check_commit()

    def tasklet_completed(self, tasklet: ProcessorTasklet) -> None:
        with self._lock:
            self._completed.add(id(tasklet))
            self._check_commit()

    def stage(self, snapshot_id: int, action: Callable[[], None]) -> None:
        """Run ``action`` once snapshot ``snapshot_id`` commits (or the job completes)."""
        with self._lock:
            self._staged.append((snapshot_id, action))

    def stage_at_completion(self, vertex: str, index: int, action: Callable[[], None]) -> None:
        """Run ``action`` once a snapshot that records processor (vertex, index) as
        completed commits, or the job completes. Output a processor produces after its
        last snapshot becomes final exactly when its completion does: a restore from an
        older snapshot re-runs the processor, one from a newer snapshot does not."""
        with self._lock:
            self._staged_at_completion.setdefault((vertex, index), []).append(action)

    # -- coordinator side ------------------------------------------------------------------
    def request(self, terminal: bool = False) -> int | None:
        """Start the next snapshot unless one is in progress; returns its id."""
        with self._lock:
            if self._stop.is_set():
                return None
            if self._requested is not None:
                if terminal and not self._requested.is_terminal:
                    # upgrade: the next snapshot after this one will be terminal
                    self._terminal_pending = True
                return None
            return self._start(terminal)

    def _start(self, terminal: bool) -> int:
        sid = self.next_id
        self.next_id += 1
        self._reported = set()
        self._entries = {}
        self._requested = SnapshotBarrier(sid, terminal)
        self._started_at = time.time()
        self._check_commit()
        return sid

    _terminal_pending = False

    def _check_commit(self) -> None:
        req = self._requested
        if req is None:
            return
        for t in self._tasklets:
            if id(t) not in self._reported and id(t) not in self._completed:
                return
        data = SnapshotData(req.snapshot_id, self.job_name)
        for name, p in self.vertex_parallelism.items():
            data.vertices[name] = VertexState(p)
        for t in self._tasklets:
            vs = data.vertices[t.vertex_name]
            if id(t) in self._reported:
                vs.entries[t.index] = self._entries.get((t.vertex_name, t.index), [])
            else:
                vs.completed.add(t.index)
        try:
            self.store.write(data)
        except BaseException as e:  # noqa: BLE001
            log.error("snapshot %d of %s could not be written: %s", req.snapshot_id, self.job_name, e)
            self._requested = None
            self.consecutive_failures += 1
            self.failed_snapshots += 1
            self.last_error = e
            if self._on_error is not None:
                self._on_error(e)
            return
        self.committed_id = req.snapshot_id
        self.snapshots_committed += 1
        now = time.time()
        self.last_commit = {
            "id": req.snapshot_id,
            "duration_ms": round((now - self._started_at) * 1000.0, 1),
            "bytes": getattr(self.store, "last_write_bytes", None),
            "entries": data.entry_count(),
            "committed_at": now,
        }
        self.consecutive_failures = 0
        self._requested = None
        self._entries = {}
        self._run_staged(req.snapshot_id)
        for name, vs in data.vertices.items():
            for index in vs.completed:
                for action in self._staged_at_completion.pop((name, index), ()):
                    action()
        if req.is_terminal:
            self.terminal_committed = True
        self._commit_event.notify_all()
        if self._on_commit is not None:
            self._on_commit(data)
        if self._terminal_pending and not req.is_terminal:
            self._terminal_pending = False
            self._start(True)

    def _run_staged(self, up_to: int | None) -> None:
        keep = []
        for sid, action in self._staged:
            if up_to is None or sid <= up_to:
                action()
            else:
                keep.append((sid, action))
        self._staged = keep

    def job_completed(self) -> None:
        """The job finished normally: everything staged is final."""
        with self._lock:
            self._run_staged(None)
            for actions in self._staged_at_completion.values():
                for action in actions:
                    action()
            self._staged_at_completion = {}

    def discard_uncommitted(self) -> None:
        with self._lock:
            self._staged = [(s, a) for (s, a) in self._staged if s <= self.committed_id]
            self._staged_at_completion = {}

    def wait_for_commit(self, snapshot_id: int, timeout: float | None) -> bool:
        with self._lock:
            return self._commit_event.wait_for(lambda: self.committed_id >= snapshot_id, timeout)


def restore_plan(
    data: SnapshotData, plans: dict[str, VertexPlan], partitioners: dict[str, Any]
) -> tuple[dict[tuple[str, int], list[Any]], set[tuple[str, int]]]:
    """Route a snapshot's entries to the processors of the new execution.

    Keyed entries go to the processor owning ``partition(routing_key(key))`` on a
    distributed partitioned edge (the vertex's own partitioner if its inbound edge has a
    custom one), broadcast entries to every processor. Returns the entries per (vertex,
    global index) and the processors to restore as already completed.
    """
    routed: dict[tuple[str, int], list[Any]] = {}
    completed: set[tuple[str, int]] = set()
    for name, vp in plans.items():
        total = vp.total_parallelism
        for g in range(total):
            routed[(name, g)] = []
        vs = data.vertices.get(name)
        if vs is None:
            continue
        if vs.completed:
            if len(vs.completed) == vs.total_parallelism:
                completed.update((name, g) for g in range(total))
            elif vs.total_parallelism == total:
                completed.update((name, g) for g in vs.completed)
            else:
                raise SnapshotError(
                    f"vertex {name!r}: {len(vs.completed)} of {vs.total_parallelism} processors "
                    f"had finished when the snapshot was taken; it cannot be restored with "
                    f"parallelism {total}"
                )
        table = partition_table(
            DEFAULT_PARTITION_COUNT, vp.member_count, vp.local_parallelism, True, 0
        )
        partitioner = partitioners.get(name) or default_partitioner
        everyone = [routed[(name, g)] for g in range(total)]
        for entries in vs.entries.values():
            for entry in entries:
                k = entry[0]
                if is_broadcast(k):
                    for lst in everyone:
                        lst.append(entry)
                else:
                    p = partitioner(routing_key(k), DEFAULT_PARTITION_COUNT)
                    routed[(name, table[p])].append(entry)
    return routed, completed


def custom_partitioners(dag: DAG) -> dict[str, Any]:
    """Each vertex's custom partitioner (from its first partitioned inbound edge), so that
    restored keyed state lands where live items with that key go."""
    out = {}
    for v in dag.vertices:
        for e in dag.inbound_edges(v):
            if e.routing is RoutingPolicy.PARTITIONED and e.partitioner is not None:
                out[v.name] = e.partitioner
                break
    return out
