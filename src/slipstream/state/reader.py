"""Reading a job's state as data: the entries of a committed snapshot as rows.

A snapshot store holds, per vertex and processor, a chain of signed chunks of plain
records (:mod:`~slipstream.state.format`). :func:`read` turns one retained snapshot into
:class:`StateRow` s through the store's own reader (every manifest and chunk is verified
before anything in it is unpickled), and :func:`changes` compares two retained snapshots.
Nothing here imports an engine: a store written by a job that is not running, or by
another process, reads the same way (with the same signing key).

What the rows of each kind of state look like (``kind`` says which):

``"keyed"``
    a key's state: rolling aggregates, ``map_stateful``, group-by aggregations and
    custom processors' keyed entries. ``key`` is the grouping key, ``detail`` ``None``
    (or what a custom processor put in ``KeyedStateKey.detail``), ``value`` the
    accumulator (for ``counting()`` or ``summing()`` the running int) or the state
    object ``map_stateful`` keeps.
``"window"``
    one key's accumulator (not finished) in one window of a sliding or tumbling
    window's last stage that has not been emitted yet: ``detail`` is ``{"start": s,
    "end": e}``. The processor keeps *frames* (``KeyedStateKey(key, frame_end)``: the
    items with timestamps in ``[frame_end - slide, frame_end)``) and saves its window
    definition ``window.definition`` (``{"size", "slide", "offset"}``, plain data; not a
    row of its own) with them. A tumbling window's frame is its window: one row per
    frame, ``start = frame_end - size``, its detail keeping ``"frame_end"`` too (what
    ``bootstrap`` and ``transform`` take). A sliding window ending at ``E`` combines the
    frames ending in ``(E - size, E]`` with the aggregate operation's ``combine``, which
    only the DAG knows: read with ``dag=`` (or a job, or through ``point_query``), its
    rows are the windows ending at or after the emission cursor that hold a frame, each
    the combine of its frames (no ``"frame_end"``: such rows do not seed a store);
    without it each frame is a row, ``{"start": frame_end - slide, "end": frame_end,
    "frame": True, "frame_end": frame_end}``. A store written before definitions were
    saved shows each frame as ``{"frame_end": E}``. Only the last stage of a window
    keeps frames (a two-stage window's first stage flushes them downstream at every
    snapshot).
``"session"``
    one open session of one key: ``detail`` is ``{"start": ts, "end": ts}`` (``end`` is
    the last event's timestamp + the timeout), ``value`` the session's accumulator.
``"offset"``
    a source's position: ``key`` is the source's own entry name (``("generator", 0)``);
    ``detail`` names what it is the position of and ``value`` the position, as a dict:
    a generator ``{"processor": i}`` -> ``{"next_seq": n, "parallelism": p}`` (processor
    ``i`` emitted the sequence numbers ``i, i + p, ...`` below ``n``); a batch or file
    source ``{"processor": i}`` -> ``{"parallelism": p, "position": pos}``; Kafka
    ``{"topic": t, "partition": n}`` -> ``{"offset": o, "watermark": w}``;
    ``stream_files`` ``{"file": identity}`` -> ``{"name", "offset", "line", "head",
    "tail"}``.
``"broadcast"``
    any other entry restored to every processor of its vertex, as saved: ``key`` is its
    name (``"window.next_win_to_emit"``: a window's emission cursor;
    ``"session_window.current_watermark"``, ``"insert_watermarks.wm"``: watermarks; a
    sink's pending transactions), ``detail`` ``None``, ``value`` as saved. A window's
    ``"window.definition"`` is not a row: it shapes the window rows (and bootstrap
    writes it from the DAG).

``processor`` is the global index of the processor whose chain held the entry.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from slipstream.core.errors import SnapshotError
from slipstream.state.columnar import MapColumns
from slipstream.state.keyed import FULL, PLAIN, StateMap, StateMapSave
from slipstream.state.keys import BroadcastKey, KeyedStateKey, expand_entries

__all__ = [
    "StateChange",
    "StateQueries",
    "StateRow",
    "changes",
    "open_store",
    "point_query",
    "read",
    "to_arrow",
    "to_pandas",
]

#: broadcast names of processors whose keyed entries are window frames / sessions
_WINDOW_CURSOR = "window.next_win_to_emit"
_SESSION_WATERMARK = "session_window.current_watermark"
_WINDOW_DEFINITION = "window.definition"
#: tags of sources that save ``(tag, global_index) -> (parallelism, position)``
_POSITIONED = {
    "offset", "items-offset", "list-offset", "map-offset", "files-offset", "csv-offset",
    "jsonl-offset", "parquet-offset", "sql-rows", "snapshot-offset",
}  # fmt: skip
#: how many times :func:`read` tries again when a running job pruned the snapshot it read
_RETRIES = 5
#: ``read(key=...)`` not given: every key
_ALL: Any = object()


class StateRow(NamedTuple):
    """One entry of a snapshot (see the module doc for each ``kind``)."""

    vertex: str
    processor: int
    key: Any
    detail: Any
    value: Any
    kind: str


class StateChange(NamedTuple):
    """An entry ``added``, ``changed`` or ``removed`` between two snapshots: ``value`` is
    its value in the newer one (``None`` when removed), ``previous`` in the older one
    (``None`` when added)."""

    vertex: str
    processor: int
    key: Any
    detail: Any
    value: Any
    kind: str
    change: str
    previous: Any


# -- the store ---------------------------------------------------------------------------
def open_store(store: Any) -> Any:
    """A :class:`~slipstream.state.store.DirectorySnapshotStore` for ``store``: a store,
    a job (its store), or a store directory. A directory that does not exist, or whose
    signing key cannot be found, is a :class:`SnapshotError` (nothing is created)."""
    from slipstream.state.signing import KEY_ENV, store_key_path
    from slipstream.state.store import DirectorySnapshotStore

    if isinstance(store, DirectorySnapshotStore):
        return store
    job_store = getattr(store, "store", None)
    if isinstance(job_store, DirectorySnapshotStore):
        return job_store
    if hasattr(store, "store") and job_store is None:
        raise SnapshotError(
            f"{store!r} takes no snapshots (processing_guarantee NONE): it has no state to read"
        )
    if not isinstance(store, str | os.PathLike):
        raise TypeError(
            f"expected a snapshot store directory, a DirectorySnapshotStore or a job, got {store!r}"
        )
    directory = os.fspath(store)
    if not os.path.isdir(directory):
        raise SnapshotError(f"no snapshot store at {directory}: no such directory")
    names = os.listdir(directory)
    if not any(n == "MANIFEST.json" or n.startswith("snapshot-") for n in names):
        raise SnapshotError(
            f"snapshot store {directory} holds no committed snapshot (not a snapshot store, "
            f"or its job has not committed one yet)"
        )
    if not os.environ.get(KEY_ENV) and not os.path.exists(store_key_path(directory)):
        raise SnapshotError(
            f"no signing key for snapshot store {directory}: its key file "
            f"{store_key_path(directory)} does not exist (the store was written by another "
            f"user or with another key directory); set ${KEY_ENV} or pass "
            f"DirectorySnapshotStore({directory!r}, key=...)"
        )
    return DirectorySnapshotStore(directory)


def _no_snapshot_yet(directory: str) -> str:
    """Why a reader finds nothing to read in store ``directory``: readers only read what
    its ``MANIFEST.json`` names, so the snapshot files a job writes before its first
    commit (and those of a store whose manifest was lost) are never read."""
    from slipstream.state.store import MANIFEST

    if not os.path.exists(os.path.join(directory, MANIFEST)):
        return (
            f"snapshot store {directory} holds no committed snapshot yet: it has no "
            f"{MANIFEST} (its job has not committed its first snapshot, or the file was "
            f"lost; a job resuming from the store rebuilds it from the snapshot files)"
        )
    return f"snapshot store {directory} holds no committed snapshot"


def _snapshot(
    store: Any,
    vertex: str | None,
    snapshot_id: int | None,
    columns: bool = False,
    owners: Callable[[int, Any], set[int] | None] | None = None,
) -> tuple[int, Any]:
    """The id and :class:`~slipstream.state.store.SnapshotData` to read (only
    ``vertex``'s processors if given; ``columns``: the maps of columnar chunks as their
    columns, :class:`~slipstream.state.columnar.MapColumns`, for the readers here;
    ``owners(id, manifest)``: the only processors of ``vertex`` whose chains hold what
    is asked, ``None`` when that cannot be known: all are read)."""
    last: SnapshotError | None = None
    for _ in range(_RETRIES):
        ids = store.committed_ids_read_only()
        if not ids:
            raise SnapshotError(_no_snapshot_yet(store.directory))
        sid = ids[-1] if snapshot_id is None else snapshot_id
        if sid not in ids:
            raise SnapshotError(
                f"snapshot {sid} is not retained in snapshot store {store.directory}; "
                f"retained: {', '.join(map(str, ids))}"
            )
        try:
            manifest = store.read_manifest(sid)
            processors = None
            if vertex is not None:
                vm = manifest.vertices.get(vertex)
                if vm is None and manifest.vertices:
                    names = ", ".join(repr(n) for n in sorted(manifest.vertices))
                    raise ValueError(
                        f"snapshot {sid} in {store.directory} has no vertex {vertex!r}; its "
                        f"vertices: {names}"
                    )
                processors = [(vertex, i) for i in vm.chains] if vm is not None else None
                chosen = owners(sid, manifest) if owners is not None and vm is not None else None
                if processors is not None and chosen is not None:
                    processors = [p for p in processors if p[1] in chosen]
            data = store.read(sid, processors, columns=columns, parallel=True)
            if vertex is not None and vertex not in data.vertices:
                names = ", ".join(repr(n) for n in sorted(data.vertices))
                raise ValueError(
                    f"snapshot {sid} in {store.directory} has no vertex {vertex!r}; its "
                    f"vertices: {names}"
                )
            return sid, data
        except SnapshotError as e:
            last = e
            if store.committed_ids_read_only() != ids:
                continue  # a running job committed and pruned meanwhile: read the new one
            if snapshot_id is None:
                store.latest()  # raises the store's SnapshotStoreDamagedError
            raise
    assert last is not None
    raise last


# -- rows ----------------------------------------------------------------------------------
def _unwrap(key: Any) -> Any:
    """The original key of a fused pipeline stage's first processor (``FirstKey``)."""
    inner: Any
    for inner in (getattr(key, "name", None), getattr(key, "detail", None)):
        t = type(inner)
        if t.__name__ == "FirstKey" and t.__module__ == "slipstream.pipeline.fused":
            return inner.key
    return key


