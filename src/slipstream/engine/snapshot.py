"""Snapshot coordination for one execution of a job (restore routing is
:mod:`slipstream.state.restore`).

Every ``snapshot_interval_ms`` the coordinator asks the sources for snapshot N (sources
notice it between ``complete()`` calls, save their state and emit barrier N). Each
tasklet reports its saved entries and, after forwarding the barrier, that it is done.
Snapshot N commits when every tasklet has saved it or had already finished (a finished
tasklet is recorded as *completed*: on restore it only sends end-of-stream, which is
right because downstream aligned on its end-of-stream instead of a barrier and so
consumed all of its output before saving). Commit = the store write; then the
coordinator *publishes* the outcome on its :class:`~slipstream.execution.tasklet.CommitBoard`
("snapshot N committed", or "N failed"), and each tasklet runs its processor's commit
phase (``snapshot_commit_finish``, the actions staged with ``stage_on_commit``) on its
own thread: a sink's commit errors surface where its other errors do, and no user code
runs on the coordinator's threads.

A completed processor's last output is committed once a snapshot that records the
completion commits: its tasklet stays alive after end-of-stream until then
(``AWAIT_COMPLETION_COMMIT``). So that a crash between that snapshot and the commit
loses nothing, what the processor offers to the snapshot in ``complete()`` (its
*completion state*, e.g. the id of its prepared transaction) goes into every later
snapshot with the completion; a restore runs such a processor's
``restore_from_snapshot`` / ``finish_snapshot_restore`` (which commit idempotently) and
then ends it, without running it on input again. At the end of a job, once every
processor completed, the store thread writes one more snapshot that records every
processor as completed and publishes it; the tasklets waiting for it commit and end. A
crash after it (before the store is marked completed) resumes into those idempotent
commits only: see :meth:`SnapshotCoordinator.wait_final`.

Cost at large state: a tasklet hands its saved entries over as they are (no copy of
immutable values, no serialisation on the cooperative thread); each processor's entries
are encoded as a chunk (:mod:`slipstream.state.format`, C pickler) and written on the
coordinator's store thread while the job goes on (:meth:`SnapshotCoordinator.write_snapshot`:
chains of full and delta chunks).
One snapshot is in flight at a time: the next one is requested only after the previous
one committed or failed.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import pickle
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from slipstream.core.errors import SnapshotError, SnapshotStalledError
from slipstream.core.items import SnapshotBarrier
from slipstream.execution.tasklet import CommitBoard
from slipstream.state import compact
from slipstream.state import format as fmt
from slipstream.state.columnar import EncodedBatches
from slipstream.state.compact import Compactor
from slipstream.state.forked import ForkedChunk, copied_maps, fork_chunk, has_live_map
from slipstream.state.keyed import KeyedState, StateMap, StateMapSave
from slipstream.state.keys import KeyedStateBatch
from slipstream.state.live import EncodedMap, LiveSave
from slipstream.state.restore import custom_partitioners as custom_partitioners
from slipstream.state.restore import recovering_completed as recovering_completed
from slipstream.state.restore import restore_plan as restore_plan
from slipstream.state.store import (
    ChunkRef,
    DirectorySnapshotStore,
    Manifest,
    SnapshotData,
    VertexManifest,
    VertexState,
    encode_chunk_parts,
    pickle_state,
)

if TYPE_CHECKING:
    from slipstream.execution.tasklet import ProcessorTasklet

log = logging.getLogger("slipstream.snapshot")

#: the store thread encodes a chunk as columns only where that costs less than the
#: pickle (maps of str or bytes keys, state/columnar.py: it shares the GIL with the
#: processing threads); compaction, in a child process, rewrites the other chains'
#: bases as columns where the encoding applies
_COLUMNAR = None


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
        on_state_error: Callable[[ProcessorTasklet, BaseException], None] | None = None,
        max_final_failures: int | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        stall_warning_s: float | None = None,
        stall_timeout_s: float | None = None,
        on_stall: Callable[[BaseException], None] | None = None,
        max_deltas: int | None = -1,
        compact_in_child: bool = True,
        snapshot_writer: str = "thread",
    ) -> None:
        """``max_final_failures``: exactly-once, the job's final snapshot is retried at
        the interval until that many snapshots in a row failed (``None``: at-least-once,
        one try, the output is released in any case). ``on_fatal``: the execution must
        fail (not restartable): the final snapshot or a terminal one failed.

        The progress watchdog: a snapshot still not committed ``stall_warning_s`` after
        it was requested is reported (a WARNING naming what it waits for: the processors
        that have not saved it, with their state, or the store write; ``stall``), and
        ``on_stall`` is called with a :class:`SnapshotStalledError` once it is
        ``stall_timeout_s`` old (``None``: never). A job whose snapshots stop committing
        makes no durable progress, whatever its sources still read.

        ``max_deltas``: a committed chain with more delta chunks is compacted in the
        background (:mod:`slipstream.state.compact`; ``compact_in_child``: in a child
        process); ``-1``: :data:`slipstream.state.compact.DEFAULT_MAX_DELTAS`, ``None``:
        never.

        ``snapshot_writer``: ``"fork"``: a processor whose save holds a keyed-state map
        handed over itself (a full save, see ``JobConfig.snapshot_writer``) forks a
        child that writes its chunk (:mod:`slipstream.state.forked`) when it is done
        saving; the store thread waits for the child."""
        self.job_name = job_name
        self.store = store
        self.interval_s = interval_ms / 1000.0
        self.next_id = first_id
        self.committed_id = first_id - 1
        self.vertex_parallelism = vertex_parallelism
        self._on_commit = on_commit
        self._on_error = on_error
        self._on_state_error = on_state_error
        self._lock = threading.Lock()
        self._tasklets: list[ProcessorTasklet] = []
        self._completed: set[int] = set()  # id() of tasklets that finished
        self._requested: SnapshotBarrier | None = None
        self._requested_at = 0.0
        self._reported: set[int] = set()
        self._entries: dict[tuple[str, int], list[Any]] = {}
        self._max_final_failures = max_final_failures
        self._on_fatal = on_fatal
        #: what the tasklets read: the outcome of every snapshot
        self.commit_board = CommitBoard(first_id - 1)
        # the job's final snapshot: None (not due), _FINAL_DUE (the store thread writes it
        # once no other snapshot is in flight) or _FINAL_DONE (outcome in _final_error)
        self._final: str | None = None
        self._final_error: BaseException | None = None
        self.final_snapshot: SnapshotData | None = None
        # what completed processors offered to the snapshot in complete()
        self._completion_state: dict[tuple[str, int], list[Any]] = {}
        self._stop = threading.Event()
        self._aborted = threading.Event()
        self._timer: threading.Thread | None = None
        # the store thread: encodes and writes a complete snapshot, then commits it
        self._to_write: SnapshotData | None = None
        self._writer: threading.Thread | None = None
        self._writer_closing = False
        self._pause_s = 0.0
        # the longest copy-on-write step of the snapshot being written (state/live.py)
        self._step_s = 0.0
        self.stats = SnapshotStats()
        # for watchers (dashboard, CLI): id, duration, size and time of the last commit
        self.last_commit: dict[str, Any] | None = None
        self.terminal_committed = False
        # store write failures: consecutive ones hold the sources (back-pressure) until a
        # snapshot commits again; the job fails after too many (see _Execution)
        self.consecutive_failures = 0
        self.failed_snapshots = 0
        self.last_error: BaseException | None = None
        self._commit_event = threading.Condition(self._lock)
        self._stall_warning_s = stall_warning_s
        self._stall_timeout_s = stall_timeout_s
        self._on_stall = on_stall
        self._stall_warned = 0  # the id of the last snapshot reported as stalled
        #: while the snapshot in flight is stalled: what it waits for, and since when
        self.stall: str | None = None
        self.stalled_s = 0.0
        # the chains of the last snapshot this execution committed, per (vertex, index);
        # a delta chunk continues one of them
        self._chains: dict[tuple[str, int], list[ChunkRef]] = {}
        # completed processors' chains: (entries in their completion state, chain),
        # reused by later manifests while the completion state is unchanged
        self._completed_chains: dict[tuple[str, int], tuple[int, list[ChunkRef]]] = {}
        #: bytes of the store's files after the last commit
        self.store_bytes = 0
        if max_deltas == -1:
            max_deltas = compact.DEFAULT_MAX_DELTAS
        self.max_deltas = max_deltas
        self._fork = snapshot_writer == "fork"
        if self._fork:
            from slipstream.core.pickling import cloudpickle  # noqa: F401 - no import in a child
        # the children writing chunks of the snapshot in flight, per (vertex, index)
        self._forked: dict[tuple[str, int], ForkedChunk] = {}
        self._fork_culprit: tuple[ProcessorTasklet, Exception] | None = None
        self._compactor: Compactor | None = (
            Compactor(store, compact_in_child, job_name)
            if max_deltas is not None and hasattr(store, "protected")
            else None
        )

    @property
    def snapshots_committed(self) -> int:
        return self.stats.count

    # -- wiring --------------------------------------------------------------------------
    def attach(self, tasklets: list[ProcessorTasklet]) -> None:
        """The execution's tasklets, and the processors fused into them (each saves and
        completes with its tasklet, execution/fusion.py), so a snapshot records every
        vertex's processors whether fused or not."""
        out: list[Any] = []
        for t in tasklets:
            out.extend(getattr(t, "fused_stages", ()))
            out.append(t)
        self._tasklets = out

    def release(self) -> None:
        """The execution ended (engine/ended.py): let go of the tasklets, of what the
        processors saved and of the final snapshot, unless the store thread is still
        writing one (a stop that timed out): it needs them. An idle store thread about
        to exit reads none of them."""
        with self._lock:
            if self._to_write is not None or self._final is _FINAL_DUE:
                return
            self._tasklets = []
            self._entries = {}
            self._completion_state = {}
            self._forked = {}
            self.final_snapshot = None
            # methods of the execution and the job: no cycle through them
            self._on_commit = self._on_error = self._on_state_error = None
            self._on_fatal = self._on_stall = None

    def start_timer(self) -> None:
        self._timer = threading.Thread(
            target=self._run_timer, name=f"slipstream-{self.job_name}-snapshots", daemon=True
        )
        self._timer.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop requesting snapshots and let the store thread finish the snapshot it is
        writing (it commits: every processor saved it), also the job's final one, at
        most ``timeout`` seconds: the job releases its store once this returns, and a
        write after that would land in a store another job may hold."""
        self._stop.set()
        if self._compactor is not None:
            self._compactor.stop()
        if self._fork:
            with self._lock:
                writing = self._to_write is not None
            if not writing:  # the store thread waits for those of the snapshot it writes
                for child in self._take_forked(-1).values():
                    child.cancel()
        with self._lock:
            self._writer_closing = True
            self._commit_event.notify_all()
            idle = self._commit_event.wait_for(
                lambda: self._to_write is None and self._final is not _FINAL_DUE, timeout
            )
        if idle and self._compactor is not None:
            self._compactor.drop_unnamed()

    def _run_timer(self) -> None:
        """Requests a snapshot every interval and watches the one in flight (woken at
        least once a second for that: the stall check is cheap)."""
        tick = min(self.interval_s, 1.0)
        next_request = time.monotonic() + self.interval_s
        while not self._stop.wait(tick):
            now = time.monotonic()
            if now >= next_request:
                self.request()
                next_request = now + self.interval_s
            self._check_stall()

    def _check_stall(self) -> None:
        """The progress watchdog (see ``__init__``)."""
        if self._stall_warning_s is None and self._stall_timeout_s is None:
            return
        with self._lock:
            req = self._requested
            if req is None:
                self.stall = None
                self.stalled_s = 0.0
                return
            age = time.perf_counter() - self._requested_at
            warn_at = self._stall_warning_s
            if warn_at is None or age < warn_at:
                self.stall = None
                self.stalled_s = 0.0
                return
            waiting = self._waiting_for()
        self.stalled_s = age
        self.stall = (
            f"snapshot {req.snapshot_id} was requested {age:.0f} s ago and has not "
            f"committed: it waits for {waiting}"
        )
        if self._stall_warned != req.snapshot_id:
            self._stall_warned = req.snapshot_id
            limit = self._stall_timeout_s
            log.warning(
                "job %s: %s; no output commits meanwhile (%s)",
                self.job_name,
                self.stall,
                "the job fails if it is still waiting after "
                f"{limit:g} s: JobConfig(stall_timeout_s=)"
                if limit is not None
                else "stall_timeout_s=None: the job keeps waiting",
            )
        if self._stall_timeout_s is not None and age >= self._stall_timeout_s:
            err = SnapshotStalledError(
                f"{self.stall}; no snapshot committed for {age:.0f} s "
                f"(JobConfig(stall_timeout_s={self._stall_timeout_s:g}))"
            )
            self._stall_timeout_s = None  # once
            if self._on_stall is not None:
                self._on_stall(err)

    def _waiting_for(self) -> str:
        """Lock held: who holds the snapshot in flight back, for the stall report."""
        if self._to_write is not None:
            return f"its write to the snapshot store {self.store.directory}"
        late = [
            t
            for t in self._tasklets
            if id(t) not in self._reported and id(t) not in self._completed
        ]
        names = ", ".join(f"{t.vertex_name}#{t.index} ({t.state_name})" for t in late[:5])
        more = f" and {len(late) - 5} more" if len(late) > 5 else ""
        return f"processors that have not saved it: {names}{more}" if late else "its commit"

    # -- the tasklet side (SnapshotSink protocol) ------------------------------------------
    def requested_snapshot(self) -> SnapshotBarrier | None:
        return self._requested

    @property
    def hold_sources(self) -> bool:
        """Sources stop emitting while the last snapshot failed: output staged for
        commit cannot be published, so it must not keep growing."""
        return self.consecutive_failures > 0

    def add_entries(self, tasklet: ProcessorTasklet, snapshot_id: int, entries: list[Any]) -> None:
        """Take over ``entries`` (the tasklet hands its snapshot bucket over, it keeps no
        reference). They are encoded later, on the store thread; values the processor
        could still change are copied now (see :func:`detached`)."""
        entries = _detached_or_error(tasklet, entries, "snapshot state")
        with self._lock:
            lst = self._entries.get((tasklet.vertex_name, tasklet.index))
            if lst is None:
                self._entries[(tasklet.vertex_name, tasklet.index)] = entries
            else:
                lst.extend(entries)

    def processor_done(self, tasklet: ProcessorTasklet, barrier: SnapshotBarrier) -> None:
        fork_s = self._fork_writer(tasklet, barrier.snapshot_id) if self._fork else 0.0
        with self._lock:
            if self._requested is None or barrier.snapshot_id != self._requested.snapshot_id:
                raise SnapshotError(
                    f"{tasklet.vertex_name}#{tasklet.index} saved snapshot "
                    f"{barrier.snapshot_id} that was not requested"
                )
            self._reported.add(id(tasklet))
            pause = getattr(tasklet, "last_save_seconds", 0.0) + fork_s
            if pause > self._pause_s:
                self._pause_s = pause
            self._check_commit()

    def _fork_writer(self, tasklet: ProcessorTasklet, snapshot_id: int) -> float:
        """The processor's thread, its save done: when its entries hold a map handed over
        itself (a full save or a live delta), fork the child that writes its chunk (full
        or delta); if no child can be forked, copy such maps as the thread writer would.
        Returns the seconds it took (part of the processor's pause)."""
        t0 = time.perf_counter()
        key = (tasklet.vertex_name, tasklet.index)
        with self._lock:
            entries = self._entries.get(key)
            if self._requested is None or self._requested.snapshot_id != snapshot_id:
                return 0.0
        if not entries or not has_live_map(entries):
            return 0.0
        store = self.store
        try:
            child = fork_chunk(
                store.directory,
                store.key,
                snapshot_id,
                key[0],
                key[1],
                entries,
                fmt.chunk_mode(entries),
            )
        except OSError as e:  # no process or pipe to be had: the thread writer's way
            log.warning(
                "job %s: %s#%d: cannot fork a snapshot writer (%s); its state is "
                "copied and written by the store thread",
                self.job_name,
                key[0],
                key[1],
                e,
            )
        else:
            with self._lock:
                self._forked[key] = child
            return time.perf_counter() - t0
        copy = _detached_or_error(tasklet, copied_maps(entries), "snapshot state")
        with self._lock:
            self._entries[key] = copy
        return time.perf_counter() - t0

    def _take_forked(self, snapshot_id: int) -> dict[tuple[str, int], ForkedChunk]:
        """The children writing chunks of snapshot ``snapshot_id``; any other is stopped."""
        with self._lock:
            forked, self._forked = self._forked, {}
        out = {}
        for key, child in forked.items():
            if child.snapshot_id == snapshot_id:
                out[key] = child
            else:
                child.cancel()
        return out

    def add_completion_entries(self, tasklet: ProcessorTasklet, entries: list[Any]) -> None:
        """Entries a processor offered to the snapshot in ``complete()``: its completion
        state, recorded with its completion in every later snapshot."""
        if self._fork and has_live_map(entries):  # kept and reused: a copy, not the map
            entries = copied_maps(entries)
        if _has_live_save(entries):  # kept and reused: produced now (the state is final)
            for e in entries:
                if type(e[0]) is StateMap and type(e[1].upserts) is LiveSave:
                    e[1].upserts.finish()
            entries = self._resolved(entries, decoded=True)
        entries = _detached_or_error(tasklet, entries, "completion state")
        with self._lock:
            self._completion_state.setdefault((tasklet.vertex_name, tasklet.index), []).extend(
                entries
            )

    def tasklet_completed(self, tasklet: ProcessorTasklet) -> None:
        with self._lock:
            self._completed.add(id(tasklet))
            self._check_commit()
            self._final_if_due()

    def _all_completed(self) -> bool:
        return bool(self._tasklets) and len(self._completed) == len(self._tasklets)

    # -- coordinator side ------------------------------------------------------------------
    def request(self, terminal: bool = False) -> int | None:
        """Start the next snapshot unless one is in progress; returns its id."""
        with self._lock:
            if self._stop.is_set() or self._final is not None or self._all_completed():
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
        for child in self._forked.values():  # of a snapshot that was never written
            child.cancel()
        self._forked = {}
        self._pause_s = 0.0
        self._step_s = 0.0
        self._requested_at = time.perf_counter()
        self._requested = SnapshotBarrier(sid, terminal)
        self._check_commit()
        return sid

    _terminal_pending = False

    def _check_commit(self) -> None:
        """Hand the snapshot to the store thread once every processor saved it (or had
        finished). Called with the lock held."""
        req = self._requested
        if req is None or self._to_write is not None:
            return
        for t in self._tasklets:
            if id(t) not in self._reported and id(t) not in self._completed:
                return
        data = self._snapshot_data(req.snapshot_id, all_completed=False)
        self._entries = {}
        self._to_write = data
        self._wake_writer()

    def _wake_writer(self) -> None:
        """Lock held: the store thread has work (started on first use)."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._run_writer, name=f"slipstream-{self.job_name}-store", daemon=True
            )
            self._writer.start()
        self._commit_event.notify_all()

    def _snapshot_data(self, snapshot_id: int, all_completed: bool) -> SnapshotData:
        """Snapshot ``snapshot_id`` from what the processors saved; a completed processor
        (every one with ``all_completed``) is recorded with its completion state."""
        data = SnapshotData(snapshot_id, self.job_name)
        for name, p in self.vertex_parallelism.items():
            data.vertices[name] = VertexState(p)
        for t in self._tasklets:
            vs = data.vertices[t.vertex_name]
            key = (t.vertex_name, t.index)
            if not all_completed and id(t) in self._reported:
                vs.entries[t.index] = self._entries.get(key, [])
            else:
                vs.completed.add(t.index)
                cid = t.completion_snapshot_id
                if not 0 < cid <= self.committed_id:  # no committed record of it yet
                    t.completion_snapshot_id = snapshot_id
                state = self._completion_state.get(key)
                if state:
                    vs.entries[t.index] = list(state)
                    vs.final.add(t.index)
        return data

    def _run_writer(self) -> None:
        """The store thread: encoding and writing happen here, off the cooperative
        threads, while the job goes on; then the outcome is published. No processor code
        runs here (the commits run on the processors' tasklets)."""
        while True:
            # hold no finished snapshot while waiting (its entries may be a copy of the state)
            data = None
            with self._lock:
                self._commit_event.wait_for(
                    lambda: self._to_write is not None
                    or self._final is _FINAL_DUE
                    or self._writer_closing
                )
                data = self._to_write
                if data is None and self._final is not _FINAL_DUE:
                    self._writer = None
                    return
            try:
                if data is None:
                    self._write_final()
                    continue
                try:
                    self.write_snapshot(data)
                except BaseException as e:  # noqa: BLE001
                    self._write_failed(data, e)
                    continue
                with self._lock:
                    self._committed(data, getattr(self.store, "last_write_bytes", None))
            except BaseException as e:  # noqa: BLE001 - never die silently (job RUNNING forever)
                log.exception("job %s: the snapshot store thread failed", self.job_name)
                with self._lock:
                    self._to_write = None
                    self._requested = None
                    if self._final is _FINAL_DUE:
                        self._final, self._final_error = _FINAL_DONE, e
                    self._commit_event.notify_all()
                if self._on_fatal is not None:
                    self._on_fatal(e)

    def write_snapshot(self, data: SnapshotData) -> None:
        """The store thread: write ``data`` as chunks and commit its manifest.

        A processor's chunk is a delta when one of its keyed-state maps saved a delta
        (or a drop): its chain is then the chain the last committed snapshot named for
        it plus this chunk, which must continue it (its maps' ``base_id`` is that
        chain's last snapshot; otherwise :class:`SnapshotError`, a bug, and the
        snapshot fails: the processors' next saves are full). Otherwise its chain is
        one full chunk. A completed processor's chunk is written once and named again
        while its completion state is unchanged."""
        store = self.store
        sid = data.snapshot_id
        forked = self._take_forked(sid) if self._fork else {}
        forked_refs: list[ChunkRef] = []
        written = 0  # bytes of the chunks written for this snapshot
        self._take_compactions()
        store.begin(sid)
        chains: dict[tuple[str, int], list[ChunkRef]] = {}
        completed_chains: dict[tuple[str, int], tuple[int, list[ChunkRef]]] = {}
        try:
            manifest = Manifest(sid, data.job_name, dag_shape=data.dag_shape, extra=data.extra)
            for name, vs in data.vertices.items():
                vm = manifest.vertices[name] = VertexManifest(
                    vs.total_parallelism, set(vs.completed), set(vs.final)
                )
                for i, entries in vs.entries.items():
                    if not entries:
                        continue
                    if _has_live_save(entries):  # wait for its steps to be done
                        entries = vs.entries[i] = self._resolved(entries)
                    key = (name, i)
                    child = forked.pop(key, None)
                    if child is not None:  # a forked writer wrote its chunk
                        ref = self._wait_child(child)
                        forked_refs.append(ref)
                        if ref.mode == fmt.CHUNK_DELTA:
                            chain = [*self._continued_chain(key, entries, sid), ref]
                        else:
                            chain = [ref]
                    elif i in vs.completed:
                        cached = self._completed_chains.get(key)
                        if cached is not None and cached[0] == len(entries):
                            chain = cached[1]
                        else:
                            payload = encode_chunk_parts(entries, sid, name, i, _COLUMNAR)
                            chain = [store.write_chunk(sid, name, i, fmt.CHUNK_FULL, payload)]
                            written += chain[0].size
                        completed_chains[key] = (len(entries), chain)
                    elif fmt.chunk_mode(entries) == fmt.CHUNK_DELTA:
                        chain = self._continued_chain(key, entries, sid)
                        payload = encode_chunk_parts(entries, sid, name, i, _COLUMNAR)
                        chain.append(store.write_chunk(sid, name, i, fmt.CHUNK_DELTA, payload))
                        written += chain[-1].size
                    else:
                        payload = encode_chunk_parts(entries, sid, name, i, _COLUMNAR)
                        chain = [store.write_chunk(sid, name, i, fmt.CHUNK_FULL, payload)]
                        written += chain[0].size
                    vm.chains[i] = chain
                    chains[key] = chain
            if forked_refs:  # the store counts only the chunks it wrote itself
                store.commit(manifest, chunk_bytes=written + sum(r.size for r in forked_refs))
            else:
                store.commit(manifest)
        except BaseException:
            store.abort(sid)
            for ref in forked_refs:
                _unlink_quietly(os.path.join(store.directory, ref.file))
            raise
        finally:
            for child in forked.values():  # not waited for: the snapshot failed first
                child.cancel()
        self._chains = chains
        self._completed_chains = completed_chains
        if self._compactor is not None:
            self._compactor.settle(manifest.files(), chains.values())
        self._compact_long_chains()
        disk_bytes = getattr(store, "disk_bytes", None)
        if disk_bytes is not None:
            self.store_bytes = disk_bytes()

    def _resolved(self, entries: list[Any], decoded: bool = False) -> list[Any]:
        """``entries`` with each copy-on-write save (:class:`LiveSave`) replaced by its
        content, once the processor's tasklet produced it (the store thread waits): its
        encoded fragments (an :class:`EncodedMap`, which the chunk's payload takes as
        they are), or with ``decoded`` a dict (entries kept and reused)."""
        out = []
        for e in entries:
            k, v = e
            if type(k) is StateMap and type(v.upserts) is LiveSave:
                live = v.upserts
                upserts, removed = live.result(self._aborted)
                if decoded and isinstance(upserts, EncodedMap | EncodedBatches):
                    upserts = upserts.to_dict()
                self._step_s = max(self._step_s, live.step_max_s)
                e = (k, StateMapSave(v.mode, upserts, removed, v.base_id))  # type: ignore[arg-type]
            out.append(e)
        return out

    def _wait_child(self, child: ForkedChunk) -> ChunkRef:
        """The store thread: the chunk a forked writer wrote (its peak RSS recorded);
        a :class:`SnapshotError` naming the processor if it failed."""
        try:
            return child.wait()
        except SnapshotError as e:
            if child.error is not None:
                for t in self._tasklets:
                    if (t.vertex_name, t.index) == (child.vertex, child.index):
                        self._fork_culprit = (t, e.__class__(child.error))
            raise
        finally:
            self.stats.writer_rss_kb = max(self.stats.writer_rss_kb, child.peak_rss_kb)

    def _take_compactions(self) -> None:
        """The store thread, before a snapshot: chains the compactor merged replace the
        prefix they stand for in the committed chains (:meth:`Compactor.take_into`)."""
        if self._compactor is not None:
            self._compactor.take_into(self._chains)

    def _compact_long_chains(self) -> None:
        """After a commit: hand to the background compaction the chains with more than
        ``max_deltas`` deltas, or whose deltas outweigh their full chunk (a restore then
        reads at most about twice the state's encoded size)."""
        compactor, limit = self._compactor, self.max_deltas
        if compactor is None or limit is None:
            return
        for key, chain in self._chains.items():
            if len(chain) < 2:
                continue
            if (
                len(chain) - 1 > limit or sum(r.size for r in chain[1:]) > chain[0].size
            ) and not compactor.busy(key):
                compactor.submit(key, chain)

    @property
    def compactions(self) -> int:
        """Chains compacted in this execution."""
        return self._compactor.compacted if self._compactor is not None else 0

    def continue_chains(self, chains: dict[tuple[str, int], list[ChunkRef]]) -> None:
        """Before the first snapshot: the committed chains (of the snapshot this execution
        was restored from) that processors restored from exactly their own chain continue
        (their keyed state saves a delta relative to it, see
        :func:`~slipstream.state.keyed.continue_restored_chain`); a processor whose first
        save is full starts a new chain instead."""
        with self._lock:
            for key, chain in chains.items():
                self._chains.setdefault(key, list(chain))

    def _continued_chain(
        self, key: tuple[str, int], entries: list[Any], snapshot_id: int
    ) -> list[ChunkRef]:
        """A copy of the committed chain that ``entries`` (holding a delta) continue."""
        chain = self._chains.get(key)
        last = chain[-1].snapshot_id if chain else None
        bases = fmt.delta_bases(entries)
        if chain is None or bases != {last}:
            raise SnapshotError(
                f"snapshot {snapshot_id}: {key[0]}#{key[1]} saved keyed state as a delta "
                f"relative to snapshot {', '.join(map(str, sorted(bases)))}, but the last "
                f"committed snapshot of this execution holds its state as of "
                + (f"snapshot {last}" if last is not None else "no snapshot")
                + " (a bug in the processor's or the engine's change tracking; the next "
                "snapshot saves its state in full)"
            )
        return list(chain)

    def _write_failed(self, data: SnapshotData, error: BaseException) -> None:
        culprit, self._fork_culprit = self._fork_culprit, None
        if culprit is None and isinstance(error, SnapshotError):
            culprit = self._unpicklable_state(data)
        with self._lock:
            terminal = self._requested is not None and self._requested.is_terminal
        if terminal and self._on_fatal is not None:
            # the tasklets end after the terminal barrier once its outcome is published:
            # the execution fails first, so that it does not end as if completed
            self._on_fatal(
                terminal_snapshot_error(
                    data.snapshot_id, self.job_name, self.store.directory, error
                )
            )
        with self._lock:
            self._requested = None
            self._to_write = None
            self.consecutive_failures += 1
            self.failed_snapshots += 1
            self.last_error = error
            self.commit_board.publish_failed(data.snapshot_id)
            self._final_if_due()
            self._commit_event.notify_all()
        if terminal and self._on_fatal is not None:
            return
        if culprit is not None:
            tasklet, e = culprit
            err = SnapshotError(
                f"{tasklet.vertex_name}#{tasklet.index}: snapshot state cannot be pickled: {e}"
            )
            err.__cause__ = e
            if self._on_state_error is not None:
                self._on_state_error(tasklet, err)
                return
        log.error(
            "snapshot %d of %s could not be written: %s", data.snapshot_id, self.job_name, error
        )
        if self._on_error is not None:
            self._on_error(error)

    def _unpicklable_state(self, data: SnapshotData) -> tuple[ProcessorTasklet, Exception] | None:
        """The processor whose saved state cannot be encoded (to name it in the error)."""
        for t in self._tasklets:
            vs = data.vertices.get(t.vertex_name)
            entries = vs.entries.get(t.index) if vs is not None else None
            if entries and not has_live_map(entries):  # a live map: its child reported
                try:
                    pickle_state(entries)
                except Exception as e:  # noqa: BLE001
                    return t, e
        return None

    def _committed(self, data: SnapshotData, size: int | None) -> None:
        """Snapshot ``data`` is durable: publish what was staged for it. Lock held."""
        req = self._requested
        assert req is not None and req.snapshot_id == data.snapshot_id
        duration = time.perf_counter() - self._requested_at
        entries = data.entry_count()
        self.stats.record(duration, size or 0, entries, self._pause_s, self._step_s)
        now = time.time()
        self.last_commit = {
            "id": req.snapshot_id,
            "duration_ms": round(duration * 1000.0, 1),
            "bytes": size,
            "entries": entries,
            "committed_at": now,
        }
        self.consecutive_failures = 0
        self.committed_id = req.snapshot_id
        self._requested = None
        self._to_write = None
        if req.is_terminal:
            self.terminal_committed = True
        if self._on_commit is not None:
            self._on_commit(data)
        self.commit_board.publish_committed(req.snapshot_id)  # the tasklets commit now
        self._commit_event.notify_all()
        if self._terminal_pending and not req.is_terminal and not self._all_completed():
            self._terminal_pending = False
            self._start(True)
        self._final_if_due()

    # -- the end of the job ----------------------------------------------------------------
    def _final_if_due(self) -> None:
        """Lock held. Every processor completed and no snapshot is in flight: the store
        thread writes the final snapshot (after the one in flight, if any)."""
        if (
            self._final is None
            and self._requested is None
            and self._all_completed()
            and not self._aborted.is_set()
        ):
            self._final = _FINAL_DUE
            self._wake_writer()

    def _write_final(self) -> None:
        """The store thread: write the snapshot that records every processor as
        completed, with its completion state, and publish it (the tasklets waiting for
        their completion commit then commit and end).

        Exactly-once (``max_final_failures``): the output is never committed without
        that record: a failed write is retried at the snapshot interval (also after a
        failed snapshot of the execution, whose staged output it then covers, as the
        next snapshot does while the job runs) until ``max_final_failures`` snapshots in
        a row failed; then the execution fails (``on_fatal``) with nothing staged since
        the last committed snapshot committed (a resume replays it). So it is when
        :meth:`abort` is called meanwhile. At-least-once (where a replay is allowed): one
        write is tried, when every earlier snapshot committed, and the output is
        released in any case."""
        limit = self._max_final_failures
        while True:
            data = None
            with self._lock:
                if limit is not None or not self.consecutive_failures:
                    data = self._snapshot_data(self.next_id, all_completed=True)
                    self.next_id += 1
            error: BaseException | None = None
            if data is not None:
                try:
                    self.write_snapshot(data)
                except BaseException as e:  # noqa: BLE001
                    error = e
            if error is None:
                with self._lock:
                    if data is not None:
                        self.consecutive_failures = 0
                        self.committed_id = data.snapshot_id
                        self.final_snapshot = data
                if data is not None and self._on_commit is not None:
                    self._on_commit(data)
                with self._lock:
                    if data is not None:
                        self.commit_board.publish_committed(data.snapshot_id)
                    if limit is None:
                        self.commit_board.release()
                    self._final = _FINAL_DONE
                    self._commit_event.notify_all()
                return
            assert data is not None
            if limit is None:
                log.warning(
                    "job %s: its completion could not be recorded in the snapshot store (%s); "
                    "committing its output anyway (at-least-once: a crash before the store is "
                    "marked completed would make a resume replay its last snapshot)",
                    self.job_name,
                    error,
                )
                with self._lock:
                    self.commit_board.release()
                    self._final = _FINAL_DONE
                    self._commit_event.notify_all()
                return
            with self._lock:
                self.consecutive_failures += 1
                self.failed_snapshots += 1
                self.last_error = error
                n = self.consecutive_failures
                self.commit_board.publish_failed(data.snapshot_id)
            log.error(
                "job %s: its final snapshot %d could not be written (%d snapshot(s) in a "
                "row failed, the job fails at %d; its last output is committed only once "
                "it is written): %s",
                self.job_name,
                data.snapshot_id,
                n,
                limit,
                error,
            )
            if n >= limit or self._aborted.wait(self.interval_s):
                what = (
                    f"{n} consecutive snapshot{'s' if n > 1 else ''} could not be written"
                    if n >= limit
                    else "the job was stopped"
                )
                err = final_snapshot_error(self.store.directory, what, self.committed_id, error)
                with self._lock:
                    self._final, self._final_error = _FINAL_DONE, err
                    self._commit_event.notify_all()
                if n >= limit and self._on_fatal is not None:
                    self._on_fatal(err)
                return

    def wait_final(self, timeout: float | None = None) -> SnapshotData | None:
        """Wait for the outcome of the job's final snapshot (every processor completed):
        the snapshot written (``None`` under at-least-once when it was not), or raise
        :class:`SnapshotError` when exactly-once could not write it (or the execution was
        stopped first)."""
        with self._lock:
            self._final_if_due()
            done = self._commit_event.wait_for(
                lambda: self._final is _FINAL_DONE
                or (self._final is None and self._aborted.is_set()),
                timeout,
            )
            if not done or self._final is not _FINAL_DONE:
                raise SnapshotError(
                    f"job {self.job_name!r}: its final snapshot was not written (the job was "
                    f"stopped{'' if done else ' or the store did not answer'}); nothing of its "
                    f"last output was committed. Run it again with resume=True."
                )
            if self._final_error is not None:
                raise self._final_error
            return self.final_snapshot

    def abort(self) -> None:
        """The execution is being stopped: a final snapshot being retried gives up."""
        with self._lock:
            self._aborted.set()
            self._commit_event.notify_all()

    def wait_for_commit(self, snapshot_id: int, timeout: float | None) -> bool:
        with self._lock:
            return self._commit_event.wait_for(lambda: self.committed_id >= snapshot_id, timeout)


class SnapshotStats:
    """Figures of the committed snapshots of one execution (``job.metrics``)."""

    def __init__(self) -> None:
        self.count = 0
        self.last: dict[str, int] = {}
        self.duration_us_total = 0
        self.duration_us_max = 0
        self.bytes_total = 0
        self.pause_us_max = 0
        #: the longest copy-on-write step (state/live.py) of a processor, µs
        self.step_us_max = 0
        #: the peak RSS of the forked snapshot writers (``snapshot_writer="fork"``), KiB
        self.writer_rss_kb = 0

    def record(
        self, duration_s: float, size: int, entries: int, pause_s: float, step_s: float = 0.0
    ) -> None:
        duration_us = int(duration_s * 1e6)
        pause_us = int(pause_s * 1e6)
        self.step_us_max = max(self.step_us_max, int(step_s * 1e6))
        self.count += 1
        self.duration_us_total += duration_us
        self.duration_us_max = max(self.duration_us_max, duration_us)
        self.bytes_total += size
        self.pause_us_max = max(self.pause_us_max, pause_us)
        self.last = {
            "snapshot_duration_us": duration_us,
            "snapshot_bytes": size,
            "snapshot_entries": entries,
            "snapshot_pause_us": pause_us,
        }

    def as_metrics(self) -> dict[str, int]:
        """``snapshots`` and, once one committed, the last snapshot's duration (request
        to commit), size in bytes, entries and longest processor pause (barrier aligned
        to barrier forwarded), with the maxima and means over the execution."""
        out = {"snapshots": self.count}
        if self.count:
            out.update(self.last)
            out["snapshot_duration_us_max"] = self.duration_us_max
            out["snapshot_duration_us_mean"] = self.duration_us_total // self.count
            out["snapshot_bytes_mean"] = self.bytes_total // self.count
            out["snapshot_pause_us_max"] = self.pause_us_max
        if self.writer_rss_kb:
            out["snapshot_writer_peak_rss_kb"] = self.writer_rss_kb
        if self.step_us_max:
            out["snapshot_save_step_us_max"] = self.step_us_max
        return out


_FINAL_DUE = "due"
_FINAL_DONE = "done"

_SCALARS = frozenset((int, float, complex, str, bytes, bool, type(None)))
_second = operator.itemgetter(1)


def store_failures_error(failures: int, directory: str, error: BaseException) -> SnapshotError:
    """The error that fails a job whose last ``failures`` snapshots could not be written
    (``JobConfig(max_snapshot_failures=)``), for one-process and member-process jobs alike."""
    e = SnapshotError(
        f"{failures} consecutive snapshots could not be written to the snapshot store "
        f"{directory}: {type(error).__name__}: {error}"
    )
    e.__cause__ = error
    return e


def terminal_snapshot_error(
    snapshot_id: int, job_name: str, directory: str, error: BaseException
) -> SnapshotError:
    """The error that fails a job whose terminal snapshot (suspend, restart) could not be
    written."""
    e = SnapshotError(
        f"the terminal snapshot {snapshot_id} of job {job_name!r} (taken to suspend or "
        f"restart it) could not be written to the snapshot store {directory}: "
        f"{type(error).__name__}: {error}"
    )
    e.__cause__ = error
    return e


def final_snapshot_error(
    directory: str, why: str, committed_id: int | None, error: BaseException
) -> SnapshotError:
    """The error that fails a job whose final snapshot (every processor completed) could
    not be written: what the sinks staged after the last commit stays uncommitted."""
    e = SnapshotError(
        f"the final snapshot (recording every processor as completed) could not be written "
        f"to the snapshot store {directory} ({why}): {type(error).__name__}: {error}. "
        f"Nothing the sinks staged after snapshot {committed_id} was committed; fix the "
        f"store and run the job again with resume=True"
    )
    e.__cause__ = error
    return e


def _frozen(values: Collection[Any], depth: int = 0) -> bool:
    """Whether ``values`` (iterated more than once: a list or a dict's values view) are immutable: scalars, tuples of such (three levels deep), and
    the values of handed-over :class:`KeyedStateBatch` mappings. Type scans at C speed."""
    types = set(map(type, values))
    if types <= _SCALARS:
        return True
    if depth >= 3:
        return False
    for t in types - _SCALARS:
        if not (t is tuple or (issubclass(t, tuple) and getattr(t, "__slots__", None) == ())):
            return False
        nested = [v for v in values if type(v) is t]
        if not _frozen(list(itertools.chain.from_iterable(nested)), depth + 1):
            return False
    return True


def detached(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """``entries`` in a form the processor can no longer change: kept as they are when
    every value is immutable (the usual case, checked at C speed), else copied with a
    pickle round trip. Keys are hashable and taken as immutable; a
    :class:`KeyedStateBatch` mapping is handed over by the processor (it does not change
    it), so only its values are checked."""
    if StateMap in set(map(type, map(operator.itemgetter(0), entries))) and any(
        map(_is_lazy, entries)
    ):
        # a disk-backed map's view (state.disk.DiskStateView): its values are decoded from
        # the database as the store reads them, so no one else holds them; reading them
        # here would read the whole state on the processor's thread
        rest = iter(detached([e for e in entries if not _is_lazy(e)]))
        return [e if _is_lazy(e) else next(rest) for e in entries]
    values = list(map(_second, entries))
    key_types = set(map(type, map(operator.itemgetter(0), entries)))
    if KeyedStateBatch in key_types or StateMap in key_types:
        plain = []
        for e in entries:
            t = type(e[0])
            if t is KeyedStateBatch:
                if not _frozen(e[1].values()):
                    return _copied(entries)
            elif t is StateMap:
                if not _frozen(e[1].upserts.values()):  # no list: a full save's map is large
                    return _copied(entries)
            else:
                plain.append(e[1])
        values = plain
    if _frozen(values):
        return entries
    return _copied(entries)


def _has_live_save(entries: list[Any]) -> bool:
    return any(type(k) is StateMap and type(v.upserts) is LiveSave for k, v in entries)


def _is_lazy(entry: tuple[Any, Any]) -> bool:
    """A map no one else can change: a disk-backed map's view, or a map handed over itself
    to a forked writer (the child sees it as of the fork; see ``_fork_writer``)."""
    if type(entry[0]) is not StateMap:
        return False
    upserts = entry[1].upserts
    return getattr(upserts, "detached", False) is True or isinstance(upserts, KeyedState)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _copied(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    copy: list[tuple[Any, Any]] = pickle.loads(pickle_state(entries))
    return copy


def _detached_or_error(tasklet: ProcessorTasklet, entries: list[Any], what: str) -> list[Any]:
    """``detached(entries)``, or a :class:`SnapshotError` naming the processor whose
    ``what`` (snapshot or completion state) cannot be encoded."""
    try:
        return detached(entries)
    except Exception as e:  # noqa: BLE001
        raise SnapshotError(
            f"{tasklet.vertex_name}#{tasklet.index}: {what} cannot be pickled: {e}"
        ) from e
