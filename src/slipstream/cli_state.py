"""``slipstream state STORE [--vertex V] [--key K] [--snapshot ID] [--format F] [--sql Q]
[--output PATH]``: print a job's state as of a committed snapshot of its store
(:func:`slipstream.state.read`: the store's signatures are checked before anything is
unpickled), or the answer of a SQL query over it.

Formats: ``table`` (aligned columns, cells cut at :data:`CELL` characters), ``csv`` (the
same cells, whole), ``jsonl`` (one JSON object per row; tuples as lists, dicts with
keys that are not strings as ``[[key, value], ...]``, anything JSON has no form for as
its ``repr``) and ``parquet`` (the Arrow table of :func:`slipstream.state.read_arrow`,
typed as it says; binary, so written to ``--output`` or to a redirected stdout, never to
a terminal). In ``table`` and ``csv`` a key and a value are shown as their ``repr``
(``'a'`` is a string, ``1`` an int), a detail dict as ``name=value`` pairs.
``--key K`` keeps the rows whose key's ``repr`` or ``str`` is ``K``.

``--sql QUERY`` runs ``QUERY`` with DuckDB (the ``sql`` extra) over the rows as the views
``state`` (the keys' state: kinds keyed, window, session) and ``entries`` (every row), with
the columns ``vertex, processor, key, detail, value, kind`` typed as
:mod:`slipstream.state.query` says, and prints its result in the chosen format: in
``table`` and ``csv`` a cell is the value's ``str`` (a NULL is empty; lists and structs
as JSON).

Exit status: 0 with the rows printed; 1 when the store cannot be read (no store, no
committed snapshot, a snapshot not retained, a damaged store: the store's message),
``--key`` matches nothing, or DuckDB or pyarrow is not installed (the message says what
to install); 2 for a usage error (an unknown ``--vertex``: the message lists the
vertices; a query DuckDB refuses: its message on one line; parquet to a terminal)."""

from __future__ import annotations

import argparse
import csv
import decimal
import json
import sys
from typing import IO, Any

from slipstream.core.errors import SlipstreamError

#: longest cell of the ``table`` format (longer ones end in "...")
CELL = 60
COLUMNS = ("vertex", "processor", "kind", "key", "detail", "value")


