"""Writing a job's state as data: seed a store from rows (``ss.state.bootstrap``;
rewriting a committed snapshot entry by entry, ``ss.state.transform``, is in
:mod:`~slipstream.state.transform` and writes through :func:`_write` here).

Both write an ordinary format-3 snapshot (:mod:`~slipstream.state.format`) through the
store's own protocol (``begin``, a signed full chunk per processor with state, then
``commit`` of the signed manifest: nothing is committed unless every chunk was written),
stamped with the DAG's shape and fingerprint as a job's snapshots are. A job started
with ``restore_from=`` that store (or ``JobConfig(resume=True)`` under the same job name)
continues from it as from a snapshot it took itself.

What can be seeded: the state of a *keyed* vertex that keeps one plain map ``key ->
state`` (a rolling aggregate: the accumulator, for ``counting()``/``summing()`` the
running int; ``map_stateful``: the state object; either stage of a group-by
aggregation: the accumulator); the frames of a sliding or tumbling window's last stage
(``KeyedStateKey(key, frame_end) -> accumulator``, with the emission cursor of the rows
given or "no window emitted yet": the first watermark past a frame's windows emits
them, so without a cursor seed only the frames of windows the history did not emit;
and the DAG's window definition, as the processor saves it for readers);
and the open sessions of a session window (``KeyedStateKey(key) -> [[start, end,
accumulator], ...]`` sorted by start, with the watermark of the rows given or "none
received yet": the first watermark past a session's end emits it). A window's first
stage (which keeps no frames across snapshots) is refused naming the vertex. Source
positions can be set with ``offsets=`` for the generator and the Kafka source. Each
entry goes to the processor that owns its key under the routing a live item takes
(:func:`~slipstream.core.partition.key_routing`, as a restore routes it).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from slipstream.core.errors import SnapshotError, SnapshotStoreInUseError
from slipstream.core.partition import key_routing
from slipstream.state.keyed import FULL, KEYED, PLAIN, StateMap, StateMapSave
from slipstream.state.keys import BroadcastKey, KeyedStateKey
from slipstream.state.reader import StateRow

__all__ = ["bootstrap"]

#: processor classes whose state is one PLAIN map key -> state (module, name)
_PLAIN_KEYED = {
    ("slipstream.pipeline.keyed", "MapStatefulP"): "map_stateful / rolling aggregate",
    ("slipstream.processors.aggregation", "GroupByKeyP"): "group-by aggregation",
}
_WINDOWED_MODULES = ("slipstream.processors.windows", "slipstream.processors.sessions")
#: processors whose state is window frames: KeyedStateKey(key, frame_end) -> accumulator
_FRAMES = {
    ("slipstream.processors.windows", "SlidingWindowP"),
    ("slipstream.processors.windows", "_CombineToSlidingWindowP"),
}
#: processors whose state is each key's open sessions: KeyedStateKey(key) -> sessions
_SESSIONS = {("slipstream.processors.sessions", "SessionWindowP")}
_GENERATOR = ("slipstream.sources.streaming", "GeneratorP")
_KAFKA = ("slipstream.sources.kafka", "KafkaSourceP")
_INPUT_FUSED = ("slipstream.pipeline.fused", "InputFusedP")
#: a sliding window's emission cursor (processors/windows.py NEXT_WIN_TO_EMIT_KEY)
_WINDOW_CURSOR = "window.next_win_to_emit"
#: a window's definition (processors/windows.py WINDOW_DEFINITION_KEY)
_WINDOW_DEFINITION = "window.definition"
#: a session window's watermark (processors/sessions.py CURRENT_WATERMARK_KEY)
_SESSION_WATERMARK = "session_window.current_watermark"


def _processor_class(supplier: Any) -> type | None:
    """The processor class a vertex's supplier makes (through ``functools.partial`` and
    an input-fused chain), ``None`` when it cannot be told without calling it."""
    for _ in range(8):
        target = supplier.func if isinstance(supplier, functools.partial) else supplier
        if not isinstance(target, type):
            return None
        if (target.__module__, target.__name__) == _INPUT_FUSED and isinstance(
            supplier, functools.partial
        ):
            supplier = (
                supplier.args[0] if supplier.args else supplier.keywords.get("inner_supplier")
            )
            continue
        return target
    return None


def window_spec(supplier: Any) -> tuple[Any, Any] | None:
    """``(window_def, agg_op)`` of a vertex supplier that makes a sliding or tumbling
    window's last stage (``processors.aggregate_to_sliding_window`` /
    ``combine_to_sliding_window``, also behind an input-fused chain), else ``None``."""
    for _ in range(8):
        if not isinstance(supplier, functools.partial):
            return None
        cid = _class_id(supplier.func if isinstance(supplier.func, type) else None)
        if cid == _INPUT_FUSED:
            supplier = (
                supplier.args[0] if supplier.args else supplier.keywords.get("inner_supplier")
            )
            continue
        if cid not in _FRAMES or len(supplier.args) < 4:
            return None
        return supplier.args[2], supplier.args[3]
    return None


def _class_id(cls: type | None) -> tuple[str, str]:
    return ("", "") if cls is None else (cls.__module__, cls.__name__)


def _keyed_kind(dag: Any, vertex: str) -> str:
    """What ``vertex`` of ``dag`` keeps, or a ``ValueError`` naming it."""
    names = [v.name for v in dag.vertices]
    if vertex not in names:
        raise ValueError(
            f"the DAG has no vertex {vertex!r}; its vertices: {', '.join(map(repr, sorted(names)))}"
        )
    cls = _processor_class(dag.vertex(vertex).supplier)
    cid = _class_id(cls)
    if cid in _PLAIN_KEYED:
        return _PLAIN_KEYED[cid]
    if cid in _FRAMES:
        return "window"
    if cid in _SESSIONS:
        return "session"
    what = (
        f"its processor is {cid[0]}.{cid[1]}" if cls is not None else "its processor is not known"
    )
    if cid[0] in _WINDOWED_MODULES:
        raise ValueError(
            f"vertex {vertex!r} keeps window state bootstrap cannot seed "
            f"({what}); it seeds the frames of a window's last stage (a two-stage "
            f"window's '-combine' vertex), a session window's sessions and keyed vertices "
            f"whose state is one value per key (a rolling aggregate, map_stateful, a "
            f"group-by aggregation)"
        )
    raise ValueError(
        f"vertex {vertex!r} is not a keyed vertex bootstrap can seed ({what}); it seeds a "
        f"rolling aggregate, map_stateful or a group-by aggregation"
    )


def _parallelism(v: Any, default: int) -> int:
    from slipstream.core.dag import effective_parallelism

    return effective_parallelism(v, default)


def _owner(dag: Any, vertex: str, total: int) -> Callable[[Any], int]:
    from slipstream.state.restore import custom_partitioners

    partitioner = custom_partitioners(dag).get(vertex)
    return key_routing(partitioner, 1, total).owner


def _frame_row(row: Any, n: int, vertex: str) -> tuple[Any, Any]:
    """``(KeyedStateKey(key, frame_end), accumulator)`` of input row number ``n`` for a
    window vertex: a ``StateRow`` of kind ``window`` or a ``(key, frame_end, acc)``
    tuple."""
    if isinstance(row, StateRow):
        frame = row.detail.get("frame_end") if isinstance(row.detail, dict) else None
        if row.kind == "window" and type(frame) is not int and isinstance(row.detail, dict):
            raise ValueError(
                f"row {n} ({row!r}) is one of a sliding window's windows, combined from "
                f"its frames; window vertex {vertex!r} is seeded with frames: read the "
                f"store without dag= (each frame a row with detail 'frame_end')"
            )
        if row.kind != "window" or type(frame) is not int:
            raise ValueError(
                f"row {n} ({row!r}) is {row.kind!r} state with detail {row.detail!r}; "
                f"window vertex {vertex!r} keeps frames (kind 'window', detail "
                f"{{'frame_end': int}})"
            )
        key, value = row.key, row.value
    elif type(row) is tuple and len(row) == 3 and type(row[1]) is int:
        key, frame, value = row
    else:
        raise ValueError(
            f"row {n} ({row!r}) is not a (key, frame_end, accumulator) tuple or a window StateRow"
        )
    try:
        hash(key)
    except TypeError as e:
        raise TypeError(f"row {n} ({row!r}): its key is unhashable ({e})") from None
    return KeyedStateKey(key, frame), value


def _definition_of(window_def: Any) -> dict[str, int]:
    """The plain-data window definition a window's last stage saves."""
    return {
        "size": window_def.window_size,
        "slide": window_def.frame_size,
        "offset": window_def.frame_offset,
    }