def _offset(name: Any, value: Any) -> tuple[Any, Any] | None:
    """``(detail, value)`` of a source offset entry named ``name``; ``None``: not one."""
    if type(name) is not tuple or not name:
        return None
    tag = name[0]
    try:
        if tag == "generator" and len(name) == 2:
            next_seq, parallelism = value
            return {"processor": name[1]}, {"next_seq": next_seq, "parallelism": parallelism}
        if tag in _POSITIONED and len(name) == 2:
            parallelism, position = value
            return {"processor": name[1]}, {"parallelism": parallelism, "position": position}
        if tag == "kafka-offset" and len(name) == 3:
            offset, watermark = value
            return {"topic": name[1], "partition": name[2]}, {
                "offset": offset,
                "watermark": watermark,
            }
        if tag == "stream_files" and len(name) == 2:
            if type(value) is int:  # an earlier version's name-keyed offset
                return {"file": name[1]}, {"offset": value}
            fname, offset, line, head, tail = value
            return {"file": name[1]}, {
                "name": fname, "offset": offset, "line": line, "head": head, "tail": tail,
            }  # fmt: skip
    except (TypeError, ValueError):
        return None
    return None


def _narrow(entries: Iterable[tuple[Any, Any]], key: Any) -> list[tuple[Any, Any]]:
    """``entries`` with each full map cut down to ``key``'s entry (a dict lookup instead
    of a row per key; the other entries stay, a window's cursor tells its frames)."""
    out: list[tuple[Any, Any]] = []
    for k, v in entries:
        if type(k) is StateMap and v.mode == FULL:
            m = v.upserts
            if type(m) is MapColumns:  # searched in its columns: no dict of the map
                found, value = m.find(key)
            else:
                found = key in m
                value = m[key] if found else None
            if found:
                out.append((k, StateMapSave(FULL, {key: value}, (), 0)))
        else:
            out.append((k, v))
    return out


