"""A forked writer for one processor's full chunk (``JobConfig(snapshot_writer="fork")``).

The way Redis saves: at the barrier the processor's thread forks; the child process
holds a copy-on-write view of the processor's state as of the barrier, encodes that
processor's saved entries with the chunk codec (:mod:`slipstream.state.format`), writes
the chunk file as the store does (signed, temp + fsync + rename:
:func:`~slipstream.state.store.write_chunk_file`), sends the chunk's ref (or the error)
back on a pipe and ``os._exit``\\ s. The job's pause is the fork; nothing is copied in the
job's process and the encoding takes none of its GIL. The coordinator's store thread
waits for the child (:meth:`ForkedChunk.wait`) and commits the manifest as usual.

The child runs no code of the job besides pickling the state's values: no logging, no
lock (locks other threads held at the fork stay held in the child forever), no import
(the chunk codec's modules are imported by the parent), and it closes every inherited
file descriptor but its pipe at once (the store's lock among them: a child must not keep
the store locked for a job that died). Nor does it collect garbage: the cyclic
collector is off across the fork and stays off in the child (as ``subprocess`` does
around its fork). The child inherits the parent's garbage not yet collected, and a
collection there would run the parent's finalizers in the child: a disk-backed state's
``weakref.finalize`` closes its SQLite connection (SQLite's own mutexes, which another
thread of the job may hold at the fork: never released in the child) and removes its
directory, a state view's finalizer takes that view's lock. Its allocations are few and
it ends with ``os._exit``: it needs no collection. Its chunk file has a name of its own
(``chunk_file_name(attempt=...)``): a child orphaned by a killed job can finish its
write but never overwrite a chunk a later execution wrote and named.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import threading
from typing import Any

from slipstream.core.errors import SnapshotError
from slipstream.state import format as fmt
from slipstream.state.keyed import DELTA, KeyedState, StateMap, StateMapSave
from slipstream.state.store import ChunkRef, chunk_file_name, write_all, write_chunk_file

__all__ = ["ForkedChunk", "fork_chunk", "fork_writer", "has_live_map"]

_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536


def has_live_map(entries: list[tuple[Any, Any]]) -> bool:
    """Whether ``entries`` hold a :class:`KeyedState` handed over itself (a full save or
    a live delta under ``snapshot_writer="fork"``) rather than a copy."""
    return any(
        type(k) is StateMap and isinstance(v.upserts, KeyedState) for k, v in entries
    )


def copied_maps(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """``entries`` with every map handed over itself replaced by what the thread writer
    gets: a plain ``dict`` copy for a full save, the changed keys' values and the removed
    keys for a *live delta* (``StateMapSave(DELTA, <the map>, <its changed keys>,
    base_id)``, see :meth:`KeyedState.snapshot_entry`)."""
    return [
        (k, materialized(v))
        if type(k) is StateMap and isinstance(v.upserts, KeyedState)
        else (k, v)
        for k, v in entries
    ]


def materialized(save: StateMapSave) -> StateMapSave:
    """A map handed over itself (full, or a live delta) as plain data."""
    m = save.upserts
    if save.mode != DELTA:
        return StateMapSave(save.mode, dict(m), save.removed, save.base_id)
    missing = _MISSING
    get = m.get
    upserts = {}
    removed = []
    for k in save.removed:  # a live delta's changed keys
        v = get(k, missing)
        if v is missing:
            removed.append(k)
        else:
            upserts[k] = v
    return StateMapSave(DELTA, upserts, tuple(removed), save.base_id)


_MISSING: Any = object()


class ForkedChunk:
    """A child process writing one processor's full chunk of snapshot ``snapshot_id``."""

    def __init__(self, pid: int, fd: int, snapshot_id: int, vertex: str, index: int, name: str):
        self.pid = pid
        self.fd = fd
        self.snapshot_id = snapshot_id
        self.vertex = vertex
        self.index = index
        self.name = name
        #: the child's peak RSS in KiB (``ru_maxrss``), once it was waited for
        self.peak_rss_kb = 0
        #: the text of the child's error (its state could not be encoded or written)
        self.error: str | None = None
        self._done = False

    def wait(self) -> ChunkRef:
        """Wait for the child (blocking reads and ``waitpid`` release the GIL) and return
        the chunk it wrote; :class:`SnapshotError` naming the processor otherwise."""
        parts = []
        try:
            while True:
                b = os.read(self.fd, 65536)
                if not b:
                    break
                parts.append(b)
        finally:
            self._reap()
        where = f"snapshot {self.snapshot_id}: {self.vertex}#{self.index}"
        try:
            msg = json.loads(b"".join(parts).decode("utf-8")) if parts else {}
        except ValueError:
            msg = {}
        if "ref" in msg:
            return ChunkRef.from_json(msg["ref"])
        if "unpicklable" in msg:
            self.error = str(msg["unpicklable"])
            raise SnapshotError(f"{where}: snapshot state cannot be pickled: {self.error}")
        self.error = str(msg.get("error") or f"the writer process ended ({self._status})")
        raise SnapshotError(f"{where}: the forked snapshot writer failed: {self.error}")

    _status = "no status"

    def _reap(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            os.close(self.fd)
        except OSError:
            pass
        try:
            _, status, usage = os.wait4(self.pid, 0)
        except ChildProcessError:
            return
        self.peak_rss_kb = int(usage.ru_maxrss)
        if os.WIFSIGNALED(status):
            self._status = f"killed by signal {os.WTERMSIG(status)}"
        else:
            self._status = f"exit status {os.WEXITSTATUS(status)}"

    def cancel(self) -> None:
        """Stop the child (its snapshot will not be committed) and reap it."""
        if not self._done:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
            self._reap()


def fork_chunk(
    directory: str,
    key: bytes,
    snapshot_id: int,
    vertex: str,
    index: int,
    entries: list[tuple[Any, Any]],
    mode: str = fmt.CHUNK_FULL,
) -> ForkedChunk:
    """Fork a child that writes ``entries`` (one processor's save, maps handed over
    themselves) as its chunk of snapshot ``snapshot_id`` (``mode``: full or delta) into
    store ``directory`` signed with ``key``. Call it on the processor's thread before the processor runs
    again: the child sees the state as it is at the fork."""
    name = chunk_file_name(snapshot_id, vertex, index, attempt="f" + secrets.token_hex(4))
    r, w = os.pipe()
    try:
        pid = fork_writer(w)
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # the child: never returns
        _child(w, directory, key, name, snapshot_id, vertex, index, entries, mode)
    os.close(w)
    return ForkedChunk(pid, r, snapshot_id, vertex, index, name)


def fork_writer(*keep: int) -> int:
    """``os.fork()`` for a child that encodes state as of now and answers on the file
    descriptors ``keep`` (a chunk writer here, a copy-on-write save's encoder in
    :mod:`slipstream.state.live`): the cyclic collector is off across the fork and stays
    off in the child, and the child closes every other inherited file descriptor at
    once (module doc). Returns the child's pid, or 0 in the child, which must end with
    ``os._exit`` and run no code of the job besides encoding."""
    _pause_gc()  # the child starts with the collector off (module doc)
    try:
        pid = os.fork()
    except BaseException:
        _resume_gc()
        raise
    if pid == 0:
        gc.disable()  # off since the fork already; stays off: no finalizer of the
        # parent's garbage runs here (module doc)
        low = 3
        for fd in sorted(keep):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, _MAX_FD)
        return 0
    _resume_gc()
    return pid


