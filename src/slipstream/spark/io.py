"""Spark data as slipstream sources and sinks.

* :func:`spark_dataframe_source` / :func:`spark_rdd_source`: a source vertex fed by a
  DataFrame's (or RDD's) partitions. On the Spark engine the Spark data itself becomes
  the vertex's input, brought to the vertex's total parallelism (``coalesce`` when it
  has more partitions, ``repartition`` when fewer), and processor ``i`` emits the rows of
  partition ``i``. On the embedded engine processor ``i`` fetches partitions
  ``i, i + n, ...`` to the driver with ``SparkContext.runJob``, so the same DAG runs on
  both engines (it needs the DataFrame's session alive).
* :func:`spark_dataframe_sink`: a sink keeping its items as a DataFrame. On the Spark
  engine the rows stay on the executors (a persisted RDD) and
  ``engine.get_dataframe(name)`` wraps them with ``createDataFrame``; on the embedded
  engine the items land in the named list (``engine.get_list(name)``). Given a ``path``
  or a ``table`` it also writes them through any Spark writer format
  (:func:`write_rows`): once at the end of a batch job, once per epoch of a streaming
  job (each epoch into its own ``slipstream_epoch=<id>`` partition, overwritten if the
  epoch is replayed, so no epoch is ever written twice).

A DataFrame or RDD holds a handle on the JVM and cannot be pickled; the source's
meta-supplier drops it when pickled (the DAG's pickle check still passes) and only the
driver that built the DAG can run it.

Nothing here imports pyspark at module import time.
"""

from __future__ import annotations

import dis
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.records import as_record
from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
)
from slipstream.core.traits import BOUNDED, SINK

__all__ = [
    "SparkRowSource",
    "SparkDataFrameSink",
    "SparkStreamSource",
    "spark_dataframe_source",
    "spark_stream_source",
    "spark_rdd_source",
    "spark_dataframe_sink",
    "EPOCH_COLUMN",
    "write_rows",
    "named_row",
    "spark_rows",
]

#: The partition column a streaming job's writing DataFrame sink adds: the epoch id.
EPOCH_COLUMN = "slipstream_epoch"


def _whole_partition(rows: Iterator[Any]) -> Iterator[Any]:
    return rows


class _DriverRowReaderP(AbstractProcessor):
    """Embedded-engine reader: fetches its share of the partitions to the driver.

    Non-cooperative: each ``runJob`` blocks until Spark returns the partition.
    """

    def __init__(self, source: SparkRowSource) -> None:
        self._source = source
        self._it: Iterator[Any] | None = None

    def is_cooperative(self) -> bool:
        return False

    def init_processor(self, context: Context) -> None:
        rdd = self._source.spark_rdd()
        mine = range(
            context.global_processor_index, rdd.getNumPartitions(), context.total_parallelism
        )
        map_fn = self._source.map_fn

        def rows() -> Iterator[Any]:
            for p in mine:
                part = rdd.context.runJob(rdd, _whole_partition, [p])
                yield from part if map_fn is None else map(map_fn, part)

        self._it = rows()

    def complete(self) -> bool:
        assert self._it is not None
        return self.emit_from(self._it)


class _DriverRowSupplier(ProcessorSupplier):
    def __init__(self, source: SparkRowSource) -> None:
        self.source = source

    def get(self, count: int) -> list[Any]:
        return [_DriverRowReaderP(self.source) for _ in range(count)]


class SparkRowSource(ProcessorMetaSupplier):
    """Meta-supplier of a source vertex reading a DataFrame or an RDD (see module doc)."""

    #: a DataFrame or RDD ends (a job whose every source is bounded is a batch job)
    slipstream_traits = frozenset({BOUNDED})

    def __init__(self, data: Any, map_fn: Callable[[Any], Any] | None, kind: str) -> None:
        if map_fn is not None and not callable(map_fn):
            raise TypeError(f"map_fn must be callable, got {type(map_fn).__name__}")
        self._data: Any = data
        self.map_fn = map_fn
        self.kind = kind

    def spark_rdd(self) -> Any:
        """The RDD behind the source (``df.rdd`` for a DataFrame)."""
        if self._data is None:
            raise RuntimeError(
                f"this spark_{self.kind}_source was pickled and lost its {self.kind}: a "
                "Spark DataFrame/RDD source runs only in the driver process that built the DAG"
            )
        return self._data.rdd if self.kind == "dataframe" else self._data

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        supplier = _DriverRowSupplier(self)
        return lambda _address: supplier

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_data"] = None  # a JVM handle: never shipped
        return state

    def __repr__(self) -> str:
        return f"spark_{self.kind}_source()"


