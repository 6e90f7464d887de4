"""Keyed state on disk (``JobConfig(state_backend="sqlite")``): state beyond memory.

:class:`DiskKeyedState` has :class:`~slipstream.state.keyed.KeyedState`'s interface (the
mapping methods the keyed processors use, ``dirty``, ``snapshot_entry()``,
``dropped_entry()``, ``attach()``) over a SQLite database (the standard library's
``sqlite3``: nothing to install) in a private directory of its own, with a write-back
cache in front so that hot keys stay in memory:

* the cache has two generations (``young``, ``old``); a key read or written goes into
  ``young``; when ``young`` holds ``cache_size / 2`` keys, ``old``'s changed entries are
  written to the database in one transaction and dropped, and ``young`` becomes
  ``old``. A key used in either of the last two generations stays in memory: an
  approximation of LRU at the cost of a dict lookup per access;
* values that may change in place (anything but ints, floats, strings, bytes, ``None``
  and tuples of such) are written back whenever they leave the cache, since a processor
  may change an accumulator without storing it again;
* :meth:`prefetch` reads the cache misses of a chunk of keys in one query (the
  processors call it per inbox chunk when the state has it).

Memory is the cache plus SQLite's page cache (``cache_kib``), whatever the number of
keys; the database file grows with the state. Why SQLite: see docs/performance.md,
"State beyond memory" (LMDB was faster but maps its whole file into the address space;
rocksdict's snapshot iterators do not read the snapshot).

Snapshots: a full save hands over a :class:`DiskStateView`, a consistent read of the
database (a read transaction of SQLite's write-ahead log on a connection of its own)
under an overlay of what the cache holds that the database lacks (a C-speed copy of the
changed cached entries when they are plain values, pickled copies of values that may
change in place), which the snapshot store's thread iterates while the processor goes on
writing: the barrier's pause is a fraction of the cache's size, not of the state's. The view pickles as a plain ``dict``
streamed from the database (``__reduce__`` with an item iterator), so a snapshot file
names no slipstream class, and it is read once: its read transaction ends when the
store has iterated it (a read transaction held longer would keep SQLite from reusing
its log). A delta (with incremental snapshots) is a plain ``dict`` of the changed keys'
values, read from the cache or the database.

Keys are stored by a canonical encoding (:func:`encode_key`): a 64-bit int big-endian,
so that keys arriving in order (ids, sequence numbers) share the database's pages (1.7x
the items per CPU second of pickled ints on a rolling count of new keys); anything else
by a pickle without memo, so equal tuples encode the same however their parts were
built; ``True``/``1``/``1.0`` encode as ``1``, as they are one dict key. Ints, strings,
bytes, floats, bools and tuples of them behave as in a ``dict``; other keys must pickle
identically when equal. Iteration follows the encoded keys' order, not insertion order. The files are this process's own (a private directory,
created ``0700``, its owner checked), so reading them back unpickles only what this
state pickled.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import sqlite3
import stat
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

from slipstream.core.errors import SnapshotError
from slipstream.state.keyed import (
    DELTA,
    FULL,
    KEYED,
    PLAIN,
    StateMap,
    StateMapSave,
    dropped_entry,
    restoring,
)

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "DiskKeyedState",
    "DiskStateView",
    "private_directory",
]

log = logging.getLogger("slipstream.state")

#: keys kept in memory per state by default (two generations of half as many)
DEFAULT_CACHE_SIZE = 200_000
#: SQLite's page cache per state (KiB)
DEFAULT_CACHE_KIB = 32 * 1024
_BATCH = 500  # keys per ``IN (...)`` query: well under SQLite's parameter limit

_PROTOCOL = 5
_dumps = pickle.dumps
_loads = pickle.loads
_MISS: Any = object()  # not in the cache
_ABSENT: Any = object()  # in the cache: known not to be in the map
_SCALARS = frozenset((int, float, str, bytes, bool, complex, type(None)))
_PLAIN_VALUES = _SCALARS | {object}  # object: _ABSENT


class _Frozen:
    """A value of a view's overlay that could change in place, pickled when the view
    was taken."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


# -- keys and values ------------------------------------------------------------------------
def _canonical(k: Any) -> Any:
    t = type(k)
    if t is bool:
        return int(k)
    if t is float and k.is_integer():
        return int(k)
    if t is tuple:
        return tuple(map(_canonical, k))
    return k


