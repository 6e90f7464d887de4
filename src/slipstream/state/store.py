"""Durable snapshot storage: a directory that a later process can read.

A committed snapshot is a signed *manifest* ``snapshot-<id:010d>.bin`` naming, per vertex
and processor, a *chain* of signed chunk files (a full chunk, then deltas); the format is
documented in :mod:`~slipstream.state.format` (version 3). Stores written before it (format
2: one pickled ``SnapshotData`` per file) still restore; new snapshots are format 3.

Writing goes through the store protocol (:class:`SnapshotStore`): :meth:`~SnapshotStore.begin`
a snapshot, :meth:`~SnapshotStore.write_chunk` per processor (temp name, fsync, rename),
:meth:`~SnapshotStore.commit` its manifest (temp + fsync + rename, then the directory's
fsync, which makes the chunks' renames durable too). Then ``MANIFEST.json`` (also signed)
names the committed ids, the job and execution that own the store and the fingerprint of
their DAG. If it cannot be written the new manifest is removed again, so a snapshot counts
as committed only once both are in place; a chunk counts only once a committed manifest
names it. Then the store's *generation* (the id of its newest committed snapshot) is
recorded outside the store, where restoring the directory from a backup cannot take it
back (:mod:`~slipstream.state.lineage`); only then may sinks publish the snapshot's
output. Then the manifests beyond ``keep`` are removed, and every chunk file that no
retained committed manifest names (never one of a snapshot newer than the committed
ones, nor a compaction's output not yet named).

Reading verifies every signature *before* unpickling (see
:mod:`~slipstream.state.signing`). ``MANIFEST.json`` is not a single point of failure:
every snapshot manifest carries its id, job and execution, so a deleted or damaged
``MANIFEST.json`` is rebuilt from the files. What the store never does is fall back
silently: if the newest committed snapshot (its manifest or a chunk it names) is missing,
corrupt or unsigned, :meth:`latest` raises
:class:`~slipstream.core.errors.SnapshotStoreDamagedError`, because an older snapshot
would republish output the newest one already published. The message lists the intact
older snapshots; restoring one explicitly (``restore_from=store.read(id)``) accepts those
duplicates.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import hmac
import io
import json
import logging
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from slipstream.core.errors import SnapshotError, SnapshotStoreDamagedError, SnapshotStoreInUseError
from slipstream.core.files import atomic_write
from slipstream.core.pickling import cloudpickle
from slipstream.state import format as fmt
from slipstream.state.lineage import DagShape, dag_fingerprint, record_generation
from slipstream.state.signing import resolve_key, sign, verify

log = logging.getLogger("slipstream.snapshot")

MANIFEST = "MANIFEST.json"
LOCK = ".lock"
MAGIC = fmt.MAGIC
MAGIC_2 = b"SLIPSTREAM-SNAPSHOT 2\n"
FORMAT = fmt.FORMAT
_PREFIX, _SUFFIX = "snapshot-", ".bin"
_CHUNK_PREFIX = "chunk-"


@dataclass
class VertexState:
    """One vertex's part of a snapshot."""

    total_parallelism: int
    entries: dict[int, list[tuple[Any, Any]]] = field(default_factory=dict)
    completed: set[int] = field(default_factory=set)
    #: completed processors whose entries are their *completion state* (what they
    #: offered to the snapshot in ``complete()``: a last transaction to commit); older
    #: snapshots lack the attribute (read it with ``getattr(vs, "final", ())``)
    final: set[int] = field(default_factory=set)


@dataclass
class SnapshotData:
    """A committed snapshot: per vertex, each processor's saved entries (the in-memory
    form; on disk it is a manifest and chunks, :mod:`~slipstream.state.format`)."""

    snapshot_id: int
    job_name: str
    vertices: dict[str, VertexState] = field(default_factory=dict)
    #: the shape of the job's DAG (vertex names and edges, see
    #: :func:`~slipstream.state.lineage.dag_shape`); ``None`` in snapshots of
    #: older versions (the class default answers for them)
    dag_shape: Any = None
    #: an engine's own metadata about the snapshot, plain data only (str keys; lists,
    #: tuples, dicts, str, int, float, bool, None; never a slipstream class), so a
    #: snapshot file names no class of the engine that wrote it (the Spark engine's
    #: epoch id and watermarks, see :mod:`slipstream.spark.streaming`); empty in
    #: snapshots of older versions (:meth:`DirectorySnapshotStore.read` fills it in)
    extra: dict[str, Any] = field(default_factory=dict)
    #: in memory only, set by :meth:`DirectorySnapshotStore.read`: the store directory
    #: and each processor's chain ``(vertex, index) -> [ChunkRef]`` the entries were
    #: merged from (a resumed job continues the chains of processors restored as they
    #: were, :func:`~slipstream.state.keyed.continue_restored_chain`)
    source: tuple[str, dict[tuple[str, int], list[ChunkRef]]] | None = field(
        default=None, repr=False, compare=False
    )

    def entry_count(self) -> int:
        return sum(len(es) for v in self.vertices.values() for es in v.entries.values())


