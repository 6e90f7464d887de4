"""A sink's server going away (issue 20): PostgreSQL stopped with ``pg_ctl stop -m
immediate`` at a ``COMMIT PREPARED``, an error injected on the commit connection, and a
Kafka broker cut off by a TCP proxy. Each test ends with the job recovered and its output
exact, or FAILED with a message that names the sink, the server and the cause; never a
RUNNING job that makes no progress without saying so.

The outages are events, not sleeps: the trap stops the server inside the sink's commit,
the test waits for the engine's warning about it, then brings the server back. Only the
outage that must outlast the budget is a span of time (that is what it tests).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from outage_support import TcpProxy, set_trap, sprung, trapped_connect
from test_kafka import produce, read_topic, topic_name, wait_for

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sinks, sources
from slipstream.core import retry
from slipstream.devservers import PostgresServer, kafka_broker, postgres_server

pytestmark = pytest.mark.slow

EO = ProcessingGuarantee.EXACTLY_ONCE
_names = itertools.count()

@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    """A private cluster these tests may stop (the session's is shared by others)."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_up(pg: PostgresServer) -> Iterator[PostgresServer]:
    yield pg
    _ensure_started(pg)


def _ensure_started(pg: PostgresServer) -> None:
    try:
        psycopg.connect(pg.dsn, connect_timeout=5).close()
    except psycopg.OperationalError:
        pg.start()


def _table(dsn: str) -> str:
    name = f"outage{next(_names)}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} (k int, v text)")
    return name


def _count(dsn: str, table: str) -> tuple[int, int]:
    """(rows, distinct keys) of ``table``; (-1, -1) while the server is down."""
    try:
        with psycopg.connect(dsn, connect_timeout=5) as c:
            row = c.execute(f"SELECT count(*), count(DISTINCT k) FROM {table}").fetchone()
    except psycopg.OperationalError:
        return (-1, -1)
    assert row is not None
    return (int(row[0]), int(row[1]))