_BIAS = 1 << 63
_INT = b"\x01"  # no pickle starts so: pickles of protocol 2+ start with b"\x80"


def encode_key(k: Any) -> bytes:
    """The bytes a key is stored under (equal keys, equal bytes; see the module doc).
    An int of 64 bits is stored big-endian (biased): keys that come in order (ids,
    sequence numbers) are then neighbours in the database, where they share pages."""
    t = type(k)
    if t is int:
        if -_BIAS <= k < _BIAS:
            return _INT + (k + _BIAS).to_bytes(8, "big")
        return _dumps(k, _PROTOCOL)
    if t is str or t is bytes:
        return _dumps(k, _PROTOCOL)
    k = _canonical(k)
    if type(k) is int:
        return encode_key(k)
    buf = io.BytesIO()
    p = pickle.Pickler(buf, _PROTOCOL)
    p.fast = True  # no memo: identity must not change the bytes
    p.dump(k)
    return buf.getvalue()


def decode_key(b: bytes) -> Any:
    """The key stored as ``b`` (:func:`encode_key`)."""
    if b[0] == 1:
        return int.from_bytes(b[1:], "big") - _BIAS
    return _loads(b)


def _mutable(v: Any) -> bool:
    t = type(v)
    if t in _SCALARS:
        return False
    if t is tuple:
        return not all(type(x) in _SCALARS for x in v)
    return True


# -- the private directory ------------------------------------------------------------------
def private_directory(root: str | os.PathLike[str] | None, prefix: str) -> str:
    """A new directory only this user can enter (``0700``), under ``root`` (created
    ``0700`` if missing, with its parent; both must be this user's and writable by no
    one else) or the system's temporary directory."""
    if root is None:
        root = tempfile.gettempdir()
    else:
        root = os.path.abspath(os.fspath(root))
        parent = os.path.dirname(root)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        for path in (parent, root):
            _check_private(path)
    return tempfile.mkdtemp(prefix=prefix, dir=root)  # 0700, unique, owned by us


def _check_private(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise SnapshotError(f"keyed state directory {path} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SnapshotError(
            f"keyed state directory {path} belongs to uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}: it must be this user's (uid {os.getuid()}) "
            f"and writable by no one else"
        )


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:60]


class _Files:
    """The connection and the directory of one state: closed and removed by
    :meth:`DiskKeyedState.close` (or at garbage collection / interpreter exit), the
    directory once the last view handed to a snapshot was read too."""

    def __init__(self, directory: str, conn: sqlite3.Connection) -> None:
        self.directory = directory
        self.conn = conn
        self.closing = False
        self.views = 0  # open views
        self.lock = threading.Lock()

    def view_opened(self) -> None:
        with self.lock:
            self.views += 1

    def view_closed(self) -> None:
        with self.lock:
            self.views -= 1
            remove = self.closing and self.views == 0
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:  # pragma: no cover - closing is best effort
            pass
        with self.lock:
            self.closing = True
            remove = self.views == 0
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)