def _definition(value: Any) -> tuple[int, int] | None:
    """``(size, slide)`` of a saved window definition, ``None`` if it is not one."""
    if type(value) is not dict:
        return None
    size, slide = value.get("size"), value.get("slide")
    if type(size) is not int or type(slide) is not int or slide <= 0 or size < slide:
        return None
    if size % slide:
        return None
    return size, slide


def _window_rows(
    vertex: str,
    index: int,
    frames: list[tuple[Any, int, Any]],
    size: int,
    slide: int,
    cursor: Any,
    op: Any,
) -> list[StateRow]:
    """The open windows of a sliding window's ``frames`` ``(key, frame_end, acc)``: each
    window ending at ``E >= cursor`` (not emitted yet) that holds a frame, its
    accumulator the combine (``op.combine`` over ``op.create()``) of its frames, in
    frame order; per key in the order the keys come, windows by end."""
    from slipstream.core.items import NO_WATERMARK

    span = size - slide
    lowest = cursor if type(cursor) is int and cursor != NO_WATERMARK else None
    per_key: dict[Any, dict[int, Any]] = {}
    for k, f, v in frames:
        per_key.setdefault(_hashable(k), {})[f] = (k, v)
    combine, create = op.combine, op.create
    rows: list[StateRow] = []
    for held in per_key.values():
        ends = {e for f in held for e in range(f, f + span + 1, slide)}
        for e in sorted(ends):
            if lowest is not None and e < lowest:
                continue
            acc = create()
            key: Any = None
            for f in range(e - span, e + 1, slide):
                got = held.get(f)
                if got is not None:
                    key = got[0]
                    acc = combine(acc, got[1])
            rows.append(StateRow(vertex, index, key, {"start": e - size, "end": e}, acc, "window"))
    return rows


