"""Named tuples and dataclasses written on the Spark engine get the columns they get on
the embedded engine: their fields, in order (issue 21, item 8). Differential: the same
windowed pipeline writes Parquet through ``write_parquet`` on both engines and through
Spark's own writer (``spark_dataframe_sink(path=, format="parquet")``)."""

from __future__ import annotations

import dataclasses
import operator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import summing
from slipstream.spark.io import spark_dataframe_sink
from slipstream.window import tumbling_window_def

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENTS = [(k, t, 1) for t in range(0, 3000, 10) for k in ("a", "b")]
COLUMNS = ["start", "end", "key", "value"]


def windowed(sink: Any) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items(EVENTS)).with_timestamps(operator.itemgetter(1), 0).group_by(
        operator.itemgetter(0)
    ).window(tumbling_window_def(1000)).aggregate(summing(operator.itemgetter(2))).write_to(sink)
    return p


def read(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    table = pq.read_table(path)
    rows = sorted(table.to_pylist(), key=lambda r: (r["start"], r["key"]))
    return table.column_names, rows


@dataclasses.dataclass(frozen=True, slots=True)
class Total:
    key: str
    total: int


def test_window_results_have_named_columns_on_both_engines(
    spark_session: Any, tmp_path: Path
) -> None:
    ss.local().new_job(windowed(sinks.write_parquet(tmp_path / "embedded"))).join(60)
    spark = ss.spark(spark_session)
    spark.new_job(windowed(sinks.write_parquet(tmp_path / "spark"))).join(300)
    spark.new_job(
        windowed(spark_dataframe_sink("w", path=str(tmp_path / "writer"), format="parquet"))
    ).join(300)
    expected = [
        {"start": s, "end": s + 1000, "key": k, "value": 100} for s in (0, 1000, 2000) for k in "ab"
    ]
    for out in ("embedded", "spark", "writer"):
        assert read(tmp_path / out) == (COLUMNS, expected), out
    assert spark.get_dataframe("w").columns == COLUMNS


def test_dataframe_sink_infers_dataclass_and_dict_columns_in_field_order(
    spark_session: Any,
) -> None:
    items = [Total("x", 1), Total("y", 2)]
    dicts = [{"zeta": 1, "alpha": "a"}]
    p = ss.Pipeline()
    p.read_from(sources.items(items)).write_to(spark_dataframe_sink("totals"))
    p.read_from(sources.items(dicts)).write_to(spark_dataframe_sink("dicts"))
    spark = ss.spark(spark_session)
    spark.new_job(p).join(300)
    df = spark.get_dataframe("totals")
    assert df.columns == ["key", "total"]
    assert sorted(map(tuple, df.collect())) == [("x", 1), ("y", 2)]
    assert spark.get_dataframe("dicts").columns == ["zeta", "alpha"]  # Spark alone sorts them
