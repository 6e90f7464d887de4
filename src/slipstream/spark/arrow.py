"""A micro-batch's rows to its source tasks as Arrow record batches.

``DataFrame.rdd`` hands Python one row at a time: the JVM pickles every row, the Python
worker unpickles it and builds a ``Row`` through a Python function call, and each
``row.field`` is a ``Row.__getattr__`` call (a search of the field names). At 500,000
rows per epoch that was most of a streaming epoch's source stage (docs/performance.md,
"Arrow batches into the source stage").

:func:`arrow_partitions` instead turns the DataFrame's rows into Arrow record batches on
the JVM (``DataFrame.mapInArrow``, Spark's columnar transfer, ``spark.sql.execution.
arrow.maxRecordsPerBatch`` rows per batch), each batch serialized as one Arrow IPC
stream in a one-column DataFrame of its own; only those few rows cross to the source
task's Python worker the usual way, and a micro-batch with fewer partitions than the
source vertex has processors is spread over them by redistributing the batches (a
shuffle of tens of blobs on the JVM, not of every row). The source task then reads each
batch column by column (:func:`arrow_rows`) and makes each row a ``Row`` of a subclass
whose fields are read-only attributes: equal to, printed, pickled and converted (``asDict``) as
the ``Row`` ``DataFrame.rdd`` gives, with the same values.

Where the Spark internals allow (``Dataset.toArrowBatchRdd``, the JVM side of
``toPandas``), the JVM makes the batches itself (:func:`_jvm_batches`) in the source
tasks' own stage: no Python worker passes them through ``mapInArrow``, and a micro-batch
of fewer partitions than the source has processors is not spread (the first processors
read it in the read's tasks, the others get no rows). The source task then reads
each record batch message with the schema the driver derived (:func:`_arrow_schema`).
``SLIPSTREAM_SPARK_ARROW=python`` keeps the ``mapInArrow`` batches (to compare).

The values are the same only for types whose Arrow-to-Python conversion is Spark's own:
strings, booleans, integers, floats and doubles (:func:`arrow_fields`). A DataFrame with
any other column (timestamps, dates, decimals, binary, nested types), a driver or
executors without ``pyarrow`` (:func:`executors_have_pyarrow`), keep the pickled-row
path; ``SLIPSTREAM_SPARK_ARROW=0`` turns this path off (to compare the two).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "ARROW_COLUMN",
    "arrow_enabled",
    "arrow_fields",
    "arrow_column",
    "arrow_partitions",
    "arrow_rows",
    "executors_have_pyarrow",
]

log = logging.getLogger("slipstream.spark")

#: The one column of the DataFrame of serialized batches.
ARROW_COLUMN = "_slipstream_arrow"

#: Spark SQL types whose values ``pyarrow``'s ``to_pylist`` gives exactly as a pickled
#: ``Row`` does (a ``FloatType`` is a Python float of the 32-bit value either way).
_PLAIN_TYPES = frozenset(
    {
        "StringType",
        "BooleanType",
        "ByteType",
        "ShortType",
        "IntegerType",
        "LongType",
        "FloatType",
        "DoubleType",
    }
)


def arrow_enabled() -> bool:
    """Whether the Arrow path may be used: ``pyarrow`` imports and
    ``SLIPSTREAM_SPARK_ARROW`` is not ``0``."""
    if os.environ.get("SLIPSTREAM_SPARK_ARROW", "1") in ("0", "false", "no"):
        return False
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def arrow_fields(df: Any) -> tuple[str, ...] | None:
    """The column names of ``df`` if every column has a plain type (module doc) and the
    names are unique, else ``None``."""
    try:
        fields = df.schema.fields
    except Exception:  # noqa: BLE001 - not a DataFrame (a test double, an RDD)
        return None
    if not fields:
        return None
    if any(type(f.dataType).__name__ not in _PLAIN_TYPES for f in fields):
        return None
    names = tuple(f.name for f in fields)
    return names if len(set(names)) == len(names) else None  # Arrow wants unique names


def _serialize(batches: Iterable[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` function: each record batch as one Arrow IPC stream, in a
    one-row batch of its own (runs in a Python worker of the executor)."""
    import pyarrow as pa

    for batch in batches:
        if batch.num_rows == 0:
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        data = sink.getvalue()
        offsets = pa.array([0, data.size], pa.int32()).buffers()[1]
        blob = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])  # no copy
        yield pa.RecordBatch.from_arrays([blob], [ARROW_COLUMN])


_probe_lock = threading.Lock()
_probed: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _import_pyarrow(_rows: Iterable[Any]) -> Iterator[bool]:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        yield False
    else:
        yield True