class SparkStreamSource(SparkRowSource):
    """Meta-supplier of a source vertex fed by a *streaming* DataFrame: each micro-batch's
    rows feed the source processors of that epoch (Spark engine only)."""

    slipstream_traits: frozenset[str] = frozenset()  # a stream never ends

    def __init__(
        self, df: Any, map_fn: Callable[[Any], Any] | None, column: str | None = None
    ) -> None:
        super().__init__(df, map_fn, "stream")
        #: the items are this column's values, not Rows (``spark_stream_source(column=)``)
        self.column = column

    @property
    def streaming_df(self) -> Any:
        if self._data is None:
            raise RuntimeError(
                "this spark_stream_source was pickled and lost its DataFrame: it runs only "
                "in the driver process that built the DAG"
            )
        return self._data

    def spark_rdd(self) -> Any:
        raise RuntimeError("a streaming DataFrame has no RDD; its micro-batches do")

    def items(self) -> tuple[str | None, Callable[[Any], Any] | None]:
        """What the source's items are made of, as ``(column, map_fn)``: ``column=``
        and ``map_fn`` as given, except that a ``map_fn`` that only reads one field of
        its row (``lambda row: row.value``, ``operator.attrgetter("value")``: see
        :func:`field_read_by`) becomes ``(that column, None)``: the column's values are
        what it returns, read without a ``Row`` made per row (docs/spark.md)."""
        if self.column is not None or self.map_fn is None:
            return self.column, self.map_fn
        known = self.__dict__.get("_items")
        if known is None:
            name = field_read_by(self.map_fn)
            columns = list(getattr(self._data, "columns", None) or []) if name else []
            if name is not None and name in columns and _plain_field(name):
                known = (name, None)
            else:
                known = (None, self.map_fn)
            self._items = known
        return known  # type: ignore[no-any-return]

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        raise RuntimeError(
            "spark_stream_source runs only on the Spark engine (ss.spark(...)): the embedded "
            "engine cannot read a Spark streaming DataFrame"
        )


#: instructions that do nothing a field read's result depends on
_NO_OPS = frozenset({"RESUME", "NOP", "CACHE", "EXTENDED_ARG"})


def field_read_by(fn: Any) -> str | None:
    """The attribute name if ``fn(row)`` is exactly ``row.<name>`` and nothing else: a
    plain function of one argument whose code loads it, reads one attribute and
    returns it, or an ``operator.attrgetter`` of one plain name; else ``None``."""
    import operator
    import types

    if isinstance(fn, operator.attrgetter):
        text = repr(fn)  # operator.attrgetter('value'): it has no public fields
        prefix, suffix = "operator.attrgetter('", "')"
        if text.startswith(prefix) and text.endswith(suffix):
            name = text[len(prefix) : -len(suffix)]
            return name if name.isidentifier() else None
        return None
    if not isinstance(fn, types.FunctionType):
        return None
    code = fn.__code__
    if (
        code.co_argcount != 1
        or code.co_kwonlyargcount
        or code.co_flags & (0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200)  # *args, **kw, generators
    ):
        return None
    ops = [i for i in dis.get_instructions(code) if i.opname not in _NO_OPS]
    if len(ops) != 3:
        return None
    load, attr, ret = ops
    if not (load.opname in ("LOAD_FAST", "LOAD_FAST_BORROW") and load.argval == code.co_varnames[0]):
        return None
    if attr.opname != "LOAD_ATTR" or not isinstance(attr.argval, str):
        return None
    return attr.argval if ret.opname == "RETURN_VALUE" else None


def _plain_field(name: str) -> bool:
    """Whether ``row.<name>`` is the field ``name`` on every ``Row`` (a ``Row``'s own
    attribute, such as ``count`` or ``index``, wins over a field of that name)."""
    from pyspark.sql import Row

    return name.isidentifier() and not name.startswith("__") and not hasattr(Row, name)