def add_parser(sub: Any) -> None:
    """Register the ``state`` subcommand on ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser(
        "state",
        help="print a job's state from its snapshot store (the last committed snapshot)",
        description="Print the entries of a committed snapshot of a snapshot store.",
    )
    p.add_argument("store", metavar="STORE", help="the snapshot store directory")
    p.add_argument("--vertex", metavar="V", help="only this vertex's state")
    p.add_argument("--key", metavar="K", help="only the entries whose key's repr or str is K")
    p.add_argument(
        "--snapshot", type=int, metavar="ID", help="a retained snapshot (default: the newest)"
    )
    p.add_argument("--format", choices=["table", "csv", "jsonl", "parquet"], default="table")
    p.add_argument(
        "--sql",
        metavar="QUERY",
        help="run QUERY with DuckDB (the sql extra) over the rows as the view 'state' and "
        "print its result",
    )
    p.add_argument(
        "-o", "--output", metavar="PATH", help="write to PATH instead of stdout (parquet needs one)"
    )
    p.set_defaults(fn=cmd_state)


def _detail(d: Any) -> str:
    if d is None:
        return ""
    if type(d) is dict:
        return ", ".join(f"{k}={v!r}" for k, v in d.items())
    return repr(d)


def _cells(r: Any) -> list[str]:
    return [r.vertex, str(r.processor), r.kind, repr(r.key), _detail(r.detail), repr(r.value)]


def _cut(s: str) -> str:
    return s if len(s) <= CELL else s[: CELL - 3] + "..."


def _jsonable(x: Any) -> Any:
    if x is None or type(x) in (str, int, float, bool):
        return x
    if type(x) in (list, tuple):
        return [_jsonable(v) for v in x]
    if type(x) is dict:
        if all(type(k) is str for k in x):
            return {k: _jsonable(v) for k, v in x.items()}
        return [[_jsonable(k), _jsonable(v)] for k, v in x.items()]
    return repr(x)


def _sql_cell(x: Any) -> str:
    if x is None:
        return ""
    if type(x) in (list, tuple, dict):
        return json.dumps(_sql_jsonable(x))
    return str(x)


def _sql_jsonable(x: Any) -> Any:
    if isinstance(x, decimal.Decimal):  # DuckDB's sum of BIGINTs is a HUGEINT
        return int(x) if x == x.to_integral_value() else float(x)
    if type(x) in (list, tuple):
        return [_sql_jsonable(v) for v in x]
    if type(x) is dict:
        return {str(k): _sql_jsonable(v) for k, v in x.items()}
    return _jsonable(x)


def _table(out: IO[str], header: list[str], cells: Any) -> None:
    table = [header] + [[_cut(c) for c in row] for row in cells]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _fail(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def _write_parquet(table: Any, path: str | None) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path if path is not None else sys.stdout.buffer)


def cmd_state(a: argparse.Namespace) -> int:
    from slipstream.state.query import NO_PYARROW, SQLError, columns_of, gather_with_id, run_sql
    from slipstream.state.reader import read_with_id

    if a.format == "parquet" and a.output is None and sys.stdout.isatty():
        return _fail(
            "--format parquet writes a binary file: give --output PATH (or redirect stdout "
            "to a file)",
            2,
        )
    if a.sql is not None:
        try:
            import duckdb  # noqa: F401
        except ImportError:
            from slipstream.state.query import NO_DUCKDB

            return _fail(NO_DUCKDB, 1)
    columnar = a.sql is not None or a.format == "parquet"
    if columnar:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return _fail(NO_PYARROW, 1)
    try:
        if columnar and a.key is None:
            sid, cols = gather_with_id(a.store, a.vertex, a.snapshot)
            rows: list[Any] = []
        else:
            sid, rows = read_with_id(a.store, a.vertex, a.snapshot)
    except ValueError as e:
        return _fail(str(e), 2)
    except SlipstreamError as e:
        return _fail(str(e), 1)
    where = f"snapshot {sid} of {a.store}" + (f", vertex {a.vertex!r}" if a.vertex else "")
    if a.key is not None:
        rows = [r for r in rows if a.key in (repr(r.key), str(r.key))]
        if not rows:
            return _fail(f"no entry with key {a.key!r} in {where}", 1)
        if columnar:
            cols = columns_of(rows)
    if a.sql is not None:
        try:
            table = run_sql(cols, a.sql)
        except SQLError as e:
            return _fail(f"the query failed: {e}", 2)
        where += ", --sql"
    elif columnar:
        table = cols.table()
    if columnar:
        n = table.num_rows
        if a.format == "parquet":
            _write_parquet(table, a.output)
            dest = f" written to {a.output}" if a.output is not None else ""
            print(f"{where}: {n} row{'s' if n != 1 else ''}{dest}", file=sys.stderr)
            return 0
        header = list(table.column_names)
        records = [tuple(r.values()) for r in table.to_pylist()]
        cells: Any = ([_sql_cell(c) for c in r] for r in records)
    else:
        n = len(rows)
        header = list(COLUMNS)
        cells = (_cells(r) for r in rows)
    out: IO[str]
    out = open(a.output, "w", encoding="utf-8", newline="") if a.output else sys.stdout  # noqa: SIM115
    try:
        if a.format == "jsonl":
            if columnar:
                for r in records:
                    obj = {h: _sql_jsonable(v) for h, v in zip(header, r, strict=True)}
                    out.write(json.dumps(obj) + "\n")
            else:
                for row in rows:
                    obj = dict(zip(COLUMNS, (row.vertex, row.processor, row.kind), strict=False))
                    obj.update(
                        key=_jsonable(row.key),
                        detail=_jsonable(row.detail),
                        value=_jsonable(row.value),
                    )
                    out.write(json.dumps(obj) + "\n")
        elif a.format == "csv":
            w = csv.writer(out, lineterminator="\n")
            w.writerow(header)
            w.writerows(cells)
        else:
            _table(out, header, cells)
    finally:
        if out is not sys.stdout:
            out.close()
    dest = f" written to {a.output}" if a.output else ""
    print(f"{where}: {n} row{'s' if n != 1 else ''}{dest}", file=sys.stderr)
    return 0