def processor_rows(
    vertex: str, index: int, entries: Iterable[tuple[Any, Any]], op: Any = None
) -> list[StateRow]:
    """The rows of one processor's merged entries (see the module doc). ``op``: the
    window's aggregate operation (from the DAG), which makes a sliding window's frames
    into its open windows; without it each frame is a row of its own."""
    flat = expand_entries([(_unwrap(k), v) for k, v in entries])
    names = {k.name: v for k, v in flat if type(k) is BroadcastKey}
    windows = _WINDOW_CURSOR in names
    sessions = _SESSION_WATERMARK in names
    sizes = _definition(names.get(_WINDOW_DEFINITION)) if windows else None
    combined = (
        sizes is not None and sizes[0] != sizes[1] and getattr(op, "combine", None) is not None
    )
    held: list[tuple[Any, int, Any]] = []
    rows: list[StateRow] = []
    append = rows.append
    for k, v in flat:
        t = type(k)
        if t is BroadcastKey:
            if windows and k.name == _WINDOW_DEFINITION:
                continue  # not state: it shapes the window rows
            off = _offset(k.name, v)
            if off is not None:
                append(StateRow(vertex, index, k.name, off[0], off[1], "offset"))
            else:
                append(StateRow(vertex, index, k.name, None, v, "broadcast"))
        elif t is KeyedStateKey:
            d = k.detail
            if windows and type(d) is int:
                if combined:
                    held.append((k.key, d, v))
                elif sizes is None:  # a store written before definitions were saved
                    append(StateRow(vertex, index, k.key, {"frame_end": d}, v, "window"))
                elif sizes[0] == sizes[1]:  # tumbling: the frame is the window
                    detail = {"start": d - sizes[0], "end": d, "frame_end": d}
                    append(StateRow(vertex, index, k.key, detail, v, "window"))
                else:  # a sliding window's frame (no combine known)
                    detail = {"start": d - sizes[1], "end": d, "frame": True, "frame_end": d}
                    append(StateRow(vertex, index, k.key, detail, v, "window"))
            elif sessions and d is None and type(v) in (list, tuple):
                for s in v:
                    append(
                        StateRow(
                            vertex, index, k.key, {"start": s[0], "end": s[1]}, s[2], "session"
                        )
                    )
            else:
                append(StateRow(vertex, index, k.key, d, v, "keyed"))
        else:
            append(StateRow(vertex, index, k, None, v, "keyed"))
    if held:
        assert sizes is not None
        rows.extend(
            _window_rows(vertex, index, held, sizes[0], sizes[1], names[_WINDOW_CURSOR], op)
        )
    return rows


