"""Snapshots in a member process (``ss.local(processes=N)`` with a processing guarantee).

The coordinator process decides when snapshot N is taken and whether it committed
(:mod:`slipstream.engine.process_snapshots`); each member saves its own processors:

1. ``("snapshot", N, terminal)`` from the coordinator starts snapshot N here
   (:meth:`MemberSnapshots.start`): this member's sources see it between
   ``complete()`` calls and emit barrier N, which travels in band on local queues and
   on the cross-process channels (:mod:`slipstream.execution.remote` carries barriers
   like items), so every processor aligns as with one process. A processor may align
   on barrier N (it came over a channel from a faster member) before this member read
   ``("snapshot", N)``: what it saves then is kept aside and taken in when N starts.
2. Once every processor of this member saved N (or had completed), the member's store
   thread writes each processor's state as a chunk of its own into the job's store
   directory (signed with the store's key, which the coordinator ships with the job),
   exactly as :class:`~slipstream.engine.snapshot.SnapshotCoordinator` writes chunks
   with one process; only the commit differs: :class:`ChunkWriter` sends this
   member's part of the manifest (chunk refs, no state) to the coordinator and waits.
   Before it, the member reports what its list and map sinks published (the batches of
   earlier snapshots, which this one no longer holds), on the same pipe: the
   coordinator has them before it can commit the snapshot.
3. The coordinator commits the manifest once every member sent its part and answers
   ``("snap_outcome", N, ok, why)``; then the member publishes it on its commit board
   and the processors commit on their own tasklets (two-phase sinks), as with one
   process. Nothing but the outcome crosses back.

Incremental snapshots as with one process: keyed state records what changed
(:mod:`slipstream.state.keyed`), saves copy-on-write where its values are replaced
(:mod:`slipstream.state.live`), and a processor's chunk is a delta continuing its chain.
A member keeps of each committed chain only its last chunk (what the next delta must
continue); its part of the manifest names that chunk and the new one. The coordinator
holds the whole chains: it puts each delta at the end of the chain it committed last
(:meth:`~slipstream.engine.process_snapshots.ProcessSnapshots.merged_chain`), and
compacts long chains over the store it commits to, so that the store's garbage
collection and the compactor's protected files are one object's. ``JobConfig.
snapshot_writer`` is taken as ``"thread"`` (no forked writer in a member). Restored at the same shape from the job's
own store, a processor that got back exactly its own chain continues it
(:func:`restore_routing`, :meth:`MemberSnapshots.prepare`; the coordinator seeds its
chains from the restored manifest): docs/fault-tolerance.md.

An outcome this member did not learn (the coordinator stopped it while it waited) is
never taken as a failure: the processors do not roll back what a committed snapshot may
hold; a restore from it commits it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slipstream.core.errors import SnapshotError
from slipstream.core.items import SnapshotBarrier
from slipstream.engine.snapshot import SnapshotCoordinator, _detached_or_error
from slipstream.state.store import ChunkRef, DirectorySnapshotStore, Manifest, SnapshotData

if TYPE_CHECKING:
    from slipstream.core.partition import KeyRouting
    from slipstream.execution.tasklet import ProcessorTasklet

log = logging.getLogger("slipstream.member")

#: the coordinator's control messages about snapshots (``MemberSnapshots.handle``)
MESSAGES = ("snapshot", "snap_outcome", "snap_release", "snap_final_settled")

#: the manifest's ``extra`` key of the chains' flags (:func:`chain_flags`)
FLAGS = "member_chains"


def chain_flags(
    data: SnapshotData,
    routing: dict[str, tuple[list[int], Callable[[Any], int]]],
    checked: dict[tuple[str, int], bool] | None = None,
) -> dict[str, Any]:
    """Per vertex with state in ``data`` (this member's part of a snapshot): the shape
    it was saved at and each chain's ``[spill, broadcast]``
    (:func:`~slipstream.state.restore.entry_flags`), so that a restore at the same shape
    reads only the chains its processors need
    (:func:`~slipstream.state.restore.chains_to_read`). A keyed-state map whose content
    is encoded already (a copy-on-write save) counts with the spill flag its production
    found, ``checked[(vertex, index)]`` (:attr:`~slipstream.state.live.LiveSave.spill`,
    OR-ed over the processor's saves); one handed over as a view (a disk-backed map), or
    encoded with its keys unchecked, counts as spilling: its keys are not scanned here."""
    from slipstream.state.keyed import StateMap
    from slipstream.state.restore import entry_flags

    checked = checked or {}
    out: dict[str, Any] = {}
    for name, vs in data.vertices.items():
        if name not in routing or not any(vs.entries.values()):
            continue
        shape, owner = routing[name]
        chains: dict[str, list[bool]] = {}
        for i, entries in vs.entries.items():
            if not entries:
                continue
            plain = [e for e in entries if type(e[0]) is not StateMap or type(e[1].upserts) is dict]
            if len(plain) < len(entries) and checked.get((name, i)) is not False:
                chains[str(i)] = [True, True]
            else:
                spill, broadcast = entry_flags(plain, i, owner)
                chains[str(i)] = [spill, broadcast]
        out[name] = {"shape": list(shape), "chains": chains}
    return out


def resolve_live_saves(
    data: SnapshotData, resolved: Callable[[list[Any]], list[Any]]
) -> dict[tuple[str, int], bool]:
    """The store thread, before the flags: each processor's copy-on-write saves in
    ``data`` replaced by their encoded content (``resolved``, which waits for them),
    and per processor that had such saves whether one found a key of another
    processor (``True`` too where one did not check its keys), for
    :func:`chain_flags`."""
    from slipstream.state.keyed import StateMap
    from slipstream.state.live import LiveSave

    spills: dict[tuple[str, int], bool] = {}
    for name, vs in data.vertices.items():
        for i, entries in vs.entries.items():
            lives = [
                v.upserts for k, v in entries if type(k) is StateMap and type(v.upserts) is LiveSave
            ]
            if lives:
                vs.entries[i] = resolved(entries)
                spills[(name, i)] = any(live.spill is not False for live in lives)
    return spills


class OutcomeUnknown(SnapshotError):
    """The member was stopped before the coordinator said whether the snapshot
    committed."""


class ChunkWriter:
    """The store a member's snapshot coordinator writes through: chunks go into the
    job's store directory, the manifest goes to the coordinator process, which commits
    it (module docstring)."""

    def __init__(
        self,
        directory: str,
        key: bytes,
        send: Callable[[tuple[Any, ...]], bool],
        flush: Callable[[], bool] | None = None,
    ) -> None:
        self._store = DirectorySnapshotStore(directory, key=key)
        self.directory = directory
        self._send = send
        self._flush = flush
        self._cond = threading.Condition()
        self._outcomes: dict[int, tuple[bool, str]] = {}
        self._stopped = False
        #: snapshots whose part was sent to the coordinator (it knows their outcome)
        self.sent: set[int] = set()
        self.last_write_bytes: int | None = None
        #: of the snapshot being written: its entries and the longest processor pause
        self.entries = 0
        self.pause_s = 0.0

    @property
    def key(self) -> bytes:
        return self._store.key

    def begin(self, snapshot_id: int) -> None:
        self._store.begin(snapshot_id)

    def write_chunk(self, *args: Any, **kw: Any) -> ChunkRef:
        return self._store.write_chunk(*args, **kw)

    def abort(self, snapshot_id: int) -> None:
        """Snapshot ``snapshot_id`` is not committed here: remove the chunks this member
        wrote for it, unless its part went to the coordinator, which may have committed
        it (its outcome unknown here); the store's garbage collection removes them at
        the next commit if no manifest names them."""
        if snapshot_id in self.sent:
            self._store._pending_id = None
            self._store._pending_files = []
        else:
            self._store.abort(snapshot_id)

    def commit(self, manifest: Manifest, chunk_bytes: int | None = None) -> None:
        """Send this member's part of ``manifest`` and wait for the coordinator's
        outcome: returns once it committed, raises :class:`SnapshotError` if it failed,
        :class:`OutcomeUnknown` if this member is stopped first."""
        sid = manifest.snapshot_id
        size = self._store._pending_bytes if chunk_bytes is None else chunk_bytes
        # what list and map sinks published here (the batches of the snapshots before
        # this one) reaches the coordinator before this part does: once this snapshot
        # commits it no longer holds them, so a member killed later loses nothing
        if self._flush is not None and not self._flush():
            raise SnapshotError(f"snapshot {sid}: the sinks' output could not be reported")
        self.sent.add(sid)
        if not self._send(("snap_saved", sid, manifest, size, self.entries, self.pause_s)):
            raise OutcomeUnknown(f"snapshot {sid}: the coordinator process is gone")
        with self._cond:
            self._cond.wait_for(lambda: sid in self._outcomes or self._stopped)
            outcome = self._outcomes.pop(sid, None)
        if outcome is None:
            raise OutcomeUnknown(f"snapshot {sid}: stopped before its outcome was known")
        ok, why = outcome
        if not ok:
            raise SnapshotError(why)
        # committed: the chunks are the coordinator's now (never removed by an abort)
        self._store._pending_id = None
        self._store._pending_files = []
        self.last_write_bytes = size

    def outcome(self, snapshot_id: int, ok: bool, why: str) -> None:
        with self._cond:
            self._outcomes[snapshot_id] = (ok, why)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


class MemberSnapshots(SnapshotCoordinator):
    """The snapshot sink of one member's processors (module docstring): a
    :class:`SnapshotCoordinator` whose snapshots are started by the coordinator process
    and committed by it."""

    def __init__(
        self,
        job_name: str,
        writer: ChunkWriter,
        interval_ms: int,
        first_id: int,
        vertex_parallelism: dict[str, int],
        send: Callable[[tuple[Any, ...]], bool],
        on_state_error: Callable[[ProcessorTasklet, BaseException], None],
        on_fatal: Callable[[BaseException], None],
        routing: dict[str, tuple[list[int], Callable[[Any], int]]] | None = None,
        key_routing: dict[str, KeyRouting] | None = None,
    ) -> None:
        super().__init__(
            job_name,
            writer,  # type: ignore[arg-type]
            interval_ms,
            first_id,
            vertex_parallelism,
            on_state_error=on_state_error,
            on_fatal=on_fatal,
            max_deltas=None,
        )
        self.writer = writer
        self._send = send
        #: per vertex: [member count, local parallelism] and its restore routing (the
        #: owner of a key), for the flags of each chain (:func:`chain_flags`)
        self.routing = routing or {}
        #: per vertex: its key routing (copy-on-write saves check their keys with it)
        self.key_routing = key_routing or {}
        # saved before this member read ("snapshot", N): N -> (entries, reported, pause)
        self._early: dict[int, tuple[dict[tuple[str, int], list[Any]], set[int], float]] = {}
        self._told_completed = False
        self._next_start: tuple[int, bool] | None = None
        #: set when the coordinator says the job's last snapshot is settled (or stops us)
        self.final_settled = threading.Event()

    # -- what the coordinator process asks ---------------------------------------------------
    def handle(self, msg: tuple[Any, ...]) -> bool:
        """A control message for the snapshots (``False``: not one of theirs)."""
        kind = msg[0]
        if kind == "snapshot":
            self.start(msg[1], msg[2])
        elif kind == "snap_outcome":
            self.writer.outcome(msg[1], msg[2], msg[3])
        elif kind == "snap_release":
            with self._lock:
                self.commit_board.release()
        elif kind == "snap_final_settled":
            self.final_settled.set()
        else:
            return False
        return True

    def start(self, snapshot_id: int, terminal: bool) -> None:
        """Start snapshot ``snapshot_id`` here, taking in what processors saved of it
        before (module docstring, 1); after the previous one, if this member's store
        thread has not settled its outcome yet."""
        with self._lock:
            if self._requested is not None or self._to_write is not None:
                self._next_start = (snapshot_id, terminal)
                return
            self._start_now(snapshot_id, terminal)

    def _start_now(self, snapshot_id: int, terminal: bool) -> None:
        """Lock held."""
        if self._stop.is_set() or self._aborted.is_set():
            return
        self.next_id = snapshot_id + 1
        self._reported = set()
        self._entries = {}
        self._pause_s = 0.0
        self._step_s = 0.0
        self._requested_at = time.perf_counter()
        self._requested = SnapshotBarrier(snapshot_id, terminal)
        early = self._early.pop(snapshot_id, None)
        for sid in [s for s in self._early if s < snapshot_id]:
            del self._early[sid]
        if early is not None:
            self._entries, self._reported, self._pause_s = early
        self._check_commit()

    def _start_next(self) -> None:
        """Lock held: the snapshot that waited for the previous one's outcome starts."""
        nxt = self._next_start
        if nxt is not None and self._requested is None and self._to_write is None:
            self._next_start = None
            self._start_now(*nxt)

    def _committed(self, data: SnapshotData, size: int | None) -> None:
        super()._committed(data, size)
        self._start_next()

    def stop_member(self) -> None:
        """This member stops: a write waiting for its outcome gives up (unknown)."""
        self.abort()
        self.writer.stop()
        self.final_settled.set()

    # -- the tasklet side ----------------------------------------------------------------------
    def add_entries(self, tasklet: ProcessorTasklet, snapshot_id: int, entries: list[Any]) -> None:
        with self._lock:
            current = self._requested is not None and self._requested.snapshot_id == snapshot_id
        if current:
            super().add_entries(tasklet, snapshot_id, entries)
            return
        entries = _detached_or_error(tasklet, entries, "snapshot state")
        with self._lock:
            early = self._early.setdefault(snapshot_id, ({}, set(), 0.0))
            early[0].setdefault((tasklet.vertex_name, tasklet.index), []).extend(entries)

    def processor_done(self, tasklet: ProcessorTasklet, barrier: SnapshotBarrier) -> None:
        with self._lock:
            req = self._requested
            if req is None or req.snapshot_id != barrier.snapshot_id:
                entries, reported, pause = self._early.setdefault(
                    barrier.snapshot_id, ({}, set(), 0.0)
                )
                reported.add(id(tasklet))
                pause = max(pause, getattr(tasklet, "last_save_seconds", 0.0))
                self._early[barrier.snapshot_id] = (entries, reported, pause)
                return
        super().processor_done(tasklet, barrier)

    # -- the coordinator process decides the job's last snapshot ----------------------------
    def _final_if_due(self) -> None:
        """Lock held: every processor of this member completed: the coordinator hears
        it once (it takes the job's last snapshot once every member completed)."""
        if not self._told_completed and self._all_completed():
            self._told_completed = True
            self._send(("snap_completed",))

    def request(self, terminal: bool = False) -> int | None:  # pragma: no cover - unused
        raise RuntimeError("a member's snapshots are requested by the coordinator process")

    def write_snapshot(self, data: SnapshotData) -> None:
        with self._lock:
            self.writer.entries = data.entry_count()
            self.writer.pause_s = self._pause_s
        # the copy-on-write saves first: their production checked their keys' owners
        spills = resolve_live_saves(data, self._resolved)
        data.extra = {**data.extra, FLAGS: chain_flags(data, self.routing, spills)}
        super().write_snapshot(data)
        # committed: a delta continues a chain's last chunk, and the coordinator, which
        # holds the chains (compacted there), names the rest (module docstring)
        self._chains = {k: c[-1:] for k, c in self._chains.items()}

    def _write_failed(self, data: SnapshotData, error: BaseException) -> None:
        if isinstance(error, OutcomeUnknown):
            # never published as failed: the coordinator may have committed it
            with self._lock:
                self._requested = None
                self._to_write = None
                self._commit_event.notify_all()
            return
        if data.snapshot_id not in self.writer.sent:
            # failed here before the coordinator got our part: it fails the snapshot
            self._send(("snap_failed", data.snapshot_id, f"{type(error).__name__}: {error}"))
        super()._write_failed(data, error)
        with self._lock:
            self._start_next()

    # -- the member's execution -------------------------------------------------------------
    def prepare(self, spec: Any, restore: Any) -> tuple[list[Any] | None, bool]:
        """Before the processors' init: what one processor's context and tasklet need
        (``spec`` a ``plan.wire`` spec, ``restore`` what :func:`restore_routing`
        returned): its restore entries (``None``: it starts fresh) and whether it is
        restored as completed."""
        ctx = spec.context
        ctx.snapshot_interval_ms = int(self.interval_s * 1000)
        # keyed state saves only what changed (delta chunks continuing this member's
        # chains), copy-on-write where its values are replaced (state/live.py), as one
        # process does; no forked writer (module docstring)
        ctx.incremental_snapshots = True
        ctx.snapshot_writer = "thread"
        ctx.live_saves = []
        routing = self.key_routing.get(spec.vertex.vertex.name)
        if routing is not None:  # copy-on-write saves check their keys (chain_flags)
            ctx.spilled_keys = functools.partial(routing.spills, index=spec.global_index)
        if restore is None:
            return None, False
        routed, completed, recovering = restore[:3]
        key = (spec.vertex.vertex.name, spec.global_index)
        continued = restore[3] if len(restore) > 3 else {}
        chain = continued.get(key)
        if chain:
            # restored from exactly its own chain: its keyed state may continue it (its
            # first save a delta, see state.keyed.continue_restored_chain), as with one
            # process; the coordinator holds the chain (module docstring)
            ctx.restored_snapshot_id = chain[-1].snapshot_id
            ctx._restored_maps = restore[4].get(key, {})
            ctx._restored_states = []
            self.continue_chains({key: chain[-1:]})
        entries = None
        if key not in completed or key in recovering:
            entries = routed.get(key, [])
        return entries, key in completed

    def execution_ended(self, member: Any) -> None:
        """The member's tasklets ended. If they completed, wait for the job's last
        snapshot to be settled (the coordinator takes it once every member completed;
        this member's store thread writes its part); if they were stopped, commit what
        they prepared for snapshots that committed. Then stop the store thread."""
        grace = member.setup["stop_grace_ms"] / 1000.0
        ended = member.failure is not None or member.cancelled
        if not ended and not self.terminal_committed:
            self.final_settled.wait()
        self.stop(timeout=grace if ended else None)
        if ended:
            from slipstream.engine.workers import run_committed_closures

            run_committed_closures(
                member.tasklets,
                self.commit_board,
                member.pool,
                member.failed_tasklet,
                grace,
                member.job_name,
            )


def member_snapshots(member: Any, setup: dict[str, Any]) -> MemberSnapshots:
    """The snapshot sink of member process ``member`` (a ``_Member``), from the job's
    setup (``setup["snapshots"]``: the store directory and key, the interval and the
    first snapshot id)."""
    from slipstream.core.partition import key_routing
    from slipstream.engine.member import JOB
    from slipstream.engine.workers import TaskletFailure
    from slipstream.state.restore import custom_partitioners

    snap = setup["snapshots"]
    writer = ChunkWriter(snap["directory"], snap["key"], member.send, member.report)
    partitioners = custom_partitioners(setup["dag"])
    routings = {
        name: key_routing(partitioners.get(name), vp.member_count, vp.local_parallelism)
        for name, vp in member.plans.items()
    }
    routing: dict[str, tuple[list[int], Callable[[Any], int]]] = {
        name: ([vp.member_count, vp.local_parallelism], routings[name].owner)
        for name, vp in member.plans.items()
    }
    return MemberSnapshots(
        member.job_name,
        writer,
        snap["interval_ms"],
        snap["first_id"],
        {n: vp.total_parallelism for n, vp in member.plans.items()},
        member.send,
        on_state_error=lambda t, e: member._on_failure(TaskletFailure(t, e)),
        on_fatal=lambda e: member.fail(None, e, JOB),
        routing=routing,
        key_routing=routings,
    )


def restore_routing(
    setup: dict[str, Any], dag: Any, plans: Any, member: int
) -> tuple[Any, ...] | None:
    """What the processors of member ``member`` restore (``None``: the job starts
    fresh): the snapshot is read here, from the store directory the coordinator names
    (``("store", directory, key, id)``; signatures checked before anything is
    unpickled), or taken from the setup (``("data", SnapshotData)``: a snapshot passed
    as data). Its entries are routed by key to the processors of the new execution
    (:func:`~slipstream.state.restore.restore_plan`, at any process count). From the
    store a member reads only the chains its processors need when the snapshot was
    taken by member processes at the same shape (:func:`chain_flags`); else all.

    Returns the entries per processor, the processors restored as completed, those of
    them recovering, and, of this member's processors restored from exactly their own
    chain of the job's own store, the chains they continue and their maps
    (``(tag, detail) -> size``, checked by
    :func:`~slipstream.state.keyed.continue_restored_chain`)."""
    from slipstream.engine.job import _chain_maps, _continued_chains
    from slipstream.state.restore import (
        chains_to_read,
        custom_partitioners,
        recovering_completed,
        restore_plan,
    )

    spec = setup.get("restore")
    if spec is None:
        return None
    store: DirectorySnapshotStore | None = None
    mine: set[tuple[str, int]] = {
        (name, g)
        for name, vp in plans.items()
        for g in range(vp.total_parallelism)
        if vp.member_of(g) == member
    }
    if spec[0] == "store":
        _, directory, key, sid = spec
        store = DirectorySnapshotStore(directory, key=key)
        manifest = store.read_manifest(sid)
        flags = manifest.extra.get(FLAGS)
        wanted = None
        if isinstance(flags, dict):
            wanted = chains_to_read(manifest, flags, plans, mine)
        data = store.read(sid, wanted)
    else:
        data = spec[1]
    own: set[tuple[str, int]] = set()
    routed, completed = restore_plan(data, plans, custom_partitioners(dag), own)
    # chains this member's processors continue: of the job's own store only
    continued = _continued_chains(data, store, own & mine)
    maps = {key: _chain_maps(data, key) for key in continued}
    return routed, completed, recovering_completed(data, plans, completed), continued, maps
