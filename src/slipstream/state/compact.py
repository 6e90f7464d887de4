"""Compaction: fold a processor's chain of a full chunk and its deltas into one new full
chunk, in the background, so that a restore never reads more than a few deltas.

The snapshot coordinator hands a committed chain that holds more than ``max_deltas``
deltas to a :class:`Compactor` (one background thread per job). It merges the chain
(:func:`~slipstream.state.format.merge_chain`: every chunk verified first) and writes the
result as ``chunk-<S>-<index>-<digest>-c.bin``, the processor's state as of snapshot
``S``, the chain's last. The next manifest names it in place of the chunks it replaces
(the deltas written after ``S`` follow it); a chunk counts only once a committed manifest
names it, so a crash during compaction loses nothing (the next start removes the file).
Until then the file is *protected* from the store's garbage collection.

Where the merge runs: by default in a child process, ``python -m slipstream.state.compact``,
fed the request (store directory, key, chain) on stdin; it answers the new chunk's
reference on stdout. Unpickling, merging and pickling a large state then takes no GIL
from the job's cooperative threads. If the child cannot do it (e.g. a value's class is
defined in the job's ``__main__``, which a child cannot import), the merge runs on the
compaction thread instead. ``docs/performance.md`` has the measured figures.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Container, Iterable, Sequence
from typing import Any

from slipstream.state import format as fmt
from slipstream.state.store import ChunkRef, DirectorySnapshotStore, chunk_file_name, encode_chunk

__all__ = ["DEFAULT_MAX_DELTAS", "Compactor", "compact_chain"]

log = logging.getLogger("slipstream.snapshot")

#: A chain holds at most this many delta chunks before it is compacted (the next
#: snapshots still append deltas while the compaction runs).
DEFAULT_MAX_DELTAS = 4

#: The compaction child's niceness: it unpickles, merges and pickles the whole state
#: (seconds of CPU at a few million keys, every ``max_deltas + 1`` snapshots of a job
#: whose keys change little), and on a machine with few cores it would take them from
#: the job's threads, whose pauses and rate suffer (docs/performance.md); niced, it runs
#: on what the job leaves idle, and the chain meanwhile grows by a delta a snapshot.
COMPACTION_NICE = 10

Key = tuple[str, int]


def compact_chain(
    store: DirectorySnapshotStore, vertex: str, index: int, chain: Sequence[ChunkRef]
) -> ChunkRef:
    """Merge ``chain`` (of processor ``vertex#index``) into one full chunk of its last
    snapshot, written as a compaction output; returns its reference."""
    sid = chain[-1].snapshot_id
    entries = store.read_chain(chain, vertex, index, sid)
    payload = encode_chunk(entries, sid, vertex, index)
    return store.write_chunk(sid, vertex, index, fmt.CHUNK_FULL, payload, compacted=True)


def _request(store: DirectorySnapshotStore, vertex: str, index: int, chain: Sequence[ChunkRef]) -> bytes:
    return json.dumps(
        {
            "directory": store.directory,
            "key": store.key.hex(),
            "vertex": vertex,
            "index": index,
            "chain": [r.as_json() for r in chain],
        }
    ).encode("utf-8")


def compact_in_child(
    store: DirectorySnapshotStore,
    vertex: str,
    index: int,
    chain: Sequence[ChunkRef],
    started: Any = None,
) -> ChunkRef:
    """:func:`compact_chain` in a child process (the key goes over stdin, never argv;
    ``started(proc)`` is called with the ``Popen``, e.g. to kill it). Raises
    ``RuntimeError`` with the child's error text if it fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream.state.compact"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    if started is not None:
        started(proc)
    out, err = proc.communicate(_request(store, vertex, index, chain))
    if proc.returncode != 0:
        text = err.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(text[-1] if text else f"exit status {proc.returncode}")
    return ChunkRef.from_json(json.loads(out))


class Compactor:
    """The background compaction of one job execution's chains (see the module doc).
    ``submit`` a committed chain; ``take_done`` the results on the store thread."""

    def __init__(self, store: DirectorySnapshotStore, in_child: bool = True, name: str = "") -> None:
        self.store = store
        self.in_child = in_child
        self._queue: queue.Queue[tuple[Key, tuple[ChunkRef, ...]] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._busy: set[Key] = set()
        self._done: dict[Key, tuple[tuple[ChunkRef, ...], ChunkRef]] = {}
        self._thread: threading.Thread | None = None
        self._name = name
        self._stopping = False
        self._child: subprocess.Popen[bytes] | None = None
        #: chains compacted (results handed over)
        self.compacted = 0
        #: compactions that failed (logged; the chain stays as it is)
        self.failed = 0
        #: compactions dropped because their chain was superseded and its chunks
        #: collected before they ran (debug log only: normal operation)
        self.superseded = 0
        # outputs taken into chains that no committed manifest names yet
        self._unnamed: set[str] = set()

    def busy(self, key: Key) -> bool:
        with self._lock:
            return key in self._busy or key in self._done

    def idle(self) -> bool:
        """No compaction is running or queued."""
        with self._lock:
            return not self._busy

    def submit(self, key: Key, chain: Sequence[ChunkRef]) -> None:
        """Compact ``chain`` of processor ``key`` (its output file protected from GC)."""
        with self._lock:
            if key in self._busy or key in self._done:
                return
            self._busy.add(key)
        self.store.protected.add(chunk_file_name(chain[-1].snapshot_id, key[0], key[1], True))
        with self._lock:
            # started under the lock: stop() (on a worker thread, as the job ends) never
            # sees a thread it cannot join yet ("cannot join thread before it is
            # started", which left the job unfinished and join() waiting for ever)
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, name=f"slipstream-{self._name}-compaction", daemon=True
                )
                thread.start()
                self._thread = thread
        self._queue.put((key, tuple(chain)))

    def take_done(self) -> dict[Key, tuple[tuple[ChunkRef, ...], ChunkRef]]:
        """The finished compactions: per processor, the chain it replaces and the new
        chunk (still protected: the caller unprotects it once a manifest names it or
        it is not used)."""
        with self._lock:
            done, self._done = self._done, {}
        return done

    # -- what both engines do with the results: chains, then manifests ----------------
    def take_into(self, chains: dict[Key, list[ChunkRef]]) -> int:
        """Before a manifest is built from the committed ``chains``: each finished
        compaction replaces the prefix of its chain it stands for (its file stays
        protected, *unnamed*, until :meth:`settle` sees a committed manifest name it); one
        whose chain started over meanwhile is removed. Returns how many were taken."""
        taken = 0
        for key, (covers, ref) in self.take_done().items():
            chain = chains.get(key)
            n = len(covers)
            self._unnamed.add(ref.file)
            if chain is not None and tuple(chain[:n]) == covers:
                chains[key] = [ref, *chain[n:]]
                taken += 1
            else:
                self.drop(ref.file)  # superseded: the chain started over
        return taken

    def settle(self, named: Container[str], chains: Iterable[Sequence[ChunkRef]]) -> None:
        """After a commit whose manifest names the files ``named`` (the chains kept are
        ``chains``): taken outputs it names are no longer protected (the store's GC
        keeps what a committed manifest names); one it does not name and no chain
        starts with was superseded before any manifest named it: removed."""
        if not self._unnamed:
            return
        heads = {c[0].file for c in chains if c}
        for f in list(self._unnamed):
            if f in named:
                self._unnamed.discard(f)
                self.store.protected.discard(f)
            elif f not in heads:
                self.drop(f)

    def drop_unnamed(self) -> None:
        """The execution ends (stopped, no manifest being written): remove the outputs
        no committed manifest names (finished too late to be used), and the chunks a
        compaction read that the last commit's GC left because they were protected then
        (no retained manifest names them any more), so that a completed job leaves no
        file behind."""
        for _covers, ref in self.take_done().values():
            self._unnamed.add(ref.file)
        for f in list(self._unnamed):
            self.drop(f)
        collect = getattr(self.store, "collect_garbage", None)
        if collect is not None:
            collect()

    def drop(self, name: str) -> None:
        """Remove compaction output ``name``, which no committed manifest names."""
        self._unnamed.discard(name)
        self.store.protected.discard(name)
        try:
            os.unlink(os.path.join(self.store.directory, name))
        except OSError:
            pass

    def stop(self, timeout: float | None = 30.0) -> None:
        """No more compactions: a child process running one is killed, one running on
        the thread is waited for (at most ``timeout`` seconds), so that nothing writes
        into the store once the job released it. A file it left is removed by the next
        start's clean-up."""
        self._stopping = True
        self._queue.put(None)
        with self._lock:
            thread = self._thread
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()  # it removes its temporary file (see main)
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            key, chain = job
            inputs = {r.file for r in chain}
            self.store.protected.update(inputs)  # GC leaves them while they are read
            try:
                if self._stopping:
                    raise RuntimeError("the job has ended")
                ref = self._compact(key, chain)
            except Exception as e:  # noqa: BLE001 - a failed compaction only keeps the chain
                self.store.protected.difference_update(inputs)
                if not self._stopping and self._superseded(chain):
                    self.superseded += 1
                    log.debug(
                        "snapshot store %s: the chain of %s#%d (snapshots %s) was superseded "
                        "and its chunks collected before its compaction ran (%s); dropped",
                        self.store.directory,
                        key[0],
                        key[1],
                        [r.snapshot_id for r in chain],
                        e,
                    )
                else:
                    self.failed += 1
                    log.log(
                        logging.DEBUG if self._stopping else logging.WARNING,
                        "snapshot store %s: compacting the chain of %s#%d (snapshots %s) failed: "
                        "%s: %s; the chain stays as it is",
                        self.store.directory,
                        key[0],
                        key[1],
                        [r.snapshot_id for r in chain],
                        type(e).__name__,
                        e,
                    )
                # its output, if written before the failure, is never used
                output = chunk_file_name(chain[-1].snapshot_id, key[0], key[1], True)
                self.store.protected.discard(output)
                try:
                    os.unlink(os.path.join(self.store.directory, output))
                except OSError:
                    pass
                with self._lock:
                    self._busy.discard(key)
                continue
            self.store.protected.difference_update(inputs - {ref.file})
            with self._lock:
                self._busy.discard(key)
                self._done[key] = (chain, ref)
                self.compacted += 1

    def _compact(self, key: Key, chain: tuple[ChunkRef, ...]) -> ChunkRef:
        if self.in_child:
            try:
                return compact_in_child(self.store, key[0], key[1], chain, self._started)
            except Exception as e:  # noqa: BLE001
                if self._stopping or self._superseded(chain):
                    raise  # the thread would fail the same way
                log.info(
                    "snapshot store %s: compaction of %s#%d in a child process failed (%s); "
                    "compacting on the job's compaction thread",
                    self.store.directory,
                    key[0],
                    key[1],
                    e,
                )
        return compact_chain(self.store, key[0], key[1], chain)

    def _superseded(self, chain: Sequence[ChunkRef]) -> bool:
        """Whether a failed compaction's ``chain`` was superseded rather than damaged: an
        input is gone from the store and no retained committed manifest names it any
        more (the chain restarted with a full save and a commit's GC removed it before
        the compaction protected it; with few keys and a high snapshot rate that is
        normal). A chunk missing from a chain a retained manifest still names, a damaged
        chunk (it is there) or an unreadable manifest is a real failure: ``False``. A
        commit writes ``MANIFEST.json`` before its GC removes a file, so a file found
        gone here is one the manifest read below no longer names."""
        gone = {r.file for r in chain if not os.path.exists(os.path.join(self.store.directory, r.file))}
        if not gone:
            return False
        for attempt in range(2):  # a commit may remove a stale manifest while it is read
            try:
                ids = self.store.committed_ids_read_only()
                # read, not cached: the store thread owns the store's manifest cache
                named = [gone & self.store.read_manifest(i).files() for i in ids]
            except Exception:  # noqa: BLE001 - a manifest cannot be read: a real failure
                if attempt:
                    return False
                continue
            return bool(ids) and not any(named)
        return False

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._child = proc
        if self._stopping:
            proc.terminate()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slipstream.state.compact``: one compaction, the request as JSON on stdin
    (``directory``, ``key`` in hex, ``vertex``, ``index``, ``chain``), the new chunk's
    reference as JSON on stdout."""
    # SIGTERM (the job ended) unwinds: the chunk being written removes its temp file
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        os.nice(COMPACTION_NICE)  # the job's threads first (see COMPACTION_NICE)
    except OSError:  # not allowed here: run as we are
        pass
    req: dict[str, Any] = json.loads(sys.stdin.buffer.read())
    store = DirectorySnapshotStore(req["directory"], key=bytes.fromhex(req["key"]))
    chain = [ChunkRef.from_json(r) for r in req["chain"]]
    ref = compact_chain(store, str(req["vertex"]), int(req["index"]), chain)
    sys.stdout.write(json.dumps(ref.as_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
