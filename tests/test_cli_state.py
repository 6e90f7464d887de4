"""``slipstream state STORE`` (issue 25, item 2): a job's state from its snapshot store as
a table, CSV, JSON lines or Parquet, one vertex, one key, an older snapshot, SQL over it
(DuckDB), and the errors with their exit status."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import operator
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting
from slipstream.state.store import DirectorySnapshotStore
from store_support import run_until_snapshots


def event(seq: int) -> tuple[str, int]:
    return ("abc"[seq % 3], seq)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store of a rolling count per key behind a generator, cancelled after 4
    committed snapshots (all retained)."""
    directory = str(tmp_path_factory.mktemp("cli-state") / "store")
    p = ss.Pipeline()
    p.read_from(sources.generator(event, 2000.0)).group_by(
        operator.itemgetter(0)
    ).rolling_aggregate(counting()).write_to(sinks.noop())
    run_until_snapshots(p, "counts", directory)
    return directory


def state(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slipstream", "state", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def state_here(*args: str) -> subprocess.CompletedProcess[str]:
    """:func:`state` in this process (``slipstream.cli.main``; no interpreter started):
    for the error paths, which print before anything is read."""
    from slipstream.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["state", *args])
        except SystemExit as e:  # argparse's own errors
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["state", *args], code, out.getvalue(), err.getvalue())


def newest(store: str) -> int:
    return DirectorySnapshotStore(store).committed_ids()[-1]


def test_jsonl_is_every_row(store: str) -> None:
    r = state(store, "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    rows = ss.state.read(store)
    got = [json.loads(line) for line in r.stdout.splitlines()]
    want = [
        {
            "vertex": row.vertex,
            "processor": row.processor,
            "kind": row.kind,
            "key": list(row.key) if type(row.key) is tuple else row.key,
            "detail": row.detail,
            "value": row.value,
        }
        for row in rows
    ]
    assert got == want
    assert {g["kind"] for g in got} == {"keyed", "offset"}
    assert r.stderr == f"snapshot {newest(store)} of {store}: {len(rows)} rows\n"


def test_one_key_of_one_vertex_as_csv(store: str) -> None:
    r = state(store, "--vertex", "rolling_aggregate", "--key", "b", "--format", "csv")
    assert r.returncode == 0, r.stderr
    (row,) = ss.state.read(store, "rolling_aggregate", key="b")
    assert r.stdout == (
        "vertex,processor,kind,key,detail,value\n"
        f"rolling_aggregate,{row.processor},keyed,'b',,{row.value}\n"
    )
    # the key matched by its repr as well
    assert (
        state_here(store, "--vertex", "rolling_aggregate", "--key", "'b'", "--format", "csv").stdout
        == r.stdout
    )
    assert list(csv.reader(io.StringIO(r.stdout)))[1][3] == "'b'"
    assert r.stderr == f"snapshot {newest(store)} of {store}, vertex 'rolling_aggregate': 1 row\n"


def test_table_of_an_older_snapshot(store: str) -> None:
    first = DirectorySnapshotStore(store).committed_ids()[0]
    r = state(store, "--snapshot", str(first))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["vertex", "processor", "kind", "key", "detail", "value"]
    rows: list[Any] = ss.state.read(store, snapshot_id=first)
    assert len(lines) == 1 + len(rows)
    for line, row in zip(lines[1:], rows, strict=True):
        assert line.startswith(f"{row.vertex}  ")
        assert line.endswith(repr(row.value))
    # the source's offset row, its detail as name=value
    assert any(
        line.split()[:4] == ["source", "0", "offset", "('generator',"] and "processor=0" in line
        for line in lines
    )
    assert r.stderr == f"snapshot {first} of {store}: {len(rows)} rows\n"


def test_errors_and_exit_status(store: str, tmp_path: Path) -> None:
    r = state_here(str(tmp_path / "none"))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"error: no snapshot store at {tmp_path / 'none'}: no such directory\n"
    r = state_here(store, "--vertex", "nope")
    assert r.returncode == 2
    assert r.stderr == (
        f"error: snapshot {newest(store)} in {store} has no vertex 'nope'; its vertices: "
        "'rolling_aggregate', 'sink', 'source'\n"
    )
    ids = DirectorySnapshotStore(store).committed_ids()
    r = state_here(store, "--snapshot", "99999")
    assert r.returncode == 1
    assert r.stderr == (
        f"error: snapshot 99999 is not retained in snapshot store {store}; retained: "
        + ", ".join(map(str, ids))
        + "\n"
    )
    r = state_here(store, "--vertex", "rolling_aggregate", "--key", "zzz")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        f"error: no entry with key 'zzz' in snapshot {newest(store)} of {store}, vertex "
        "'rolling_aggregate'\n"
    )
    r = state_here(store, "--format", "xml")
    assert r.returncode == 2 and "invalid choice: 'xml'" in r.stderr


