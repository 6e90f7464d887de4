"""The size of each stateful vertex's state, as of a job's last committed snapshot.

What is cheap is read on every request: the store's committed ids and the newest
snapshot's manifest (one small signed file, read once per snapshot id), which names each
processor's chain of chunk files and their sizes, so the bytes on disk of a vertex's
state are known at once. How many entries and keys a vertex holds is not in the
manifest: it takes decoding the chunks. That is done off the request, on one thread per
job at a time, once per snapshot id, and no more often than ``budget`` allows (a count
that took ``d`` seconds is followed by the next one ``d / budget`` seconds later at the
earliest): a small state is counted at every commit, a state of millions of keys every
so often, and the figures say which snapshot they were counted in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("slipstream.dashboard")

#: The share of one core the counting may take, at most (see the module doc).
BUDGET = 0.1


class _Sizes:
    """One job's figures: the newest manifest's sizes and the newest count."""

    def __init__(self) -> None:
        self.manifest_id: int | None = None
        # vertex -> (processors, chunks, bytes), in the manifest's order
        self.bytes: dict[str, tuple[int, int, int]] = {}
        self.counted_id: int | None = None
        self.counts: dict[str, tuple[int, int]] = {}
        self.counting: threading.Thread | None = None
        self.next_count = 0.0


def job_store(job: Any) -> Any:
    """The job's :class:`~slipstream.state.store.DirectorySnapshotStore`, or ``None``
    for a job that takes no snapshots."""
    from slipstream.state.store import DirectorySnapshotStore

    store = getattr(job, "store", None)
    return store if isinstance(store, DirectorySnapshotStore) else None


class StateSizes:
    """Per job, what :meth:`describe` reports (see docs/watching.md, "State"). Thread
    safe; counting threads are daemons, joined by :meth:`close`."""

    def __init__(
        self,
        budget: float = BUDGET,
        clock: Callable[[], float] = time.monotonic,
        counter: Callable[[Any], tuple[int, dict[str, tuple[int, int]]]] | None = None,
    ) -> None:
        from slipstream.state.reader import newest_size_counts

        self.budget = budget
        #: counts the newest snapshot of a store: ``(its id, {vertex: (entries, keys)})``
        self.counter = counter or newest_size_counts
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, _Sizes] = {}
        self._closed = False

    def describe(self, job: Any, job_key: str, order: list[str] | None = None) -> dict[str, Any] | None:
        """``None`` for a job that takes no snapshots; otherwise ``snapshot_id`` (the
        newest committed, ``None`` before the first), ``counted_snapshot_id`` (the one
        ``entries`` and ``keys`` were counted in, ``None`` until a count is done) and a
        row per vertex with state in that snapshot (``order``: vertex names in the order
        to list them): ``name``, ``processors`` (those with state), ``chunks``,
        ``bytes`` (on disk, of the chunks its chains name), ``entries`` (rows of
        ``ss.state.read``) and ``keys`` (distinct keys of its keyed, window and session
        rows); the last two ``None`` while not counted."""
        store = job_store(job)
        if store is None:
            return None
        with self._lock:
            sizes = self._jobs.setdefault(job_key, _Sizes())
        try:
            ids = store.committed_ids_read_only()
        except Exception:  # noqa: BLE001 - a watcher never fails the page
            log.debug("dashboard: reading the committed ids of %s failed", store.directory, exc_info=True)
            ids = []
        newest = ids[-1] if ids else None
        if newest is not None and newest != sizes.manifest_id:
            self._read_manifest(store, newest, sizes)
        if newest is not None:
            self._maybe_count(store, newest, sizes)
        with self._lock:
            names = list(sizes.bytes)
            if order:
                rank = {n: i for i, n in enumerate(order)}
                names.sort(key=lambda n: rank.get(n, len(rank)))
            vertices = []
            for name in names:
                procs, chunks, size = sizes.bytes[name]
                entries, keys = sizes.counts.get(name, (None, None))
                vertices.append(
                    {
                        "name": name,
                        "processors": procs,
                        "chunks": chunks,
                        "bytes": size,
                        "entries": entries,
                        "keys": keys,
                    }
                )
            return {
                "snapshot_id": sizes.manifest_id,
                "counted_snapshot_id": sizes.counted_id,
                "vertices": vertices,
            }

    def _read_manifest(self, store: Any, sid: int, sizes: _Sizes) -> None:
        try:
            manifest = store.read_manifest(sid)
        except Exception:  # noqa: BLE001 - pruned meanwhile: the next request reads the newer one
            log.debug("dashboard: reading manifest %s of %s failed", sid, store.directory, exc_info=True)
            return
        found = {
            name: (len(vm.chains), sum(len(c) for c in vm.chains.values()),
                   sum(r.size for c in vm.chains.values() for r in c))
            for name, vm in manifest.vertices.items()
            if vm.chains
        }  # fmt: skip
        with self._lock:
            if sizes.manifest_id is None or sid > sizes.manifest_id:
                sizes.manifest_id, sizes.bytes = sid, found

    def _maybe_count(self, store: Any, sid: int, sizes: _Sizes) -> None:
        with self._lock:
            if (
                self._closed
                or (sizes.counted_id is not None and sizes.counted_id >= sid)
                or sizes.counting is not None
                or self._clock() < sizes.next_count
            ):
                return
            t = threading.Thread(
                target=self._count, args=(store, sizes), name="slipstream-dashboard-state", daemon=True
            )
            sizes.counting = t
            # started under the lock: close() joins every thread it finds in
            # ``counting`` and must never find one not yet started
            t.start()

    def _count(self, store: Any, sizes: _Sizes) -> None:
        start = self._clock()
        counted: tuple[int, dict[str, tuple[int, int]]] | None = None
        try:
            counted = self.counter(store)
        except Exception:  # noqa: BLE001 - damaged or gone: tried again at the next commit
            log.debug("dashboard: counting the state of %s failed", store.directory, exc_info=True)
        took = self._clock() - start
        with self._lock:
            if counted is not None and (sizes.counted_id is None or counted[0] > sizes.counted_id):
                sizes.counted_id, sizes.counts = counted
            sizes.next_count = self._clock() + took / self.budget
            sizes.counting = None

    def retain(self, keys: set[str]) -> None:
        """Forget the jobs not in ``keys``."""
        with self._lock:
            for k in [k for k in self._jobs if k not in keys]:
                del self._jobs[k]

    def close(self) -> None:
        """Start no more counts; wait a little for those running."""
        with self._lock:
            self._closed = True
            running = [s.counting for s in self._jobs.values() if s.counting is not None]
        for t in running:
            t.join(timeout=5)