def _session_row(row: Any, n: int, vertex: str) -> tuple[Any, int, int, Any]:
    """``(key, start, end, accumulator)`` of input row number ``n`` for a session window
    vertex: a ``StateRow`` of kind ``session`` or a ``(key, start, end, accumulator)``
    tuple, with ``start < end`` (ints)."""
    if isinstance(row, StateRow):
        d = row.detail
        if row.kind != "session" or not (
            isinstance(d, dict) and type(d.get("start")) is int and type(d.get("end")) is int
        ):
            raise ValueError(
                f"row {n} ({row!r}) is {row.kind!r} state with detail {row.detail!r}; "
                f"session window vertex {vertex!r} keeps sessions (kind 'session', detail "
                f"{{'start': int, 'end': int}})"
            )
        key, start, end, value = row.key, d["start"], d["end"], row.value
    elif type(row) is tuple and len(row) == 4 and type(row[1]) is int and type(row[2]) is int:
        key, start, end, value = row
    else:
        raise ValueError(
            f"row {n} ({row!r}) is not a (key, start, end, accumulator) tuple or a session StateRow"
        )
    if not start < end:
        raise ValueError(
            f"row {n} ({row!r}): a session's start {start} is not before its end {end}"
        )
    try:
        hash(key)
    except TypeError as e:
        raise TypeError(f"row {n} ({row!r}): its key is unhashable ({e})") from None
    return key, start, end, value


