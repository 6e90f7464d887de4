"""SQL source over any DB-API connection (``sources.sql``).

``connect`` is a zero-argument callable returning a *new* DB-API connection (e.g.
``lambda: psycopg.connect(dsn)``): every processor opens its own, where it runs, so
connections are never pickled.

The query runs once per processor and each row is emitted as a tuple. Rows are fetched
through a server-side cursor (psycopg named cursors) in batches no larger than the outbox
has room for, so memory stays bounded whatever the result size. With ``split_by=column``
every processor reads the rows whose ``hashtext(column)`` falls in its share (PostgreSQL);
without it the first processor reads everything. A snapshot saves how many rows were
emitted; a restore re-runs the query and skips them, so the query needs a deterministic
order (``ORDER BY``) for a restore to be exact, and the same parallelism.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from slipstream.core.errors import SqlError
from slipstream.core.validation import check_callable
from slipstream.sources.batch import _emit_chunk, _emit_room, _PositionedSource

__all__ = ["sql_source", "SqlSourceP"]

Connect = Callable[[], Any]


class SqlSourceP(_PositionedSource):
    """Streams the rows of ``query`` through a server-side cursor."""

    snapshot_tag = "sql-rows"

    def __init__(
        self, connect: Connect, query: str, params: Sequence[Any], split_by: str | None
    ) -> None:
        self._connect = connect
        self._query = query
        self._params = tuple(params)
        self._split_by = split_by
        self._conn: Any = None
        self._cursor: Any = None
        self._emitted = 0
        self._skip = 0
        self._done = False

    def is_cooperative(self) -> bool:
        return False  # every fetch is a network round trip

    def _statement(self) -> tuple[str, tuple[Any, ...]] | None:
        ctx = self.context
        n, i = ctx.total_parallelism, ctx.global_processor_index
        if n == 1:
            return self._query, self._params
        if self._split_by is None:
            return (self._query, self._params) if i == 0 else None
        col = '"' + self._split_by.replace('"', '""') + '"'
        sql = (
            f"SELECT * FROM ({self._query}) AS _slipstream_split "
            f"WHERE mod(abs(hashtext(({col})::text)::bigint), {n}) = {i}"
        )
        return sql, self._params

    def _open(self) -> None:
        stmt = self._statement()
        if stmt is None:
            self._done = True
            return
        self._conn = conn = self._connect()
        try:
            # psycopg: a named cursor is a server-side cursor (rows stay on the server)
            cur = conn.cursor(name=f"slipstream_{uuid.uuid4().hex[:12]}")
        except TypeError:  # a DB-API driver without server-side cursors
            cur = conn.cursor()
        try:
            cur.execute(*stmt)
        except Exception as e:
            raise SqlError(
                f"vertex {self.context.vertex_name!r}: query failed: {e}\n  query: {stmt[0]}"
            ) from e
        self._cursor = cur

    def complete(self) -> bool:
        if self._done:
            return True
        if self._cursor is None:
            self._open()
            if self._done:
                return True
        room = _emit_room(self.outbox)
        if room <= 0:
            return False
        rows = self._cursor.fetchmany(min(self._skip or room, 10_000))
        if not rows:
            self._finish()
            return True
        if self._skip:
            self._skip -= len(rows)  # restored: these were emitted before the snapshot
            return False
        _emit_chunk(self.outbox, [tuple(r) for r in rows])
        self._emitted += len(rows)
        return False

    def _finish(self) -> None:
        self._done = True
        cur, self._cursor = self._cursor, None
        if cur is not None:
            cur.close()
        self.close()

    def _position(self) -> Any:
        return self._emitted

    def _seek(self, position: Any) -> None:
        self._emitted = self._skip = int(position)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.rollback()  # read-only: nothing to keep
            finally:
                conn.close()


def sql_source(
    connect: Connect,
    query: str,
    params: Sequence[Any] = (),
    *,
    split_by: str | None = None,
) -> functools.partial[SqlSourceP]:
    """Emits the rows of ``query`` (with ``params``) as tuples; see the module doc."""
    check_callable(connect, "connect", "sql")
    if not isinstance(query, str) or not query.strip():
        raise TypeError(f"sql(): argument 'query' must be a non-empty str, got {query!r}")
    if split_by is not None and (not isinstance(split_by, str) or not split_by):
        raise TypeError(f"sql(): argument 'split_by' must be a column name, got {split_by!r}")
    return functools.partial(SqlSourceP, connect, query, tuple(params), split_by)
