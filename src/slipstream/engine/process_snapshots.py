"""Snapshot coordination of a job whose members run in OS processes (the coordinator's
side; the members' side is :mod:`slipstream.engine.member_snapshots`).

The coordinator (the user's process) holds no processor and no state. Every
``snapshot_interval_ms`` it sends ``("snapshot", N, terminal)`` to every member; the
members' sources emit barrier N, the barriers travel in band (also across processes)
and each member writes its processors' chunks into the job's store directory, then
sends its part of the manifest (chunk refs only). Once every member answered, the
coordinator commits the merged manifest (:meth:`DirectorySnapshotStore.commit`: the
manifest file, ``MANIFEST.json``, the generation, garbage collection), and only then
sends ``("snap_outcome", N, True, "")``: the members' processors commit (two-phase
sinks) on their own tasklets. If a member could not save its part, N fails for all
(``ok`` False): nothing of it is committed, and a member removes its chunks.

The end of the job: a member whose processors all completed says so once
(``snap_completed``); when every member did, the coordinator takes the job's last
snapshot (every processor recorded as completed, with its completion state), exactly
once under exactly-once (retried at the interval up to ``max_snapshot_failures``,
then the job fails with its last output uncommitted), at most once under
at-least-once (``snap_release`` commits the output without it); then
``snap_final_settled`` lets the members end.

``suspend()``: a terminal snapshot (after the one in flight, if any); the members'
processors end once its outcome is known.

Incremental snapshots: a member names, for a processor whose chunk is a delta, only the
chunk it continues and the delta; the coordinator holds the committed chains and puts
the delta at the end of the one the last manifest named (:meth:`ProcessSnapshots.
merged_chain`), so a manifest names base + deltas per chain as with one process. Long
chains are compacted here, over the store this process commits to
(:class:`~slipstream.state.compact.Compactor`, its merge in a child process): the files
a running compaction protects and the store's garbage collection are then one object's,
and the next manifest names the compacted chunk in place of the prefix it merged,
whatever the member names. A chain's flags (``FLAGS``) are OR-ed over its chunks.

The figures the job reads of an execution's coordinator (``job.metrics``,
``job.watch()``, ``snapshot_error``) have the names of
:class:`~slipstream.engine.snapshot.SnapshotCoordinator`'s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from slipstream.core.errors import SnapshotError, SnapshotStalledError
from slipstream.engine.member_snapshots import FLAGS
from slipstream.engine.snapshot import (
    SnapshotStats,
    final_snapshot_error,
    store_failures_error,
    terminal_snapshot_error,
)
from slipstream.state import compact
from slipstream.state import format as fmt
from slipstream.state.compact import Compactor
from slipstream.state.store import (
    ChunkRef,
    DirectorySnapshotStore,
    Manifest,
    SnapshotData,
    VertexManifest,
)

log = logging.getLogger("slipstream.snapshot")

_DUE = "due"
_DONE = "done"


class ProcessSnapshots:
    """One execution's snapshot coordination across member processes (module
    docstring). ``send(member, message)`` sends a control message to a member
    (``False`` if it is gone)."""

    def __init__(
        self,
        job_name: str,
        store: DirectorySnapshotStore,
        interval_ms: int,
        first_id: int,
        members: int,
        send: Callable[[int, tuple[Any, ...]], bool],
        *,
        on_commit: Callable[[SnapshotData], None],
        on_error: Callable[[BaseException], None],
        on_fatal: Callable[[BaseException], None],
        on_stall: Callable[[BaseException], None],
        max_final_failures: int | None,
        stall_warning_s: float | None,
        stall_timeout_s: float | None,
    ) -> None:
        self.job_name = job_name
        self.store = store
        self.interval_s = interval_ms / 1000.0
        self.members = members
        self._send = send
        self._on_commit = on_commit
        self._on_error = on_error
        self._on_fatal = on_fatal
        self._on_stall = on_stall
        self._max_final_failures = max_final_failures
        self._stall_warning_s = stall_warning_s
        self._stall_timeout_s = stall_timeout_s
        self.next_id = first_id
        self.committed_id = first_id - 1
        self.terminal_committed = False
        self.stats = SnapshotStats()
        self.last_commit: dict[str, Any] | None = None
        self.consecutive_failures = 0
        self.failed_snapshots = 0
        self.last_error: BaseException | None = None
        self.stall: str | None = None
        self.stalled_s = 0.0
        self.store_bytes = 0
        # the chains of the last committed manifest and each chain's flags (OR over its
        # chunks: a delta's keys are a few of the chain's), per (vertex, index)
        self._chains: dict[tuple[str, int], list[ChunkRef]] = {}
        self._flags: dict[tuple[str, int], list[bool]] = {}
        self.max_deltas = compact.DEFAULT_MAX_DELTAS
        self._compactor = Compactor(store, True, job_name)
        # held while the store commits a manifest or the compactor's outputs are settled
        self._store_lock = threading.Lock()
        # held while a message goes out too: a member reads snapshot N's outcome before
        # snapshot N + 1
        self._lock = threading.RLock()
        # the snapshot in flight: (id, terminal, the job's last one)
        self._requested: tuple[int, bool, bool] | None = None
        self._requested_at = 0.0
        self._parts: dict[int, tuple[Manifest, int, int, float]] = {}
        self._failed: dict[int, str] = {}
        self._terminal_pending = False
        self._completed: set[int] = set()
        self._final: str | None = None
        self._final_retry_at = 0.0
        self._stall_warned = 0
        self._stop = threading.Event()
        self._aborted = threading.Event()

    @property
    def snapshots_committed(self) -> int:
        return self.stats.count

    def continue_chains(self, manifest: Manifest) -> None:
        """Before the first snapshot: the chains (and flags) of ``manifest``, the
        snapshot of this store the execution restores from, which processors restored
        from exactly their own chain continue with a delta
        (:meth:`~slipstream.engine.member_snapshots.MemberSnapshots.prepare`)."""
        flags = manifest.extra.get(FLAGS)
        with self._store_lock:
            for name, vm in manifest.vertices.items():
                chain_flags = flags.get(name, {}).get("chains", {}) if isinstance(flags, dict) else {}
                for i, chain in vm.chains.items():
                    self._chains[(name, i)] = list(chain)
                    f = chain_flags.get(str(i))
                    if f is not None:
                        self._flags[(name, i)] = list(f)

    @property
    def compactions(self) -> int:
        """Chains compacted in this execution."""
        return self._compactor.compacted

    # -- lifecycle ---------------------------------------------------------------------------
    def start_timer(self) -> None:
        threading.Thread(
            target=self._run_timer, name=f"slipstream-{self.job_name}-snapshots", daemon=True
        ).start()

    def stop(self) -> None:
        """The execution ended: no more snapshots; the compaction stops and its outputs
        that no committed manifest names are removed."""
        self._stop.set()
        self._compactor.stop()
        with self._store_lock:
            self._compactor.drop_unnamed()

    def abort(self) -> None:
        """The execution is being stopped: no new snapshot, no retry of the last one."""
        self._aborted.set()

    def _run_timer(self) -> None:
        tick = min(self.interval_s, 0.25)
        next_request = time.monotonic() + self.interval_s
        while not self._stop.wait(tick):
            now = time.monotonic()
            if now >= next_request:
                self.request()
                next_request = now + self.interval_s
            with self._lock:
                self._send_all(self._final_if_due_locked())
            self._check_stall()

    # -- requests ----------------------------------------------------------------------------
    def request(self, terminal: bool = False) -> int | None:
        """Start the next snapshot unless one is in flight (a terminal one is then taken
        next); returns its id."""
        with self._lock:
            if self._stop.is_set() or self._aborted.is_set() or self._final is not None:
                return None
            if len(self._completed) == self.members:
                return None  # the job's last snapshot is due instead
            if self._requested is not None:
                if terminal and not self._requested[1]:
                    self._terminal_pending = True
                return None
            sid, messages = self._begin(terminal, final=False)
            self._send_all(messages)
        return sid

    def _begin(self, terminal: bool, final: bool) -> tuple[int, list[tuple[int, tuple[Any, ...]]]]:
        """Lock held: snapshot ``next_id`` starts; returns it and the messages to send."""
        sid = self.next_id
        self.next_id += 1
        self._requested = (sid, terminal, final)
        self._requested_at = time.perf_counter()
        self._parts = {}
        self._failed = {}
        return sid, [(m, ("snapshot", sid, terminal)) for m in range(self.members)]

    def _send_all(self, messages: list[tuple[int, tuple[Any, ...]]]) -> None:
        for m, msg in messages:
            self._send(m, msg)

    # -- the members' answers ----------------------------------------------------------------
    def on_message(self, member: int, msg: tuple[Any, ...]) -> bool:
        """A member's snapshot message (``False``: not one)."""
        kind = msg[0]
        if kind == "snap_saved":
            _, sid, manifest, size, entries, pause = msg
            self._answer(member, sid, (manifest, size, entries, pause), None)
        elif kind == "snap_failed":
            self._answer(member, msg[1], None, f"member {member}: {msg[2]}")
        elif kind == "snap_completed":
            with self._lock:
                self._completed.add(member)
                self._send_all(self._final_if_due_locked())
        else:
            return False
        return True

    def _answer(
        self,
        member: int,
        sid: int,
        part: tuple[Manifest, int, int, float] | None,
        why: str | None,
    ) -> None:
        with self._lock:
            req = self._requested
            if req is None or req[0] != sid:
                return  # of a snapshot given up on
            if part is not None:
                self._parts[member] = part
            else:
                assert why is not None
                self._failed[member] = why
            if len(self._parts) + len(self._failed) < self.members:
                return
            failed = dict(self._failed)
            parts = list(self._parts.values())
        if failed:
            self._settle_failed(req, SnapshotError("; ".join(failed[m] for m in sorted(failed))))
            return
        try:
            size = self._commit(sid, parts)
        except BaseException as e:  # noqa: BLE001 - the snapshot fails
            self._settle_failed(req, e)
            return
        self._settle_committed(req, size, parts)

    def _commit(self, sid: int, parts: list[tuple[Manifest, int, int, float]]) -> int:
        """The members' parts as one manifest, committed; returns the snapshot's bytes.
        Compactions done meanwhile replace the prefix of the chains they merged first;
        after the commit, long chains go to the compaction."""
        with self._store_lock:
            self._compactor.take_into(self._chains)
            manifest = Manifest(sid, self.job_name)
            flags: dict[str, Any] = {}
            chains: dict[tuple[str, int], list[ChunkRef]] = {}
            chain_flags: dict[tuple[str, int], list[bool]] = {}
            for part, _, _, _ in parts:
                part_flags = part.extra.get(FLAGS, {})
                for name, f in part_flags.items():
                    flags.setdefault(name, {"shape": f["shape"], "chains": {}})
                for name, vm in part.vertices.items():
                    target = manifest.vertices.get(name)
                    if target is None:
                        target = manifest.vertices[name] = VertexManifest(vm.total_parallelism)
                    target.completed |= vm.completed
                    target.final |= vm.final
                    vflags = part_flags.get(name, {}).get("chains", {})
                    for i, chain in vm.chains.items():
                        key = (name, i)
                        chain = self.merged_chain(sid, key, chain)
                        target.chains[i] = chains[key] = chain
                        f = vflags.get(str(i))
                        if f is not None:
                            if len(chain) > 1:  # a delta: the chain's flags and its own
                                prev = self._flags.get(key, [True, True])
                                f = [a or b for a, b in zip(prev, f, strict=True)]
                            chain_flags[key] = flags[name]["chains"][str(i)] = list(f)
                if part.dag_shape is not None:
                    manifest.dag_shape = part.dag_shape
            manifest.extra = {FLAGS: flags}
            self.store.commit(manifest, chunk_bytes=sum(p[1] for p in parts))
            self._chains, self._flags = chains, chain_flags
            self._compactor.settle(manifest.files(), chains.values())
            self._compact_long_chains()
            self.store_bytes = self.store.disk_bytes()
            return self.store.last_write_bytes or 0

    def merged_chain(self, sid: int, key: tuple[str, int], chain: list[ChunkRef]) -> list[ChunkRef]:
        """The chain of processor ``key`` in manifest ``sid``, from a member's part: a
        full chunk as it is; a delta (a member names only the chunk it continues, the
        last of its chain, and the delta) at the end of the chain the last committed
        manifest named, which must end at the snapshot the delta continues (else
        :class:`SnapshotError`: the snapshot fails, the processor's next save is full)."""
        if len(chain) < 2 or chain[-1].mode != fmt.CHUNK_DELTA:
            return list(chain)
        committed = self._chains.get(key)
        last = committed[-1].snapshot_id if committed else None
        if committed is None or last != chain[-2].snapshot_id:
            raise SnapshotError(
                f"snapshot {sid}: {key[0]}#{key[1]} wrote {chain[-1].file} as a delta "
                f"continuing snapshot {chain[-2].snapshot_id}, but the last committed "
                f"chain of this execution ends "
                + (f"at snapshot {last}" if last is not None else "nowhere (it has none)")
                + " (a bug in the change tracking; the next snapshot saves its state in full)"
            )
        return [*committed, chain[-1]]

    def _compact_long_chains(self) -> None:
        """Store lock held, after a commit: chains with more than ``max_deltas`` deltas,
        or whose deltas outweigh their full chunk, go to the background compaction (as
        with one process, :class:`~slipstream.engine.snapshot.SnapshotCoordinator`)."""
        for key, chain in self._chains.items():
            if len(chain) < 2:
                continue
            if (
                len(chain) - 1 > self.max_deltas or sum(r.size for r in chain[1:]) > chain[0].size
            ) and not self._compactor.busy(key):
                self._compactor.submit(key, chain)

    def _settle_committed(
        self,
        req: tuple[int, bool, bool],
        size: int,
        parts: list[tuple[Manifest, int, int, float]],
    ) -> None:
        sid, terminal, final = req
        duration = time.perf_counter() - self._requested_at
        entries = sum(p[2] for p in parts)
        pause = max((p[3] for p in parts), default=0.0)
        self._on_commit(SnapshotData(sid, self.job_name))
        messages: list[tuple[int, tuple[Any, ...]]] = []
        with self._lock:
            self.stats.record(duration, size, entries, pause)
            self.last_commit = {
                "id": sid,
                "duration_ms": round(duration * 1000.0, 1),
                "bytes": size,
                "entries": entries,
                "committed_at": time.time(),
            }
            self.consecutive_failures = 0
            self.committed_id = sid
            self._requested = None
            if terminal:
                self.terminal_committed = True
            messages += [(m, ("snap_outcome", sid, True, "")) for m in range(self.members)]
            if final:
                self._final = _DONE
                messages += [(m, ("snap_final_settled",)) for m in range(self.members)]
            elif self._terminal_pending and not terminal:
                self._terminal_pending = False
                messages += self._begin(True, final=False)[1]
            else:
                messages += self._final_if_due_locked()
            self._send_all(messages)

    def _settle_failed(self, req: tuple[int, bool, bool], error: BaseException) -> None:
        sid, terminal, final = req
        log.error("snapshot %d of %s could not be written: %s", sid, self.job_name, error)
        limit = self._max_final_failures
        with self._lock:
            self.consecutive_failures += 1
            self.failed_snapshots += 1
            self.last_error = error
            self._requested = None
            n = self.consecutive_failures
            messages: list[tuple[int, tuple[Any, ...]]] = [
                (m, ("snap_outcome", sid, False, f"{type(error).__name__}: {error}"))
                for m in range(self.members)
            ]
            if final and limit is None:
                # at-least-once: the output is committed without the record of it
                self._final = _DONE
                messages += [(m, ("snap_release",)) for m in range(self.members)]
                messages += [(m, ("snap_final_settled",)) for m in range(self.members)]
            elif final:
                self._final = None
                self._final_retry_at = time.monotonic() + self.interval_s
            self._send_all(messages)
        if final and limit is not None and n >= limit:
            err = final_snapshot_error(
                self.store.directory,
                f"{n} consecutive snapshots could not be written",
                self.committed_id,
                error,
            )
            with self._lock:
                self._final = _DONE
            self._on_fatal(err)
        elif terminal:
            self._on_fatal(terminal_snapshot_error(sid, self.job_name, self.store.directory, error))
        elif not final:
            self._on_error(error)

    # -- the job's last snapshot -------------------------------------------------------------
    def _final_if_due_locked(self) -> list[tuple[int, tuple[Any, ...]]]:
        if (
            self._final is None
            and self._requested is None
            and not self.terminal_committed  # suspended: the members end
            and len(self._completed) == self.members
            and not self._aborted.is_set()
            and not self._stop.is_set()
            and time.monotonic() >= self._final_retry_at
        ):
            self._final = _DUE
            return self._begin(False, final=True)[1]
        return []

    # -- the progress watchdog ---------------------------------------------------------------
    def _check_stall(self) -> None:
        if self._stall_warning_s is None:
            return
        with self._lock:
            req = self._requested
            if req is None or time.perf_counter() - self._requested_at < self._stall_warning_s:
                self.stall = None
                self.stalled_s = 0.0
                return
            age = time.perf_counter() - self._requested_at
            late = [m for m in range(self.members) if m not in self._parts and m not in self._failed]
        waiting = (
            f"members that have not saved it: {', '.join(map(str, late))}" if late else "its commit"
        )
        self.stalled_s = age
        self.stall = (
            f"snapshot {req[0]} was requested {age:.0f} s ago and has not committed: it "
            f"waits for {waiting}"
        )
        if self._stall_warned != req[0]:
            self._stall_warned = req[0]
            log.warning("job %s: %s; no output commits meanwhile", self.job_name, self.stall)
        if self._stall_timeout_s is not None and age >= self._stall_timeout_s:
            err = SnapshotStalledError(
                f"{self.stall}; no snapshot committed for {age:.0f} s "
                f"(JobConfig(stall_timeout_s={self._stall_timeout_s:g}))"
            )
            self._stall_timeout_s = None
            self._on_stall(err)


