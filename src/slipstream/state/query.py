"""A snapshot's state as one Arrow table, and SQL over it (DuckDB, an optional extra).

:func:`read_arrow` gives the rows of :func:`~slipstream.state.reader.read` as a
``pyarrow.Table`` without making a Python row per entry: a processor's keyed state is a
plain map ``key -> value`` in its chunk, and its keys and values go into Arrow arrays
as they are (a 10M-key map becomes two arrays, not 10M named tuples). Entries that are
not such a map (window frames, sessions, offsets, broadcast entries, a custom
processor's entries) go through the row path. The table is what ``ss.state.to_arrow(
ss.state.read(...))`` gives, row for row and in the same order, except that ``vertex``
and ``kind`` are dictionary-encoded strings.

:func:`sql` hands the rows to DuckDB through Arrow (no conversion per row) as two views
with those columns: ``state``, the rows that hold keys' state (kinds ``keyed``,
``window``, ``session``), and ``entries``, every row (sources' offsets and broadcast
entries such as a window's emission cursor too), and returns the result as a
``pyarrow.Table``.

Column types: ``vertex`` and ``kind`` strings, ``processor`` a 64-bit int; ``key``,
``detail`` and ``value`` each one Arrow type when every value in the column fits one
(ints: BIGINT, floats or floats and ints: DOUBLE, str: VARCHAR, bool, bytes, tuples and
lists of one type: LIST, dicts with str keys: STRUCT, ``None``: NULL). A column whose
values do not fit one type (keys of mixed types, an int above 2**63, objects) holds
every value's ``repr`` string instead, as ``to_arrow`` does. The view ``state`` is
typed over its own rows, so a counter's values are BIGINT there even though the
offset rows of ``entries`` (dicts) make that view's ``value`` column strings.
"""

from __future__ import annotations

import re
import struct
from itertools import accumulate
from typing import Any

from slipstream.state.columnar import Column, MapColumns
from slipstream.state.keyed import FULL, PLAIN, StateMap
from slipstream.state.keys import BroadcastKey
from slipstream.state.reader import (
    _SESSION_WATERMARK,
    _WINDOW_CURSOR,
    StateRow,
    _snapshot,
    gc_paused,
    open_store,
    processor_rows,
    window_ops,
)

__all__ = ["read_arrow", "sql"]

#: what ``sql`` tells a user without DuckDB (the CLI prints it as it is)
NO_DUCKDB = (
    "SQL over state needs DuckDB, which is not installed: pip install -e '.[sql]' in the "
    "slipstream checkout (or pip install duckdb)"
)
NO_PYARROW = (
    "reading state as Arrow needs pyarrow, which is not installed: pip install -e "
    "'.[parquet]' in the slipstream checkout (or pip install pyarrow)"
)


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as e:
        raise ImportError(NO_PYARROW) from e
    return pa


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as e:
        raise ImportError(NO_DUCKDB) from e
    return duckdb


def _column(pa: Any, values: list[Any]) -> Any:
    """One Arrow array of ``values``: their common type, or their ``repr`` strings."""
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.array([None if v is None else repr(v) for v in values], pa.string())


def _segments(pa: Any, parts: list[Any]) -> Any:
    """One column of ``parts`` (lists, or a map's keys or values), each made an Arrow
    array alone; when their types differ, the column is made of all values at once as
    :func:`_column` makes it (the type Arrow infers for them together, or reprs)."""
    arrays = []
    try:
        arrays = [
            p.to_arrow(pa) if type(p) is Column else pa.array(p if type(p) is list else list(p))
            for p in parts
        ]
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    else:
        types = {a.type for a in arrays} - {pa.null()}
        if len(types) <= 1:
            t = types.pop() if types else pa.null()
            if not arrays:
                return pa.array([], pa.null())
            return pa.chunked_array([a if a.type == t else a.cast(t) for a in arrays], t)
    everything: list[Any] = []
    for p in parts:
        everything.extend(p.to_list() if type(p) is Column else p)
    return _column(pa, everything)


def _fast_map(entry: tuple[Any, Any]) -> dict[Any, Any] | MapColumns | None:
    """The map of a full plain keyed-state entry (one row per key, detail ``None``)."""
    k, v = entry
    if type(k) is StateMap and k.tag == PLAIN and k.detail is None and v.mode == FULL:
        return v.upserts  # type: ignore[no-any-return]
    return None


#: the kinds of rows that hold keys' state (the others: sources' offsets, broadcast entries)
STATE_KINDS = ("keyed", "window", "session")