def pickle_state(obj: Any) -> bytes:
    """Pickle snapshot state: the C pickler (several times faster on large state), or
    cloudpickle when the state holds what only cloudpickle encodes (lambdas, classes
    defined in ``__main__``)."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - PicklingError, TypeError, AttributeError
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


# -- the manifest in memory ---------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkRef:
    """A chunk file as a manifest names it: the file (in the store directory), its MAC,
    the snapshot whose state it brings its chain to, full or delta, and its size."""

    file: str
    mac: str
    snapshot_id: int
    mode: str
    size: int

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "mac": self.mac,
            "snapshot": self.snapshot_id,
            "mode": self.mode,
            "bytes": self.size,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> ChunkRef:
        return ChunkRef(str(d["file"]), str(d["mac"]), int(d["snapshot"]), str(d["mode"]), int(d["bytes"]))

    def as_manifest(self, vertex: str, index: int) -> list[Any] | dict[str, Any]:
        """How a manifest spells this ref (processor ``vertex#index``'s chain): ``[snapshot,
        mode, bytes, mac]`` with the MAC in URL-safe base64 (43 characters), and the
        file's name last only when it is not the one :func:`chunk_file_name` gives
        (a compaction's, a Spark task attempt's): ~60 bytes a ref where the object
        :meth:`as_json` gives is ~190, and a manifest names every chunk of every chain
        (a small state's delta pickles to a few hundred bytes). A MAC that is not 64 hex
        digits keeps the object."""
        try:
            raw = bytes.fromhex(self.mac)
        except ValueError:
            raw = b""
        if len(raw) != 32:
            return self.as_json()
        out: list[Any] = [
            self.snapshot_id,
            self.mode,
            self.size,
            base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii"),
        ]
        if self.file != chunk_file_name(self.snapshot_id, vertex, index):
            out.append(self.file)
        return out

    @staticmethod
    def from_manifest(r: Any, vertex: str, index: int) -> ChunkRef:
        """The inverse of :meth:`as_manifest`; also reads the object spelling of stores
        written before the compact one (:meth:`from_json`)."""
        if type(r) is dict:
            return ChunkRef.from_json(r)
        sid, mode, size, mac = int(r[0]), str(r[1]), int(r[2]), str(r[3])
        name = str(r[4]) if len(r) > 4 else chunk_file_name(sid, vertex, index)
        return ChunkRef(name, base64.urlsafe_b64decode(mac + "=").hex(), sid, mode, size)


@dataclass
class VertexManifest:
    """One vertex in a manifest (as :class:`VertexState` without entries): its parallelism, its completed processors (``final``:
    those whose chain is their completion state) and each processor's chain."""

    total_parallelism: int
    completed: set[int] = field(default_factory=set)
    final: set[int] = field(default_factory=set)
    chains: dict[int, list[ChunkRef]] = field(default_factory=dict)


@dataclass
class Manifest:
    """A snapshot as the store commits it (format 3): chains of chunk files."""

    snapshot_id: int
    job_name: str
    vertices: dict[str, VertexManifest] = field(default_factory=dict)
    dag_shape: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def files(self) -> set[str]:
        return {r.file for vm in self.vertices.values() for c in vm.chains.values() for r in c}

    def body(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.snapshot_id,
            "job": self.job_name,
            "dag_shape": self.dag_shape,
            "extra": fmt.to_json(self.extra),
            "vertices": {name: _vertex_body(name, vm) for name, vm in self.vertices.items()},
        }

    @staticmethod
    def from_body(body: dict[str, Any]) -> Manifest:
        shape = body.get("dag_shape")
        if shape is not None:
            shape = (tuple(shape[0]), tuple(tuple(e) for e in shape[1]))
        m = Manifest(int(body["snapshot_id"]), str(body["job"]), dag_shape=shape)
        m.extra = fmt.from_json(body.get("extra") or {})
        for name, v in body["vertices"].items():
            m.vertices[name] = VertexManifest(
                int(v["parallelism"]),
                {int(i) for i in v.get("completed", ())},
                {int(i) for i in v.get("final", ())},
                {
                    int(i): [ChunkRef.from_manifest(r, name, int(i)) for r in c]
                    for i, c in v.get("chains", {}).items()
                },
            )
        return m


def _vertex_body(name: str, vm: VertexManifest) -> dict[str, Any]:
    """A vertex in a manifest body: its parallelism, and its completed and final
    processors and chains where it has any (an absent field reads as empty)."""
    out: dict[str, Any] = {"parallelism": vm.total_parallelism}
    if vm.completed:
        out["completed"] = sorted(vm.completed)
    if vm.final:
        out["final"] = sorted(vm.final)
    if vm.chains:
        out["chains"] = {
            str(i): [r.as_manifest(name, i) for r in chain] for i, chain in sorted(vm.chains.items())
        }
    return out


class SnapshotStore(Protocol):
    """What the snapshot coordinator and a restore need of a store (the directory store
    is one implementation). A snapshot is written as :meth:`begin`, a
    :meth:`write_chunk` per processor with state, then :meth:`commit` of its manifest
    (or :meth:`abort`); it counts as committed only once :meth:`commit` returned."""

    directory: str

    def lock(self) -> None: ...

    def begin(self, snapshot_id: int) -> None: ...

    def write_chunk(
        self, snapshot_id: int, vertex: str, index: int, mode: str, payload: bytes | list[bytes]
    ) -> ChunkRef: ...

    def commit(self, manifest: Manifest, chunk_bytes: int | None = None) -> None: ...

    def abort(self, snapshot_id: int) -> None: ...

    def read_chunks(
        self, snapshot_id: int, processors: Iterable[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], list[tuple[Any, Any]]]: ...

    def read(
        self,
        snapshot_id: int,
        processors: Iterable[tuple[str, int]] | None = None,
        *,
        columns: bool = False,
    ) -> SnapshotData: ...

    def latest(self) -> SnapshotData | None: ...


def chunk_file_name(
    snapshot_id: int, vertex: str, index: int, compacted: bool = False, attempt: str = ""
) -> str:
    """``chunk-<id>-<index>-<digest of the vertex name>[-c][-t<attempt>].bin`` (vertex
    names may hold any character; the chunk's header names the vertex). ``attempt``
    makes the name unique per writer (a Spark task attempt: a retried or replayed task
    never overwrites a chunk another attempt wrote, which a manifest may name)."""
    digest = hashlib.sha256(vertex.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    tail = f"-t{attempt}" if attempt else ""
    return f"{_CHUNK_PREFIX}{snapshot_id:010d}-{index}-{digest}{'-c' if compacted else ''}{tail}{_SUFFIX}"


def chunk_file_id(name: str) -> int | None:
    """The snapshot id in a chunk file's name (``None``: not a chunk file)."""
    if not (name.startswith(_CHUNK_PREFIX) and name.endswith(_SUFFIX)):
        return None
    try:
        return int(name[len(_CHUNK_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return None


def _write_synced(path: str, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``path`` under a temporary name, fsync it and rename it into place (the
    directory's fsync is the commit's)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        try:
            write_all(fd, parts)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


_IOV_MAX = 1024  # buffers per writev (Linux's IOV_MAX)


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` to ``fd`` in order: ``os.writev`` of up to :data:`_IOV_MAX` of
    them per system call. One call lets the GIL go once, where a write per part (a
    copy-on-write save's ~450 fragments at 10M keys) took it back once per part, each
    time waiting up to the switch interval (5 ms) for a busy processing thread."""
    # each part as a view of bytes: writev returns bytes, and len() of a view of
    # another item size (an array's buffer) counts items
    rest = [memoryview(p).cast("B") for p in parts if len(p)]
    i = 0
    while i < len(rest):
        n = os.writev(fd, rest[i : i + _IOV_MAX])
        if n <= 0:
            raise OSError(f"writev wrote nothing to fd {fd}")
        while n:  # past the buffers written whole, into a partly written one
            size = len(rest[i])
            if n < size:
                rest[i] = rest[i][n:]
                break
            n -= size
            i += 1


@dataclass(frozen=True)
class StoreOwner:
    """Who wrote a store's snapshots: the job's name and its execution's unique id;
    ``completed`` once that execution finished normally (nothing is left to resume)."""

    job: str
    execution: str
    completed: bool = False


class DirectorySnapshotStore:
    """Snapshots of one job execution in ``directory`` (the newest ``keep`` are kept).

    ``key`` signs and verifies the files (``bytes``/``str``); ``None`` means the
    ``SLIPSTREAM_SNAPSHOT_KEY`` environment variable or the store's own random key.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int = 3,
        key: bytes | str | None = None,
    ) -> None:
        self.directory = os.fspath(directory)
        self.keep = max(2, keep)
        self._explicit_key = key
        self._key: bytes | None = None
        self.key_origin = ""
        self.job_name: str | None = None
        self.execution_id = ""
        self.dag_shape: DagShape | None = None
        self._warned_rebuild = False
        self.last_write_bytes: int | None = None  # size of the last committed file
        self._lock_fd: int | None = None
        # the snapshot being written (begin .. commit): its chunk files and their bytes
        self._pending_id: int | None = None
        self._pending_files: list[str] = []
        self._pending_bytes = 0
        # committed manifest id -> the chunk files it names (for GC)
        self._files_of: dict[int, set[str]] = {}
        #: chunk files written but not yet named by a committed manifest that GC must
        #: leave alone (a compaction's output)
        self.protected: set[str] = set()

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({self.directory!r})"

    # -- keys and paths --------------------------------------------------------------------
    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key, self.key_origin = resolve_key(self.directory, self._explicit_key)
        return self._key

    def _path(self, snapshot_id: int) -> str:
        return os.path.join(self.directory, f"{_PREFIX}{snapshot_id:010d}{_SUFFIX}")

    def file_ids(self) -> list[int]:
        """Ids of the snapshot files present (committed or not), sorted."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        ids = []
        for n in names:
            if n.startswith(_PREFIX) and n.endswith(_SUFFIX):
                try:
                    ids.append(int(n[len(_PREFIX) : -len(_SUFFIX)]))
                except ValueError:
                    continue
        return sorted(ids)

    # -- the manifest ------------------------------------------------------------------------
    def _manifest_body(self, manifest: dict[str, Any]) -> bytes:
        body = {k: v for k, v in manifest.items() if k != "mac"}
        return json.dumps(body, sort_keys=True).encode("utf-8")

    def _load_manifest(self) -> tuple[dict[str, Any] | None, str | None]:
        """The verified manifest (``None`` if absent or damaged) and, for a damaged one,
        why it cannot be used. Only reads."""
        path = os.path.join(self.directory, MANIFEST)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return None, None
        try:
            manifest = json.loads(raw)
            ok = isinstance(manifest, dict) and verify(
                self.key, str(manifest.get("mac", "")), self._manifest_body(manifest)
            )
            if ok:
                manifest["committed"] = sorted(int(i) for i in manifest["committed"])
                return manifest, None
            return None, "its signature does not match"
        except (ValueError, KeyError, TypeError) as e:
            return None, f"it cannot be parsed ({e})"

    def _read_manifest(self) -> dict[str, Any] | None:
        """The verified manifest; ``None`` if absent. A damaged one is logged and
        treated as absent (the files are the truth)."""
        manifest, reason = self._load_manifest()
        if reason is not None:
            log.warning(
                "snapshot manifest %s is damaged: %s; rebuilding it from the snapshot files",
                os.path.join(self.directory, MANIFEST),
                reason,
            )
        return manifest

    def _write_manifest(self, ids: Sequence[int], completed: bool = False) -> None:
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "job": self.job_name or "",
            "execution": self.execution_id,
            "committed": list(ids),
            "latest": ids[-1] if ids else None,
            "completed": completed,
        }
        if self.dag_shape is not None:
            manifest["dag"] = dag_fingerprint(self.dag_shape)
        manifest["mac"] = sign(self.key, self._manifest_body(manifest))
        atomic_write(os.path.join(self.directory, MANIFEST), json.dumps(manifest).encode("utf-8"))

    def committed_ids(self) -> list[int]:
        """The committed snapshot ids, oldest first. Without a usable manifest they are
        rebuilt from the snapshot files (each file is only ever renamed into place
        complete, and carries its own id): the recovery path of the job that owns the
        store (its restore, its next commit). Readers use
        :meth:`committed_ids_read_only`: to them a snapshot file the manifest does not
        name yet is not committed."""
        manifest = self._read_manifest()
        if manifest is not None:
            return list(manifest["committed"])
        ids = self.file_ids()
        if ids and not self._warned_rebuild:
            self._warned_rebuild = True
            log.warning(
                "snapshot store %s has no usable %s; rebuilt it from %d snapshot file(s): %s",
                self.directory,
                MANIFEST,
                len(ids),
                ids,
            )
        return ids[-self.keep :]

    def committed_ids_read_only(self) -> list[int]:
        """The committed snapshot ids as ``MANIFEST.json`` lists them, for a reader (the
        state readers, the dashboard): nothing is rebuilt, written, locked or cleaned
        up, and no snapshot file is trusted that the manifest does not name. Without a
        manifest (the job has not committed its first snapshot: its files may be in
        place, the manifest not yet) the list is empty; a damaged manifest is a
        :class:`SnapshotStoreDamagedError` (only the job that owns the store rebuilds
        it, when it resumes: :meth:`committed_ids`)."""
        manifest, reason = self._load_manifest()
        if reason is not None:
            raise SnapshotStoreDamagedError(
                f"snapshot store {self.directory} is damaged: its {MANIFEST} "
                f"{os.path.join(self.directory, MANIFEST)} cannot be used: {reason}; a "
                f"reader does not rebuild it (a job resuming from the store rebuilds it "
                f"from the snapshot files)"
            )
        return [] if manifest is None else list(manifest["committed"])

    def owner(self) -> StoreOwner | None:
        """Who wrote the committed snapshots (``None`` for an empty store)."""
        manifest = self._read_manifest()
        if manifest is not None:
            if not manifest["committed"]:
                return None
            return StoreOwner(
                str(manifest.get("job", "")),
                str(manifest.get("execution", "")),
                bool(manifest.get("completed", False)),
            )
        for i in reversed(self.file_ids()):
            try:
                header = self.read_header(i)
            except SnapshotError:
                continue
            return StoreOwner(str(header.get("job", "")), str(header.get("execution", "")))
        if self.file_ids():
            return StoreOwner("?", "?")  # files nobody can vouch for: not ours either
        return None

    # -- exclusive use ------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the store for this process's job until :meth:`unlock` (or the process
        ends): ``fcntl.flock`` on ``<store>/.lock``. Raises
        :class:`SnapshotStoreInUseError` while another job holds it: a job releases it
        when it ends, before its status turns terminal and ``join()`` returns."""
        if self._lock_fd is not None:
            return
        self.ensure_directory()
        path = os.path.join(self.directory, LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise SnapshotStoreInUseError(
                f"snapshot store {self.directory} is in use by another running job ({path} "
                f"is locked). A job holds its store until it has ended: cancel() only asks "
                f"it to stop, so join() a cancelled job before giving its store to another "
                f"one; or give this job its own snapshot_store"
            ) from e
        self._lock_fd = fd

    def _keep_lock(self) -> None:
        """Before a write: if the store directory was removed or replaced while the job
        holds it (its lock file is gone), take the new directory's lock, with a warning.
        Each snapshot is complete, so the job goes on writing whole snapshots there; but
        the lock it held was on a file nobody else sees, and another job could have taken
        the store. Raises :class:`SnapshotStoreInUseError` if one did."""
        fd = self._lock_fd
        if fd is None:
            return
        path = os.path.join(self.directory, LOCK)
        held = os.fstat(fd)
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):
                return
        except FileNotFoundError:
            pass
        log.warning(
            "snapshot store %s was removed or replaced while job %s held it (its lock file "
            "%s is gone): the snapshots it held are lost; taking the store again and writing "
            "the next snapshots there",
            self.directory,
            self.job_name,
            path,
        )
        self._lock_fd = None
        os.close(fd)
        self.lock()

    def unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    # -- writing ------------------------------------------------------------------------------
    def bind(self, job_name: str, execution_id: str, dag_shape: DagShape | None = None) -> None:
        """Record the execution that writes the following snapshots (and its DAG's shape,
        stamped on each snapshot)."""
        self.job_name = job_name
        self.execution_id = execution_id
        if dag_shape is not None:
            self.dag_shape = dag_shape

    def ensure_directory(self) -> None:
        """Create the store directory (``0700``); refuse one owned by another user."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        st = os.stat(self.directory)
        if st.st_uid != os.getuid():
            raise SnapshotError(
                f"snapshot store {self.directory} is owned by uid {st.st_uid}, not by this "
                f"user (uid {os.getuid()})"
            )

    def begin(self, snapshot_id: int) -> None:
        """Start writing snapshot ``snapshot_id`` (its chunks, then :meth:`commit`)."""
        self._keep_lock()
        self.ensure_directory()
        self._pending_id = snapshot_id
        self._pending_files = []
        self._pending_bytes = 0

    def write_chunk(
        self,
        snapshot_id: int,
        vertex: str,
        index: int,
        mode: str,
        payload: bytes | list[bytes],
        compacted: bool = False,
    ) -> ChunkRef:
        """Write one processor's chunk (``payload``: :func:`~slipstream.state.format.
        encode_payload` of its records), signed, fsynced and renamed into place; returns
        what the manifest records of it. ``compacted``: written by compaction (it does
        not count as the snapshot's own bytes, and its name differs)."""
        name = chunk_file_name(snapshot_id, vertex, index, compacted)
        ref = write_chunk_file(self.directory, self.key, name, snapshot_id, vertex, index, mode, payload)
        path = os.path.join(self.directory, name)
        size = ref.size
        if not compacted and snapshot_id == self._pending_id:
            self._pending_files.append(path)
            self._pending_bytes += size
        return ref

    def abort(self, snapshot_id: int) -> None:
        """Snapshot ``snapshot_id`` will not be committed: remove the chunks it wrote."""
        if snapshot_id == self._pending_id:
            for path in self._pending_files:
                _unlink(path)
            self._pending_files = []
            self._pending_id = None

    def commit(self, manifest: Manifest, chunk_bytes: int | None = None) -> None:
        """Commit snapshot ``manifest`` (its chunks written): signed manifest file (temp,
        fsync, rename, the directory's fsync), then ``MANIFEST.json``, then the
        generation outside the store; then the manifests beyond ``keep`` and the chunk
        files no retained manifest names are removed. Raises ``OSError`` (disk full,
        read-only, ...) with nothing committed, or, when only the generation could not
        be recorded, with the snapshot in the store but not to be published yet (as
        after a crash before its sinks commit: the next snapshot names its output too).
        ``chunk_bytes``: the bytes of the chunks this snapshot wrote when others wrote
        them (:func:`write_chunk_file`, e.g. Spark executors); by default those written
        through :meth:`write_chunk` since :meth:`begin`."""
        sid = manifest.snapshot_id
        if self._pending_id != sid:
            self.begin(sid)
        if manifest.dag_shape is None and self.dag_shape is not None:
            manifest.dag_shape = self.dag_shape
        body = fmt.dumps(manifest.body())
        if chunk_bytes is None:
            chunk_bytes = self._pending_bytes
        info: dict[str, Any] = {
            "format": FORMAT,
            "snapshot_id": sid,
            "job": self.job_name or manifest.job_name or "",
            "execution": self.execution_id,
            "size": len(body),
            "created": time.time(),
            "chunk_bytes": chunk_bytes,
        }
        if self.dag_shape is not None:
            info["dag"] = dag_fingerprint(self.dag_shape)
        header = json.dumps(info, sort_keys=True, separators=(",", ":")).encode("utf-8")
        mac = sign(self.key, header, b"\n", body).encode("ascii")
        path = self._path(sid)
        try:
            previous = self.committed_ids()
            atomic_write(path, [MAGIC, mac, b"\n", header, b"\n", body])
        except BaseException:
            self.abort(sid)
            raise
        self.last_write_bytes = chunk_bytes + len(MAGIC) + len(mac) + len(header) + 2 + len(body)
        try:
            ids = sorted(set(previous) | {sid})
            stale, ids = ids[: -self.keep], ids[-self.keep :]
            self._write_manifest(ids)
        except BaseException:
            _unlink(path)  # not committed: the manifest does not name it
            self.abort(sid)
            raise
        self._pending_id = None
        self._pending_files = []
        self._files_of[sid] = manifest.files()
        record_generation(self.directory, self.job_name or "", self.execution_id, sid)
        for i in stale:
            _unlink(self._path(i))
            self._files_of.pop(i, None)
        self._collect_garbage(ids, upto=sid)

    def write(self, data: SnapshotData) -> None:
        """Commit ``data`` durably as one snapshot: a full chunk per processor with
        entries (:func:`encode_snapshot`)."""
        if self.job_name is None:
            self.job_name = data.job_name
        if data.dag_shape is None and self.dag_shape is not None:
            data.dag_shape = self.dag_shape
        self.begin(data.snapshot_id)
        try:
            manifest = encode_snapshot(self, data)
        except BaseException:
            self.abort(data.snapshot_id)
            raise
        self.commit(manifest)

    def mark_completed(self) -> None:
        """The owning execution finished normally: a later ``resume`` starts fresh."""
        ids = self.committed_ids()
        if ids:
            self._write_manifest(ids, completed=True)
            record_generation(
                self.directory, self.job_name or "", self.execution_id, ids[-1], completed=True
            )

    # -- disk use ------------------------------------------------------------------------------
    def _names_of(self, snapshot_id: int) -> set[str] | None:
        """The chunk files committed manifest ``snapshot_id`` names (``None``: it cannot
        be read; format 2 files name none)."""
        files = self._files_of.get(snapshot_id)
        if files is None:
            try:
                files = self._files_of[snapshot_id] = self.read_manifest(snapshot_id).files()
            except SnapshotError:
                return None
        return files

    def collect_garbage(self) -> list[str]:
        """Remove the chunk files no retained committed manifest names, of snapshots up
        to the newest committed one, except :attr:`protected` ones: what a commit does,
        again, for files that were protected then (a compaction's inputs while it ran,
        e.g. when the job ends during one). Returns the names."""
        retained = self.committed_ids()
        if not retained:
            return []
        return self._collect_garbage(retained, upto=retained[-1])

    def _collect_garbage(self, retained: Sequence[int], upto: int | None) -> list[str]:
        """Remove the chunk files no manifest of ``retained`` names, of snapshots up to
        ``upto`` (``None``: any; a newer one's chunks may belong to a snapshot being
        written), except :attr:`protected` ones (a compaction's output not yet named).
        Nothing is removed if a retained manifest cannot be read. Returns the names."""
        needed: set[str] = set()
        for i in retained:
            files = self._names_of(i)
            if files is None:
                return []
            needed |= files
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        removed = []
        for n in names:
            cid = chunk_file_id(n)
            if cid is None or n in needed or n in self.protected:
                continue
            if upto is not None and cid > upto:
                continue
            _unlink(os.path.join(self.directory, n))
            removed.append(n)
        return removed

    def disk_bytes(self) -> int:
        """The bytes of the store's files (manifests, chunks, ``MANIFEST.json``)."""
        total = 0
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    if e.name.endswith((_SUFFIX, ".json")) and not e.name.startswith("."):
                        try:
                            total += e.stat().st_size
                        except OSError:
                            continue
        except FileNotFoundError:
            return 0
        return total

    def clean_up(self) -> list[str]:
        """Remove leftover temporary files, snapshot files the manifest does not name
        (pruned or never committed) and chunk files no committed snapshot names. Only
        with a verified manifest: without one every file may be needed to rebuild it.
        Returns the names removed."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        manifest = self._read_manifest()
        keep = set(manifest["committed"]) if manifest is not None else None
        removed = []
        for n in names:
            if n.startswith(".tmp-"):
                removed.append(n)
            elif keep is not None and n.startswith(_PREFIX) and n.endswith(_SUFFIX):
                try:
                    if int(n[len(_PREFIX) : -len(_SUFFIX)]) not in keep:
                        removed.append(n)
                except ValueError:
                    continue
        for n in removed:
            _unlink(os.path.join(self.directory, n))
        if keep is not None:
            removed += self._collect_garbage(sorted(keep), upto=None)
        if removed:
            log.info("snapshot store %s: removed leftover files %s", self.directory, removed)
        return removed

    def clear(self) -> None:
        """Remove every snapshot file, chunk and the manifest (a fresh start here)."""
        for i in self.file_ids():
            _unlink(self._path(i))
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            names = []
        for n in names:
            if chunk_file_id(n) is not None:
                _unlink(os.path.join(self.directory, n))
        self._files_of.clear()
        _unlink(os.path.join(self.directory, MANIFEST))
        self.clean_up()

    # -- reading ------------------------------------------------------------------------------
    def _read_verified(self, snapshot_id: int) -> tuple[int, dict[str, Any], memoryview]:
        """The format, verified header and payload of snapshot file ``snapshot_id``."""
        path = self._path(snapshot_id)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as e:
            raise SnapshotError(f"snapshot {snapshot_id} cannot be read from {path}: {e}") from e
        if raw.startswith(MAGIC):
            version, magic = 3, MAGIC
        elif raw.startswith(MAGIC_2):
            version, magic = 2, MAGIC_2
        else:
            first = raw.split(b"\n", 1)[0]
            what = (
                "an unsigned snapshot of an older slipstream version"
                if len(first) == 64
                else "not a slipstream snapshot file"
            )
            raise SnapshotError(f"snapshot {snapshot_id} in {path} is {what}; it is not loaded")
        mac, header, payload = _split_signed(raw, len(magic))
        if header is None:
            raise SnapshotError(f"snapshot {snapshot_id} in {path} is truncated")
        if not verify(self.key, mac, header, b"\n", payload):
            raise SnapshotError(
                f"snapshot {snapshot_id} in {path} fails its signature check (corrupt, "
                f"truncated, tampered with, or signed with another key; this store's key "
                f"is the {self.key_origin})"
            )
        info = json.loads(header)
        if info.get("snapshot_id") != snapshot_id or info.get("size") != len(payload):
            raise SnapshotError(f"snapshot {snapshot_id} in {path} has an inconsistent header")
        return version, info, payload

    def read_header(self, snapshot_id: int) -> dict[str, Any]:
        """The verified header of one snapshot file (id, job, execution, size, created;
        format 3: ``format`` and ``chunk_bytes``)."""
        return self._read_verified(snapshot_id)[1]

    def read_manifest(self, snapshot_id: int) -> Manifest:
        """The verified manifest of snapshot ``snapshot_id`` (a format 2 snapshot has no
        chunks: an empty manifest with its id)."""
        version, _info, payload = self._read_verified(snapshot_id)
        if version == 2:
            return Manifest(snapshot_id, "")
        try:
            return Manifest.from_body(json.loads(bytes(payload)))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise SnapshotError(
                f"snapshot {snapshot_id} in {self._path(snapshot_id)} has a signed manifest "
                f"this version cannot parse: {e}"
            ) from e

    def read_chunk(self, ref: ChunkRef, vertex: str, index: int, snapshot_id: int) -> list[Any]:
        """The records of chunk ``ref`` (of processor ``vertex#index`` in the chain of
        snapshot ``snapshot_id``), verified against its own MAC and the manifest's."""
        return read_chunk_file(
            self.directory, self.key, ref, vertex, index, snapshot_id, self.key_origin
        )

    def check(self, snapshot_id: int) -> None:
        """Verify snapshot ``snapshot_id``: its manifest and every chunk it names (their
        signatures and headers; nothing is unpickled). :class:`SnapshotError` if not."""
        manifest = self.read_manifest(snapshot_id)
        for name, vm in manifest.vertices.items():
            for i, chain in vm.chains.items():
                for ref in chain:
                    verified_chunk_file(
                        self.directory, self.key, ref, name, i, snapshot_id, self.key_origin
                    )

    def read_chain(
        self,
        chain: Sequence[ChunkRef],
        vertex: str,
        index: int,
        snapshot_id: int,
        *,
        columns: bool = False,
    ) -> list[tuple[Any, Any]]:
        """A processor's chain merged into its full entries (maps as full StateMap
        entries, :func:`~slipstream.state.format.merge_chain`; ``columns``: as
        :func:`read_chain_files`)."""
        return read_chain_files(
            self.directory,
            self.key,
            chain,
            vertex,
            index,
            snapshot_id,
            self.key_origin,
            columns=columns,
        )

    def read_chunks(
        self, snapshot_id: int, processors: Iterable[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], list[tuple[Any, Any]]]:
        """The merged entries of the given processors (``(vertex, index)``; ``None``:
        all) in snapshot ``snapshot_id``; those without state are absent."""
        data = self.read(snapshot_id, processors)
        return {
            (name, i): es for name, vs in data.vertices.items() for i, es in vs.entries.items()
        }

    def read(
        self,
        snapshot_id: int,
        processors: Iterable[tuple[str, int]] | None = None,
        *,
        columns: bool = False,
        parallel: bool = False,
    ) -> SnapshotData:
        """Read one snapshot (only ``processors``' chains, if given); SnapshotError if it,
        or a chunk it names, is missing, corrupt or unsigned. Nothing is decoded before
        its signature is verified. ``columns``: a full map read from a columnar chunk
        stays its columns (:class:`~slipstream.state.columnar.MapColumns`, for the
        readers of state as data) instead of becoming a dict. ``parallel``: the chains
        are read on a few threads at once when they hold :data:`PARALLEL_READ_BYTES` or
        more (each chain as alone: its chunks read, verified, then decoded; reading a
        file and the HMAC over it release the GIL, so two cores verify two chunks at
        once); an error is the one the first failing chain in order raises."""
        version, _info, payload = self._read_verified(snapshot_id)
        if version == 2:
            return self._load_format2(snapshot_id, payload)
        manifest = self.read_manifest(snapshot_id)
        wanted = set(processors) if processors is not None else None
        data = SnapshotData(snapshot_id, manifest.job_name, dag_shape=manifest.dag_shape)
        data.extra = manifest.extra
        chains: list[tuple[VertexState, str, int, list[ChunkRef]]] = []
        for name, vm in manifest.vertices.items():
            vs = data.vertices[name] = VertexState(vm.total_parallelism)
            vs.completed = set(vm.completed)
            vs.final = set(vm.final)
            chains.extend(
                (vs, name, i, chain)
                for i, chain in vm.chains.items()
                if wanted is None or (name, i) in wanted
            )
        read = functools.partial(self._read_one_chain, snapshot_id, columns)
        if parallel and len(chains) > 1 and _bytes_of(chains) >= PARALLEL_READ_BYTES:
            for (vs, _name, i, _chain), entries in zip(
                chains, _in_threads(read, chains), strict=True
            ):
                vs.entries[i] = entries
        else:
            for c in chains:
                c[0].entries[c[2]] = read(c)
        data.source = (
            os.path.realpath(self.directory),
            {(name, i): list(c) for name, vm in manifest.vertices.items() for i, c in vm.chains.items()},
        )
        return data

    def _read_one_chain(
        self,
        snapshot_id: int,
        columns: bool,
        chain: tuple[VertexState, str, int, list[ChunkRef]],
    ) -> list[tuple[Any, Any]]:
        _vs, name, i, refs = chain
        return self.read_chain(refs, name, i, snapshot_id, columns=columns)

    def _load_format2(self, snapshot_id: int, payload: memoryview) -> SnapshotData:
        try:
            data = _SnapshotUnpickler(io.BytesIO(payload)).load()
        except Exception as e:  # noqa: BLE001
            raise SnapshotError(
                f"snapshot {snapshot_id} in {self._path(snapshot_id)} cannot be loaded: {e}"
            ) from e
        if not isinstance(data, SnapshotData):
            raise SnapshotError(f"{self._path(snapshot_id)} does not hold a slipstream snapshot")
        return upgrade(data)

    def latest(self, entries: bool = True) -> SnapshotData | None:
        """The newest committed snapshot, or ``None`` for an empty store. Raises
        :class:`SnapshotStoreDamagedError` if it cannot be read: falling back to an older
        one would republish what it published. ``entries=False``: its manifest only (no
        entries; ``source`` names every chain), the chunks verified but not unpickled
        (for a restore whose member processes read the chunks themselves)."""
        ids = self.committed_ids()
        if not ids:
            return None
        try:
            if not entries:
                self.check(ids[-1])
                return self.read(ids[-1], processors=())
            return self.read(ids[-1])
        except SnapshotError as e:
            intact = []
            for i in reversed(ids[:-1]):
                try:
                    self.check(i)  # its manifest and the chunks it names
                    intact.append(i)
                except SnapshotError:
                    continue
            older = (
                f"Intact older snapshots: {intact}. To restore one and accept that output "
                f"published after it is published again, pass restore_from="
                f"DirectorySnapshotStore({self.directory!r}).read({intact[0]}) and "
                f"JobConfig(allow_rollback=True)"
                if intact
                else "No older snapshot is intact either"
            )
            raise SnapshotStoreDamagedError(
                f"snapshot store {self.directory} is damaged: its newest committed snapshot "
                f"cannot be used: {e}. Restoring an older snapshot would publish output "
                f"again that snapshot {ids[-1]} already published, so nothing is restored. "
                f"{older}; or start from scratch with another snapshot_store (or after "
                f"removing {self.directory})."
            ) from e


#: :meth:`DirectorySnapshotStore.read` with ``parallel``: the chains' size from which
#: they are read on threads (below it, a thread's start costs more than it saves)
PARALLEL_READ_BYTES = 4 << 20
#: at most this many reading threads (fewer on fewer cores)
PARALLEL_READ_THREADS = 4


def _bytes_of(chains: Sequence[tuple[Any, str, int, list[ChunkRef]]]) -> int:
    return sum(r.size for c in chains for r in c[3])


def _in_threads(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]`` on a few threads; the first item's error (in the
    order of ``items``) if any fails."""
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(len(items), os.cpu_count() or 1, PARALLEL_READ_THREADS))
    with ThreadPoolExecutor(workers, thread_name_prefix="slipstream-state-read") as pool:
        futures = [pool.submit(fn, x) for x in items]
        return [f.result() for f in futures]


# -- one chunk or one chain without a store object (the Spark engine's executors) ----------
def write_chunk_file(
    directory: str,
    key: bytes,
    name: str,
    snapshot_id: int,
    vertex: str,
    index: int,
    mode: str,
    payload: bytes | list[bytes],
) -> ChunkRef:
    """Write one processor's chunk ``name`` into store ``directory``, signed with ``key``
    (temp name, fsync, rename; the directory's fsync is the manifest commit's) and return
    its ref. Stateless: an executor writes its processors' chunks with it and hands the
    refs to whoever commits the manifest (:meth:`DirectorySnapshotStore.commit`).
    ``payload`` may be given as the pieces it is made of (:func:`encode_chunk_parts`)."""
    parts = list(payload) if isinstance(payload, list) else [payload]
    size = sum(map(len, parts))
    info = {
        "format": FORMAT,
        "snapshot_id": snapshot_id,
        "vertex": vertex,
        "index": index,
        "mode": mode,
        "size": size,
    }
    header = json.dumps(info, sort_keys=True, separators=(",", ":")).encode("utf-8")
    mac = sign(key, header, b"\n", *parts)
    path = os.path.join(directory, name)
    _write_synced(path, [fmt.CHUNK_MAGIC, mac.encode("ascii"), b"\n", header, b"\n", *parts])
    size = len(fmt.CHUNK_MAGIC) + len(mac) + len(header) + 2 + size
    return ChunkRef(name, mac, snapshot_id, mode, size)


def read_chunk_file(
    directory: str,
    key: bytes,
    ref: ChunkRef,
    vertex: str,
    index: int,
    snapshot_id: int,
    key_origin: str = "",
    *,
    columns: bool = False,
) -> list[Any]:
    """The records of chunk ``ref`` in store ``directory`` (of processor ``vertex#index``
    in the chain of snapshot ``snapshot_id``), verified against its own MAC and the one
    the manifest recorded before anything is decoded; :class:`SnapshotError` naming
    the file otherwise. ``columns``: see :func:`~slipstream.state.format.decode_payload`."""
    where, payload = verified_chunk_file(directory, key, ref, vertex, index, snapshot_id, key_origin)
    try:
        return fmt.decode_payload(payload, columns)
    except Exception as e:  # noqa: BLE001
        raise SnapshotError(f"{where} cannot be loaded: {e}") from e


def verified_chunk_file(
    directory: str,
    key: bytes,
    ref: ChunkRef,
    vertex: str,
    index: int,
    snapshot_id: int,
    key_origin: str = "",
) -> tuple[str, memoryview]:
    """Chunk ``ref``'s payload, verified as :func:`read_chunk_file` does (not unpickled),
    and the text that names it in errors."""
    path = os.path.join(directory, ref.file)
    where = f"snapshot {snapshot_id}: chunk {path} (vertex {vertex!r}, processor {index})"
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError as e:
        raise SnapshotError(f"{where} is missing") from e
    except OSError as e:
        raise SnapshotError(f"{where} cannot be read: {e}") from e
    if not raw.startswith(fmt.CHUNK_MAGIC):
        raise SnapshotError(f"{where} is not a slipstream snapshot chunk")
    mac, header, payload = _split_signed(raw, len(fmt.CHUNK_MAGIC))
    if header is None:
        raise SnapshotError(f"{where} is truncated")
    if not verify(key, mac, header, b"\n", payload):
        origin = f"; this store's key is the {key_origin}" if key_origin else ""
        raise SnapshotError(
            f"{where} fails its signature check (corrupt, truncated, tampered with, or "
            f"signed with another key{origin})"
        )
    if not hmac.compare_digest(mac, ref.mac):
        raise SnapshotError(
            f"{where} is not the chunk the manifest names: its signature differs from "
            f"the one the manifest recorded (a validly signed chunk swapped in or "
            f"reordered)"
        )
    info = json.loads(header)
    if (
        info.get("snapshot_id") != ref.snapshot_id
        or info.get("vertex") != vertex
        or info.get("index") != index
        or info.get("mode") != ref.mode
        or info.get("size") != len(payload)
    ):
        raise SnapshotError(f"{where} has a header that does not match the manifest: {info}")
    return where, payload


def read_chain_files(
    directory: str,
    key: bytes,
    chain: Sequence[ChunkRef],
    vertex: str,
    index: int,
    snapshot_id: int,
    key_origin: str = "",
    *,
    columns: bool = False,
) -> list[tuple[Any, Any]]:
    """Processor ``vertex#index``'s chain in store ``directory`` (each chunk verified as
    :func:`read_chunk_file`) merged into its full entries (maps as full StateMap entries,
    :func:`~slipstream.state.format.merge_chain`). Stateless: an executor restores its
    processor from the refs of the committed manifest. ``columns``: a full map of a
    columnar chunk that no delta follows stays a
    :class:`~slipstream.state.columnar.MapColumns` (state read as data); a restore
    leaves it false (dicts)."""
    chunks = [
        (
            r.mode,
            r.snapshot_id,
            read_chunk_file(
                directory, key, r, vertex, index, snapshot_id, key_origin, columns=columns
            ),
        )
        for r in chain
    ]
    try:
        return fmt.merge_chain(
            chunks, f"snapshot {snapshot_id}, vertex {vertex!r}, processor {index}: "
        )
    except ValueError as e:
        files = ", ".join(r.file for r in chain)
        raise SnapshotError(f"{e} (chunks {files} in {directory})") from e


def encode_snapshot(store: SnapshotStore, data: SnapshotData) -> Manifest:
    """Write ``data``'s entries as a full chunk per processor with entries (the store's
    snapshot is begun); returns the manifest to commit."""
    manifest = Manifest(data.snapshot_id, data.job_name, dag_shape=data.dag_shape, extra=data.extra)
    for name, vs in data.vertices.items():
        vm = manifest.vertices[name] = VertexManifest(
            vs.total_parallelism, set(vs.completed), set(getattr(vs, "final", ()))
        )
        for i, entries in vs.entries.items():
            if entries:
                payload = encode_chunk(entries, data.snapshot_id, name, i)
                vm.chains[i] = [store.write_chunk(data.snapshot_id, name, i, fmt.CHUNK_FULL, payload)]
    return manifest


def encode_chunk_parts(
    entries: list[tuple[Any, Any]],
    snapshot_id: int,
    vertex: str,
    index: int,
    columnar: bool | None = True,
) -> list[bytes]:
    """:func:`encode_chunk` as the pieces of the payload (written and signed as they are:
    a copy-on-write save's encoded fragments are not joined into one more copy).
    ``columnar``: as :func:`~slipstream.state.format.encode_payload_parts`."""
    try:
        return fmt.encode_payload_parts(fmt.encode_records(entries), columnar)
    except Exception as e:  # noqa: BLE001
        raise _unpicklable(snapshot_id, vertex, index, e) from e


def encode_chunk(entries: list[tuple[Any, Any]], snapshot_id: int, vertex: str, index: int) -> bytes:
    """The payload of one processor's chunk; :class:`SnapshotError` naming the processor
    if its state cannot be pickled."""
    try:
        return fmt.encode_payload(fmt.encode_records(entries))
    except Exception as e:  # noqa: BLE001
        raise _unpicklable(snapshot_id, vertex, index, e) from e


def _unpicklable(snapshot_id: int, vertex: str, index: int, e: Exception) -> SnapshotError:
    """The error of a chunk encoder (:func:`encode_chunk`, :func:`encode_chunk_parts`)
    whose state cannot be pickled, naming the processor."""
    return SnapshotError(
        f"snapshot {snapshot_id}: {vertex}#{index}: snapshot state cannot be pickled: {e}"
    )


def _split_signed(raw: bytes, start: int) -> tuple[str, bytes | None, memoryview]:
    """``<mac>\\n<header>\\n<payload>`` after a magic of ``start`` bytes."""
    nl1 = raw.find(b"\n", start)
    nl2 = raw.find(b"\n", nl1 + 1) if nl1 >= 0 else -1
    if nl2 < 0:
        return "", None, memoryview(b"")
    mac = raw[start:nl1].decode("ascii", "replace")
    return mac, raw[nl1 + 1 : nl2], memoryview(raw)[nl2 + 1 :]


#: Where slipstream versions before ``SnapshotData.extra`` pickled the Spark engine's
#: snapshots: a subclass of SnapshotData with the epoch's fields as attributes.
_LEGACY_EPOCH_SNAPSHOT = ("slipstream.spark.streaming", "EpochSnapshot")
#: Those attributes; :func:`upgrade` moves them into ``extra`` under the same names.
LEGACY_EPOCH_FIELDS = ("epoch_id", "watermarks", "finished", "no_data", "watermark_pending")


class _LegacyEpochSnapshot(SnapshotData):
    """What an ``EpochSnapshot`` pickle of an older version unpickles as (its state is
    set attribute by attribute, no constructor runs); :func:`upgrade` turns it into a
    plain :class:`SnapshotData`."""


class _SnapshotUnpickler(pickle.Unpickler):
    """Unpickles a verified format 2 payload; an older version's Spark ``EpochSnapshot``
    becomes a :class:`_LegacyEpochSnapshot` (the state layer imports no engine)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == _LEGACY_EPOCH_SNAPSHOT:
            return _LegacyEpochSnapshot
        return super().find_class(module, name)


def upgrade(data: SnapshotData) -> SnapshotData:
    """A format 2 snapshot in this version's shape: ``extra`` present (older pickles lack
    it), and an older Spark ``EpochSnapshot`` as a plain :class:`SnapshotData` whose
    ``extra`` holds its epoch fields (names of :data:`LEGACY_EPOCH_FIELDS`; the Spark
    engine reads them with its accessors)."""
    attrs = vars(data)
    extra = attrs.get("extra")
    if not isinstance(extra, dict):
        extra = {}
    if type(data) is SnapshotData:
        data.extra = extra
        return data
    for name in LEGACY_EPOCH_FIELDS:
        if name in attrs:
            extra.setdefault(name, attrs[name])
    return SnapshotData(
        data.snapshot_id,
        data.job_name,
        data.vertices,
        attrs.get("dag_shape"),
        extra,
    )


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
