"""The file sources and sinks on the Spark engine: the same DAG reads CSV, JSON lines
and Parquet and writes them back on both engines, inside Spark tasks through the same
processors; the outputs must be the same multiset of records (and the same part
files, since the split of files and items over processors is the same)."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LP = 2


def chain(src: Any, fn: Callable[[Any], Any], sink: Any) -> DAG:
    dag = DAG()
    s = dag.new_vertex("read", src)
    m = dag.new_vertex("convert", P.map(fn))
    k = dag.new_vertex("write", sink)
    dag.edge(Edge.between(s, m).isolated()).edge(Edge.between(m, k).isolated())
    return dag


def typed(row: dict[str, str]) -> dict[str, Any]:
    return {"id": int(row["id"]), "word": row["word"], "half": int(row["id"]) / 2}


def read_back(d: Path, read: Any) -> Counter[str]:
    engine = ss.local()
    dag = DAG()
    s = dag.new_vertex("s", read(d))
    k = dag.new_vertex("k", sinks.list_sink("x"))
    dag.edge(Edge.between(s, k))
    engine.new_job(dag).join(60)
    return Counter(map(repr, engine.get_list("x")))


def test_csv_jsonl_parquet_same_output_on_both_engines(spark_session: Any, tmp_path: Path) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    for f in range(3):
        with open(inp / f"{f}.csv", "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "word"])
            w.writerows([str(i), f"wörd,{i % 5}"] for i in range(f * 100, f * 100 + 100))
    pq.write_table(
        pa.Table.from_pylist([{"id": i, "tag": f"t{i % 3}"} for i in range(250)]),
        inp / "p.parquet",
        row_group_size=64,
    )
    engines = {
        "local": ss.local(cooperative_threads=LP),
        "spark": ss.spark(spark_session, local_parallelism=LP),
    }
    for name, engine in engines.items():
        out = tmp_path / name
        engine.new_job(chain(sources.read_csv(inp), typed, sinks.write_jsonl(out / "jsonl"))).join(
            180
        )
        engine.new_job(
            chain(sources.read_parquet(inp), dict, sinks.write_parquet(out / "parquet"))
        ).join(180)
        engine.new_job(
            chain(sources.read_jsonl(out / "jsonl"), dict, sinks.write_csv(out / "csv"))
        ).join(180)
    oracle_rows = [typed({"id": str(i), "word": f"wörd,{i % 5}"}) for i in range(300)]
    for fmt, read in (
        ("jsonl", sources.read_jsonl),
        ("parquet", sources.read_parquet),
        ("csv", sources.read_csv),
    ):
        local, spark = (
            read_back(tmp_path / "local" / fmt, read),
            read_back(tmp_path / "spark" / fmt, read),
        )
        assert local == spark, fmt
        names = sorted(p.name for p in (tmp_path / "spark" / fmt).iterdir())
        assert names == sorted(p.name for p in (tmp_path / "local" / fmt).iterdir())
        assert not [n for n in names if n.startswith(".")], "temporary files left behind"
    assert read_back(tmp_path / "spark" / "jsonl", sources.read_jsonl) == Counter(
        map(repr, oracle_rows)
    )
    assert sum(read_back(tmp_path / "spark" / "parquet", sources.read_parquet).values()) == 250


def test_a_glob_matching_no_file_fails_on_spark_too(spark_session: Any, tmp_path: Path) -> None:
    """Issue 21, item 6: the same error as on the embedded engine (the same processor)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.CSV").write_text("id,word\n1,a\n")
    engine = ss.spark(spark_session, local_parallelism=LP)
    dag = chain(sources.read_csv(tmp_path / "in"), typed, sinks.list_sink("never"))
    with pytest.raises(ss.JobFailedError) as info:
        engine.new_job(dag).join(120)
    assert (
        f"read_csv (vertex 'read'): no file in '{tmp_path / 'in'}' matches glob '*.csv'; the "
        "directory holds data.CSV (globs are case-sensitive: glob='*.CSV' matches data.CSV)"
    ) in str(info.value)
    # and a glob written into the directory argument reads the files it names
    engine.new_job(
        chain(sources.read_csv(f"{tmp_path / 'in'}/*.CSV"), typed, sinks.list_sink("csv"))
    ).join(120)
    assert engine.get_list("csv") == [{"id": 1, "word": "a", "half": 0.5}]