def _sessions_of(rows: Iterable[Any], vertex: str) -> tuple[dict[Any, list[list[Any]]], int]:
    """Each key's sessions ``[[start, end, accumulator], ...]`` sorted by start, as the
    session processor keeps them, and the watermark to restore: the lowest of the
    ``session_window.current_watermark`` rows given (``ss.state.read`` gives one per
    processor; a restore takes the minimum too), else "none yet". A ``ValueError`` names
    the rows of two sessions of one key that overlap (the processor would have merged
    them into one)."""
    from slipstream.core.time import NO_WATERMARK

    per_key: dict[Any, list[tuple[int, int, int, Any]]] = {}
    watermarks: list[int] = []
    for n, row in enumerate(rows):
        if isinstance(row, StateRow) and row.kind == "broadcast" and row.key == _SESSION_WATERMARK:
            if type(row.value) is not int:
                raise ValueError(f"row {n} ({row!r}): a session window's watermark is an int")
            watermarks.append(row.value)
            continue
        key, start, end, value = _session_row(row, n, vertex)
        per_key.setdefault(key, []).append((start, end, n, value))
    out: dict[Any, list[list[Any]]] = {}
    for key, sessions in per_key.items():
        sessions.sort(key=lambda s: (s[0], s[1], s[2]))
        for a, b in zip(sessions, sessions[1:], strict=False):
            if b[0] < a[1]:
                raise ValueError(
                    f"row {b[2]}: session [{b[0]}, {b[1]}) of key {key!r} overlaps session "
                    f"[{a[0]}, {a[1]}) in row {a[2]}; a key's open sessions do not overlap "
                    f"(give the merged session)"
                )
        out[key] = [[s, e, v] for s, e, _n, v in sessions]
    return out, min(watermarks, default=NO_WATERMARK)