# -- what an execution with member processes needs of them --------------------------------
def member_setup(job: Any, restore: SnapshotData | None) -> dict[str, Any]:
    """The part of a member's setup about snapshots (``setup["snapshots"]``: the store
    directory, its key, the interval, the first id) and the restore
    (``setup["restore"]``, see :func:`~slipstream.engine.member_snapshots.
    restore_routing`): a snapshot committed in the job's own store is read by the
    members themselves; one passed as data or read from another store travels in the
    setup. Checks first that the snapshot fits the DAG (as with one process, the error
    comes from ``new_job``)."""
    store = job.store
    assert store is not None
    out: dict[str, Any] = {
        "snapshots": {
            "directory": store.directory,
            "key": store.key,
            "interval_ms": job.config.snapshot_interval_ms,
            "first_id": job.next_snapshot_id,
        },
        "restore": None,
    }
    if restore is None:
        return out
    from slipstream.state.lineage import check_same_dag, dag_shape
    from slipstream.state.restore import check_no_lost_state

    check_same_dag(restore, dag_shape(job.dag), job.config.allow_job_change)
    source = getattr(restore, "source", None)
    with_state = {n for n, vs in restore.vertices.items() if any(vs.entries.values())}
    if source is not None:  # a snapshot read without its entries names its chains
        with_state |= {name for (name, _i), chain in source[1].items() if chain}
    check_no_lost_state(
        restore.snapshot_id,
        restore.job_name,
        sorted(with_state),
        {v.name: v for v in job.dag.vertices},
    )
    if (
        source is not None
        and source[0] == os.path.realpath(store.directory)
        and restore.snapshot_id in store.committed_ids()
    ):
        out["restore"] = ("store", store.directory, store.key, restore.snapshot_id)
    else:
        # never one read without its entries: those come from the job's own store
        out["restore"] = ("data", restore)
    return out