class _Columns:
    """The rows of a snapshot as they are gathered, in :func:`read`'s order: parts that
    are a full plain map (its keys and values used as they are: no row per key) or a
    list of :class:`StateRow` s (every other entry)."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, int, dict[Any, Any] | MapColumns] | list[StateRow]] = []

    def add_map(self, vertex: str, index: int, m: dict[Any, Any] | MapColumns) -> None:
        if m:
            self.parts.append((vertex, index, m))

    def add_rows(self, rows: list[StateRow]) -> None:
        if rows:
            self.parts.append(rows)

    def table(self, state_only: bool = False, run_ends: bool = False) -> Any:
        """The rows as a ``pyarrow.Table`` (only those of :data:`STATE_KINDS` if
        ``state_only``: their columns typed among themselves). ``run_ends``: the
        ``vertex``, ``processor`` and ``kind`` columns run-end encoded (a value per run
        of rows, nothing per row: for DuckDB, which reads them as VARCHAR and BIGINT;
        at 10M rows the per-row columns took a quarter of an SQL aggregate)."""
        pa = _pyarrow()
        runs: list[tuple[str, int, str, int]] = []  # vertex, processor, kind, length
        keys: list[Any] = []
        details: list[Any] = []  # an int n: n Nones (a map's rows)
        values: list[Any] = []
        for part in self.parts:
            if not isinstance(part, list):
                vertex, index, m = part
                runs.append((vertex, index, "keyed", len(m)))
                if type(m) is MapColumns and m.unique:  # Arrow over the chunk's buffers
                    keys.extend(m.keys_columns)
                    values.extend(m.values_columns)
                else:
                    keys.append(m.keys())
                    values.append(m.values())
                details.append(len(m))
                continue
            rows = [r for r in part if r.kind in STATE_KINDS] if state_only else part
            if not rows:
                continue
            for r in rows:
                last = runs[-1] if runs else None
                if last is not None and last[:3] == (r.vertex, r.processor, r.kind):
                    runs[-1] = (*last[:3], last[3] + 1)
                else:
                    runs.append((r.vertex, r.processor, r.kind, 1))
            keys.append([r.key for r in rows])
            details.append([r.detail for r in rows])
            values.append([r.value for r in rows])
        if all(type(d) is int for d in details):
            # no window, session or offset rows: a null column, no list of Nones made
            detail_column = pa.nulls(sum(r[3] for r in runs))
        else:
            detail_column = _segments(pa, [[None] * d if type(d) is int else d for d in details])
        column = _run_ends if run_ends else _runs
        arrays = [
            column(pa, runs, 0),
            column(pa, runs, 1),
            _segments(pa, keys),
            detail_column,
            _segments(pa, values),
            column(pa, runs, 2),
        ]
        return pa.Table.from_arrays(arrays, names=list(StateRow._fields))


def _constant(pa: Any, value: int, n: int, type_: Any, fmt: str) -> Any:
    """``n`` times ``value`` as an Arrow array of ``type_`` (``fmt``: its struct code),
    made from one repeated buffer (a memset, where ``pa.repeat`` loops)."""
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(struct.pack(fmt, value) * n)])


def _runs(pa: Any, runs: list[tuple[str, int, str, int]], field: int) -> Any:
    """A dictionary-encoded (or int64, for the processor) column of the runs' ``field``,
    a chunk per run."""
    if field == 1:
        parts = [_constant(pa, r[1], r[3], pa.int64(), "=q") for r in runs]
        return pa.chunked_array(parts, pa.int64())
    names: dict[Any, int] = {}
    for r in runs:
        names.setdefault(r[field], len(names))
    dictionary = pa.array(list(names), pa.string())
    kind = pa.dictionary(pa.int32(), pa.string())
    parts = [
        pa.DictionaryArray.from_arrays(
            _constant(pa, names[r[field]], r[3], pa.int32(), "=i"), dictionary
        )
        for r in runs
    ]
    return pa.chunked_array(parts, kind)


def _run_ends(pa: Any, runs: list[tuple[str, int, str, int]], field: int) -> Any:
    """The runs' ``field`` as one run-end encoded array (strings, or int64 for the
    processor): a value and an end per run."""
    runs = [r for r in runs if r[3]]
    ends = list(accumulate(r[3] for r in runs))
    end_type = pa.int32() if not ends or ends[-1] <= 2**31 - 1 else pa.int64()
    values = pa.array([r[field] for r in runs], pa.int64() if field == 1 else pa.string())
    return pa.RunEndEncodedArray.from_arrays(pa.array(ends, end_type), values)


def _gather(data: Any, vertex: str | None, ops: dict[str, Any] | None = None) -> _Columns:
    cols = _Columns()
    for name, vs in data.vertices.items():
        if vertex is not None and name != vertex:
            continue
        for i in sorted(vs.entries):
            entries = vs.entries[i]
            names = {k.name for k, _ in entries if type(k) is BroadcastKey}
            if _WINDOW_CURSOR in names or _SESSION_WATERMARK in names:
                cols.add_rows(processor_rows(name, i, entries, (ops or {}).get(name)))
                continue
            # the row path's order: entries in turn, each map's keys in the map's order
            pending: list[tuple[Any, Any]] = []
            for entry in entries:
                m = _fast_map(entry)
                if m is None:
                    pending.append(entry)
                    continue
                if pending:
                    cols.add_rows(processor_rows(name, i, pending))
                    pending = []
                cols.add_map(name, i, m)
            if pending:
                cols.add_rows(processor_rows(name, i, pending))
    return cols


def read_arrow(
    store: Any, vertex: str | None = None, snapshot_id: int | None = None, *, dag: Any = None
) -> Any:
    """The rows of ``ss.state.read(store, vertex, snapshot_id, dag=dag)`` as a ``pyarrow.Table``
    (columns ``vertex, processor, key, detail, value, kind``; types in the module doc),
    built column by column: the fast way to get a large state into Arrow, Parquet or
    pandas (``.to_pandas()``). Errors as :func:`~slipstream.state.reader.read`; an
    ``ImportError`` naming the extra when pyarrow is not installed."""
    return read_arrow_with_id(store, vertex, snapshot_id, dag)[1]


def read_arrow_with_id(
    store: Any, vertex: str | None = None, snapshot_id: int | None = None, dag: Any = None
) -> tuple[int, Any]:
    """:func:`read_arrow` and the id of the snapshot it read."""
    sid, cols = gather_with_id(store, vertex, snapshot_id, dag)
    return sid, cols.table()


def gather_with_id(
    store: Any, vertex: str | None = None, snapshot_id: int | None = None, dag: Any = None
) -> tuple[int, _Columns]:
    """The id of the snapshot read and its rows, gathered for :meth:`_Columns.table`
    (``dag``: as :func:`~slipstream.state.reader.read`'s)."""
    _pyarrow()
    s = open_store(store)
    ops = window_ops(dag if dag is not None else getattr(store, "dag", None))
    with gc_paused():
        sid, data = _snapshot(s, vertex, snapshot_id, columns=True)
        return sid, _gather(data, vertex, ops)


def columns_of(rows: list[StateRow]) -> _Columns:
    """``rows`` (of :func:`~slipstream.state.reader.read`), gathered as :func:`run_sql`
    takes them."""
    cols = _Columns()
    cols.add_rows(list(rows))
    return cols


def _one_line(text: str) -> str:
    """DuckDB's message on one line (without the lines of carets under the query)."""
    return " ".join(p.strip() for p in text.splitlines() if p.strip().strip("^"))


class SQLError(ValueError):
    """A query DuckDB refused (its message, on one line)."""


def run_sql(cols: _Columns, query: str) -> Any:
    """``query`` over the gathered rows ``cols``: the view ``state`` (the rows of
    :data:`STATE_KINDS`) and ``entries`` (every row; made only when the query names it).
    The result is a ``pyarrow.Table`` (an empty one for a statement without a result);
    DuckDB's own errors are :class:`SQLError` with its message on one line."""
    duckdb = _duckdb()
    pa = _pyarrow()
    # no extension is downloaded behind the user's back (a query naming an https:// file)
    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    try:
        con.register("state", cols.table(state_only=True, run_ends=True))
        if re.search(r"\bentries\b", query, re.IGNORECASE):
            con.register("entries", cols.table(run_ends=True))
        try:
            rel = con.sql(query)
            if rel is None:
                return pa.table({})
            # to_arrow_table: DuckDB 1.4 on; fetch_arrow_table before (the sql extra
            # allows 1.1); whatever answers, a reader is read whole
            fetch = getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table
            result = fetch()
            return result.read_all() if hasattr(result, "read_all") else result
        except duckdb.Error as e:
            raise SQLError(_one_line(str(e))) from None
    finally:
        con.close()


def sql(
    store: Any,
    query: str,
    vertex: str | None = None,
    snapshot_id: int | None = None,
    *,
    dag: Any = None,
) -> Any:
    """Run the SQL ``query`` with DuckDB over a committed snapshot of ``store`` (the
    newest, or ``snapshot_id``; only ``vertex``'s chunks if given) and return its result
    as a ``pyarrow.Table`` (``.to_pylist()``, ``.to_pandas()``). The query sees two
    views with :func:`read_arrow`'s columns: ``state``, the rows that hold keys' state
    (kinds ``keyed``, ``window``, ``session``), and ``entries``, every row (sources'
    offsets and broadcast entries too; what ``read_arrow`` returns); each typed as the
    module doc says. ``dag``: as :func:`~slipstream.state.reader.read`'s (a sliding
    window's open windows instead of its frames).

    Errors: an ``ImportError`` naming the ``sql`` extra without DuckDB;
    :class:`SQLError` (a ``ValueError``) with DuckDB's message for a query it refuses;
    the store's errors as :func:`~slipstream.state.reader.read`."""
    _duckdb()
    return run_sql(gather_with_id(store, vertex, snapshot_id, dag)[1], query)
