"""A one-file micro-batch of a source that reads one column is read in byte ranges by
every source processor (slipstream.spark.file_splits): each line reaches the job exactly
once, whichever split its bytes fall in, both source processors read a share of a
splittable file, and a file its format cannot split (gzip) is read whole by one. A
``map_fn`` that only reads one field of its row makes the source read that column
(``SparkStreamSource.items``)."""

from __future__ import annotations

import gzip
import operator
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from slipstream.spark.file_splits import _cuts
from slipstream.spark.io import field_read_by, spark_stream_source


def _value_of(row: Any) -> Any:
    return row.value


def _pair(row: Any) -> Any:
    return (row.value, 1)


def _twice(row: Any) -> Any:
    return row.value.value


def _nested(row: Any) -> Any:
    return row.a.b


def _two(row: Any, other: Any = None) -> Any:
    return row.value


def _varargs(*rows: Any) -> Any:
    return rows[0].value


def _gen(row: Any) -> Any:
    yield row.value


@pytest.mark.parametrize(
    ("fn", "field"),
    [
        (_value_of, "value"),
        (lambda r: r.key, "key"),
        (operator.attrgetter("value"), "value"),
        (operator.attrgetter("a.b"), None),
        (operator.attrgetter("a", "b"), None),
        (_pair, None),
        (_twice, None),
        (_nested, None),
        (_two, None),
        (_varargs, None),
        (_gen, None),
        (str.upper, None),
        (operator.itemgetter("value"), None),
    ],
)
def test_a_map_fn_that_only_reads_one_field_is_told(fn: Any, field: str | None) -> None:
    assert field_read_by(fn) == field


class _FakeStream:
    isStreaming = True
    columns = ["value", "count", "n"]


def test_the_source_reads_the_column_a_field_getter_reads() -> None:
    assert spark_stream_source(_FakeStream(), _value_of).items() == ("value", None)
    assert spark_stream_source(_FakeStream(), lambda r: r.n).items() == ("n", None)
    # a Row's own attribute wins over a field named so: row.count is the tuple method
    count = operator.attrgetter("count")
    assert spark_stream_source(_FakeStream(), count).items() == (None, count)
    # a field the stream does not have: the map_fn runs (and fails as it would)
    other = spark_stream_source(_FakeStream(), lambda r: r.other)
    assert other.items()[0] is None
    assert spark_stream_source(_FakeStream(), _pair).items() == (None, _pair)
    assert spark_stream_source(_FakeStream(), column="n").items() == ("n", None)
    assert spark_stream_source(_FakeStream()).items() == (None, None)


def test_the_cuts_cover_every_byte_once_in_about_equal_parts() -> None:
    sizes = [(1000, True), (10, False), (501, True)]
    parts = _cuts(sizes, 3)
    assert len(parts) == 3
    for i, (length, _) in enumerate(sizes):
        pieces = sorted((off, n) for p in parts for (j, off, n) in p if j == i)
        assert pieces[0][0] == 0
        assert all(a + n == b for (a, n), (b, _) in zip(pieces, pieces[1:], strict=False))
        assert sum(n for _, n in pieces) == length
    assert [sum(n for _, _, n in p) for p in parts] == [504, 506, 501]
    # a file that is not splittable stays whole, in the part where it starts
    assert [p for p in parts if any(j == 1 for j, _, _ in p)] == [[(0, 504, 496), (1, 0, 10)]]


def test_one_file_not_splittable_is_one_part() -> None:
    assert _cuts([(100, False)], 2) == [[(0, 0, 100)], []]


def _lines(i: int) -> list[str]:
    # lines of different lengths, so the byte cut falls inside a line
    return [f"f{i}-line-{j}-" + "x" * (j % 17) for j in range(3000)]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_one_file_micro_batch_is_read_by_both_source_processors(
    spark_session: Any, tmp_path: Path
) -> None:
    import slipstream as ss
    from slipstream import DAG, Edge, sinks
    from slipstream.spark.io import spark_stream_source

    directory = tmp_path / "in"
    directory.mkdir()
    for i in range(3):
        tmp = tmp_path / f".tmp-{i}"
        text = "\n".join(_lines(i))
        if i == 2:  # gzip: Spark cannot split it
            tmp.write_bytes(gzip.compress(text.encode()))
        else:
            tmp.write_text(text)
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # read oldest first
        tmp.rename(directory / (f"part-{i}.txt" + (".gz" if i == 2 else "")))
    df = spark_session.readStream.option("maxFilesPerTrigger", 1).text(str(directory))
    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(df, _value))
    out = dag.new_vertex("sink", sinks.list_sink("split-lines")).local_parallelism(1)
    dag.edge(Edge.between(src, out).distributed().all_to_one())
    engine = ss.spark(spark_session)
    job = engine.new_job(
        dag,
        ss.JobConfig(name="file-splits"),
        checkpoint_location=str(tmp_path / "checkpoint"),
        trigger={"availableNow": True},
    )
    job.join(300)
    assert job.status is ss.JobStatus.COMPLETED
    expected = Counter(line for i in range(3) for line in _lines(i))
    assert Counter(engine.get_list("split-lines")) == expected  # each line exactly once
    per_epoch = [
        sorted(t["items_out"] for t in e["task"] if t["vertex"] == "source")
        for e in job.epoch_breakdown
    ]
    assert len(per_epoch) == 3
    for shares in per_epoch[:2]:  # the plain files: both processors read a share
        assert sum(shares) == 3000
        assert min(shares) > 1000
    assert per_epoch[2] == [0, 3000]  # the gzip file: read whole by one