# -- the state --------------------------------------------------------------------------------
class DiskKeyedState(MutableMapping[Any, Any]):
    """A processor's keyed state in SQLite behind a write-back cache (see the module
    doc); the same interface as :class:`~slipstream.state.keyed.KeyedState`."""

    def __init__(
        self,
        tag: str = PLAIN,
        detail: Any = None,
        context: Any = None,
        directory: str | os.PathLike[str] | None = None,
        cache_size: int | None = None,
        cache_kib: int | None = None,
    ) -> None:
        """``cache_size``: keys kept in memory (``None``: :data:`DEFAULT_CACHE_SIZE`);
        ``cache_kib``: SQLite's page cache (``None``: :data:`DEFAULT_CACHE_KIB`)."""
        if cache_size is None:
            cache_size = DEFAULT_CACHE_SIZE
        if cache_kib is None:
            cache_kib = DEFAULT_CACHE_KIB
        if tag not in (PLAIN, KEYED):
            raise ValueError(f"KeyedState tag must be PLAIN or KEYED, got {tag!r}")
        if cache_size < 2:
            raise ValueError(f"cache_size must be >= 2, got {cache_size}")
        self.tag = tag
        self.detail = detail
        self.dirty: set[Any] | None = None
        self._context: Any = None
        self._saved_id = 0
        self._entry: tuple[StateMap, StateMapSave] | None = None
        self._half = cache_size // 2
        self._young: dict[Any, Any] = {}
        self._old: dict[Any, Any] = {}
        self._unflushed: set[Any] = set()  # cached entries the database lacks
        self._blind: set[Any] = set()  # set without knowing if the database has them
        # the map's size less the blind keys the database does not hold (a blind key it
        # holds was counted when it got there)
        self._len = 0
        self.directory = private_directory(
            directory if directory is not None else getattr(context, "state_dir", None),
            _prefix(context),
        )
        self.path = os.path.join(self.directory, "state.db")
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._files = _Files(self.directory, conn)
        self._finalizer = weakref.finalize(self, self._files.close)
        conn.execute("PRAGMA journal_mode=WAL")
        # durability comes from snapshots: the file is scratch space, removed at the end
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute(f"PRAGMA cache_size=-{int(cache_kib)}")
        conn.execute("CREATE TABLE s (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        self._conn = conn
        self._view: DiskStateView | None = None
        closers = getattr(context, "closers", None)
        if isinstance(closers, list):
            closers.append(self.close)
        if context is not None:
            self.attach(context)

    def __repr__(self) -> str:
        return f"DiskKeyedState({self.tag!r}, {self.detail!r}, {len(self)} keys, {self.path})"

    # -- KeyedState's contract ----------------------------------------------------------
    def attach(self, context: Any) -> None:
        """Track changes if ``context`` (the processor's) takes incremental snapshots."""
        self._context = context
        self.dirty = set() if getattr(context, "incremental_snapshots", False) else None
        restoring(self, context)

    @property
    def saved_id(self) -> int:
        """As :attr:`KeyedState.saved_id`."""
        return self._saved_id

    def changed(self, key: Any) -> None:
        if self.dirty is not None:
            self.dirty.add(key)

    def snapshot_entry(self) -> tuple[StateMap, StateMapSave]:
        """As :meth:`KeyedState.snapshot_entry`; a full save is a :class:`DiskStateView`
        (the pause is a copy of the cache's changed entries), a delta a dict of the
        changed keys' values (those out of the cache read in one query per 500, without
        bringing them into the cache)."""
        ctx = self._context
        sid = int(getattr(ctx, "current_snapshot_id", 0) or 0)
        if sid and sid == self._saved_id and self._entry is not None:
            return self._entry  # asked again for the same snapshot: the same entry
        self._entry = entry = self._new_entry(sid)
        return entry

    def _new_entry(self, sid: int) -> tuple[StateMap, StateMapSave]:
        ctx = self._context
        key = StateMap(self.tag, self.detail)
        dirty = self.dirty
        base = self._saved_id
        self._saved_id = sid
        if dirty is not None:
            self.dirty = set()
            committed = int(getattr(ctx, "committed_snapshot_id", 0) or 0)
            if not (base == 0 or committed < base or len(dirty) >= len(self)):
                young, old = self._young, self._old
                upserts = {}
                removed = []
                uncached = []
                for k in dirty:
                    v = young.get(k, _MISS)
                    if v is _MISS:
                        v = old.get(k, _MISS)
                        if v is _MISS:
                            uncached.append(k)
                            continue
                    if v is _ABSENT:
                        removed.append(k)
                    else:
                        upserts[k] = _loads(_dumps(v, _PROTOCOL)) if _mutable(v) else v
                if uncached:  # decoded from the database: fresh objects, nothing to copy
                    found = self._read_many(uncached)
                    for k in uncached:
                        raw = found.get(k, _MISS)
                        if raw is _MISS:
                            removed.append(k)
                        else:
                            upserts[k] = _loads(raw)
                return key, StateMapSave(DELTA, upserts, tuple(removed), base)
        return key, StateMapSave(FULL, self.view())  # type: ignore[arg-type]

    def dropped_entry(self) -> tuple[StateMap, StateMapSave] | None:
        if self._saved_id == 0 or self.dirty is None:
            return None
        return dropped_entry(self.tag, self.detail, self._saved_id)

    def view(self) -> DiskStateView:
        """A consistent read of the whole map as it is now, for another thread to
        iterate once while this state goes on changing: the database as it is (a read
        transaction) under what the cache holds that the database lacks (an overlay),
        so the cache is not written out on the processor's thread."""
        if self._view is not None:
            self._view.close()  # the previous snapshot is over (one at a time)
        self._resolve_blind()
        overlay = self._overlay()
        v = DiskStateView(self.path, self._len, self.tag, self.detail, self._files, overlay)
        self._view = v
        return v

    def _overlay(self) -> dict[Any, Any]:
        """The cached entries the database lacks (deleted ones as ``_ABSENT``), and
        those whose values may have changed in place (pickled: frozen as they are now)."""
        out: dict[Any, Any] = {}
        unflushed = self._unflushed
        for gen in (self._old, self._young):
            if set(map(type, gen.values())) <= _PLAIN_VALUES:
                keys = unflushed.intersection(gen)  # C speed: counts and sums
                out.update(zip(keys, map(gen.__getitem__, keys)))  # noqa: B905
                continue
            for k, v in gen.items():
                if v is not _ABSENT and _mutable(v):
                    out[k] = _Frozen(_dumps(v, _PROTOCOL))
                elif k in unflushed:
                    out[k] = v
        return out

    # -- reading ------------------------------------------------------------------------
    def _load(self, key: Any) -> Any:
        """The cached value of ``key`` (``_ABSENT`` if it has none), from ``old`` or the
        database, now in ``young``."""
        v = self._old.pop(key, _MISS)
        if v is _MISS:
            row = self._conn.execute("SELECT v FROM s WHERE k = ?", (encode_key(key),)).fetchone()
            v = _ABSENT if row is None else _loads(row[0])
        self._young[key] = v
        if len(self._young) >= self._half:
            self._flip()
        return v

    def prefetch(self, keys: Iterable[Any]) -> None:
        """Bring the keys of a chunk into the cache with one query per 500 misses. Stops
        quietly where iterating ``keys`` raises (a key function failing on an item: the
        processor meets that item itself)."""
        young, old = self._young, self._old
        want: dict[bytes, Any] = {}
        try:
            for k in keys:
                if k not in young and k not in old:
                    want[encode_key(k)] = k
        except Exception:  # noqa: BLE001 - the processor handles the item
            pass
        if not want:
            return
        encoded = sorted(want)
        found: dict[bytes, bytes] = {}
        execute = self._conn.execute
        for i in range(0, len(encoded), _BATCH):
            part = encoded[i : i + _BATCH]
            found.update(
                execute(f"SELECT k, v FROM s WHERE k IN ({','.join('?' * len(part))})", part)
            )
        for kb, k in want.items():
            raw = found.get(kb)
            young[k] = _ABSENT if raw is None else _loads(raw)
        if len(young) >= self._half:
            self._flip()

    def _read_many(self, keys: list[Any]) -> dict[Any, bytes]:
        """The stored values (pickled) of those of ``keys`` the database holds."""
        want = {encode_key(k): k for k in keys}
        encoded = sorted(want)
        out: dict[Any, bytes] = {}
        execute = self._conn.execute
        for i in range(0, len(encoded), _BATCH):
            part = encoded[i : i + _BATCH]
            q = f"SELECT k, v FROM s WHERE k IN ({','.join('?' * len(part))})"
            for kb, vb in execute(q, part):
                out[want[kb]] = vb
        return out

    def get(self, key: Any, default: Any = None) -> Any:
        v = self._young.get(key, _MISS)
        if v is _MISS:
            v = self._load(key)
        return default if v is _ABSENT else v

    def __getitem__(self, key: Any) -> Any:
        v = self._young.get(key, _MISS)
        if v is _MISS:
            v = self._load(key)
        if v is _ABSENT:
            raise KeyError(key)
        return v

    def __contains__(self, key: object) -> bool:
        v = self._young.get(key, _MISS)
        if v is _MISS:
            v = self._load(key)
        return v is not _ABSENT

    def __len__(self) -> int:
        if self._blind:
            self._resolve_blind()
        return self._len

    def __iter__(self) -> Iterator[Any]:
        for k, _ in self.items():  # type: ignore[attr-defined]
            yield k

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        """Every ``(key, value)``, in the encoded keys' order; a cached key yields its
        cached value (the same object). The map must not change meanwhile."""
        self.flush()
        young, old = self._young, self._old
        cursor = self._conn.execute("SELECT k, v FROM s")
        try:
            while rows := cursor.fetchmany(1024):
                for kb, vb in rows:
                    k = decode_key(kb)
                    v = young.get(k, _MISS)
                    if v is _MISS:
                        v = old.get(k, _MISS)
                    yield k, (_loads(vb) if v is _MISS else v)
        finally:
            cursor.close()

    def keys(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(self)

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        return (v for _, v in self.items())

    # -- writing ------------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        young = self._young
        prev = young.get(key, _MISS)
        if prev is _MISS:
            prev = self._old.pop(key, _MISS)
            if prev is _MISS:
                self._blind.add(key)  # counted when the database is asked (len, flush)
            elif prev is _ABSENT:
                self._len += 1
            young[key] = value
            self._unflushed.add(key)
            if len(young) >= self._half:
                self._flip()
        else:
            if prev is _ABSENT:
                self._len += 1
            young[key] = value
            self._unflushed.add(key)
        if self.dirty is not None:
            self.dirty.add(key)

    def __delitem__(self, key: Any) -> None:
        v = self._young.get(key, _MISS)
        if v is _MISS:
            v = self._load(key)
        if v is _ABSENT:
            raise KeyError(key)
        if key in self._blind:
            self._count_new([key])  # counted now, whether the database held it or not
        self._len -= 1
        if key in self._young:
            self._young[key] = _ABSENT
        else:  # _load flipped the generations
            self._old[key] = _ABSENT
        self._unflushed.add(key)
        if self.dirty is not None:
            self.dirty.add(key)

    def pop(self, key: Any, default: Any = _MISS) -> Any:
        v = self.get(key, _MISS)
        if v is _MISS:
            if default is _MISS:
                raise KeyError(key)
            return default
        del self[key]
        return v

    def setdefault(self, key: Any, default: Any = None) -> Any:
        v = self.get(key, _MISS)
        if v is _MISS:
            self[key] = v = default
        return v

    def clear(self) -> None:
        """Empty the map (and the database)."""
        if self.dirty is not None:
            self.dirty.update(self.keys())
        # a view handed to a save stays open: it is a read transaction of its own, and
        # the store thread may not have read it yet (a keyed aggregation clears its
        # groups once it emitted them, maybe right after a save); it closes once read
        self._young.clear()
        self._old.clear()
        self._unflushed.clear()
        self._blind.clear()
        self._conn.execute("DELETE FROM s")
        self._len = 0

    # -- the cache and the database -----------------------------------------------------
    def _flip(self) -> None:
        """``young`` is full: write ``old``'s changed (and mutable) entries, drop ``old``."""
        old = self._old
        unflushed = self._unflushed
        self._write(old, [k for k, v in old.items() if k in unflushed or _mutable(v)])
        self._old = self._young
        self._young = {}

    def flush(self) -> None:
        """Write every changed (or mutable) cached entry to the database; the cache keeps
        them."""
        unflushed = self._unflushed
        for gen in (self._old, self._young):
            self._write(gen, [k for k, v in gen.items() if k in unflushed or _mutable(v)])

    def _write(self, gen: dict[Any, Any], keys: list[Any]) -> None:
        if not keys:
            return
        blind = self._blind
        if blind:
            mine = [k for k in keys if k in blind]
            if mine:
                self._count_new(mine)
        upserts = []
        deletes = []
        for k in keys:
            v = gen[k]
            if v is _ABSENT:
                deletes.append((encode_key(k),))
            else:
                upserts.append((encode_key(k), _dumps(v, _PROTOCOL)))
        upserts.sort()
        conn = self._conn
        conn.execute("BEGIN")
        try:
            conn.executemany("INSERT OR REPLACE INTO s VALUES (?, ?)", upserts)
            if deletes:
                conn.executemany("DELETE FROM s WHERE k = ?", deletes)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._unflushed.difference_update(keys)

    def _count_new(self, keys: list[Any]) -> None:
        """Count the blind ``keys`` the database does not hold (one query per 500)."""
        enc = sorted(encode_key(k) for k in keys)
        present = 0
        execute = self._conn.execute
        for i in range(0, len(enc), _BATCH):
            part = enc[i : i + _BATCH]
            present += execute(
                f"SELECT count(*) FROM s WHERE k IN ({','.join('?' * len(part))})", part
            ).fetchone()[0]
        self._len += len(keys) - present
        self._blind.difference_update(keys)

    def _resolve_blind(self) -> None:
        if self._blind:
            self._count_new(list(self._blind))

    def close(self) -> None:
        """Close the database and remove its directory (the engine calls this when the
        execution ends). The map is unusable afterwards."""
        self._view = None
        self._finalizer()


def _prefix(context: Any) -> str:
    if context is None:
        return "keyed-state-"
    job = getattr(context, "job_name", "job")
    vertex = getattr(context, "vertex_name", "vertex")
    index = getattr(context, "global_processor_index", 0)
    return f"{_safe(str(job))}-{_safe(str(vertex))}-{index}-"


class DiskStateView(Mapping[Any, Any]):
    """A consistent read of a :class:`DiskKeyedState` (a read transaction on its own
    connection), handed to the snapshot store as a full save's ``upserts``.

    It is iterated on the store's thread while the processor writes on. It pickles as a
    plain ``dict`` streamed from the database, and its read transaction ends once an
    iteration went through (or at :meth:`close`): read it once. ``len()`` is the map's
    size when the view was taken."""

    #: its values are decoded from the database as they are read: nothing else holds
    #: them, so the engine need not copy them (``engine.snapshot.detached``)
    detached = True

    def __init__(
        self,
        path: str,
        length: int,
        tag: str,
        detail: Any,
        files: _Files,
        overlay: dict[Any, Any] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._len = length
        #: what the state's cache held that the database lacked when the view was taken
        self._overlay = overlay or {}
        self._what = f"keyed state map ({tag!r}, {detail!r}) at {path}"
        self.closed = False
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN")
        conn.execute("SELECT 1 FROM s LIMIT 1").fetchall()  # the read snapshot starts here
        self._conn: sqlite3.Connection | None = conn
        files.view_opened()
        # the state's directory stays until the store read this view (or it is collected)
        self._finalizer = weakref.finalize(self, _close_view, self._lock, conn, files)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"DiskStateView({self._len} entries{', closed' if self.closed else ''})"

    def _open(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            raise SnapshotError(
                f"the view of the disk-backed {self._what} is closed: the snapshot store "
                f"read it already or a later snapshot replaced it (a view is read once; "
                f"read the snapshot back from the store instead)"
            )
        return conn

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        """Every entry, decoded as it is read; the read transaction ends after the last."""
        lock = self._lock
        with lock:
            cursor = self._open().execute("SELECT k, v FROM s")
        loads = _loads
        overlay = self._overlay
        try:
            while True:
                with lock:  # close() waits for a fetch in progress
                    self._open()
                    rows = cursor.fetchmany(1024)
                if not rows:
                    break
                for kb, vb in rows:
                    k = decode_key(kb)
                    if k not in overlay:
                        yield k, loads(vb)
        finally:
            with lock:
                if self._conn is not None:
                    cursor.close()
        for k, v in overlay.items():
            if v is not _ABSENT:
                yield k, (loads(v.data) if type(v) is _Frozen else v)
        self.close()

    def __iter__(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        return (v for _, v in self.items())

    def __getitem__(self, key: Any) -> Any:
        v = self._overlay.get(key, _MISS)
        if v is _ABSENT:
            raise KeyError(key)
        if v is not _MISS:
            return _loads(v.data) if type(v) is _Frozen else v
        with self._lock:
            row = self._open().execute("SELECT v FROM s WHERE k = ?", (encode_key(key),)).fetchone()
        if row is None:
            raise KeyError(key)
        return _loads(row[0])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # a plain dict, filled from the database as the pickler goes (SETITEMS batches)
        return (dict, (), None, None, self.items())

    def close(self) -> None:
        """End the read transaction (the database may then reuse its log)."""
        with self._lock:
            self._conn = None
            self.closed = True
        self._finalizer()


def _close_view(lock: threading.Lock, conn: sqlite3.Connection, files: _Files) -> None:
    with lock:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        conn.close()
    files.view_closed()
