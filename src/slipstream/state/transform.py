"""Rewriting a job's state as data: ``ss.state.transform`` passes each entry of one vertex
of a committed snapshot through a function and commits the result as a new snapshot
(drop a bad key, fix a value, change an accumulator's type before a deploy).

It reads the snapshot through the store's own reader (every file verified before
anything in it is unpickled), calls the function on every entry before anything is
written, and writes through :func:`slipstream.state.bootstrap._write` (signed chunks,
then the signed manifest: nothing partial is committed). The function sees the rows
``ss.state.read`` gives: ``keyed`` rows, a window's frames as ``window`` rows and a
session window's sessions as ``session`` rows (one per session); a vertex's broadcast
entries (a window's cursor, a session window's watermark, offsets) and the other
vertices are kept as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slipstream.core.errors import SnapshotError
from slipstream.core.partition import key_routing
from slipstream.state.bootstrap import _as_store, _write
from slipstream.state.keyed import FULL, PLAIN, StateMap, StateMapSave
from slipstream.state.keys import BroadcastKey, KeyedStateKey, expand_entries
from slipstream.state.lineage import shape_difference
from slipstream.state.reader import StateRow, _snapshot, open_store, processor_rows

__all__ = ["transform"]

_REWRITTEN = ("keyed", "window")
#: the manifest's ``extra`` key of the chains' flags member processes record
#: (:data:`slipstream.engine.member_snapshots.FLAGS`; the state layer imports no engine)
FLAGS = "member_chains"


def _parse(row: Any, original: StateRow, where: str) -> tuple[Any, Any, Any]:
    """``(key, detail, value)`` of ``fn``'s result ``row`` for entry ``original``: a
    ``StateRow`` of its vertex and kind, or a ``(key, value)`` tuple (the detail kept)."""
    if isinstance(row, StateRow):
        if row.vertex != original.vertex:
            raise ValueError(
                f"{where}: fn returned a row of vertex {row.vertex!r} ({row!r}); it may only "
                f"return rows of vertex {original.vertex!r}"
            )
        if row.kind != original.kind:
            raise ValueError(
                f"{where}: fn returned a row of kind {row.kind!r} for an entry of kind "
                f"{original.kind!r} ({row!r})"
            )
        key, detail, value = row.key, row.detail, row.value
    elif type(row) is tuple and len(row) == 2:
        key, value = row
        detail = original.detail
    else:
        raise TypeError(
            f"{where}: fn returned {row!r} ({type(row).__name__}); it returns a StateRow "
            f"(e.g. row._replace(value=...)), a (key, value) tuple, or None to drop the entry"
        )
    try:
        hash(key)
    except TypeError as e:
        raise TypeError(f"{where}: fn returned an unhashable key {key!r} ({e})") from None
    return key, detail, value


def _entry_of(row: Any, original: StateRow, plain: bool, where: str) -> tuple[Any, Any]:
    """The snapshot entry of ``fn``'s result ``row`` for keyed or window entry
    ``original``."""
    key, detail, value = _parse(row, original, where)
    if original.kind == "window":
        frame = detail.get("frame_end") if isinstance(detail, dict) else None
        if type(frame) is not int:
            raise ValueError(
                f"{where}: a window row's detail is {{'frame_end': int}}, fn returned {detail!r}"
            )
        return KeyedStateKey(key, frame), value
    if plain:
        if detail is not None:
            raise ValueError(
                f"{where}: the vertex keeps one value per key (detail None), fn returned "
                f"detail {detail!r}"
            )
        return key, value
    return KeyedStateKey(key, detail), value


def _session_of(row: Any, original: StateRow, where: str) -> tuple[Any, int, int, Any]:
    """``(key, start, end, accumulator)`` of ``fn``'s result ``row`` for session row
    ``original``."""
    key, detail, value = _parse(row, original, where)
    start = detail.get("start") if isinstance(detail, dict) else None
    end = detail.get("end") if isinstance(detail, dict) else None
    if type(start) is not int or type(end) is not int or not start < end:
        raise ValueError(
            f"{where}: a session row's detail is {{'start': int, 'end': int}} with start < "
            f"end, fn returned {detail!r}"
        )
    return key, start, end, value


def _session_entries(
    sessions: dict[Any, list[tuple[int, int, Any, str, Any, int]]],
    owner: Callable[[Any], int],
) -> dict[int, list[tuple[Any, Any]]]:
    """Per processor, the session entries ``(KeyedStateKey(key), [[start, end, acc],
    ...])`` of ``fn``'s results: each key's sessions sorted by start, on the processor
    that held them (or the new key's owner). A key given the sessions of two keys, or
    two sessions of one key that overlap, raise naming both entries."""
    out: dict[int, list[tuple[Any, Any]]] = {}
    for key, found in sessions.items():
        first = found[0]
        for s in found[1:]:
            if not _same(s[4], first[4]) or s[5] != first[5]:
                raise ValueError(
                    f"{s[3]}: fn returned key {key!r}, which {first[3]} has too (a key's "
                    f"sessions come from one key)"
                )
        found.sort(key=lambda s: (s[0], s[1]))
        for a, b in zip(found, found[1:], strict=False):
            if b[0] < a[1]:
                raise ValueError(
                    f"{b[3]}: fn returned session [{b[0]}, {b[1]}) of key {key!r}, which "
                    f"overlaps session [{a[0]}, {a[1]}) that {a[3]} returned"
                )
        target = first[5] if _same(key, first[4]) else owner(key)
        out.setdefault(target, []).append(
            (KeyedStateKey(key, None), [[s[0], s[1], s[2]] for s in found])
        )
    return out


def transform(
    store: Any,
    vertex: str,
    fn: Callable[[StateRow], Any],
    *,
    to_store: Any = None,
    dag: Any = None,
) -> int:
    """Write a new snapshot: the newest committed one of ``store`` with each entry of
    ``vertex`` passed through ``fn(row) -> row | None`` (a
    :class:`~slipstream.state.reader.StateRow` of kind ``keyed``, ``window`` or
    ``session``: one row per session; return it changed, e.g.
    ``row._replace(value=...)``, or a ``(key, value)`` tuple, or ``None`` to drop the
    entry). Other entries (other vertices, the vertex's broadcast state and offsets) are
    kept as they are. A renamed key moves to the processor a restore routes it to: by
    the vertex's own partitioner when ``dag`` (the job's DAG or Pipeline) is given,
    else by the default one (a restore routes every keyed entry by the job's
    partitioner all the same; once a key moved, the flags member processes record with
    the chains of ``vertex`` are dropped, so that a restore reads them all). Committed
    into ``store`` under the next id (the store must not be in use by a running job) or
    into ``to_store`` (empty, or holding snapshots of the same DAG: another DAG's store
    is refused with a :class:`SnapshotError` naming the vertices that differ); returns
    the new id.

    ``fn`` runs over every entry before anything is written: a result that does not fit
    (a row of another vertex or kind, a non-tuple, an unhashable key, two entries with
    one key, a session's bounds that are not ints with start < end, two overlapping
    sessions of one key) raises naming the entry, and nothing is committed."""
    src = open_store(store)
    sid, data = _snapshot(src, None, None)
    if vertex not in data.vertices:
        names = ", ".join(repr(n) for n in sorted(data.vertices))
        raise ValueError(
            f"snapshot {sid} in {src.directory} has no vertex {vertex!r}; its vertices: {names}"
        )
    vs = data.vertices[vertex]
    total = vs.total_parallelism
    owner = _owner(data, vertex, total, dag)
    moved = False
    out: dict[tuple[str, int], list[Any]] = {}
    keys: dict[Any, str] = {}
    plain_maps: dict[int, dict[Any, Any]] = {}
    # new key -> its sessions (start, end, acc, where, original key, processor)
    sessions: dict[Any, list[tuple[int, int, Any, str, Any, int]]] = {}
    for i in sorted(vs.entries):
        flat = expand_entries(vs.entries[i])
        # the processor's broadcast entries tell what its keyed entries are (a window's
        # cursor: frames; a session window's watermark: sessions), as the reader tells it
        context = [e for e in flat if type(e[0]) is BroadcastKey]
        for entry in flat:
            k = entry[0]
            plain = type(k) not in (KeyedStateKey, BroadcastKey)
            rows = (
                []
                if type(k) is BroadcastKey
                else [
                    r
                    for r in processor_rows(vertex, i, [*context, entry])
                    if r.kind != "broadcast" and r.kind != "offset"
                ]
            )
            if rows and all(r.kind == "session" for r in rows):
                for original in rows:
                    where = (
                        f"snapshot {sid}, vertex {vertex!r}, processor {i}, entry "
                        f"{original.key!r} (session [{original.detail['start']}, "
                        f"{original.detail['end']}))"
                    )
                    result = fn(original)
                    if result is not None:
                        key, start, end, value = _session_of(result, original, where)
                        sessions.setdefault(key, []).append(
                            (start, end, value, where, original.key, i)
                        )
                continue
            if len(rows) != 1 or rows[0].kind not in _REWRITTEN:
                out.setdefault((vertex, i), []).append(entry)  # kept as it is
                continue
            original = rows[0]
            where = f"snapshot {sid}, vertex {vertex!r}, processor {i}, entry {original.key!r}"
            if original.kind == "window":
                where += f" (frame_end {original.detail['frame_end']})"
            result = fn(original)
            if result is None:
                continue
            new = _entry_of(result, original, plain, where)
            ident = new[0]
            try:
                other = keys.get(ident)
            except TypeError:
                other = None
            if other is not None:
                raise ValueError(f"{where}: fn returned key {new[0]!r}, which {other} has too")
            keys[ident] = where
            nk = new[0].key if type(new[0]) is KeyedStateKey else new[0]
            target = i if _same(nk, original.key) else owner(nk)
            moved = moved or target != i
            if type(new[0]) is KeyedStateKey:
                out.setdefault((vertex, target), []).append(new)
            else:
                plain_maps.setdefault(target, {})[new[0]] = new[1]
    moved = moved or any(
        not _same(key, found[0][4]) and owner(key) != found[0][5] for key, found in sessions.items()
    )
    for i, es in sorted(_session_entries(sessions, owner).items()):
        out.setdefault((vertex, i), []).extend(es)
    for i, m in sorted(plain_maps.items()):
        out.setdefault((vertex, i), []).append((StateMap(PLAIN, None), StateMapSave(FULL, m)))
    for name, other_vs in data.vertices.items():
        if name != vertex:
            for i, es in other_vs.entries.items():
                out[(name, i)] = list(es)
    totals = {name: v.total_parallelism for name, v in data.vertices.items()}
    extra = {k: v for k, v in data.extra.items() if k != "executor_state"}
    if moved:
        extra = _without_chain_flags(extra, vertex)
    dest = src if to_store is None else _as_store(to_store)
    if dest is not src:
        _check_same_dag(dest, data.dag_shape, f"snapshot {sid} of {src.directory}")
    owner_info = src.owner()
    execution = owner_info.execution if owner_info is not None and dest is src else None
    completed = {
        name: (set(v.completed), set(getattr(v, "final", ()))) for name, v in data.vertices.items()
    }
    return _write(dest, data.job_name, data.dag_shape, extra, totals, out, execution, completed)


def _owner(data: Any, vertex: str, total: int, dag: Any) -> Callable[[Any], int]:
    """Which processor of ``vertex`` a restore at the snapshot's shape gives a key: the
    partition of ``dag``'s partitioner for the vertex (the default one without ``dag``)
    on the snapshot's member count (recorded with its chains' flags by member processes;
    one member otherwise)."""
    partitioner = None
    if dag is not None:
        from slipstream.core.dag import as_dag
        from slipstream.state.restore import custom_partitioners

        partitioner = custom_partitioners(as_dag(dag)).get(vertex)
    members, local = 1, total
    flags = data.extra.get(FLAGS)
    shape = flags.get(vertex, {}).get("shape") if isinstance(flags, dict) else None
    if isinstance(shape, list) and len(shape) == 2 and shape[0] * shape[1] == total:
        members, local = shape
    return key_routing(partitioner, members, local).owner


def _without_chain_flags(extra: dict[str, Any], vertex: str) -> dict[str, Any]:
    """``extra`` without the chains' flags of ``vertex``: a restore by member processes
    at the snapshot's shape then reads all of its chains (a flag saying a chain holds
    only its processor's keys may no longer be true once keys were renamed)."""
    flags = extra.get(FLAGS)
    if not isinstance(flags, dict) or vertex not in flags:
        return extra
    return {**extra, FLAGS: {k: v for k, v in flags.items() if k != vertex}}


def _check_same_dag(dest: Any, shape: Any, what: str) -> None:
    """Refuse to write a snapshot of DAG ``shape`` into ``dest`` when its newest
    committed snapshot is of another DAG (naming the vertices that differ): a store holds
    the snapshots of one DAG, and a job of either would be refused its restore."""
    ids = dest.committed_ids()
    if not ids or shape is None:
        return
    manifest = dest.read_manifest(ids[-1])
    theirs = manifest.dag_shape
    if theirs is None:
        return
    diff = shape_difference(theirs, shape)
    if diff is None:
        return
    parts = []
    if diff.only_old:
        parts.append(f"vertices {diff.only_old} are in its DAG only")
    if diff.only_new:
        parts.append(f"vertices {diff.only_new} in that of {what} only")
    if diff.rewired:
        parts.append(f"the edges of vertices {diff.rewired} differ")
    raise SnapshotError(
        f"snapshot store {dest.directory} holds snapshots of another DAG (snapshot "
        f"{ids[-1]} of job {manifest.job_name!r}): {', '.join(parts)}; write the transformed "
        f"snapshot into an empty store or one of the same DAG"
    )


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a key's __eq__ may raise on another type
        return False