def executors_have_pyarrow(spark_context: Any) -> bool:
    """Whether an executor's Python imports ``pyarrow`` (asked once per SparkContext,
    by a one-task Spark job): the driver's having it says nothing of a cluster's
    executors, and without it every source task of the Arrow path would fail."""
    with _probe_lock:
        known = _probed.get(spark_context)
    if known is not None:
        return known
    try:
        have = all(spark_context.parallelize([0], 1).mapPartitions(_import_pyarrow).collect())
    except Exception:  # noqa: BLE001 - the pickled rows work wherever Spark does
        log.debug("probing the executors for pyarrow failed", exc_info=True)
        have = False
    if not have:
        log.info("the executors cannot import pyarrow: stream rows reach them pickled")
    with _probe_lock:
        _probed[spark_context] = have
    return have


def _map_in_arrow(df: Any, fn: Any, schema: str) -> Any:
    """``df.mapInArrow(fn, schema)``, or ``None`` if this Spark cannot run it here.

    PySpark's ``mapInArrow`` (up to 4.3 at least) refuses to run without pandas, which
    it never uses for it: neither on the driver nor in the worker, which hands the
    function ``pyarrow`` record batches. Without pandas the same plan is built the way
    ``mapInArrow`` builds it (the UDF, then the JVM's ``mapInArrow``); any failure to do
    so (another PySpark version's internals) falls back to the pickled rows."""
    try:
        return df.mapInArrow(fn, schema)
    except ImportError:  # PySpark's pandas check (PySparkImportError)
        pass
    except Exception:  # noqa: BLE001 - e.g. a pyarrow older than this Spark needs
        return None
    try:
        from pyspark.sql import DataFrame
        from pyspark.sql.udf import _create_udf
        from pyspark.util import PythonEvalType

        udf = _create_udf(fn, returnType=schema, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        column = udf(*[df[c] for c in df.columns])
        return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)
    except Exception:  # noqa: BLE001 - not this PySpark's internals
        return None


def _jvm_batches(
    df: Any, n: int, large: bool = False, one_batch: bool = False, plan: Any = None
) -> tuple[Any, bytes] | None:
    """``df``'s rows as an RDD of ``n`` partitions of Arrow record batch messages made
    on the JVM (``Dataset.toArrowBatchRdd``, what ``toPandas`` uses: no Python worker
    serializes them), and the serialized Arrow schema to read them with; ``None`` where
    this Spark has no such method (its internals differ): then :func:`_map_in_arrow`
    makes the batches. ``large``: batches of :func:`_batch_rows` rows, ``one_batch``:
    each partition as one batch (:func:`_batch_rdd`).

    A micro-batch with fewer partitions than ``n`` (a file below Spark's open cost is
    one) is not spread: its partitions feed the first processors in the read's own
    tasks, and the RDD gets empty partitions for the others (:func:`_unspread`). The
    source's output edge spreads the work after it anyway (the key shuffle), as native
    Structured Streaming's first stage is one task per file too; spreading the batches
    first was a shuffle of every row's bytes and a stage of its own, which took as long
    as native's whole epoch (docs/performance.md, "One stage fewer: the micro-batch
    not spread"). ``SLIPSTREAM_SPARK_ARROW_SPREAD=1`` spreads them again (to compare)."""
    try:
        from pyspark import RDD
        from pyspark.serializers import NoOpSerializer

        sc = df.sparkSession.sparkContext
        jrdd = _batch_rdd(df, one_batch, plan) if large else _arrow_rdd(df, plan)
        have = jrdd.getNumPartitions()
        if have < n:
            if os.environ.get("SLIPSTREAM_SPARK_ARROW_SPREAD", "0") in ("0", "false", "no"):
                jrdd = _unspread(sc, jrdd, n - have)
            else:
                jrdd = jrdd.repartition(n)
        elif have > n:
            jrdd = jrdd.coalesce(n, False)
        schema = _arrow_schema(df)
        return RDD(jrdd, sc, NoOpSerializer()), schema
    except Exception:  # noqa: BLE001 - not this Spark's internals: the mapInArrow path
        log.debug("Dataset.toArrowBatchRdd is not usable here", exc_info=True)
        return None


#: Spark's batch size setting, which ``toArrowBatchRdd`` reads when it builds the RDD
_MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: values (rows x columns) per Arrow batch the JVM makes for a source task, unless the
#: session sets ``spark.sql.execution.arrow.maxRecordsPerBatch`` itself
BATCH_VALUES = 50_000


