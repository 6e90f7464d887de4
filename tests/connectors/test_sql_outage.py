"""The SQL sink rides out a lost connection and fails loudly at the outage budget
(issue 20): an error on its commit connection, a connection cut while rows wait in the
open transaction (a retry must write them all again: nothing staged is lost), and a
PostgreSQL that stops answering at a ``COMMIT PREPARED``. The faults are events (a trap
in the connection, a proxy that cuts or hangs), not sleeps."""

from __future__ import annotations

import functools
import itertools
import logging
import tempfile
import threading
from typing import Any

import psycopg
import pytest
from outage_support import TcpProxy, clear_trap, set_trap, trapped_connect
from test_kafka import wait_for

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
from slipstream.core.processor import AbstractProcessor

EO = ProcessingGuarantee.EXACTLY_ONCE
_names = itertools.count()

def _table(dsn: str) -> str:
    name = f"sqlout{next(_names)}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} (k int, v text)")
    return name


def _rows(dsn: str, table: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as c:
        return sorted((int(k), v) for k, v in c.execute(f"SELECT k, v FROM {table}").fetchall())


def _open_writes(dsn: str, table: str) -> bool:
    """Whether a transaction that wrote rows into ``table`` is open (not yet prepared)."""
    with psycopg.connect(dsn) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.relation = %s::regclass AND l.mode = 'RowExclusiveLock' "
            "AND a.state = 'idle in transaction'",
            (table,),
        ).fetchone()
    return bool(row and row[0])


def _prepared(dsn: str, job: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute("SELECT gid FROM pg_prepared_xacts").fetchall() if job in r[0]]


def _rollback_prepared(dsn: str, job: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for gid in _prepared(dsn, job):
            c.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))


class Halves(AbstractProcessor):
    """Emits rows 0..n/2-1, then waits for ``go`` (an event the test sets), then the
    rest; a batch source (no snapshot state: the tests run without periodic snapshots)."""

    go = threading.Event()

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def complete(self) -> bool:
        while self.i < self.n:
            if self.i == self.n // 2 and not self.go.is_set():
                return False
            if not self.try_emit((self.i, f"v{self.i}")):
                return False
            self.i += 1
        return True


def _job(connect: Any, table: str, name: str, n: int, **cfg: Any) -> Any:
    dag = DAG()
    src = dag.new_vertex("rows", functools.partial(Halves, n)).local_parallelism(1)
    db = dag.new_vertex("db", sinks.sql(connect, f"INSERT INTO {table} (k, v) VALUES (%s, %s)"))
    dag.edge(Edge.between(src, db.local_parallelism(1)))
    cfg.setdefault("snapshot_store", tempfile.mkdtemp(prefix="sql-outage-"))
    cfg.setdefault("snapshot_interval_ms", 3_600_000)  # only the job's final commit
    return ss.local().new_job(dag, JobConfig(name=name, processing_guarantee=EO, **cfg))


def _always() -> None:
    raise psycopg.OperationalError("injected: the commit connection broke")


def test_a_commit_connection_that_keeps_failing_fails_the_job_at_the_budget(postgres: Any) -> None:
    """On main the commit's exception killed the snapshot thread at the job's end: the
    job never finished (join timed out)."""
    table = _table(postgres.dsn)
    name = f"always-{next(_names)}"
    set_trap(name, _always, once=False)
    Halves.go.set()
    try:
        job = _job(functools.partial(trapped_connect, postgres.dsn, name, 2), table, name, 200, sink_outage_timeout=1.5)
        with pytest.raises(ss.JobFailedError) as ei:
            job.join(120)
    finally:
        clear_trap(name)
    text = str(ei.value).split("\n--- processor traceback ---")[0]
    assert text.startswith(
        f"job {name!r} failed: vertex 'db', processor 0: SinkUnavailableError: COMMIT PREPARED "
        f"to PostgreSQL at 127.0.0.1:{postgres.port} (database 'postgres') failed for "
    ), text
    assert text.endswith(
        "(JobConfig.sink_outage_timeout=1.5 s): OperationalError: injected: the commit "
        "connection broke"
    ), text
    assert job.restarts == 0  # the budget is the user's: no restart after it
    assert _rows(postgres.dsn, table) == []  # prepared, never committed
    assert len(_prepared(postgres.dsn, name)) == 1  # left for a resume to commit
    _rollback_prepared(postgres.dsn, name)


