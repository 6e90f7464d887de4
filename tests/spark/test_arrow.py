"""A micro-batch's rows as Arrow batches (slipstream.spark.arrow), without a JVM: the
rows the source task makes from the serialized batches are the ``Row`` s that
``DataFrame.rdd`` gives, and only plain column types take that path."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql import Row  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    _create_row,
)

from slipstream.spark import arrow  # noqa: E402

FIELDS = ("key", "count", "x y", "ratio", "small")


def _batch() -> Any:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["a", None, "c"]),
            pa.array([1, 2, None], pa.int64()),
            pa.array([True, False, None]),
            pa.array([0.1, None, 2.5], pa.float32()),
            pa.array([7, -8, 9], pa.int8()),
        ],
        list(FIELDS),
    )


def _chunks(batches: list[Any]) -> list[tuple[bytes]]:
    """What the source task receives: one ``Row`` per serialized batch."""
    return [(bytearray(b.column(0)[0].as_py()),) for b in arrow._serialize(batches)]


def test_rows_from_arrow_batches_are_the_rows_dataframe_rdd_gives() -> None:
    batch = _batch()
    got = list(arrow.arrow_rows(_chunks([batch, batch.slice(0, 0), batch]), FIELDS))
    values = [tuple(c[i].as_py() for c in batch.columns) for i in range(batch.num_rows)] * 2
    expected = [_create_row(list(FIELDS), v) for v in values]
    assert got == expected
    assert [repr(r) for r in got] == [repr(r) for r in expected]
    assert [r.asDict() for r in got] == [r.asDict() for r in expected]
    first = got[0]
    assert isinstance(first, Row)
    assert (first.key, first.ratio, first.small) == ("a", pytest.approx(0.1), 7)
    assert first["count"] == 1 and first["x y"] is True and "ratio" in first
    # a Row's own attribute still wins over a field of that name, as on a Row
    assert first.count("a") == expected[0].count("a") == 1
    back = pickle.loads(pickle.dumps(first))
    assert type(back) is Row and back == first and back.asDict() == first.asDict()
    with pytest.raises(AttributeError):
        first.missing  # noqa: B018


def test_rows_from_the_jvms_record_batch_messages_are_the_same_rows() -> None:
    """Batches the JVM made (``toArrowBatchRdd``: record batch messages without their
    schema) read with the schema the driver ships give the same rows."""
    batch = _batch()
    messages = [bytes(b.serialize()) for b in (batch, batch.slice(0, 0), batch.slice(1))]
    schema = bytes(batch.schema.serialize())
    got = list(arrow.arrow_rows(messages, FIELDS, schema))
    assert got == list(arrow.arrow_rows(_chunks([batch, batch.slice(1)]), FIELDS))
    assert len(got) == 5 and got[0].key == "a" and got[0]["count"] == 1


def test_one_columns_values_from_both_kinds_of_batches() -> None:
    """``spark_stream_source(column=)``: the column's values, no Row per row, from the
    JVM's record batch messages and from mapInArrow's streams alike."""
    batch = _batch()
    messages = [bytes(b.serialize()) for b in (batch, batch.slice(0, 0), batch.slice(1))]
    schema = bytes(batch.schema.serialize())
    expected = ["a", None, "c", None, "c"]
    assert list(arrow.arrow_column(messages, FIELDS, "key", schema)) == expected
    chunks = _chunks([batch, batch.slice(1)])
    assert list(arrow.arrow_column(chunks, FIELDS, "key")) == expected
    assert list(arrow.arrow_column(chunks, FIELDS, "small")) == [7, -8, 9, -8, 9]


def test_a_column_the_stream_does_not_have_is_named() -> None:
    from slipstream.spark.io import spark_stream_source

    class _Stream:
        isStreaming = True
        columns = ["key", "ts"]

    with pytest.raises(ValueError) as info:
        spark_stream_source(_Stream(), column="value")
    assert str(info.value) == (
        "spark_stream_source(column='value'): the stream has no such column (its columns: "
        "key, ts)"
    )
    assert spark_stream_source(_Stream(), column="ts").column == "ts"


def test_only_plain_column_types_take_the_arrow_path() -> None:
    class Frame:
        def __init__(self, *fields: StructField) -> None:
            self.schema = StructType(list(fields))

    plain = Frame(
        StructField("k", StringType()),
        StructField("n", LongType()),
        StructField("i", IntegerType()),
        StructField("f", FloatType()),
        StructField("d", DoubleType()),
    )
    assert arrow.arrow_fields(plain) == ("k", "n", "i", "f", "d")
    assert (
        arrow.arrow_fields(Frame(StructField("k", StringType()), StructField("t", TimestampType())))
        is None
    )
    assert arrow.arrow_fields(Frame(StructField("b", BinaryType()))) is None
    assert arrow.arrow_fields(Frame()) is None
    assert (
        arrow.arrow_fields(Frame(StructField("k", StringType()), StructField("k", LongType())))
        is None
    )
    assert arrow.arrow_fields(object()) is None  # an RDD, a test double


class _JvmFrame:
    """Stands in for a DataFrame's JVM side as ``arrow._batch_rdd`` uses it: records the
    session's ``maxRecordsPerBatch`` when the batch RDD is built."""

    def __init__(self, columns: int, settings: dict[str, str]) -> None:
        self.schema = StructType([StructField(f"c{i}", StringType()) for i in range(columns)])
        self.settings = settings
        self.built_with: list[str | None] = []
        self._jdf = self

    # the JVM Dataset, its session, session state and SQLConf, all in one
    def sparkSession(self) -> Any:  # noqa: N802
        return self

    def sessionState(self) -> Any:  # noqa: N802
        return self

    def conf(self) -> Any:
        return self

    def contains(self, key: str) -> bool:
        return key in self.settings

    def setConfString(self, key: str, value: str) -> None:  # noqa: N802
        self.settings[key] = value

    def unsetConf(self, key: str) -> None:  # noqa: N802
        del self.settings[key]

    def toArrowBatchRdd(self) -> Any:  # noqa: N802
        self.built_with.append(self.settings.get("spark.sql.execution.arrow.maxRecordsPerBatch"))
        return self

    def toJavaRDD(self) -> Any:  # noqa: N802
        return "jrdd"