def _batch_rows(columns: int) -> int | None:
    """Rows per Arrow batch for a stream of ``columns`` columns: :data:`BATCH_VALUES`
    values (``SLIPSTREAM_SPARK_ARROW_BATCH_VALUES`` overrides it; ``0`` keeps Spark's
    setting), never fewer than Spark's default 10,000 rows; ``None``: Spark's setting."""
    values = int(os.environ.get("SLIPSTREAM_SPARK_ARROW_BATCH_VALUES", BATCH_VALUES))
    rows = values // max(1, columns)
    return rows if rows > 10_000 else None


def _arrow_rdd(df: Any, plan: Any = None) -> Any:
    """``df._jdf.toArrowBatchRdd()`` as a ``JavaRDD``; with ``plan`` (a physical plan
    whose rows are ``df``'s, :func:`slipstream.spark.file_splits.micro_batch_plan`) the
    batches of that plan's rows."""
    jdf = df._jdf
    return (jdf.toArrowBatchRdd() if plan is None else jdf.toArrowBatchRdd(plan)).toJavaRDD()


def _batch_rdd(df: Any, one_batch: bool = False, plan: Any = None) -> Any:
    """``df._jdf.toArrowBatchRdd()`` as a ``JavaRDD``, its batches of
    :func:`_batch_rows` rows when the session leaves
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` at its default. Spark's 10,000 rows
    are sized for ``toPandas`` and Python UDFs; a source task that reads one column's
    values (``spark_stream(df, column=...)``) keeps up with the JVM, and fewer, larger
    batches cost the JVM less: one 500,000-line file read into Python took 0.25 s in
    batches of 10,000 rows and 0.21 s in batches of 50,000 (docs/performance.md, "Larger
    Arrow batches for a column's values"). A source task that makes a ``Row`` per row is
    slower than the JVM, and larger batches only delay its first one, so it keeps
    Spark's size. The setting is read when the RDD is built, so it is set on the
    micro-batch's own session for that call only. ``one_batch``: no bound (Spark's
    ``0``), each partition one batch, where the caller knows the partitions are small
    (:func:`slipstream.spark.file_splits.split_file_scan`)."""
    rows = 0 if one_batch else _batch_rows(len(df.schema.fields))
    jconf = df._jdf.sparkSession().sessionState().conf()
    if rows is None or jconf.contains(_MAX_RECORDS):
        return _arrow_rdd(df, plan)
    jconf.setConfString(_MAX_RECORDS, str(rows))
    try:
        return _arrow_rdd(df, plan)
    finally:
        jconf.unsetConf(_MAX_RECORDS)


def _unspread(sc: Any, jrdd: Any, empty: int) -> Any:
    """``jrdd`` followed by ``empty`` empty partitions (a JVM ``UnionRDD``: each of
    ``jrdd``'s partitions is computed in the task of the same index, no shuffle)."""
    return jrdd.union(sc.parallelize([], empty)._jrdd)


_ARROW_TYPES = {
    "BooleanType": "bool_",
    "ByteType": "int8",
    "ShortType": "int16",
    "IntegerType": "int32",
    "LongType": "int64",
    "FloatType": "float32",
    "DoubleType": "float64",
}


def _arrow_schema(df: Any) -> bytes:
    """The Arrow schema the JVM writes ``df``'s plain columns with (strings as
    ``large_string`` when ``spark.sql.execution.arrow.useLargeVarTypes`` is on),
    serialized."""
    import pyarrow as pa

    large = str(
        df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")
    ).lower() == "true"
    fields = []
    for f in df.schema.fields:
        name = type(f.dataType).__name__
        if name == "StringType":
            t = pa.large_string() if large else pa.string()
        else:
            t = getattr(pa, _ARROW_TYPES[name])()
        fields.append(pa.field(f.name, t, f.nullable))
    return bytes(pa.schema(fields).serialize().to_pybytes())


def arrow_partitions(
    df: Any, n: int, large_batches: bool = False, one_batch: bool = False, plan: Any = None
) -> tuple[Any, tuple[str, ...], bytes | None] | None:
    """``df``'s rows as an RDD of ``n`` partitions of serialized Arrow batches (module
    doc), the column names and, for batches made on the JVM (:func:`_jvm_batches`), the
    serialized schema :func:`arrow_rows` reads them with (``None``: batches made by
    ``mapInArrow``); ``None`` where the pickled-row path must be used.
    ``large_batches``: the source reads one column's values, ``one_batch``: and each
    partition is small enough to be one batch (:func:`_batch_rdd`); ``plan``: the
    physical plan ``df``'s rows come from, to make the JVM's batches from (:func:`_arrow_rdd`)."""
    if not arrow_enabled():
        return None
    fields = arrow_fields(df)
    if fields is None or not hasattr(df, "mapInArrow"):
        return None
    if not executors_have_pyarrow(df.sparkSession.sparkContext):
        return None
    if os.environ.get("SLIPSTREAM_SPARK_ARROW", "1") != "python":
        jvm = _jvm_batches(df, n, large_batches, one_batch, plan)
        if jvm is not None:
            return jvm[0], fields, jvm[1]
    batches = _map_in_arrow(df, _serialize, f"{ARROW_COLUMN} binary")
    if batches is None:
        return None
    have = batches.rdd.getNumPartitions()
    if have < n:
        batches = batches.repartition(n)  # the batches, not the rows, move
    rdd = batches.rdd
    if have > n:
        rdd = rdd.coalesce(n)
    return rdd, fields, None


