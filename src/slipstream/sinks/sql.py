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
import re
import uuid
from collections.abc import Callable
from typing import Any

from slipstream.core.commit import AT_COMPLETION, PreparedCommits
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.errors import SqlError
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
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


class SqlSinkP(AbstractProcessor):
    """Executes ``statement`` for each item in batches; see the module doc."""

    snapshot_tag = "sql-prepared"

    def __init__(self, connect: Connect, statement: str) -> None:
        self._connect = connect
        self._statement = statement
        self._conn: Any = None
        self._control: Any = None  # autocommit connection for COMMIT/ROLLBACK PREPARED
        self._two_phase = False
        self._in_txn = False
        self._recovered = False
        self._restored: list[tuple[int, list[str]]] = []
        # prepared ids whose COMMIT PREPARED has not run yet: every snapshot names all of
        # them, not only its own (a snapshot whose write failed leaves its transaction to
        # the next one's commit, and a restore from that one must commit it too)
        self._prepared: PreparedCommits[str] = PreparedCommits()
        self._token = uuid.uuid4().hex[:8]  # this execution: ids never repeat across runs

    def is_cooperative(self) -> bool:
        return False  # every batch is a network round trip

    def init_processor(self, context: Context) -> None:
        self._two_phase = (
            context.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            and context.commits_snapshots
        )
        self._prefix = transaction_prefix(context.job_name, context.vertex_name)
        self._conn = self._connect()
        if self._two_phase:
            self._conn.autocommit = True  # explicit BEGIN / PREPARE TRANSACTION

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True

    # -- writing -------------------------------------------------------------------
    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._recover()
        rows = list(inbox)
        inbox.clear()
        if not rows:
            return
        conn = self._conn
        if self._two_phase and not self._in_txn:
            conn.execute("BEGIN")
            self._in_txn = True
        try:
            with conn.cursor() as cur:
                cur.executemany(self._statement, rows)
        except Exception as e:
            raise self._row_error(rows, e) from e
        if not self._two_phase:
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

    def _prepare(self, label: str) -> str | None:
        if not self._in_txn:
            return None
        gid = self._gid(label)
        self._conn.execute(f"PREPARE TRANSACTION {_literal(gid)}")
        self._in_txn = False
        return gid

    def _offer_prepared(self) -> bool:
        """Name every prepared id not committed yet in the snapshot (or the completion
        state)."""
        return self.outbox.offer_to_snapshot(
            BroadcastKey((self.snapshot_tag, self.context.global_processor_index)),
            self._prepared.items(),
        )

    def save_to_snapshot(self) -> bool:
        self._recover()
        if self._two_phase:
            return True  # snapshot_commit_prepare prepares and names the transactions
        return self._offer_prepared()  # nothing prepared: an empty list

    def snapshot_commit_prepare(self) -> bool:
        if self._two_phase:
            sid = self.context.current_snapshot_id
            gid = self._prepare(str(sid))
            if gid is not None:
                self._prepared.add(sid, gid)
        return self._offer_prepared()

    def snapshot_commit_finish(self, success: bool) -> bool:
        if success and self._two_phase:
            due = self._prepared.due(self.context)
            if due:
                self._finish_prepared(due, [])
        return True

    def complete(self) -> bool:
        self._recover()
        if self._two_phase:
            gid = self._prepare("final")
            if gid is not None:
                self._prepared.add(AT_COMPLETION, gid)
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
        self._recover()
        return True

    def _recover(self) -> None:
        """Once per execution, before the first write: commit the prepared transactions
        the restored snapshot names, roll back every other one of this processor (and,
        for processor 0, of indices that no longer exist at this parallelism)."""
        if self._recovered or not self._two_phase:
            return
        self._recovered = True
        ctx = self.context
        mine = {ctx.global_processor_index}
        committed = {g for i, gids in self._restored for g in gids}
        self._restored = []
        pending = self._pending_ids()
        ours = []
        for gid in pending:
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

    def _control_conn(self) -> Any:
        if self._control is None:
            self._control = self._connect()
            self._control.autocommit = True
        return self._control

    def _finish_prepared(self, commit: list[str], rollback: list[str]) -> None:
        conn = self._control_conn()
        for verb, gids in (("COMMIT", commit), ("ROLLBACK", rollback)):
            for gid in gids:
                cur = conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,))
                if cur.fetchone() is not None:  # else: finished already (idempotent)
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


def sql_sink(connect: Connect, statement: str) -> functools.partial[SqlSinkP]:
    """Executes ``statement`` (``%s`` placeholders) with each item as its parameter tuple;
    see the module doc for batching and guarantees."""
    check_callable(connect, "connect", "sql")
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError(f"sql(): argument 'statement' must be a non-empty str, got {statement!r}")
    return functools.partial(SqlSinkP, connect, statement)