def _row_pair(row: Any, n: int, vertex: str) -> tuple[Any, Any]:
    """``(key, value)`` of input row number ``n``; a ``ValueError``/``TypeError`` naming
    it when it does not fit a plain keyed vertex."""
    if isinstance(row, StateRow):
        if row.kind != "keyed" or row.detail is not None:
            raise ValueError(
                f"row {n} ({row!r}) is {row.kind!r} state with detail {row.detail!r}; "
                f"vertex {vertex!r} keeps one value per key (kind 'keyed', detail None)"
            )
        key, value = row.key, row.value
    elif type(row) is tuple or (isinstance(row, tuple) and not hasattr(row, "_fields")):
        if len(row) != 2:
            raise ValueError(f"row {n} ({row!r}) is not a (key, value) pair")
        key, value = row
    elif isinstance(row, list) and len(row) == 2:
        key, value = row
    else:
        raise TypeError(
            f"row {n} ({row!r}) is a {type(row).__name__}, not a (key, value) pair or a StateRow"
        )
    try:
        hash(key)
    except TypeError as e:
        raise TypeError(f"row {n} ({row!r}): its key is unhashable ({e})") from None
    return key, value


def _source_offsets(dag: Any, vertex: str, spec: Any, total: int) -> dict[int, list[Any]]:
    """The offset entries of source ``vertex`` per processor, from ``spec``."""
    if vertex not in {v.name for v in dag.vertices}:
        raise ValueError(f"offsets: the DAG has no vertex {vertex!r}")
    v = dag.vertex(vertex)
    cid = _class_id(_processor_class(v.supplier))
    out: dict[int, list[Any]] = {}
    if cid == _GENERATOR:
        if isinstance(spec, bool) or not isinstance(spec, int) or spec < 0:
            raise ValueError(
                f"offsets[{vertex!r}]: a generator's offset is the number of sequence "
                f"numbers already emitted (an int >= 0), got {spec!r}"
            )
        for i in range(total):
            # processor i emits i, i + total, ...: the first of them at or above spec
            out[i] = [(BroadcastKey(("generator", i)), (spec + (i - spec) % total, total))]
        return out
    if cid == _KAFKA:
        # the class and its module are loaded (the DAG's supplier holds the class): the
        # state layer imports no source module for them
        cls = _processor_class(v.supplier)
        partition_owner = sys.modules[cid[0]].partition_owner
        tag = cls.snapshot_tag  # type: ignore[union-attr]
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"offsets[{vertex!r}]: a Kafka source's offsets are a dict "
                f"{{(topic, partition): next offset to read}}, got {spec!r}"
            )
        for tp, offset in spec.items():
            if not (
                isinstance(tp, tuple)
                and len(tp) == 2
                and isinstance(tp[0], str)
                and isinstance(tp[1], int)
                and isinstance(offset, int)
                and not isinstance(offset, bool)
                and offset >= 0
            ):
                raise ValueError(
                    f"offsets[{vertex!r}]: {tp!r}: {offset!r} is not (topic, partition): "
                    f"next offset to read (an int >= 0)"
                )
            owner = partition_owner(tp[0], tp[1], total)
            out.setdefault(owner, []).append((BroadcastKey((tag, tp[0], tp[1])), (offset, None)))
        return out
    raise ValueError(
        f"offsets: vertex {vertex!r} is not a source whose offsets bootstrap can set "
        f"(the generator and the Kafka source); its processor is {cid[0]}.{cid[1]}"
    )


def _as_store(store: Any) -> Any:
    from slipstream.state.store import DirectorySnapshotStore

    if isinstance(store, DirectorySnapshotStore):
        return store
    if isinstance(store, str | os.PathLike):
        return DirectorySnapshotStore(store)
    raise TypeError(
        f"expected a snapshot store directory or a DirectorySnapshotStore, got {store!r}"
    )


