"""The SQL source and sink against a real PostgreSQL server (started by the fixture)."""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

import psycopg
import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.sinks.sql import transaction_prefix

_names = itertools.count()


def _table(dsn: str, columns: str = "k int, v text") -> str:
    name = f"t{next(_names)}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} ({columns})")
    return name


def _rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        return [tuple(r) for r in c.execute(sql).fetchall()]


def _connect(dsn: str) -> Any:
    return lambda: psycopg.connect(dsn)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_source_reads_every_row_once(postgres: Any, parallelism: int) -> None:
    t = _table(postgres.dsn)
    with psycopg.connect(postgres.dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO {t} SELECT i, 'v' || i FROM generate_series(1, 25000) i")
    dag = DAG()
    src = dag.new_vertex(
        "rows",
        sources.sql(
            _connect(postgres.dsn), f"SELECT k, v FROM {t} WHERE k > %s", (5,), split_by="k"
        ),
    ).local_parallelism(parallelism)
    out = dag.new_vertex("out", sinks.list_sink("rows")).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    engine = ss.local()
    engine.new_job(dag, JobConfig(name="sql-src")).join(60)
    got = engine.get_list("rows")
    assert sorted(got) == [(i, f"v{i}") for i in range(6, 25001)]


def test_source_query_error_names_vertex(postgres: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("bad-query", sources.sql(_connect(postgres.dsn), "SELECT * FROM nope"))
    out = dag.new_vertex("out", sinks.noop())
    dag.edge(Edge.between(src, out))
    with pytest.raises(ss.JobFailedError) as err:
        ss.local().new_job(dag, JobConfig(name="sql-bad")).join(60)
    assert "bad-query" in str(err.value) and "nope" in str(err.value)


def _sink_job(dsn: str, statement: str, items: list[Any], name: str, **cfg: Any) -> Any:
    dag = DAG()
    src = dag.new_vertex("items", sources.items(items))
    out = dag.new_vertex("db", sinks.sql(_connect(dsn), statement)).local_parallelism(2)
    dag.edge(Edge.between(src, out))
    cfg.setdefault("snapshot_store", tempfile.mkdtemp(prefix="sql-test-store-"))
    return ss.local().new_job(dag, JobConfig(name=name, **cfg))


@pytest.mark.parametrize(
    "guarantee",
    [ProcessingGuarantee.NONE, ProcessingGuarantee.AT_LEAST_ONCE, ProcessingGuarantee.EXACTLY_ONCE],
)
def test_sink_writes_every_item(postgres: Any, guarantee: ProcessingGuarantee) -> None:
    t = _table(postgres.dsn)
    items = [(i, f"x{i}") for i in range(20000)]
    _sink_job(
        postgres.dsn,
        f"INSERT INTO {t} (k, v) VALUES (%s, %s)",
        items,
        f"sink-{guarantee.name}",
        processing_guarantee=guarantee,
        snapshot_interval_ms=20,
    ).join(60)
    assert sorted(_rows(postgres.dsn, f"SELECT k, v FROM {t}")) == items
    assert _rows(postgres.dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()") == []


def test_sink_upsert(postgres: Any) -> None:
    t = _table(postgres.dsn, "k int primary key, v int")
    items = [(i % 10, i) for i in range(100)]
    stmt = f"INSERT INTO {t} (k, v) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = greatest({t}.v, EXCLUDED.v)"
    _sink_job(postgres.dsn, stmt, items, "upsert").join(60)
    assert sorted(_rows(postgres.dsn, f"SELECT k, v FROM {t}")) == [(k, 90 + k) for k in range(10)]


def test_sink_error_names_the_failing_row(postgres: Any) -> None:
    t = _table(postgres.dsn, "k int primary key, v text not null")
    items = [(i, "ok") for i in range(50)] + [(999, None)]
    with pytest.raises(ss.JobFailedError) as err:
        _sink_job(postgres.dsn, f"INSERT INTO {t} (k, v) VALUES (%s, %s)", items, "bad-row").join(
            60
        )
    text = str(err.value)
    assert "'db'" in text and "(999, None)" in text and "null value" in text


def test_fresh_exactly_once_run_rolls_back_leftover_prepared_transactions(postgres: Any) -> None:
    t = _table(postgres.dsn)
    gid = f"{transaction_prefix('leftover', 'db')}:0:7:deadbeef"
    with psycopg.connect(postgres.dsn, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute(f"INSERT INTO {t} VALUES (-1, 'stale')")
        c.execute(f"PREPARE TRANSACTION '{gid}'")
    _sink_job(
        postgres.dsn,
        f"INSERT INTO {t} (k, v) VALUES (%s, %s)",
        [(1, "a"), (2, "b")],
        "leftover",
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=50,
    ).join(60)
    assert sorted(_rows(postgres.dsn, f"SELECT k, v FROM {t}")) == [(1, "a"), (2, "b")]
    assert _rows(postgres.dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()") == []


def test_sink_factory_checks_arguments() -> None:
    with pytest.raises(TypeError, match="connect"):
        sinks.sql("not callable", "INSERT")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="statement"):
        sinks.sql(lambda: None, "")
    with pytest.raises(TypeError, match="query"):
        sources.sql(lambda: None, "  ")
