"""Named tuples and dataclasses written by the file sinks: their fields are the columns
(issue 21, item 8: a ``KeyedWindowResult`` written to Parquet became ``f0..f3``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import operator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow.parquet as pq
import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import summing
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.window import KeyedWindowResult, WindowResult, tumbling_window_def


class Trade(NamedTuple):
    symbol: str
    price: float


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Order:
    id: int
    item: str


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    symbol: str
    qty: int


def write(factory: Any, tmp: Path, items: list[Any], **kw: Any) -> Path:
    proc = factory(tmp, **kw)()
    proc.init(Outbox(0, 1), Context(vertex_name="out"))
    proc.process(0, Inbox(items))
    assert proc.complete()
    proc.close()
    (part,) = [p for p in tmp.iterdir() if not p.name.startswith(".")]
    return part


def test_record_fields_of_named_tuples_and_dataclasses() -> None:
    from slipstream.core.records import as_record, record_fields

    assert record_fields(KeyedWindowResult) == ("start", "end", "key", "value")
    assert record_fields(WindowResult) == ("start", "end", "value")
    assert record_fields(Point) == ("x", "y")
    assert record_fields(Tick) == ("symbol", "qty")
    for plain in (tuple, list, dict, int, str, type):
        assert record_fields(plain) is None
    assert as_record(Order(1, "a")) == {"id": 1, "item": "a"}
    assert as_record(Tick("X", 3)) == {"symbol": "X", "qty": 3}
    assert as_record((1, 2)) is None and as_record(Order) is None


def test_parquet_columns_are_the_fields(tmp_path: Path) -> None:
    cases: list[tuple[list[Any], list[str]]] = [
        ([KeyedWindowResult(0, 1000, "a", 5), KeyedWindowResult(0, 1000, "b", 7)],
         ["start", "end", "key", "value"]),
        ([WindowResult(0, 10, 2.5)], ["start", "end", "value"]),
        ([Trade("X", 1.5)], ["symbol", "price"]),
        ([Point(1, 2)], ["x", "y"]),
        ([Order(1, "pen")], ["id", "item"]),
        ([Tick("Y", 4)], ["symbol", "qty"]),
        ([(1, "plain")], ["f0", "f1"]),  # plain tuples keep positional names
    ]
    for i, (items, columns) in enumerate(cases):
        part = write(sinks.write_parquet, tmp_path / str(i), items)
        table = pq.read_table(part)
        assert table.column_names == columns
        assert table.to_pylist() == [dict(zip(columns, it if isinstance(it, tuple) else
                                                 dataclasses.astuple(it), strict=True))
                                     for it in items]


def test_csv_header_is_the_fields(tmp_path: Path) -> None:
    # a record of other fields than the file's columns fails naming it, like a dict
    with pytest.raises(ValueError, match=r"item Order\(id=2, item='x'\) does not have the "
                       r"file's columns \['start', 'end', 'key', 'value'\]"):
        write(sinks.write_csv, tmp_path / "bad", [KeyedWindowResult(0, 1000, "a", 5), Order(2, "x")])
    part = write(sinks.write_csv, tmp_path / "k2", [KeyedWindowResult(0, 1000, "a", 5),
                                                    {"key": "b", "value": 6, "start": 0, "end": 1000}])
    assert part.read_text(encoding="utf-8") == "start,end,key,value\n0,1000,a,5\n0,1000,b,6\n"
    part = write(sinks.write_csv, tmp_path / "d", [Tick("Y", 4), Tick("Z", 5)])
    assert part.read_text(encoding="utf-8") == "symbol,qty\nY,4\nZ,5\n"
    part = write(sinks.write_csv, tmp_path / "h", [Trade("X", 1.5)], header=["price", "symbol"])
    assert part.read_text(encoding="utf-8") == "price,symbol\n1.5,X\n"
    part = write(sinks.write_csv, tmp_path / "n", [Point(1, 2)], header=False)
    assert part.read_text(encoding="utf-8") == "1,2\n"
    part = write(sinks.write_csv, tmp_path / "t", [(1, 2), Point(3, 4)])  # rows first: no header
    assert part.read_text(encoding="utf-8") == "1,2\n3,4\n"


def test_jsonl_objects_are_the_fields(tmp_path: Path) -> None:
    part = write(sinks.write_jsonl, tmp_path / "j", [WindowResult(0, 10, 3), Order(1, "ü"), (1, 2)])
    assert [json.loads(line) for line in part.read_text(encoding="utf-8").splitlines()] == [
        {"start": 0, "end": 10, "value": 3},
        {"id": 1, "item": "ü"},
        [1, 2],
    ]


def test_windowed_pipeline_to_parquet_has_named_columns(tmp_path: Path) -> None:
    """The issue's case end to end: a window's results written to Parquet and read
    back by name."""
    events = [(k, t, 1) for t in range(0, 3000, 10) for k in ("a", "b")]
    p = ss.Pipeline()
    p.read_from(sources.items(events)).with_timestamps(operator.itemgetter(1), 0).group_by(
        operator.itemgetter(0)
    ).window(tumbling_window_def(1000)).aggregate(summing(operator.itemgetter(2))).write_to(
        sinks.write_parquet(tmp_path / "out")
    )
    ss.local().new_job(p).join(60)
    rows = pq.read_table(tmp_path / "out").to_pylist()
    assert sorted(rows, key=lambda r: (r["start"], r["key"])) == [
        {"start": s, "end": s + 1000, "key": k, "value": 100}
        for s in (0, 1000, 2000)
        for k in ("a", "b")
    ]