def _write(
    store: Any,
    job_name: str,
    shape: Any,
    extra: dict[str, Any],
    parallelism: Mapping[str, int],
    entries: Mapping[tuple[str, int], list[Any]],
    execution: str | None = None,
    completed: Mapping[str, tuple[set[int], set[int]]] | None = None,
) -> int:
    """Commit one snapshot of ``entries`` per ``(vertex, processor)`` (every vertex of
    ``parallelism`` recorded, those without entries with no chain) as the next id of
    ``store`` under its lock; returns the id. Nothing is committed if a chunk fails."""
    from slipstream.state import format as fmt
    from slipstream.state.lineage import recorded_generation
    from slipstream.state.store import Manifest, VertexManifest, encode_chunk

    if getattr(store, "_lock_fd", None) is not None:
        # this very store object holds the lock: a job of this process runs on it
        raise SnapshotStoreInUseError(
            f"snapshot store {store.directory} is in use by a running job; a snapshot is "
            f"written into a store no job holds (join() the job first)"
        )
    store.lock()
    try:
        sid = max(max(store.file_ids(), default=0), recorded_generation(store.directory)) + 1
        store.bind(job_name, execution or os.urandom(16).hex(), shape)
        store.begin(sid)
        manifest = Manifest(sid, job_name, dag_shape=shape, extra=dict(extra))
        try:
            for name, total in parallelism.items():
                done, final = (completed or {}).get(name, (set(), set()))
                vm = manifest.vertices[name] = VertexManifest(total, set(done), set(final))
                for i in range(total):
                    es = entries.get((name, i))
                    if es:
                        payload = encode_chunk(es, sid, name, i)
                        vm.chains[i] = [store.write_chunk(sid, name, i, fmt.CHUNK_FULL, payload)]
        except BaseException:
            store.abort(sid)
            raise
        store.commit(manifest)
        return sid
    finally:
        store.unlock()