def _field_getter(i: int) -> Any:
    """``row -> row[i]`` past ``Row.__getitem__`` (a Python method that also takes names;
    ``operator.itemgetter`` would call it)."""

    def get(row: Any, _get: Any = tuple.__getitem__) -> Any:
        return _get(row, i)

    return get


def _field(i: int, name: str) -> Any:
    """The class attribute of field ``i``: the C descriptor ``collections.namedtuple``
    gives its fields (it reads the tuple's item ``i`` directly, past ``Row.__getitem__``),
    ~4x faster than a ``property`` over :func:`_field_getter` (a Python call per
    access, once per row in a ``map_fn`` such as ``lambda row: row.value``); that
    ``property`` where the descriptor is not available."""
    try:
        from collections import _tuplegetter  # type: ignore[attr-defined]
    except ImportError:  # not CPython's collections
        return property(_field_getter(i))
    return _tuplegetter(i, f"Field {name!r}")


@functools.lru_cache(maxsize=64)
def row_class(fields: tuple[str, ...]) -> type:
    """A ``Row`` subclass for rows of ``fields``: the names are a class attribute (a
    ``Row`` keeps them per instance) and each field that a ``Row`` would reach through
    ``__getattr__`` is a read-only descriptor of its index (:func:`_field`; a ``Row``
    searches the names on every access)."""
    from pyspark.sql import Row

    namespace: dict[str, Any] = {"__fields__": list(fields)}
    for i, name in enumerate(fields):
        if name.isidentifier() and not name.startswith("__") and not hasattr(Row, name):
            # where a Row's own attribute wins (count, index, asDict), it still does
            namespace[name] = _field(i, name)
    cls = type("Row", (Row,), namespace)
    cls.__module__ = Row.__module__
    return cls


def _batches(chunks: Iterable[Any], schema: bytes | None) -> Iterator[Any]:
    """The record batches of ``chunks``, in order: with ``schema`` each chunk is one
    record batch message the JVM made (:func:`_jvm_batches`), without it an IPC stream
    in a ``Row`` (``mapInArrow``'s, :func:`_serialize`). One step per batch, not per
    row."""
    import pyarrow as pa

    if schema is not None:
        arrow_schema = pa.ipc.read_schema(pa.py_buffer(schema))
        read = pa.ipc.read_record_batch
        for message in chunks:
            yield read(pa.py_buffer(message), arrow_schema)
        return
    for chunk in chunks:
        with pa.ipc.open_stream(pa.py_buffer(chunk[0])) as reader:
            yield from reader


def arrow_rows(
    chunks: Iterable[Any], fields: tuple[str, ...], schema: bytes | None = None
) -> Iterator[Any]:
    """The rows of the serialized batches in ``chunks`` (the ``Row`` s of
    :func:`arrow_partitions`' RDD, or with ``schema`` the JVM's record batch messages),
    in order, as ``Row`` s (:func:`row_class`)."""
    cls = itertools.repeat(row_class(fields))
    new = tuple.__new__

    def rows(batch: Any) -> Iterator[Any]:
        columns = [column.to_pylist() for column in batch.columns]
        # tuple.__new__(cls, values) called by map with two iterables: ~20 ns a row
        # less than through a functools.partial of it (75 against 86 ms for the
        # 500,000 rows of a count-10k epoch with their map_fn)
        return map(new, cls, zip(*columns, strict=True))

    # rows are handed out by C iterators only (a generator's yield per row cost more
    # than making the row)
    return itertools.chain.from_iterable(map(rows, _batches(chunks, schema)))


def arrow_column(
    chunks: Iterable[Any], fields: tuple[str, ...], column: str, schema: bytes | None = None
) -> Iterator[Any]:
    """The values of ``column`` in the serialized batches in ``chunks`` (as
    :func:`arrow_rows` reads them), in order: no ``Row`` per row."""
    i = fields.index(column)

    def values(batch: Any) -> list[Any]:
        return batch.column(i).to_pylist()  # type: ignore[no-any-return]

    return itertools.chain.from_iterable(map(values, _batches(chunks, schema)))