def window_ops(dag: Any) -> dict[str, Any]:
    """The aggregate operation of each sliding window's last stage in ``dag`` (a DAG, a
    Pipeline or ``None``), by vertex name: what combines its frames into windows."""
    if dag is None:
        return {}
    from slipstream.core.dag import as_dag
    from slipstream.state.bootstrap import window_spec

    out: dict[str, Any] = {}
    for v in as_dag(dag).vertices:
        spec = window_spec(v.supplier)
        if spec is not None and not spec[0].is_tumbling:
            out[v.name] = spec[1]
    return out


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a snapshot becomes rows: each row is a
    new tuple, the collector runs every 700 of them (and over the older ones ever more
    often as they pile up) and finds nothing to free. 1M rows: ~2.0-2.6 s with it, ~1.0
    without (a 2-core machine at load 10-14). It is enabled again afterwards unless it
    was off already."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _rows(
    data: Any, vertex: str | None, key: Any = _ALL, ops: dict[str, Any] | None = None
) -> list[StateRow]:
    """The rows of ``data`` (``vertex``'s only, if given; ``key``'s only, if given;
    ``ops``: :func:`window_ops`)."""
    narrow = key is not _ALL
    if narrow:
        try:
            hash(key)
        except TypeError:
            narrow = False
    rows: list[StateRow] = []
    for name, vs in data.vertices.items():
        if vertex is not None and name != vertex:
            continue
        for i in sorted(vs.entries):
            entries = vs.entries[i]
            op = ops.get(name) if ops else None
            rows.extend(
                processor_rows(name, i, _narrow(entries, key) if narrow else entries, op)
            )
    if key is not _ALL:
        rows = [r for r in rows if _same_key(r.key, key)]
    return rows


