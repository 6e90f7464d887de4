"""A snapshot as one Arrow table and SQL over it (issue 25, "Query"): ``ss.state.read_arrow``
gives the rows of ``ss.state.read`` (row for row, in order: keyed maps column by column,
windows, sessions and offsets through the row path), typed as documented, and
``ss.state.sql`` answers aggregates exactly, with DuckDB's errors and a clear message
without DuckDB."""

from __future__ import annotations

import operator
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting, summing
from slipstream.core.errors import SnapshotError
from slipstream.state.store import DirectorySnapshotStore
from slipstream.window import session_window_def, tumbling_window_def
from store_support import run_until_snapshots

pa = pytest.importorskip("pyarrow")


def event(seq: int) -> tuple[int, int, int]:
    return (seq % 3, seq * 10 + (seq // 20) * 100, seq % 7)


@pytest.fixture(scope="module")
def job_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A job's store: a rolling sum, a tumbling window and a session window behind a
    generator (keyed maps, frames, sessions, offsets and broadcast entries)."""
    directory = str(tmp_path_factory.mktemp("query") / "store")
    p = ss.Pipeline()
    s = p.read_from(sources.generator(event, 4000.0)).with_timestamps(operator.itemgetter(1), 0)
    g = s.group_by(operator.itemgetter(0))
    g.rolling_aggregate(summing(operator.itemgetter(2))).write_to(sinks.noop())
    g.window(tumbling_window_def(1000)).aggregate(counting()).write_to(sinks.noop())
    g.window(session_window_def(50)).aggregate(counting()).write_to(sinks.noop())
    run_until_snapshots(p, "query", directory)
    return directory


def pipeline() -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items([])).group_by(operator.itemgetter(0)).rolling_aggregate(
        summing(operator.itemgetter(1))
    ).write_to(sinks.noop())
    return p


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """5,000 int keys on 3 processors, seeded with bootstrap."""
    directory = str(tmp_path_factory.mktemp("query") / "seeded")
    rows = [(k, k * 7 % 1000) for k in range(5000)]
    ss.state.bootstrap(pipeline(), "rolling_aggregate", rows, directory, parallelism=3)
    return directory


def test_read_arrow_is_read_row_for_row(job_store: str, seeded: str) -> None:
    for store in (job_store, seeded):
        ids = DirectorySnapshotStore(store).committed_ids()
        for sid in (ids[0], ids[-1]):
            for vertex in (
                None,
                *sorted({r.vertex for r in ss.state.read(store, snapshot_id=sid)}),
            ):
                rows = ss.state.read(store, vertex, sid)
                table = ss.state.read_arrow(store, vertex, sid)
                assert table.column_names == [
                    "vertex",
                    "processor",
                    "key",
                    "detail",
                    "value",
                    "kind",
                ]
                assert table.to_pylist() == ss.state.to_arrow(rows).to_pylist(), (
                    store,
                    sid,
                    vertex,
                )
    kinds = Counter(ss.state.read_arrow(job_store)["kind"].to_pylist())
    assert set(kinds) == {"keyed", "window", "session", "offset", "broadcast"}


def test_columns_are_typed_by_the_documented_rule(job_store: str, seeded: str) -> None:
    t = ss.state.read_arrow(seeded)
    assert [str(f.type) for f in t.schema] == [
        "dictionary<values=string, indices=int32, ordered=0>",
        "int64",
        "int64",
        "null",
        "int64",
        "dictionary<values=string, indices=int32, ordered=0>",
    ]
    # a whole job store: the offsets' dict values next to ints, tuple keys next to ints:
    # both columns hold every value's repr
    t = ss.state.read_arrow(job_store)
    assert (t.schema.field("key").type, t.schema.field("value").type) == (pa.string(), pa.string())
    rows = ss.state.read(job_store)
    assert t["value"].to_pylist() == [None if r.value is None else repr(r.value) for r in rows]
    # one vertex: typed; windows' details as a struct
    w = ss.state.read_arrow(job_store, "window-combine")
    assert w.schema.field("value").type == pa.int64()
    frames = [
        d["frame_end"]
        for d, k in zip(w["detail"].to_pylist(), w["kind"].to_pylist(), strict=True)
        if k == "window"
    ]
    assert frames and all(type(f) is int for f in frames)


def test_mixed_keys_of_one_vertex_are_reprs(tmp_path: Path) -> None:
    rows = [(1, 10), ("1", 20), ((1, 2), 30)]
    ss.state.bootstrap(pipeline(), "rolling_aggregate", rows, str(tmp_path / "s"))
    t = ss.state.read_arrow(str(tmp_path / "s"), "rolling_aggregate")
    assert sorted(zip(t["key"].to_pylist(), t["value"].to_pylist(), strict=True)) == [
        ("'1'", 20),
        ("(1, 2)", 30),
        ("1", 10),
    ]


def test_sql_answers_aggregates_exactly(seeded: str, job_store: str) -> None:
    pytest.importorskip("duckdb")
    got = ss.state.sql(
        seeded,
        "select count(*) as n, sum(value) as total, count(distinct processor) as p from state",
        vertex="rolling_aggregate",
    ).to_pylist()
    assert got == [{"n": 5000, "total": sum(k * 7 % 1000 for k in range(5000)), "p": 3}]
    got = ss.state.sql(
        seeded, "select key, value from state where value >= 995 order by key limit 3"
    ).to_pylist()
    assert got == [
        {"key": k, "value": v}
        for k, v in sorted((k, k * 7 % 1000) for k in range(5000) if k * 7 % 1000 >= 995)[:3]
    ]
    # a window vertex: its int keys typed in the view state (the cursor's row, a str key,
    # is in entries only); the frames' accumulators summed per key = the rows' sums
    rows = [r for r in ss.state.read(job_store, "window-combine") if r.kind == "window"]
    got = ss.state.sql(
        job_store,
        "select key, sum(value) as n from state where kind = 'window' group by key order by key",
        vertex="window-combine",
    ).to_pylist()
    want: Counter[Any] = Counter()
    for r in rows:
        want[r.key] += r.value
    assert got == [{"key": k, "n": n} for k, n in sorted(want.items())]
    assert all(type(g["key"]) is int for g in got)
    # entries: every row, the offsets too (their values as reprs: they are dicts)
    got = ss.state.sql(
        job_store, "select kind, count(*) as n from entries group by kind order by kind"
    ).to_pylist()
    kinds = Counter(r.kind for r in ss.state.read(job_store))
    assert got == [{"kind": k, "n": n} for k, n in sorted(kinds.items())]
    (offset,) = ss.state.sql(
        job_store, "select key, value from entries where kind = 'offset' and key like '%0)'"
    ).to_pylist()
    (want_offset,) = [r for r in ss.state.read(job_store, "source") if r.key == ("generator", 0)]
    assert offset == {"key": "('generator', 0)", "value": repr(want_offset.value)}
    # an older snapshot
    first = DirectorySnapshotStore(job_store).committed_ids()[0]
    (got_n,) = ss.state.sql(
        job_store, "select count(*) as n from state", snapshot_id=first
    ).to_pylist()
    old = ss.state.read(job_store, snapshot_id=first)
    assert got_n == {"n": sum(r.kind in ("keyed", "window", "session") for r in old)}


def test_sql_errors(seeded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("duckdb")
    from slipstream.state.query import SQLError

    with pytest.raises(SQLError) as e:
        ss.state.sql(seeded, "select nope from state")
    assert "\n" not in str(e.value)
    assert str(e.value).startswith('Binder Error: Referenced column "nope" not found')
    with pytest.raises(SnapshotError, match="no snapshot store at"):
        ss.state.sql(str(tmp_path / "none"), "select 1")
    monkeypatch.setitem(sys.modules, "duckdb", None)
    with pytest.raises(ImportError) as ie:
        ss.state.sql(seeded, "select 1")
    assert str(ie.value) == (
        "SQL over state needs DuckDB, which is not installed: pip install -e '.[sql]' in "
        "the slipstream checkout (or pip install duckdb)"
    )


def test_reads_leave_the_garbage_collector_as_they_found_it(seeded: str, tmp_path: Path) -> None:
    import gc

    assert gc.isenabled()
    ss.state.read(seeded)
    ss.state.read_arrow(seeded)
    assert gc.isenabled()
    with pytest.raises(ValueError, match="has no vertex 'nope'"):
        ss.state.read(seeded, "nope")
    assert gc.isenabled()
    gc.disable()
    try:
        ss.state.read(seeded)
        assert not gc.isenabled()
    finally:
        gc.enable()