def bootstrap(
    dag_or_pipeline: Any,
    vertex: str,
    rows: Iterable[Any],
    store: Any,
    *,
    job_name: str = "bootstrap",
    parallelism: int | None = None,
    offsets: Mapping[str, Any] | None = None,
) -> int:
    """Write a signed snapshot of ``dag_or_pipeline`` (a DAG or a Pipeline, compiled as
    ``new_job`` compiles it) into ``store`` (a directory or a ``DirectorySnapshotStore``
    holding no snapshot yet) in which keyed ``vertex`` holds ``rows`` and every other
    vertex holds no state; returns the snapshot's id. Start the job with
    ``restore_from=store`` to continue from it.

    ``rows``: ``(key, value)`` pairs (``value``: the vertex's per-key state, e.g. a
    rolling aggregate's accumulator), :class:`~slipstream.state.reader.StateRow` s of
    ``ss.state.read`` (kind ``keyed``), or the ``(key, result)`` output of another job
    whose result is the accumulator (``counting()``, ``summing()``); for a window's last
    stage (``window-combine``) ``(key, frame_end, accumulator)`` tuples or ``window``
    rows of frames (``ss.state.read`` without ``dag=``: a sliding window's windows
    combined from frames are refused, naming the row), and optionally its ``window.next_win_to_emit`` rows (the emission cursor: the
    end of the next window to emit; without them no window was emitted yet); for a session window ``(key, start, end, accumulator)`` tuples or ``session``
    rows (the open sessions: ``end`` is the last event's timestamp + the timeout), and
    optionally its ``session_window.current_watermark`` rows (the restored watermark:
    their minimum; without them none, so no event is late until the first watermark). ``parallelism``: the
    local parallelism of the vertices that set none (``None``: 1); a job at another
    parallelism restores it all the same (keyed entries are routed by key).
    ``offsets``: ``{source vertex: position}`` where history ends: a generator's count of
    emitted sequence numbers (an int), a Kafka source's ``{(topic, partition): next
    offset to read}``. ``job_name``: the name the store is stamped with (a job resuming
    it with ``JobConfig(resume=True)`` has this name).

    Raises ``ValueError``/``TypeError`` naming the row or vertex that does not fit (an
    unknown vertex, one that is not keyed, a row that is not a pair, an unhashable or
    repeated key, two overlapping sessions of one key) before anything is written, and :class:`SnapshotError` for a store
    that already holds snapshots."""
    from slipstream.core.dag import as_dag
    from slipstream.state.lineage import dag_shape

    dag = as_dag(dag_or_pipeline)
    kind = _keyed_kind(dag, vertex)
    default = 1 if parallelism is None else int(parallelism)
    if default < 1:
        raise ValueError(f"parallelism must be >= 1, got {parallelism!r}")
    totals = {v.name: _parallelism(v, default) for v in dag.vertices}
    total = totals[vertex]
    owner = _owner(dag, vertex, total)
    maps: list[dict[Any, Any]] = [{} for _ in range(total)]
    first_row: dict[Any, int] = {}
    entries: dict[tuple[str, int], list[Any]] = {}
    if kind == "session":
        sessions: list[dict[Any, Any]] = [{} for _ in range(total)]
        per_key, watermark = _sessions_of(rows, vertex)
        for key, lst in per_key.items():
            sessions[owner(key)][key] = lst
        for i, m in enumerate(sessions):
            es = entries.setdefault((vertex, i), [])
            if m:
                es.append((StateMap(KEYED, None), StateMapSave(FULL, m)))
            # on every processor (saved, the rows read back as sessions); "none yet"
            # unless given: the first watermark past a session's end emits it
            es.append((BroadcastKey(_SESSION_WATERMARK), watermark))
        rows = ()
    cursors: list[int] = []
    for n, row in enumerate(rows):
        if kind == "window":
            if isinstance(row, StateRow) and row.kind == "broadcast" and row.key == _WINDOW_CURSOR:
                if type(row.value) is not int:
                    raise ValueError(f"row {n} ({row!r}): a window's emission cursor is an int")
                cursors.append(row.value)
                continue
            if (
                isinstance(row, StateRow)
                and row.kind == "broadcast"
                and row.key == _WINDOW_DEFINITION
            ):
                continue  # written from the DAG's own definition below
            entry = _frame_row(row, n, vertex)
            seen = first_row.setdefault(entry[0], n)
            if seen != n:
                raise ValueError(
                    f"row {n} ({row!r}): key {entry[0].key!r} in frame {entry[0].detail} is "
                    f"already in row {seen}"
                )
            entries.setdefault((vertex, owner(entry[0].key)), []).append(entry)
            continue
        key, value = _row_pair(row, n, vertex)
        seen = first_row.setdefault(key, n)
        if seen != n:
            raise ValueError(f"row {n} ({row!r}): key {key!r} is already in row {seen}")
        maps[owner(key)][key] = value
    for i, m in enumerate(maps):
        if m:
            entries[(vertex, i)] = [(StateMap(PLAIN, None), StateMapSave(FULL, m))]
    if kind == "window":
        from slipstream.core.time import NO_WATERMARK

        # the cursor given (the lowest: a restore takes the minimum), else no window
        # emitted yet: the first watermark past a frame's windows emits them (what a
        # processor restores without a cursor too; saved, the rows read as windows)
        cursor = min(cursors, default=NO_WATERMARK)
        spec = window_spec(dag.vertex(vertex).supplier)
        for i in range(total):
            es = entries.setdefault((vertex, i), [])
            es.append((BroadcastKey(_WINDOW_CURSOR), cursor))
            if spec is not None:  # as the processor saves it: readers tell its windows
                es.append((BroadcastKey(_WINDOW_DEFINITION), _definition_of(spec[0])))
    for source, spec in (offsets or {}).items():
        for i, es in _source_offsets(dag, source, spec, totals.get(source, 0)).items():
            entries.setdefault((source, i), []).extend(es)
    s = _as_store(store)
    if s.file_ids() or s.committed_ids():
        raise SnapshotError(
            f"snapshot store {s.directory} already holds snapshots; bootstrap writes the "
            f"first snapshot of an empty store (use ss.state.transform to rewrite one)"
        )
    return _write(s, job_name, dag_shape(dag), {}, totals, entries)