# The collector is off while any thread of the process forks a writer: processors fork
# on their own threads, and one that resumed it as another forks would let that child
# start with it on. Taken only around gc.disable/enable (never across the fork).
_gc_lock = threading.Lock()
_gc_forks = 0
_gc_was_enabled = False


def _pause_gc() -> None:
    global _gc_forks, _gc_was_enabled
    with _gc_lock:
        if _gc_forks == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_forks += 1


def _resume_gc() -> None:
    global _gc_forks
    with _gc_lock:
        _gc_forks -= 1
        if _gc_forks == 0 and _gc_was_enabled:
            gc.enable()


def _child(
    w: int,
    directory: str,
    key: bytes,
    name: str,
    snapshot_id: int,
    vertex: str,
    index: int,
    entries: list[tuple[Any, Any]],
    mode: str,
) -> None:
    code = 1
    try:
        try:
            records = fmt.encode_records(copied_maps(entries))
            payload = fmt.encode_payload(records)
        except Exception as e:  # noqa: BLE001 - the state cannot be pickled
            msg: dict[str, Any] = {"unpicklable": str(e)}
        else:
            ref = write_chunk_file(
                directory, key, name, snapshot_id, vertex, index, mode, payload
            )
            msg = {"ref": ref.as_json()}
        write_all(w, [json.dumps(msg).encode("utf-8")])
        code = 0
    except BaseException as e:  # noqa: BLE001 - nothing may escape into the job's code
        try:
            write_all(w, [json.dumps({"error": f"{type(e).__name__}: {e}"}).encode("utf-8")])
        except BaseException:  # noqa: BLE001, S110
            pass
    finally:
        os._exit(code)

