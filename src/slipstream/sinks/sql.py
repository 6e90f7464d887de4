"""SQL sink over any DB-API connection, with PostgreSQL two-phase commit for
exactly-once output (``sinks.sql``).

``connect`` is a zero-argument callable returning a *new* DB-API connection (e.g.
``lambda: psycopg.connect(dsn)``); every processor opens its own where it runs.

The sink executes ``statement`` with each item as its parameter tuple (``executemany``),
one batch per inbox. An error names the failing row. Upserts are plain SQL (``INSERT ...
ON CONFLICT (...) DO UPDATE``). Guarantees:

* no snapshots / at-least-once: each batch is committed when written;
* exactly-once (PostgreSQL): each processor writes into one transaction per snapshot
  interval. At the snapshot barrier (``snapshot_commit_prepare``) it ``PREPARE
  TRANSACTION``s it under an id naming the job, vertex, processor, snapshot and
  execution, and records the id in the snapshot; ``COMMIT PREPARED`` runs when the
  snapshot commits (``snapshot_commit_finish``, on this processor's thread). On restore the ids in
  the restored snapshot are committed (a crash may have come between the snapshot's
  commit and the ``COMMIT PREPARED``) and every other prepared transaction of this
  sink is rolled back: it belongs to a snapshot that never committed, and the replay
  writes its rows again. A fresh (not restored) execution rolls back all of them. The
  server needs ``max_prepared_transactions`` > 0.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
import uuid
from collections.abc import Callable
from typing import Any

from slipstream.core.commit import AT_COMPLETION, PreparedCommits
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.errors import SqlError
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.retry import CommitRetry, transient_connection_error
from slipstream.core.validation import check_callable
from slipstream.state.keys import BroadcastKey, tagged_broadcast_name

__all__ = ["sql_sink", "SqlSinkP", "transaction_prefix"]

Connect = Callable[[], Any]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def transaction_prefix(job_name: str, vertex_name: str) -> str:
    """The start of every prepared-transaction id of one sink vertex of one job; the
    names are reduced to safe characters plus a hash, so any job name makes a valid,
    unique id."""
    digest = hashlib.sha256(f"{job_name}\0{vertex_name}".encode()).hexdigest()[:10]
    return f"slipstream-{_SAFE.sub('_', job_name)[:40]}-{_SAFE.sub('_', vertex_name)[:40]}-{digest}"


def _literal(text: str) -> str:
    """An SQL string literal (ids are made of safe characters; quote anyway)."""
    return "'" + text.replace("'", "''") + "'"


#: The longest one call to the server may take before it counts as a failed attempt (its
#: connection is then shut down from a timer thread): a hung server or network becomes
#: an error the retry handles, within JobConfig.sink_outage_timeout. Calls that write rows
#: (which may write a whole snapshot interval's rows again after a reconnect) may take
#: what is left of the outage budget, if that is longer.
CALL_TIMEOUT_S = 30.0


class SqlSinkP(AbstractProcessor):
    """Executes ``statement`` for each item in batches; see the module doc."""

    snapshot_tag = "sql-prepared"
    metric_names = ("commit_retries",)  # failed attempts to reach the server

    def __init__(self, connect: Connect, statement: str) -> None:
        self._connect = connect
        self._statement = statement
        self._conn: Any = None
        self._control: Any = None  # autocommit connection for COMMIT/ROLLBACK PREPARED
        self._two_phase = False
        self._in_txn = False
        # two-phase: the rows written into the open transaction. A transaction dies with
        # its connection: after a reconnect they are written again before anything else,
        # so a retry never prepares a transaction missing rows staged before the cut
        self._txn_rows: list[Any] = []
        self._preparing: str | None = None  # a PREPARE TRANSACTION whose outcome is unknown
        self._recovered = False
        self._restored: list[tuple[int, list[str]]] = []
        # prepared ids whose COMMIT PREPARED has not run yet: every snapshot names all of
        # them, not only its own (a snapshot whose write failed leaves its transaction to
        # the next one's commit, and a restore from that one must commit it too)
        self._prepared: PreparedCommits[str] = PreparedCommits()
        self._token = uuid.uuid4().hex[:8]  # this execution: ids never repeat across runs
        self._server = "the database"
        self._retry: CommitRetry | None = None
        self._using: Any = None  # the connection of the attempt under way

    def is_cooperative(self) -> bool:
        return False  # every batch is a network round trip

    def init_processor(self, context: Context) -> None:
        self._two_phase = (
            context.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            and context.commits_snapshots
        )
        self._prefix = transaction_prefix(context.job_name, context.vertex_name)
        self._retry = CommitRetry(context, "the database", lambda: self._server, reset=self._reset)
        self._conn = self._open()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True

    # -- connections ------------------------------------------------------------------
    def _open(self, autocommit: bool | None = None) -> Any:
        conn = self._connect()
        self._server = _describe(conn) or self._server
        if autocommit if autocommit is not None else self._two_phase:
            conn.autocommit = True  # explicit BEGIN / PREPARE TRANSACTION (or control)
        return conn

    def _data_conn(self) -> Any:
        if self._conn is None:
            self._conn = self._open()
        self._using = self._conn
        return self._conn

    def _control_conn(self) -> Any:
        if self._control is None:
            self._control = self._open(autocommit=True)
        self._using = self._control
        return self._control

    def _reset(self) -> None:
        """After a failed attempt: drop the connection it used and every broken one (the
        next attempt reconnects); the open transaction died with the data connection."""
        for attr in ("_conn", "_control"):
            conn = getattr(self, attr)
            if conn is None or not (conn is self._using or _broken(conn)):
                continue
            setattr(self, attr, None)
            if attr == "_conn":
                self._in_txn = False
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is broken already
                pass

    def _attempt(self, fn: Callable[[], Any], what: str, writes: bool = False) -> bool:
        """``fn`` through the retry (see :mod:`slipstream.core.retry`), each call bounded
        by ``CALL_TIMEOUT_S`` (at most what is left of the outage budget; with ``writes``
        at least that)."""
        retry = self._retry
        assert retry is not None
        left = max(2.0, retry.remaining_s())
        timeout = max(CALL_TIMEOUT_S, left) if writes else min(CALL_TIMEOUT_S, left)
        return retry.attempt(fn, what=what, timeout=timeout, interrupt=self._interrupt)

    def _interrupt(self) -> None:
        """A call ran past its timeout: shut its connection's socket down, so that the
        blocked call fails (and is retried) instead of hanging."""
        _shut_down(self._using)

    # -- writing -------------------------------------------------------------------
    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._recover():
            return  # the rows wait in the inbox
        rows = list(inbox)
        if rows and self._attempt(functools.partial(self._write, rows), "writing rows", True):
            inbox.clear()

    def _begin(self) -> Any:
        """The data connection with the two-phase transaction open (after a reconnect:
        a new one holding every row written since the last PREPARE)."""
        conn = self._data_conn()
        if not self._in_txn:
            conn.execute("BEGIN")
            self._in_txn = True
            if self._txn_rows:
                with conn.cursor() as cur:
                    cur.executemany(self._statement, self._txn_rows)
        return conn

    def _write(self, rows: list[Any]) -> None:
        conn = self._begin() if self._two_phase else self._data_conn()
        try:
            with conn.cursor() as cur:
                cur.executemany(self._statement, rows)
        except Exception as e:
            if transient_connection_error(e):
                raise  # the connection or the server, not the rows: retried
            raise self._row_error(rows, e) from e
        if self._two_phase:
            self._txn_rows.extend(rows)
        else:
            conn.commit()

    def _end_transaction(self) -> None:
        """Roll back the open transaction (an explicit one under two-phase commit)."""
        if self._two_phase:
            self._conn.execute("ROLLBACK")
        else:
            self._conn.rollback()
        self._in_txn = False

    def _row_error(self, rows: list[Any], error: Exception) -> SqlError:
        """Find the row that fails on its own (each tried in a transaction rolled back)."""
        conn = self._conn
        where = f"vertex {self.context.vertex_name!r}: statement failed"
        try:
            self._end_transaction()
            for n, row in enumerate(rows):
                if self._two_phase:
                    conn.execute("BEGIN")
                try:
                    with conn.cursor() as cur:
                        cur.execute(self._statement, row)
                except Exception as e:  # noqa: BLE001
                    return SqlError(f"{where} for row {n} of the batch, {row!r}: {e}")
                finally:
                    self._end_transaction()
        except Exception:  # noqa: BLE001 - the connection itself is gone
            pass
        return SqlError(f"{where} for a batch of {len(rows)} rows: {error}")

    # -- two-phase commit ------------------------------------------------------------
    def _gid(self, label: str) -> str:
        return f"{self._prefix}:{self.context.global_processor_index}:{label}:{self._token}"

    def _prepare(self, snapshot_id: int, label: str) -> bool:
        """PREPARE TRANSACTION the rows written since the last one (if any) under a new
        id filed under ``snapshot_id``; ``False`` while the server cannot be reached."""
        if self._preparing is None:
            if not self._in_txn and not self._txn_rows:
                return True  # nothing written since the last PREPARE
            self._preparing = self._gid(label)
        if not self._attempt(self._prepare_once, "PREPARE TRANSACTION", True):
            return False
        self._prepared.add(snapshot_id, self._preparing)
        self._preparing = None
        return True

    def _prepare_once(self) -> None:
        gid = self._preparing
        assert gid is not None
        if not self._in_txn and self._is_prepared(gid):
            pass  # an earlier attempt prepared it; only the answer was lost
        else:
            self._begin().execute(f"PREPARE TRANSACTION {_literal(gid)}")
        self._in_txn = False
        self._txn_rows = []

    def _is_prepared(self, gid: str) -> bool:
        cur = self._control_conn().execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,))
        return cur.fetchone() is not None

    def _offer_prepared(self) -> bool:
        """Name every prepared id not committed yet in the snapshot (or the completion
        state)."""
        return self.outbox.offer_to_snapshot(
            BroadcastKey((self.snapshot_tag, self.context.global_processor_index)),
            self._prepared.items(),
        )

    def save_to_snapshot(self) -> bool:
        if self._two_phase:
            return self._recover()  # snapshot_commit_prepare prepares and names them
        return self._offer_prepared()  # nothing prepared: an empty list

    def snapshot_commit_prepare(self) -> bool:
        if self._two_phase:
            sid = self.context.current_snapshot_id
            if not self._prepare(sid, str(sid)):
                return False
        return self._offer_prepared()

    def snapshot_commit_finish(self, success: bool) -> bool:
        if success and self._two_phase and self._prepared.due(self.context):
            return self._attempt(self._commit_due, "COMMIT PREPARED")
        return True

    def _commit_due(self) -> None:
        self._finish_prepared(self._prepared.due(self.context), [])

    def complete(self) -> bool:
        if not self._recover():
            return False
        if self._two_phase:
            if not self._prepare(AT_COMPLETION, "final"):
                return False
            if self._prepared:
                # completion state: a restore from a snapshot recording this processor's
                # completion commits these ids (the engine does not run a completed
                # processor again, so nobody else would)
                self._offer_prepared()
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        name = tagged_broadcast_name(
            key, self.snapshot_tag, 2, self.context.vertex_name, "the sql sink"
        )
        self._restored.append((name[1], list(value)))

    def finish_snapshot_restore(self) -> bool:
        return self._recover()

    def _recover(self) -> bool:
        """Once per execution, before the first write: commit the prepared transactions
        the restored snapshot names, roll back every other one of this processor (and,
        for processor 0, of indices that no longer exist at this parallelism).
        ``False`` while the server cannot be reached."""
        if self._recovered or not self._two_phase:
            return True
        if not self._attempt(self._recover_once, "recovering prepared transactions"):
            return False
        self._recovered = True
        self._restored = []
        return True

    def _recover_once(self) -> None:
        ctx = self.context
        mine = {ctx.global_processor_index}
        committed = {g for i, gids in self._restored for g in gids}
        ours = []
        for gid in self._pending_ids():
            rest = gid[len(self._prefix) + 1 :]
            try:
                index = int(rest.split(":", 1)[0])
            except ValueError:
                continue
            if index in mine or (
                ctx.global_processor_index == 0 and index >= ctx.total_parallelism
            ):
                ours.append(gid)
        self._finish_prepared(
            [g for g in ours if g in committed], [g for g in ours if g not in committed]
        )

    def _pending_ids(self) -> list[str]:
        cur = self._control_conn().execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s AND database = current_database()",
            (self._prefix.replace("_", r"\_") + ":%",),
        )
        return [r[0] for r in cur.fetchall()]

    def _finish_prepared(self, commit: list[str], rollback: list[str]) -> None:
        """COMMIT / ROLLBACK PREPARED each id still prepared (an id that is not was
        finished already, e.g. by an attempt whose answer was lost: idempotent)."""
        conn = self._control_conn()
        for verb, gids in (("COMMIT", commit), ("ROLLBACK", rollback)):
            for gid in gids:
                cur = conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,))
                if cur.fetchone() is not None:
                    conn.execute(f"{verb} PREPARED {_literal(gid)}")
                self._prepared.remove(gid)

    def close(self) -> None:
        for attr in ("_conn", "_control"):
            conn = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None:
                try:
                    if attr == "_conn" and self._in_txn:
                        conn.execute("ROLLBACK")
                    conn.close()
                except Exception:  # noqa: BLE001 - closing after a failure
                    pass


def _describe(conn: Any) -> str | None:
    """The server of a psycopg connection: PostgreSQL at host:port (database name)."""
    info = getattr(conn, "info", None)
    host = getattr(info, "host", None)
    if host is None:
        return None
    port = getattr(info, "port", None)
    dbname = getattr(info, "dbname", None)
    where = f"{host}:{port}" if port is not None and not str(host).startswith("/") else str(host)
    return f"PostgreSQL at {where}" + (f" (database {dbname!r})" if dbname else "")


def _broken(conn: Any) -> bool:
    return bool(getattr(conn, "broken", False) or getattr(conn, "closed", False))


def _shut_down(conn: Any) -> None:
    """Shut the connection's socket down (from another thread): a call blocked on it
    returns with an error. psycopg 3 (``pgconn.socket``) and DB-API drivers with
    ``fileno()``; others are left alone."""
    if conn is None:
        return
    try:
        pgconn = getattr(conn, "pgconn", None)
        fd = pgconn.socket if pgconn is not None else conn.fileno()
        sock = socket.socket(fileno=os.dup(fd))
    except Exception:  # noqa: BLE001 - no socket to shut down
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def sql_sink(connect: Connect, statement: str) -> functools.partial[SqlSinkP]:
    """Executes ``statement`` (``%s`` placeholders) with each item as its parameter tuple;
    see the module doc for batching and guarantees."""
    check_callable(connect, "connect", "sql")
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError(f"sql(): argument 'statement' must be a non-empty str, got {statement!r}")
    return functools.partial(SqlSinkP, connect, statement)