def _value(row: Any) -> str:
    return row.value  # type: ignore[no-any-return]


@pytest.mark.spark
@pytest.mark.slow
def test_only_a_file_stream_with_row_wise_operators_is_cut(
    spark_session: Any, tmp_path: Path
) -> None:
    """An aggregate Spark may plan without an exchange over a one-partition read, so a
    stream with one is never cut; projections and filters keep each row where it is."""
    from pyspark.sql import functions as F  # noqa: N812

    from slipstream.spark.file_splits import _find_file_format

    (tmp_path / "in").mkdir()
    df = spark_session.readStream.text(str(tmp_path / "in"))
    found = _find_file_format(df.select(F.upper("value").alias("v")).where("v != ''"))
    assert found is not None
    assert found[0].getClass().getSimpleName() == "TextFileFormat"
    assert _find_file_format(df.groupBy("value").count()) is None
    assert _find_file_format(df.union(df)) is None
    assert _find_file_format(spark_session.readStream.format("rate").load()) is None


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cut_micro_batch_keeps_its_rows_and_says_when_a_part_is_one_batch(
    spark_session: Any, tmp_path: Path
) -> None:
    """``split_file_scan`` on the micro-batch ``foreachBatch`` gets: a small text file
    is cut in two parts (each small text: one Arrow batch each), a gzip file is not, and
    the cut batch has the same rows as the file."""
    from slipstream.spark.file_splits import split_file_scan

    directory = tmp_path / "in"
    directory.mkdir()
    text = "\n".join(_lines(0))
    (tmp_path / ".a").write_text(text)
    os.utime(tmp_path / ".a", (1_700_000_000, 1_700_000_000))
    (tmp_path / ".a").rename(directory / "a.txt")
    (tmp_path / ".b").write_bytes(gzip.compress(text.encode()))
    os.utime(tmp_path / ".b", (1_700_000_001, 1_700_000_001))
    (tmp_path / ".b").rename(directory / "b.txt.gz")
    df = spark_session.readStream.option("maxFilesPerTrigger", 1).text(str(directory))
    seen: list[Any] = []

    def batch(b: Any, _epoch: int) -> None:
        cut = split_file_scan(b, df, 2)
        seen.append((cut, b.rdd.getNumPartitions(), sorted(r.value for r in b.collect())))

    query = (
        df.writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert [(cut, parts) for cut, parts, _ in seen] == [((True, True), 2), ((False, False), 1)]
    assert seen[0][2] == seen[1][2] == sorted(_lines(0))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_micro_batch_is_read_through_its_own_plan(spark_session: Any, tmp_path: Path) -> None:
    """``micro_batch_plan`` gives the plan ``foreachBatch``'s rows came from: the Arrow
    batches made from it hold the file's lines once each, in the two parts
    ``split_file_scan`` cut, with no scan of the micro-batch's RDD under them (no copy
    of each row through ``SQLExecutionRDD``), and the query's progress still counts the
    rows read (the plan's own metrics)."""
    from slipstream.spark.arrow import _jvm_batches, arrow_column
    from slipstream.spark.file_splits import micro_batch_plan, split_file_scan

    directory = tmp_path / "in"
    directory.mkdir()
    (tmp_path / ".a").write_text("\n".join(_lines(0)))
    (tmp_path / ".a").rename(directory / "a.txt")
    df = spark_session.readStream.option("maxFilesPerTrigger", 1).text(str(directory))
    seen: list[Any] = []

    def batch(b: Any, epoch: int) -> None:
        query = next(q for q in spark_session.streams.active if q.name == "own-plan")
        plan = micro_batch_plan(query, epoch, df)
        cut = split_file_scan(b, df, 2)
        made = _jvm_batches(b, 2, True, cut[1], plan)
        assert made is not None
        rdd, schema = made
        values = list(arrow_column(rdd.collect(), ("value",), "value", schema))
        seen.append((plan is not None, cut, rdd._jrdd.toDebugString(), values))

    query = (
        df.writeStream.queryName("own-plan")
        .foreachBatch(batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert len(seen) == 1
    planned, cut, lineage, values = seen[0]
    assert planned
    assert cut == (True, True)
    assert "FileScanRDD" in lineage
    assert "SQLExecutionRDD" not in lineage
    assert sorted(values) == sorted(_lines(0))
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert rows == [3000]