def test_a_connection_cut_mid_transaction_loses_no_staged_row(postgres: Any) -> None:
    """The first half of the rows is written into the open transaction, every
    connection is cut, the second half comes: the sink reconnects and writes the first
    half again before it (a retry that just went on would prepare the second half
    only). On main a cut failed the job (a restart replayed it)."""
    table = _table(postgres.dsn)
    name = f"cut-{next(_names)}"
    n = 2000
    proxy = TcpProxy(target_port=postgres.port)
    dsn = postgres.dsn.replace(f"port={postgres.port}", f"port={proxy.port}")
    Halves.go.clear()
    try:
        job = _job(functools.partial(psycopg.connect, dsn, connect_timeout=2), table, name, n)
        wait_for(lambda: job.metrics["db"]["items_in"] >= n // 2, "the first half at the sink")
        wait_for(lambda: _open_writes(postgres.dsn, table), "rows in the sink's open transaction")
        proxy.cut()
        proxy.heal()  # the connections are gone; new ones go through
        Halves.go.set()
        job.join(120)
    finally:
        Halves.go.set()
        proxy.close()
    assert _rows(postgres.dsn, table) == [(i, f"v{i}") for i in range(n)]
    assert job.restarts == 0
    assert job.metrics["db"]["commit_retries"] >= 1
    assert _prepared(postgres.dsn, name) == []


def test_a_commit_that_hangs_fails_the_job_at_the_budget(postgres: Any) -> None:
    """PostgreSQL stops answering (a proxy that forwards nothing) inside COMMIT
    PREPARED: each call is cut off at its timeout, the job fails at the budget naming
    the sink, the server and the cause. On main the snapshot thread hung in the call
    and the job never finished."""
    table = _table(postgres.dsn)
    name = f"hang-{next(_names)}"
    proxy = TcpProxy(target_port=postgres.port)
    dsn = postgres.dsn.replace(f"port={postgres.port}", f"port={proxy.port}")
    set_trap(name, proxy.hang, once=False)
    Halves.go.set()
    try:
        # a budget of 1.5 s (3 s made the test 7.4 s: the hung call is cut at the budget,
        # then the budget runs again from that first failure)
        job = _job(functools.partial(trapped_connect, dsn, name, 2), table, name, 200, sink_outage_timeout=1.5)
        with pytest.raises(ss.JobFailedError) as ei:
            job.join(120)
    finally:
        clear_trap(name)
        proxy.heal()
        proxy.close()
    text = str(ei.value)
    assert f"vertex 'db', processor 0: SinkUnavailableError: COMMIT PREPARED to PostgreSQL at 127.0.0.1:{proxy.port}" in text, text
    assert "(JobConfig.sink_outage_timeout=1.5 s): " in text, text
    assert _rows(postgres.dsn, table) == []
    _rollback_prepared(postgres.dsn, name)



class _Outage:
    """A trap that refuses every COMMIT PREPARED until ``over`` is set."""

    def __init__(self) -> None:
        self.over = threading.Event()
        self.refused = 0

    def __call__(self) -> None:
        if not self.over.is_set():
            self.refused += 1
            raise psycopg.OperationalError("injected: the server is restarting")


def test_an_outage_is_said_in_the_log_watch_metrics_and_prometheus_then_cleared(
    postgres: Any, caplog: Any
) -> None:
    from slipstream.dashboard.prometheus import metrics_text
    from slipstream.dashboard.stats import Sampler

    table = _table(postgres.dsn)
    name = f"said-{next(_names)}"
    outage = _Outage()
    set_trap(name, outage, once=False)
    Halves.go.set()
    caplog.set_level(logging.WARNING, logger="slipstream.sinks")
    try:
        job = _job(functools.partial(trapped_connect, postgres.dsn, name, 2), table, name, 300)
        wait_for(lambda: job.watch().get("warnings"), "the outage in job.watch()")
        server = f"PostgreSQL at 127.0.0.1:{postgres.port} (database 'postgres')"
        said = (
            f"vertex 'db', processor 0: COMMIT PREPARED to {server} failed: OperationalError: "
            "injected: the server is restarting"
        )
        (warning,) = job.watch()["warnings"].values()
        assert warning.startswith(said), warning
        assert f"{said}; retrying for up to 120 s (JobConfig.sink_outage_timeout)" in caplog.text
        metrics = job.metrics
        assert metrics["__job__"]["commit_retries"] >= 1 and metrics["db"]["commit_retries"] >= 1
        assert metrics["__job__"]["sink_unavailable_s"] >= 0
        doc = Sampler().describe(job)
        assert len(doc["warnings"]) == 1 and doc["warnings"][0].startswith(f"db#0: {said}")
        text = metrics_text(lambda: [doc]).decode()
        assert f'slipstream_job_warnings{{job="{name}",job_id="{job.id}"}} 1.0' in text, text
        assert f'slipstream_commit_retries_total{{job="{name}",job_id="{job.id}"}}' in text, text
        assert "slipstream_sink_unavailable_seconds{" in text
        outage.over.set()
        job.join(120)
    finally:
        clear_trap(name)
    assert job.status is ss.JobStatus.COMPLETED and job.restarts == 0
    assert _rows(postgres.dsn, table) == [(i, f"v{i}") for i in range(300)]
    assert "warnings" not in job.watch()
    assert job.metrics["__job__"]["sink_unavailable_s"] == 0
    assert f"COMMIT PREPARED to {server} succeeded again after" in caplog.text