def read(
    store: Any,
    vertex: str | None = None,
    snapshot_id: int | None = None,
    *,
    key: Any = _ALL,
    dag: Any = None,
) -> list[StateRow]:
    """The entries of a committed snapshot of ``store`` (a directory, a
    :class:`~slipstream.state.store.DirectorySnapshotStore`, or a job) as
    :class:`StateRow` s: the newest by default, any retained one with ``snapshot_id``.
    ``vertex`` reads only that vertex's chunks; ``key`` keeps the rows of that key.
    ``dag`` (a DAG or Pipeline; a job's own when ``store`` is a job): the job's DAG,
    whose aggregate operations make a sliding window's frames into its open windows
    (without it each frame is a row; see the module doc).

    Errors: :class:`SnapshotError` when there is no store, no committed snapshot, or
    ``snapshot_id`` is not retained (the message lists the retained ids);
    ``ValueError`` for an unknown ``vertex`` (listing the snapshot's vertices); the
    store's own :class:`~slipstream.core.errors.SnapshotStoreDamagedError` when its
    newest snapshot cannot be read (a file missing, corrupt or failing its signature),
    and its ``SnapshotError`` naming the file for an older one."""
    s = open_store(store)
    ops = window_ops(dag if dag is not None else getattr(store, "dag", None))
    with gc_paused():
        _sid, data = _snapshot(s, vertex, snapshot_id, columns=True)
        return _rows(data, vertex, key, ops)


def read_with_id(
    store: Any, vertex: str | None = None, snapshot_id: int | None = None, dag: Any = None
) -> tuple[int, list[StateRow]]:
    """:func:`read` and the id of the snapshot it read."""
    s = open_store(store)
    ops = window_ops(dag if dag is not None else getattr(store, "dag", None))
    with gc_paused():
        sid, data = _snapshot(s, vertex, snapshot_id, columns=True)
        return sid, _rows(data, vertex, _ALL, ops)


def point_query(job: Any, vertex: str, key: Any = _ALL) -> tuple[int, list[StateRow]]:
    """What ``job.state(vertex, key)`` answers, and the id of the snapshot it read: the
    rows of ``key`` (every key if not given) in ``vertex``'s state as of the last
    snapshot committed to ``job.store``. The dashboard's key search asks this too, so
    both answer alike. A :class:`SnapshotError` if the job takes no snapshots or has
    committed none yet; ``ValueError`` for a vertex the snapshot does not have."""
    store = getattr(job, "store", None)
    if store is None:
        raise SnapshotError(
            f"job {job.name!r} takes no snapshots (processing_guarantee NONE): it has no "
            f"state to read"
        )
    if not store.committed_ids_read_only():
        raise SnapshotError(
            f"job {job.name!r} has committed no snapshot yet (its store is "
            f"{store.directory}): there is no state to read"
        )
    s = open_store(store)
    owners = None if key is _ALL else functools.partial(_key_owner, job, s, vertex, key)
    sid, data = _snapshot(s, vertex, None, columns=True, owners=owners)
    return sid, _rows(data, vertex, key, window_ops(getattr(job, "dag", None)))


#: the manifest's ``extra`` key of the chains' flags member processes record
#: (:data:`slipstream.engine.member_snapshots.FLAGS`; nothing here imports an engine)
_CHAIN_FLAGS = "member_chains"


def _key_owner(
    job: Any, store: Any, vertex: str, key: Any, sid: int, manifest: Any
) -> set[int] | None:
    """The processor of ``vertex`` whose chain in snapshot ``sid`` of ``job``'s store
    holds ``key``'s state, as a set; ``None`` when that cannot be known (then every
    chain is read). Known when the snapshot was written by this job (its shape is the
    job's), only partitioned edges feed the vertex, and no chain may hold another
    processor's keys (member processes record it with each chain; one member
    without processes routes every key it holds): the key is then where a live item
    with that key goes (:func:`~slipstream.core.partition.key_routing` with the
    vertex's inbound edge partitioner, as a restore routes it)."""
    from slipstream.core.dag import RoutingPolicy
    from slipstream.core.partition import key_routing
    from slipstream.state.restore import custom_partitioners

    dag = getattr(job, "dag", None)
    plan = getattr(getattr(job, "_execution", None), "plans", {}).get(vertex)
    vm = manifest.vertices.get(vertex)
    if dag is None or plan is None or vm is None:
        return None
    if vm.total_parallelism != plan.total_parallelism:
        return None
    try:
        edges = dag.inbound_edges(dag.vertex(vertex))
        if not edges or any(e.routing is not RoutingPolicy.PARTITIONED for e in edges):
            return None  # an item of another edge (a join's broadcast side) goes anywhere
        if store.read_header(sid).get("execution") != getattr(job, "execution_id", None):
            return None  # written by another job (restored from): its shape is not known
        flags = manifest.extra.get(_CHAIN_FLAGS)
        mine = flags.get(vertex) if isinstance(flags, dict) else None
        if mine is not None:
            chains = mine.get("chains", {})
            if list(mine.get("shape", ())) != [plan.member_count, plan.local_parallelism]:
                return None
            if not all(str(i) in chains and not chains[str(i)][0] for i in vm.chains):
                return None
        elif plan.member_count != 1:
            return None
        routing = key_routing(
            custom_partitioners(dag).get(vertex), plan.member_count, plan.local_parallelism
        )
        return {routing.owner(key)}
    except Exception:  # noqa: BLE001 - an odd key or DAG: read every chain instead
        return None


