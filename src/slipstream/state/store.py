"""Durable snapshot storage: a directory that a later process can read.

Each committed snapshot is one file ``snapshot-<id:010d>.bin``::

    SLIPSTREAM-SNAPSHOT 2\\n
    <HMAC-SHA256 hex of header + "\\n" + payload>\\n
    <header: JSON {snapshot_id, job, execution, size, created, dag}>\\n
    <payload: the pickled SnapshotData>

It is written to a temporary name (``.tmp-*``), fsynced and renamed; then ``MANIFEST.json``
(also signed, temp + fsync + rename) names the committed ids, the job and execution that
own the store and the fingerprint of their DAG. If the manifest cannot be written the new
snapshot file is removed again, so a snapshot counts as committed only once both are in
place. Then the store's *generation* (the id of its newest committed snapshot) is
recorded outside the store, where restoring the directory from a backup cannot take it
back (:mod:`~slipstream.state.lineage`); only then may sinks publish the
snapshot's output.

Reading verifies the signature *before* unpickling (see
:mod:`~slipstream.state.signing`). The manifest is not a single point of
failure: every snapshot file carries its id, job and execution, so a deleted or damaged
manifest is rebuilt from the files. What the store never does is fall back silently: if
the newest committed snapshot is missing, corrupt or unsigned, :meth:`latest` raises
:class:`~slipstream.core.errors.SnapshotStoreDamagedError`, because an older snapshot
would republish output the newest one already published. The message lists the intact
older snapshots; restoring one explicitly (``restore_from=store.read(id)``) accepts those
duplicates.

:meth:`encode` and :meth:`write_encoded` split a commit in two, so that pickling can
happen wherever the caller likes (a store thread) and only the signed write goes through
the store.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slipstream.core.errors import SnapshotError, SnapshotStoreDamagedError, SnapshotStoreInUseError
from slipstream.core.files import atomic_write
from slipstream.core.pickling import cloudpickle
from slipstream.state.lineage import DagShape, dag_fingerprint, record_generation
from slipstream.state.signing import resolve_key, sign, verify

log = logging.getLogger("slipstream.snapshot")

MANIFEST = "MANIFEST.json"
LOCK = ".lock"
MAGIC = b"SLIPSTREAM-SNAPSHOT 2\n"
FORMAT = 2
_PREFIX, _SUFFIX = "snapshot-", ".bin"


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
    """A committed snapshot: per vertex, each processor's saved entries."""

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

    def _read_manifest(self) -> dict[str, Any] | None:
        """The verified manifest; ``None`` if absent. A damaged one is logged and
        treated as absent (the files are the truth)."""
        path = os.path.join(self.directory, MANIFEST)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return None
        try:
            manifest = json.loads(raw)
            ok = isinstance(manifest, dict) and verify(
                self.key, str(manifest.get("mac", "")), self._manifest_body(manifest)
            )
            if ok:
                manifest["committed"] = sorted(int(i) for i in manifest["committed"])
                return manifest
            reason = "its signature does not match"
        except (ValueError, KeyError, TypeError) as e:
            reason = f"it cannot be parsed ({e})"
        log.warning(
            "snapshot manifest %s is damaged: %s; rebuilding it from the snapshot files",
            path,
            reason,
        )
        return None

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
        complete, and carries its own id)."""
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

    @staticmethod
    def encode(data: SnapshotData) -> bytes:
        """The payload of ``data`` (a pickle), for :meth:`write_encoded`."""
        try:
            return pickle_state(data)
        except Exception as e:  # noqa: BLE001
            raise SnapshotError(f"snapshot {data.snapshot_id} state cannot be pickled: {e}") from e

    def write(self, data: SnapshotData) -> None:
        """Commit ``data`` durably."""
        if self.job_name is None:
            self.job_name = data.job_name
        if data.dag_shape is None and self.dag_shape is not None:
            data.dag_shape = self.dag_shape
        self.write_encoded(data.snapshot_id, self.encode(data))

    def write_encoded(self, snapshot_id: int, payload: bytes) -> None:
        """Commit an encoded snapshot (:meth:`encode`): signed file, then manifest, then
        the generation outside the store; the oldest snapshots beyond ``keep`` are
        removed. Raises ``OSError`` (disk full, read-only, ...) with nothing committed,
        or, when only the generation could not be recorded, with the snapshot in the
        store but not to be published yet (as after a crash before its sinks commit:
        the next snapshot names its output too)."""
        self._keep_lock()
        self.ensure_directory()
        info: dict[str, Any] = {
            "snapshot_id": snapshot_id,
            "job": self.job_name or "",
            "execution": self.execution_id,
            "size": len(payload),
            "created": time.time(),
        }
        if self.dag_shape is not None:
            info["dag"] = dag_fingerprint(self.dag_shape)
        header = json.dumps(info, sort_keys=True).encode("utf-8")
        mac = sign(self.key, header, b"\n", payload).encode("ascii")
        path = self._path(snapshot_id)
        previous = self.committed_ids()
        atomic_write(path, [MAGIC, mac, b"\n", header, b"\n", payload])
        self.last_write_bytes = len(MAGIC) + len(mac) + len(header) + 2 + len(payload)
        try:
            ids = sorted(set(previous) | {snapshot_id})
            stale, ids = ids[: -self.keep], ids[-self.keep :]
            self._write_manifest(ids)
        except BaseException:
            _unlink(path)  # not committed: the manifest does not name it
            raise
        record_generation(self.directory, self.job_name or "", self.execution_id, snapshot_id)
        for i in stale:
            _unlink(self._path(i))

    def mark_completed(self) -> None:
        """The owning execution finished normally: a later ``resume`` starts fresh."""
        ids = self.committed_ids()
        if ids:
            self._write_manifest(ids, completed=True)
            record_generation(
                self.directory, self.job_name or "", self.execution_id, ids[-1], completed=True
            )

    def clean_up(self) -> list[str]:
        """Remove leftover temporary files and snapshot files the manifest does not name
        (pruned or never committed). Only with a verified manifest: without one every
        file may be needed to rebuild it. Returns the names removed."""
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
        if removed:
            log.info("snapshot store %s: removed leftover files %s", self.directory, removed)
        return removed

    def clear(self) -> None:
        """Remove every snapshot file and the manifest (a fresh start in this store)."""
        for i in self.file_ids():
            _unlink(self._path(i))
        _unlink(os.path.join(self.directory, MANIFEST))
        self.clean_up()

    # -- reading ------------------------------------------------------------------------------
    def _read_verified(self, snapshot_id: int) -> tuple[dict[str, Any], memoryview]:
        path = self._path(snapshot_id)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as e:
            raise SnapshotError(f"snapshot {snapshot_id} cannot be read from {path}: {e}") from e
        if not raw.startswith(MAGIC):
            first = raw.split(b"\n", 1)[0]
            what = (
                "an unsigned snapshot of an older slipstream version"
                if len(first) == 64
                else "not a slipstream snapshot file"
            )
            raise SnapshotError(f"snapshot {snapshot_id} in {path} is {what}; it is not loaded")
        view = memoryview(raw)[len(MAGIC) :]
        nl1 = raw.find(b"\n", len(MAGIC))
        nl2 = raw.find(b"\n", nl1 + 1) if nl1 >= 0 else -1
        if nl2 < 0:
            raise SnapshotError(f"snapshot {snapshot_id} in {path} is truncated")
        mac = bytes(view[: nl1 - len(MAGIC)]).decode("ascii", "replace")
        header = raw[nl1 + 1 : nl2]
        payload = memoryview(raw)[nl2 + 1 :]
        if not verify(self.key, mac, header, b"\n", payload):
            raise SnapshotError(
                f"snapshot {snapshot_id} in {path} fails its signature check (corrupt, "
                f"truncated, tampered with, or signed with another key; this store's key "
                f"is the {self.key_origin})"
            )
        info = json.loads(header)
        if info.get("snapshot_id") != snapshot_id or info.get("size") != len(payload):
            raise SnapshotError(f"snapshot {snapshot_id} in {path} has an inconsistent header")
        return info, payload

    def read_header(self, snapshot_id: int) -> dict[str, Any]:
        """The verified header of one snapshot file (id, job, execution, size, created)."""
        return self._read_verified(snapshot_id)[0]

    def read(self, snapshot_id: int) -> SnapshotData:
        """Read one snapshot; :class:`SnapshotError` if missing, corrupt or unsigned.
        Nothing is unpickled before the signature is verified."""
        _info, payload = self._read_verified(snapshot_id)
        try:
            data = _SnapshotUnpickler(io.BytesIO(payload)).load()
        except Exception as e:  # noqa: BLE001
            raise SnapshotError(
                f"snapshot {snapshot_id} in {self._path(snapshot_id)} cannot be loaded: {e}"
            ) from e
        if not isinstance(data, SnapshotData):
            raise SnapshotError(f"{self._path(snapshot_id)} does not hold a slipstream snapshot")
        return upgrade(data)

    def latest(self) -> SnapshotData | None:
        """The newest committed snapshot, or ``None`` for an empty store. Raises
        :class:`SnapshotStoreDamagedError` if it cannot be read: falling back to an older
        one would republish what it published."""
        ids = self.committed_ids()
        if not ids:
            return None
        try:
            return self.read(ids[-1])
        except SnapshotError as e:
            intact = []
            for i in reversed(ids[:-1]):
                try:
                    self.read_header(i)
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
    """Unpickles a verified snapshot payload; an older version's Spark ``EpochSnapshot``
    becomes a :class:`_LegacyEpochSnapshot` (the state layer imports no engine)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == _LEGACY_EPOCH_SNAPSHOT:
            return _LegacyEpochSnapshot
        return super().find_class(module, name)


def upgrade(data: SnapshotData) -> SnapshotData:
    """``data`` in this version's shape: ``extra`` present (older pickles lack it), and
    an older Spark ``EpochSnapshot`` as a plain :class:`SnapshotData` whose ``extra``
    holds its epoch fields (names of :data:`LEGACY_EPOCH_FIELDS`; the Spark engine reads
    them with its accessors)."""
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