def spark_stream_source(
    df: Any, map_fn: Callable[[Any], Any] | None = None, *, column: str | None = None
) -> SparkStreamSource:
    """A source vertex fed by a streaming DataFrame (``spark.readStream...``): the DAG then
    runs as a Structured Streaming query, one epoch per micro-batch, with processor state
    carried from epoch to epoch (see :mod:`slipstream.spark.streaming`). ``map_fn``
    converts each ``Row`` first.

    ``column="name"``: the items are that column's values instead of ``Row`` s (``map_fn``,
    if given, then converts each value). Where the micro-batch comes as Arrow batches
    (docs/spark.md) the values are read straight from the column, with no ``Row`` made
    per row: a quarter of the Python time of ``lambda row: row.name`` in a measurement
    of 250,000 rows (docs/performance.md)."""
    if not getattr(df, "isStreaming", False):
        raise TypeError(
            "spark_stream_source needs a streaming DataFrame (spark.readStream...); for a "
            "static one use spark_dataframe_source"
        )
    if column is not None:
        columns = list(getattr(df, "columns", None) or [])
        if column not in columns:
            raise ValueError(
                f"spark_stream_source(column={column!r}): the stream has no such column "
                f"(its columns: {', '.join(columns) or 'none'})"
            )
    return SparkStreamSource(df, map_fn, column)


def spark_dataframe_source(df: Any, map_fn: Callable[[Any], Any] | None = None) -> SparkRowSource:
    """A source vertex emitting the rows (``pyspark.sql.Row``) of ``df``; ``map_fn``
    converts each row first (e.g. ``lambda r: (r.word, r.n)`` or ``Row.asDict``).

    Each DataFrame partition feeds one source processor (after bringing the partition
    count to the vertex's total parallelism)."""
    if not hasattr(df, "rdd"):
        raise TypeError(
            f"spark_dataframe_source needs a pyspark DataFrame, got {type(df).__name__}"
        )
    if getattr(df, "isStreaming", False):
        raise TypeError("spark_dataframe_source needs a static DataFrame; use spark_stream_source")
    return SparkRowSource(df, map_fn, "dataframe")


def spark_rdd_source(rdd: Any, map_fn: Callable[[Any], Any] | None = None) -> SparkRowSource:
    """A source vertex emitting the elements of ``rdd`` (one partition per processor)."""
    if not hasattr(rdd, "mapPartitionsWithIndex"):
        raise TypeError(f"spark_rdd_source needs a pyspark RDD, got {type(rdd).__name__}")
    return SparkRowSource(rdd, map_fn, "rdd")