def new_coordinator(ex: Any) -> ProcessSnapshots:
    """The snapshot coordination of ``ex`` (a ``ProcessExecution`` of a job with a
    processing guarantee), its failures handled as one process's are (the execution
    fails after ``max_snapshot_failures`` in a row; a final or terminal snapshot that
    cannot be written fails it for good)."""
    from slipstream.core.config import ProcessingGuarantee
    from slipstream.engine.workers import TaskletFailure

    job = ex.job
    config = job.config
    store = job.store

    def on_error(error: BaseException) -> None:
        c = ex.coordinator
        n, limit = c.consecutive_failures, config.max_snapshot_failures
        if n >= limit:
            e = store_failures_error(n, store.directory, error)
            ex.snapshot_failed(TaskletFailure(None, e, restartable=False))

    def on_stall(error: BaseException) -> None:
        log.error("job %s: %s", job.name, error)
        ex.snapshot_failed(TaskletFailure(None, error))

    coordinator = ProcessSnapshots(
        job.name,
        store,
        config.snapshot_interval_ms,
        job.next_snapshot_id,
        ex.count,
        ex.send_to,
        on_commit=job._on_commit,
        on_error=on_error,
        on_fatal=lambda e: ex.snapshot_failed(TaskletFailure(None, e, restartable=False)),
        on_stall=on_stall,
        max_final_failures=(
            config.max_snapshot_failures
            if config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            else None
        ),
        stall_warning_s=config.stall_warning_s,
        stall_timeout_s=config.stall_timeout_s,
    )
    spec = getattr(ex, "restore_spec", None)
    if spec is not None and spec[0] == "store":  # the members read it from this store
        coordinator.continue_chains(store.read_manifest(spec[3]))
    return coordinator