def _prepared(dsn: str, job: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
    return [r[0] for r in rows if job in r[0]]


class _Warnings(logging.Handler):
    """Collects WARNING+ records of slipstream's loggers; ``seen`` is set at the first
    that mentions every word of ``words``."""

    def __init__(self, *words: str) -> None:
        super().__init__(logging.WARNING)
        self.words = words
        self.seen = threading.Event()
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.texts.append(text)
        if all(w in text for w in self.words):
            self.seen.set()


@pytest.fixture
def warnings_of() -> Iterator[Callable[..., _Warnings]]:
    handlers: list[_Warnings] = []
    logger = logging.getLogger("slipstream")

    def make(*words: str) -> _Warnings:
        h = _Warnings(*words)
        logger.addHandler(h)
        handlers.append(h)
        return h

    yield make
    for h in handlers:
        logger.removeHandler(h)


def _kafka_to_sql(
    kafka_bootstrap: str, topic: str, dsn: str, table: str, trap: str, name: str, **cfg: Any
) -> Any:
    """A streaming job: Kafka records ``b"<int>"`` -> rows (k, 'v<k>') in ``table``."""
    dag = DAG()
    src = dag.new_vertex(
        "kafka",
        sources.kafka(
            topic,
            {"bootstrap.servers": kafka_bootstrap, "group.id": name},
            projection=lambda m: int(m.value()),
        ),
    ).local_parallelism(1)
    rows = dag.new_vertex("rows", ss.processors.map(lambda k: (k, f"v{k}")))
    db = dag.new_vertex(
        "db",
        sinks.sql(
            functools.partial(trapped_connect, dsn, trap),
            f"INSERT INTO {table} (k, v) VALUES (%s, %s)",
        ),
    ).local_parallelism(2)
    dag.edge(Edge.between(src, rows))
    dag.edge(Edge.between(rows, db))
    cfg.setdefault("snapshot_store", tempfile.mkdtemp(prefix="outage-store-"))
    cfg.setdefault("snapshot_interval_ms", 200)
    return ss.local().new_job(dag, JobConfig(name=name, processing_guarantee=EO, **cfg))


def _records(lo: int, hi: int) -> list[tuple[int, bytes, int | None]]:
    return [(0, str(i).encode(), None) for i in range(lo, hi)]


def test_sql_sink_pg_crash_at_commit_recovers_in_place_output_exact(
    kafka: Any, pg_up: PostgresServer, warnings_of: Callable[..., _Warnings]
) -> None:
    """PostgreSQL crashes inside a COMMIT PREPARED of a streaming job and comes back
    after the engine warned about it: the job recovers in place (no restart), every row
    is written once, and no prepared transaction is left behind."""
    pg = pg_up
    topic = topic_name("pg-crash")
    kafka.create_topic(topic, 1)
    table = _table(pg.dsn)
    name = f"pg-crash-{next(_names)}"
    set_trap(name, functools.partial(pg.stop, "immediate"))
    warned = warnings_of("'db'", f"127.0.0.1:{pg.port}")
    produce(kafka.bootstrap, topic, _records(0, 1000))
    job = _kafka_to_sql(kafka.bootstrap, topic, pg.dsn, table, name, name, sink_outage_timeout=120)
    try:
        assert warned.seen.wait(120), f"no warning naming the sink and server: {warned.texts}"
        assert job.status is JobStatus.RUNNING
        pg.start()
        produce(kafka.bootstrap, topic, _records(1000, 2000))
        wait_for(lambda: _count(pg.dsn, table)[0] >= 2000, "all 2,000 rows")
        assert _count(pg.dsn, table) == (2000, 2000)
        assert job.metrics["__job__"]["restarts"] == 0
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(120)
    assert _count(pg.dsn, table) == (2000, 2000)


def test_sql_sink_pg_down_past_the_budget_fails_naming_sink_server_cause_then_resumes(
    kafka: Any, pg_up: PostgresServer
) -> None:
    """PostgreSQL stays down past ``sink_outage_timeout``: the job fails (never RUNNING
    without progress) naming the sink, the server and the cause; a resume after the
    server is back writes every row once and leaves no prepared transaction."""
    pg = pg_up
    topic = topic_name("pg-down")
    kafka.create_topic(topic, 1)
    table = _table(pg.dsn)
    name = f"pg-down-{next(_names)}"
    store = tempfile.mkdtemp(prefix="outage-store-")
    set_trap(name, functools.partial(pg.stop, "immediate"))
    produce(kafka.bootstrap, topic, _records(0, 1500))
    job = _kafka_to_sql(
        kafka.bootstrap, topic, pg.dsn, table, name, name, sink_outage_timeout=1.5, snapshot_store=store
    )  # the budget is what the job waits out before it fails: 1.5 s (3 s before)
    with pytest.raises(ss.JobFailedError) as err:
        job.join(180)
    text = str(err.value)
    assert "'db'" in text and f"127.0.0.1:{pg.port}" in text, text
    assert "sink_outage_timeout" in text, text
    assert job.status is JobStatus.FAILED
    pg.start()
    again = _kafka_to_sql(
        kafka.bootstrap, topic, pg.dsn, table, "none", name, snapshot_store=store, resume=True
    )
    try:
        wait_for(lambda: _count(pg.dsn, table)[0] >= 1500, "all 1,500 rows after the resume")
        assert _count(pg.dsn, table) == (1500, 1500)
        wait_for(lambda: again.metrics["__job__"]["snapshots"] >= 2, "two snapshots committed")
        # what the failed run prepared was committed (it was in its last snapshot) or
        # rolled back; only the running job's open snapshot may hold one now
        assert len(_prepared(pg.dsn, name)) <= 2
    finally:
        again.cancel()
        with pytest.raises(ss.JobCancelledError):
            again.join(120)


def _batch_to_sql(dsn: str, table: str, trap: str, name: str, n: int, **cfg: Any) -> Any:
    dag = DAG()
    src = dag.new_vertex("items", sources.items([(i, f"v{i}") for i in range(n)]))
    db = dag.new_vertex(
        "db",
        sinks.sql(
            functools.partial(trapped_connect, dsn, trap),
            f"INSERT INTO {table} (k, v) VALUES (%s, %s)",
        ),
    ).local_parallelism(2)
    dag.edge(Edge.between(src, db))
    cfg.setdefault("snapshot_store", tempfile.mkdtemp(prefix="outage-store-"))
    # no periodic snapshot: the only commit is the job's last one
    cfg.setdefault("snapshot_interval_ms", 3_600_000)
    return ss.local().new_job(dag, JobConfig(name=name, processing_guarantee=EO, **cfg))


def test_batch_job_pg_crash_at_its_last_commit_completes_once_the_server_is_back(
    pg_up: PostgresServer, warnings_of: Callable[..., _Warnings]
) -> None:
    """The end of a batch job: PostgreSQL crashes at the final COMMIT PREPARED and comes
    back within the budget: the job completes with every row once (it hung forever
    before: the exception ended the last worker thread)."""
    pg = pg_up
    table = _table(pg.dsn)
    name = f"batch-end-{next(_names)}"
    set_trap(name, functools.partial(pg.stop, "immediate"))
    warned = warnings_of("'db'", f"127.0.0.1:{pg.port}")
    job = _batch_to_sql(pg.dsn, table, name, name, 3000, sink_outage_timeout=120)
    assert warned.seen.wait(120), f"no warning naming the sink and server: {warned.texts}"
    pg.start()
    job.join(180)
    assert job.status is JobStatus.COMPLETED
    assert _count(pg.dsn, table) == (3000, 3000)
    assert _prepared(pg.dsn, name) == []


def test_batch_job_pg_down_at_its_last_commit_past_the_budget_fails_then_resumes(
    pg_up: PostgresServer,
) -> None:
    pg = pg_up
    table = _table(pg.dsn)
    name = f"batch-end-down-{next(_names)}"
    store = tempfile.mkdtemp(prefix="outage-store-")
    set_trap(name, functools.partial(pg.stop, "immediate"))
    # the budget is what the job waits out before it fails: 1.5 s (3 s before)
    job = _batch_to_sql(pg.dsn, table, name, name, 3000, sink_outage_timeout=1.5, snapshot_store=store)
    with pytest.raises(ss.JobFailedError) as err:
        job.join(180)
    text = str(err.value)
    assert "'db'" in text and f"127.0.0.1:{pg.port}" in text and "sink_outage_timeout" in text, text
    pg.start()
    _batch_to_sql(pg.dsn, table, "none", name, 3000, snapshot_store=store, resume=True).join(180)
    assert _count(pg.dsn, table) == (3000, 3000)
    assert _prepared(pg.dsn, name) == []


def _raise_once() -> None:
    raise psycopg.OperationalError("injected: the commit connection broke")


def test_an_error_injected_on_the_commit_connection_is_retried(pg_up: PostgresServer) -> None:
    pg = pg_up
    table = _table(pg.dsn)
    name = f"injected-{next(_names)}"
    set_trap(name, _raise_once)
    job = _batch_to_sql(pg.dsn, table, name, name, 2000, snapshot_interval_ms=100)
    job.join(180)
    assert sprung(name)
    assert _count(pg.dsn, table) == (2000, 2000)
    assert _prepared(pg.dsn, name) == []
    assert job.metrics["__job__"]["restarts"] == 0


# -- the Kafka sink behind a proxy -------------------------------------------------------


@pytest.fixture(scope="module")
def proxied_kafka() -> Iterator[tuple[Any, TcpProxy]]:
    """A broker every client reaches only through a proxy the test can cut."""
    proxy = TcpProxy()
    with kafka_broker(advertised_port=proxy.port) as broker:
        proxy.target_port = broker.listen_port
        try:
            yield broker, proxy
        finally:
            proxy.heal()
    proxy.close()


def _items_to_kafka(bootstrap: str, topic: str, name: str, n: int, **cfg: Any) -> Any:
    dag = DAG()
    src = dag.new_vertex(
        "items", sources.generator(lambda i: str(i).encode(), 2000.0, max_items=n)
    ).local_parallelism(1)
    out = dag.new_vertex("out", sinks.kafka(topic, {"bootstrap.servers": bootstrap}))
    dag.edge(Edge.between(src, out))
    cfg.setdefault("snapshot_store", tempfile.mkdtemp(prefix="outage-store-"))
    cfg.setdefault("snapshot_interval_ms", 200)
    return ss.local().new_job(dag, JobConfig(name=name, processing_guarantee=EO, **cfg))


@pytest.mark.parametrize("outage_s", [2.0])
def test_kafka_sink_broker_cut_off_recovers_in_place(
    proxied_kafka: tuple[Any, TcpProxy],
    outage_s: float,
    warnings_of: Callable[..., _Warnings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The call the cut leaves hanging (send_offsets_to_transaction ignores its timeout)
    # is reported after 1 s, not 10 (the test waits for that warning), and abandoned
    # after 3 s + kafka.CALL_GRACE_S, not 10 s + grace (that hang was 12 of the test's
    # 14.5-16 s); its retry after the heal then writes the transaction.
    monkeypatch.setattr(retry, "SLOW_CALL_S", 1.0)
    # (the module, not slipstream.sinks.kafka: the package's function of that name)
    monkeypatch.setattr(importlib.import_module("slipstream.sinks.kafka"), "TXN_TIMEOUT_S", 3.0)
    broker, proxy = proxied_kafka
    topic = topic_name("cut")
    broker.create_topic(topic, 1)
    name = f"kafka-cut-{next(_names)}"
    warned = warnings_of("'out'")
    job = _items_to_kafka(broker.bootstrap, topic, name, 6000, sink_outage_timeout=120)
    try:
        wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 2, "two snapshots")
        proxy.cut()
        cut_at = time.monotonic()
        assert warned.seen.wait(120), f"no warning naming the sink: {warned.texts}"
        # the outage lasts outage_s from the cut (at least until the warning came)
        time.sleep(max(0.0, outage_s - (time.monotonic() - cut_at)))
        proxy.heal()
        job.join(240)
    finally:
        proxy.heal()
    got = read_topic(broker.bootstrap, topic, 1, 6000)
    assert sorted(int(v) for v in got) == list(range(6000))


def test_kafka_sink_broker_cut_off_past_the_budget_fails_naming_sink_broker_cause(
    proxied_kafka: tuple[Any, TcpProxy],
) -> None:
    broker, proxy = proxied_kafka
    topic = topic_name("cut-long")
    broker.create_topic(topic, 1)
    name = f"kafka-cut-long-{next(_names)}"
    # a budget of 1 s: the hung call is given up after max(2 s, budget) + kafka.CALL_GRACE_S
    # (the outage's first failure), and the job fails 1 s later (with 3 s: 8.8-11 s a run)
    job = _items_to_kafka(broker.bootstrap, topic, name, 1_000_000, sink_outage_timeout=1)
    try:
        wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 2, "two snapshots")
        proxy.cut()
        with pytest.raises(ss.JobFailedError) as err:
            job.join(240)
    finally:
        proxy.heal()
    text = str(err.value)
    assert "'out'" in text and broker.bootstrap in text and "sink_outage_timeout" in text, text