class _CollectRowsP(AbstractProcessor):
    """Appends (converted) items to the named list; swallows watermarks."""

    def __init__(self, name: str, to_row: Callable[[Any], Any] | None) -> None:
        self.name = name
        self.to_row = to_row

    def init_processor(self, context: Context) -> None:
        self.out = context.get_list(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self.to_row is None:
            self.out.extend(inbox)
        else:
            self.out.extend(map(self.to_row, inbox))
        inbox.clear()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True


class SparkDataFrameSink(ProcessorMetaSupplier):
    """Meta-supplier of a sink whose items become ``engine.get_dataframe(name)`` (and,
    with a ``path`` or ``table``, are written with ``DataFrameWriter``)."""

    slipstream_traits = frozenset({SINK})

    def __init__(
        self,
        name: str,
        schema: Any,
        to_row: Callable[[Any], Any] | None,
        *,
        format: str | None = None,  # noqa: A002 - Spark's own name
        path: str | None = None,
        table: str | None = None,
        mode: str = "append",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a DataFrame sink needs a non-empty name, got {name!r}")
        if to_row is not None and not callable(to_row):
            raise TypeError(f"to_row must be callable, got {type(to_row).__name__}")
        if path is not None and table is not None:
            raise ValueError("a DataFrame sink writes to a path or to a table, not both")
        if format is not None and path is None and table is None:
            raise ValueError("format= needs path= or table= to write to")
        self.name = name
        self.schema = schema
        self.to_row = to_row
        self.format = format
        self.path = path
        self.table = table
        self.mode = mode
        self.options = {str(k): str(v) for k, v in (options or {}).items()}

    @property
    def writes(self) -> bool:
        """Whether the sink writes its rows somewhere (a path or a table)."""
        return self.path is not None or self.table is not None

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        supplier = FactorySupplier(functools.partial(_CollectRowsP, self.name, self.to_row))
        return lambda _address: supplier

    def __repr__(self) -> str:
        return f"spark_dataframe_sink({self.name!r})"


def spark_dataframe_sink(
    name: str,
    schema: Any = None,
    to_row: Callable[[Any], Any] | None = None,
    *,
    format: str | None = None,  # noqa: A002 - Spark's own name
    path: str | None = None,
    table: str | None = None,
    mode: str = "append",
    options: Mapping[str, Any] | None = None,
) -> SparkDataFrameSink:
    """A sink whose items become a DataFrame: ``engine.get_dataframe(name)`` on the Spark
    engine (``schema`` as for ``SparkSession.createDataFrame``: a DDL string, a
    ``StructType`` or column names; ``None`` infers it from the rows, whose columns are
    then a dict's keys or a named tuple's or dataclass's fields, in their order, as
    ``write_parquet`` writes them). ``to_row`` converts each item first (items must be
    tuples, dicts, named tuples, dataclass instances or Rows for Spark). On the
    embedded engine the (converted) items go to ``engine.get_list(name)``.

    With ``path`` (or ``table``) the Spark engine also writes the rows with
    ``DataFrameWriter`` in ``format`` (``"parquet"``, ``"json"``, ``"csv"``, ...;
    Spark's default source if ``None``) with ``options``: a batch job once when it
    completes (``mode`` as for ``DataFrameWriter.mode``), a streaming job once per
    epoch, into the partition ``slipstream_epoch=<epoch id>`` (dynamic partition
    overwrite, so a replayed epoch replaces its own output instead of adding to it:
    exactly once per epoch)."""
    return SparkDataFrameSink(
        name, schema, to_row, format=format, path=path, table=table, mode=mode, options=options
    )


def named_row(item: Any) -> Any:
    """``item`` as Spark should infer its columns: a dict with string keys, a named tuple
    or a dataclass instance becomes a ``Row`` of its fields in their order (the columns
    ``write_parquet`` and ``write_csv`` give it); anything else stays as it is. Spark's
    own inference sorts a dict's keys and an object's attributes by name, and cannot
    read a dataclass with ``__slots__``."""
    fields = item if isinstance(item, dict) else as_record(item)
    if fields is None or not all(type(k) is str for k in fields):
        return item
    from pyspark.sql import Row

    return Row(**fields)


def spark_rows(rows: Any, schema: Any) -> Any:
    """The RDD to hand ``createDataFrame`` with ``schema``: without a schema, records
    and dicts as :func:`named_row` (so the inferred columns are their fields, in
    order); with one, the items as they are (Spark matches them to it)."""
    return rows.map(named_row) if schema is None else rows


def write_rows(session: Any, rows: Any, sink: SparkDataFrameSink, epoch_id: int | None) -> None:
    """Write a writing DataFrame sink's rows (an RDD) as its spec says (see
    :func:`spark_dataframe_sink`); ``epoch_id`` for one epoch of a streaming job."""
    if sink.schema is None and rows.isEmpty():
        return  # nothing to write, and Spark could not infer a schema
    df = session.createDataFrame(spark_rows(rows, sink.schema), sink.schema)
    if epoch_id is None:
        writer = df.write.mode(sink.mode)
    else:
        from pyspark.sql import functions as F  # noqa: N812

        df = df.withColumn(EPOCH_COLUMN, F.lit(epoch_id))
        writer = df.write.option("partitionOverwriteMode", "dynamic")
    if sink.format is not None:
        writer = writer.format(sink.format)
    writer = writer.options(**sink.options)
    if sink.path is not None:
        if epoch_id is not None:
            writer = writer.partitionBy(EPOCH_COLUMN).mode("overwrite")
        writer.save(sink.path)
        return
    assert sink.table is not None
    if epoch_id is not None and session.catalog.tableExists(sink.table):
        # a dynamic partition overwrite replaces only this epoch's partition
        _overwrite_partition(session, df, sink.table)
    elif epoch_id is not None:
        writer.partitionBy(EPOCH_COLUMN).mode("append").saveAsTable(sink.table)
    else:
        writer.saveAsTable(sink.table)


def _overwrite_partition(session: Any, df: Any, table: str) -> None:
    key = "spark.sql.sources.partitionOverwriteMode"
    before = session.conf.get(key, None)
    session.conf.set(key, "dynamic")
    try:
        columns = session.table(table).columns
        df.select(*columns).write.insertInto(table, overwrite=True)
    finally:
        if before is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, before)