def size_counts(data: Any) -> dict[str, tuple[int, int]]:
    """Per vertex of ``data`` (a :class:`~slipstream.state.store.SnapshotData`), how
    many rows :func:`read` gives for it and how many distinct keys its ``keyed``,
    ``window`` and ``session`` rows have, without making the rows of a plain keyed map
    (a rolling aggregate's or ``map_stateful``'s: its size is its dict's)."""
    out: dict[str, tuple[int, int]] = {}
    for name, vs in data.vertices.items():
        n_rows = n_keys = 0
        for i, entries in vs.entries.items():
            rest: list[tuple[Any, Any]] = []
            maps: list[Any] = []
            for k, v in entries:
                k = _unwrap(k)
                if type(k) is StateMap and k.tag == PLAIN and v.mode == FULL:
                    maps.append(v.upserts)
                else:
                    rest.append((k, v))
            rows = processor_rows(name, i, rest) if rest else []
            keyed = [r.key for r in rows if r.kind in ("keyed", "window", "session")]
            n_rows += len(rows) + sum(len(m) for m in maps)
            if len(maps) == 1 and not keyed:
                n_keys += len(maps[0])
            else:
                seen: set[Any] = set()
                for m in maps:
                    seen.update(m.keys())
                seen.update(_hashable(k) for k in keyed)
                n_keys += len(seen)
        out[name] = (n_rows, n_keys)
    return out


def newest_size_counts(store: Any) -> tuple[int, dict[str, tuple[int, int]]]:
    """:func:`size_counts` of the newest committed snapshot of ``store``, and its id
    (a snapshot a running job pruned while it was read is skipped for the newer one)."""
    sid, data = _snapshot(open_store(store), None, None, columns=True)
    return sid, size_counts(data)