def test_the_jvm_makes_batches_of_50000_values_unless_the_session_sets_a_size() -> None:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    one = _JvmFrame(1, {})
    assert arrow._batch_rdd(one) == "jrdd"
    assert one.built_with == ["50000"] and one.settings == {}  # set for the call only
    two = _JvmFrame(2, {})
    arrow._batch_rdd(two)
    assert two.built_with == ["25000"] and two.settings == {}
    wide = _JvmFrame(8, {})  # 6,250 rows: Spark's own 10,000
    arrow._batch_rdd(wide)
    assert wide.built_with == [None] and wide.settings == {}
    mine = _JvmFrame(1, {key: "777"})
    arrow._batch_rdd(mine)
    assert mine.built_with == ["777"] and mine.settings == {key: "777"}


def test_the_arrow_path_is_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert arrow.arrow_enabled()
    monkeypatch.setenv("SLIPSTREAM_SPARK_ARROW", "0")
    assert not arrow.arrow_enabled()
    assert arrow.arrow_partitions(object(), 2) is None


def _row_dag(df: Any) -> Any:
    """stream source (each Row as it is) -> one list sink 'rows'."""
    from slipstream import DAG, Edge, sinks
    from slipstream.spark.io import spark_stream_source

    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(df))
    out = dag.new_vertex("sink", sinks.list_sink("rows")).local_parallelism(1)
    dag.edge(Edge.between(src, out).distributed().all_to_one())
    return dag


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("schema", "arrow_sources"),
    [("key string, n long, count long, ok boolean", ["source"]), ("key string, t timestamp", [])],
)
def test_a_streaming_job_gets_the_rows_spark_reads(
    spark_session: Any, tmp_path: Any, schema: str, arrow_sources: list[str]
) -> None:
    """Each one-file micro-batch (one partition, for a source of 2 processors) reaches
    the source as the Rows a batch read of the same files gives: through Arrow batches
    for plain columns, pickled rows for a timestamp column. The Arrow batches are read
    by the first source processor in the read's own stage, not spread over both by a
    shuffle of their own: an epoch is 2 stages (read and source, then the sink)."""
    import json
    import os

    import slipstream as ss

    directory = tmp_path / "in"
    directory.mkdir()
    for i in range(2):
        lines = [
            {"key": f"k{j}", "n": i * 100 + j, "count": None if j == 3 else j, "ok": j % 2 == 0}
            | {"t": "2026-11-26T03:00:00"}
            for j in range(40)
        ]
        tmp = directory / f".tmp-{i}"
        tmp.write_text("\n".join(json.dumps(line) for line in lines))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))
        tmp.rename(directory / f"part-{i}.json")
    expected = spark_session.read.schema(schema).json(str(directory)).collect()
    df = (
        spark_session.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(directory))
    )
    engine = ss.spark(spark_session)
    job = engine.new_job(
        _row_dag(df),
        ss.JobConfig(name=f"arrow-{len(arrow_sources)}"),
        checkpoint_location=str(tmp_path / "checkpoint"),
        trigger={"availableNow": True},
    )
    job.join(300)
    assert job.status is ss.JobStatus.COMPLETED
    got = sorted(engine.get_list("rows"), key=repr)
    expected.sort(key=repr)
    assert got == expected
    assert [r.asDict() for r in got] == [e.asDict() for e in expected]
    assert job.epochs_committed == 2
    assert [e["arrow_sources"] for e in job.epoch_breakdown] == [arrow_sources] * 2
    if arrow_sources:  # (the first epoch's count may include the one pyarrow probe job)
        assert job.epoch_breakdown[1]["spark_stages"] == 2