# -- parquet and SQL (issue 25, "Query") ---------------------------------------------------
def test_parquet_output_reads_back_as_the_rows(store: str, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "state.parquet"
    r = state(store, "--format", "parquet", "--output", str(path))
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    rows = ss.state.read(store)
    assert r.stderr == f"snapshot {newest(store)} of {store}: {len(rows)} rows written to {path}\n"
    got = pq.read_table(path)
    assert got.column_names == ["vertex", "processor", "key", "detail", "value", "kind"]
    assert got.to_pylist() == ss.state.to_arrow(rows).to_pylist()
    # one vertex: its keys and counts typed (str, int64), as DuckDB or pandas read them
    path = tmp_path / "counts.parquet"
    r = state_here(store, "--vertex", "rolling_aggregate", "--format", "parquet", "-o", str(path))
    assert r.returncode == 0, r.stderr
    got = pq.read_table(path)
    assert (str(got.schema.field("key").type), str(got.schema.field("value").type)) == (
        "string",
        "int64",
    )
    want = ss.state.read(store, "rolling_aggregate")
    assert len(want) == 3  # the keys a, b and c
    assert sorted(zip(got["key"].to_pylist(), got["value"].to_pylist(), strict=True)) == sorted(
        (row.key, row.value) for row in want
    )
    # --output with a text format: the text stdout gets
    piped = subprocess.run(
        [
            sys.executable,
            "-m",
            "slipstream",
            "state",
            store,
            "-o",
            "/dev/stdout",
            "--format",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.stdout == state_here(store, "--format", "csv").stdout


def test_parquet_to_a_terminal_is_refused(store: str) -> None:
    import pty

    leader, follower = pty.openpty()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "slipstream", "state", store, "--format", "parquet"],
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert r.returncode == 2
    assert r.stderr == (
        "error: --format parquet writes a binary file: give --output PATH (or redirect "
        "stdout to a file)\n"
    )


def test_sql_answers_an_aggregate_exactly(store: str) -> None:
    pytest.importorskip("duckdb")
    rows = ss.state.read(store, "rolling_aggregate")
    r = state(
        store,
        "--vertex",
        "rolling_aggregate",
        "--sql",
        "select count(*) as n, sum(value) as total, max(value) as top from state",
        "--format",
        "csv",
    )
    assert r.returncode == 0, r.stderr
    values = [row.value for row in rows]
    assert r.stdout == f"n,total,top\n{len(values)},{sum(values)},{max(values)}\n"
    assert (
        r.stderr
        == f"snapshot {newest(store)} of {store}, vertex 'rolling_aggregate', --sql: 1 row\n"
    )
    # a group-by over every row of the store (the view entries: offsets too)
    r = state(
        store,
        "--sql",
        "select vertex, kind, count(*) as n from entries group by all order by all",
        "--format",
        "jsonl",
    )
    assert r.returncode == 0, r.stderr
    counts = Counter((row.vertex, row.kind) for row in ss.state.read(store))
    assert [json.loads(line) for line in r.stdout.splitlines()] == [
        {"vertex": v, "kind": k, "n": n} for (v, k), n in sorted(counts.items())
    ]
    # the table format, one key
    r = state_here(store, "--key", "b", "--sql", "select key, value from state")
    (b,) = ss.state.read(store, "rolling_aggregate", key="b")
    assert r.stdout.splitlines() == ["key  value", f"b    {b.value}"]


def test_bad_sql_is_duckdb_s_message_on_one_line(store: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    for query in ("selec 1", "select nope from state"):
        r = state_here(store, "--sql", query)
        assert (r.returncode, r.stdout) == (2, "")
        con = duckdb.connect()
        con.execute("create table state (vertex varchar, processor bigint, key varchar)")
        with pytest.raises(duckdb.Error) as e:
            con.sql(query)
        lines = [p.strip() for p in str(e.value).splitlines() if p.strip().strip("^")]
        assert r.stderr == f"error: the query failed: {' '.join(lines)}\n"
        assert "Traceback" not in r.stderr


def test_sql_without_duckdb_says_what_to_install(
    store: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slipstream.cli import main

    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    assert main(["state", store, "--sql", "select 1"]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "error: SQL over state needs DuckDB, which is not installed: pip install -e "
        "'.[sql]' in the slipstream checkout (or pip install duckdb)\n",
    )


def test_parquet_through_a_pipe_and_without_pyarrow(
    store: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "slipstream",
            "state",
            store,
            "--format",
            "parquet",
            "--vertex",
            "rolling_aggregate",
        ],
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    got = pq.read_table(pa.BufferReader(r.stdout))
    assert got.num_rows == 3  # the keys a, b and c
    assert (
        got.to_pylist() == ss.state.to_arrow(ss.state.read(store, "rolling_aggregate")).to_pylist()
    )
    assert (
        r.stderr.decode()
        == f"snapshot {newest(store)} of {store}, vertex 'rolling_aggregate': 3 rows\n"
    )

    from slipstream.cli import main

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    assert main(["state", store, "--format", "parquet", "-o", os.devnull]) == 1
    assert capsys.readouterr() == (
        "",
        "error: reading state as Arrow needs pyarrow, which is not installed: pip install -e "
        "'.[parquet]' in the slipstream checkout (or pip install pyarrow)\n",
    )