def _same_key(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a key's __eq__ may raise on another type
        return False


# -- changes -------------------------------------------------------------------------------
def _hashable(x: Any) -> Any:
    if type(x) is dict:
        return tuple((k, _hashable(v)) for k, v in x.items())
    if type(x) is list:
        return tuple(_hashable(v) for v in x)
    try:
        hash(x)
    except TypeError:
        return repr(x)
    return x


def _identity(r: StateRow) -> tuple[Any, ...]:
    """What names an entry across snapshots: a keyed entry by its key and detail (it may
    move to another processor when a job is restored at another parallelism), the rest
    by processor and name as well."""
    if r.kind in ("keyed", "window", "session"):
        return (r.vertex, r.kind, _hashable(r.key), _hashable(r.detail))
    return (r.vertex, r.kind, r.processor, _hashable(r.key), _hashable(r.detail))


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - arrays and the like: compare what they pickle as
        return repr(a) != repr(b)


def changes(
    store: Any, from_id: int, to_id: int, vertex: str | None = None, *, dag: Any = None
) -> list[StateChange]:
    """The entries ``added``, ``changed`` and ``removed`` from retained snapshot
    ``from_id`` to retained snapshot ``to_id`` of ``store`` (a change feed): the newer
    snapshot's rows that are new or whose value differs, in its order, then the rows it
    no longer has. A session that grew is a removed session and an added one (its
    bounds are its detail). ``dag``: as :func:`read`'s (a sliding window's open windows
    instead of its frames)."""
    s = open_store(store)
    ops = window_ops(dag if dag is not None else getattr(store, "dag", None))
    _a, old = _snapshot(s, vertex, from_id, columns=True)
    _b, new = _snapshot(s, vertex, to_id, columns=True)
    before: dict[tuple[Any, ...], StateRow] = {}
    for r in _rows(old, vertex, _ALL, ops):
        before[_identity(r)] = r
    out: list[StateChange] = []
    seen: set[tuple[Any, ...]] = set()
    for r in _rows(new, vertex, _ALL, ops):
        ident = _identity(r)
        seen.add(ident)
        prev = before.get(ident)
        if prev is None:
            out.append(StateChange(*r, "added", None))
        elif _differs(prev.value, r.value):
            out.append(StateChange(*r, "changed", prev.value))
    for ident, prev in before.items():
        if ident not in seen:
            out.append(StateChange(*prev[:4], None, prev.kind, "removed", prev.value))
    return out


# -- data frames -----------------------------------------------------------------------------
def _columns(rows: Sequence[tuple[Any, ...]]) -> tuple[tuple[str, ...], list[list[Any]]]:
    fields: tuple[str, ...] = tuple(getattr(rows[0], "_fields", ())) if rows else StateRow._fields
    cols: list[list[Any]] = [[] for _ in fields]
    for r in rows:
        for c, v in zip(cols, r, strict=True):
            c.append(v)
    return fields, cols


def to_pandas(rows: Sequence[tuple[Any, ...]]) -> Any:
    """``rows`` (of :func:`read` or :func:`changes`) as a ``pandas.DataFrame``, one
    column per field (keys, details and values as the Python objects they are)."""
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(
            "slipstream.state.to_pandas needs pandas, which is not installed: pip install pandas"
        ) from e
    fields, cols = _columns(rows)
    return pd.DataFrame(dict(zip(fields, cols, strict=True)), columns=list(fields))


def to_arrow(rows: Sequence[tuple[Any, ...]]) -> Any:
    """``rows`` (of :func:`read` or :func:`changes`) as a ``pyarrow.Table``. A column
    whose values Arrow cannot hold as one type (keys of mixed types, tuples next to
    ints, objects) holds their ``repr`` strings instead."""
    try:
        import pyarrow as pa
    except ImportError as e:
        raise ImportError(
            "slipstream.state.to_arrow needs pyarrow, which is not installed: pip install "
            "pyarrow (or slipstream[parquet])"
        ) from e
    fields, cols = _columns(rows)
    arrays = []
    for c in cols:
        try:
            arrays.append(pa.array(c))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            arrays.append(pa.array([None if v is None else repr(v) for v in c], pa.string()))
    return pa.Table.from_arrays(arrays, names=list(fields))


class StateQueries:
    """What a job handle adds to answer point queries on its state (``job.state``).
    Every engine's job with a store mixes it in (the embedded engine's ``Job``, the
    Spark engine's jobs); it lives here, not on ``core``'s ``JobHandle``, because
    ``core`` imports no state layer."""

    def state(self, vertex: str, key: Any = _ALL) -> list[StateRow]:
        """A point query: the rows of ``key`` (every key if not given) in ``vertex``'s
        state as of the last snapshot committed to the job's store, read from the store
        (signatures checked) while the job runs on; see :func:`slipstream.state.read`
        for what the rows hold. Every engine's job with a store answers it (the embedded
        engine's with a processing guarantee, a Spark streaming or micro-batch job's
        checkpoint). A ``SnapshotError`` if the job takes no snapshots or has committed
        none yet."""
        return point_query(self, vertex, key)[1]
