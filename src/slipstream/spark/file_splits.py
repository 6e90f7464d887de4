"""A micro-batch of fewer files than source processors, read by all of them.

Spark plans a file stream's micro-batch with the session's split settings: a file below
``spark.sql.files.openCostInBytes`` (4 MB) is one partition, read by one task, so a
one-file micro-batch reaches one source processor. Where the source reads one column's
values, the JVM's read and Arrow conversion is the longer side of that task and it runs
on one core (the task's Python waits for it), while native Structured Streaming's first
stage is that read alone (docs/performance.md, "A one-file micro-batch read by both
source tasks"). The
micro-batch that ``foreachBatch`` hands the driver is planned already, on the session that
made the stream (its file relation's), so a setting on the query's own session does not
reach it, and a setting on the user's session would change every other query too (native
Structured Streaming's own among them).

:func:`split_file_scan` instead cuts the planned read itself into as many byte ranges as
the source vertex has processors, where Spark itself would cut it with a smaller
``maxSplitBytes``: it only re-partitions the read's ``FileScanRDD`` (the same read
function, the same files, each a ``PartitionedFile`` of a narrower range, which Spark's
readers take as they take its own splits: a text or JSON-lines split reads the lines
that start in it), and only

* for a micro-batch that is a chain of one-to-one RDDs over one ``FileScanRDD`` (a file
  stream, possibly filtered or projected: no shuffle, join or union in it), with fewer
  partitions than processors;
* splitting only the files the stream's file format says are splittable
  (``FileFormat.isSplitable``: not a gzip file, not ``wholetext`` or ``multiLine``);
  a file that is not is read whole by one task, as before.

The stream's own plan must be a file stream with nothing but projections and filters
on it (the plan is checked, not the RDDs: an aggregate Spark planned without an exchange
because the read was one partition would be wrong over two). Narrow RDDs compute their
partitions from their parent's when first asked, so the cut read is what Spark would
have planned with smaller splits; an RDD above the read that computed its partitions
before the cut would keep the whole read in one task, still correct.

The ranges follow the files' order, so source processor ``i`` reads the ``i``-th part of
the micro-batch; a replay of the epoch reads the same files with the same cuts. Where
anything of this is not as expected (another Spark's internals, a stream of another
kind), the micro-batch is left as Spark planned it. ``SLIPSTREAM_SPARK_SPLIT_FILES=0``
turns the cutting off (to compare).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

from slipstream.spark.jvm import jvm_class, jvm_static

__all__ = ["micro_batch_plan", "split_file_scan"]

log = logging.getLogger("slipstream.spark")

_DS = "org.apache.spark.sql.execution.datasources."
_SCAN = _DS + "FileScanRDD"
_ONE_TO_ONE = "org.apache.spark.OneToOneDependency"
_TEXT_BASED = _DS + "TextBasedFileFormat"
_STREAMING_RELATION = "StreamingRelation"


def split_enabled() -> bool:
    """Whether :func:`split_file_scan` may cut (``SLIPSTREAM_SPARK_SPLIT_FILES``)."""
    return os.environ.get("SLIPSTREAM_SPARK_SPLIT_FILES", "1") not in ("0", "false", "no")


_lock = threading.Lock()
#: per streaming DataFrame: its file format, session and options, or None (not a file
#: stream); asked once per job, not per epoch (each JVM call is a py4j round trip)
_formats: weakref.WeakKeyDictionary[Any, tuple[Any, Any, Any] | None] = weakref.WeakKeyDictionary()
#: per SparkContext: the JVM classes and the reflected ``RDD.partitions_`` field
_jvm_handles: weakref.WeakKeyDictionary[Any, tuple[Any, Any, Any, Any]] = (
    weakref.WeakKeyDictionary()
)
#: logical plan nodes that keep each row where it is (a projection, a filter, a name)
_ROW_WISE = frozenset({"Project", "Filter", "SubqueryAlias"})


def _file_format(streaming_df: Any) -> tuple[Any, Any, Any] | None:
    """:func:`_find_file_format`, once per streaming DataFrame."""
    with _lock:
        if streaming_df in _formats:
            return _formats[streaming_df]
    found = _find_file_format(streaming_df)
    with _lock:
        _formats[streaming_df] = found
    return found


def _handles(sc: Any) -> tuple[Any, Any, Any, Any]:
    """The ``FileScanRDD``, ``OneToOneDependency`` and ``TextBasedFileFormat`` classes
    and ``RDD``'s cached partitions field (made accessible), once per SparkContext."""
    with _lock:
        known = _jvm_handles.get(sc)
    if known is not None:
        return known
    cls = jvm_static(sc, "java.lang.Class", "forName")
    cached = cls("org.apache.spark.rdd.RDD").getDeclaredField("partitions_")
    cached.setAccessible(True)
    handles = (cls(_SCAN), cls(_ONE_TO_ONE), cached, cls(_TEXT_BASED))
    with _lock:
        _jvm_handles[sc] = handles
    return handles


def _find_file_format(streaming_df: Any) -> tuple[Any, Any, Any] | None:
    """The stream's file format, its session and options (for ``isSplitable``), where
    the streaming DataFrame is one file source with only row-wise operators on it
    (projections, filters: each output row depends on one input row, whatever the
    partitions)."""
    leaf = streaming_df._jdf.queryExecution().analyzed()
    for _ in range(64):
        name = leaf.getClass().getSimpleName()
        if name == _STREAMING_RELATION:
            break
        if name not in _ROW_WISE:
            return None
        children = leaf.children()
        if children.size() != 1:
            return None
        leaf = children.head()
    else:
        return None
    source = leaf.dataSource()
    fmt = source.providingInstance()
    sc = streaming_df.sparkSession.sparkContext
    file_format = jvm_static(sc, "java.lang.Class", "forName")(_DS + "FileFormat")
    if not file_format.isInstance(fmt):
        return None
    return fmt, source.sparkSession(), source.options()


def _scan_of(batch_df: Any) -> Any | None:
    """The ``FileScanRDD`` under ``batch_df``'s RDD through one-to-one dependencies
    only, or ``None``."""
    logical = batch_df._jdf.queryExecution().logical()
    if logical.getClass().getSimpleName() != "LogicalRDD":
        return None
    scan_class, one_to_one, _cached, _text = _handles(batch_df.sparkSession.sparkContext)
    rdd = logical.rdd()
    for _ in range(64):
        if scan_class.isInstance(rdd):
            return rdd
        deps = rdd.dependencies()
        if deps.size() != 1:
            return None
        dep = deps.head()
        if not one_to_one.isInstance(dep):
            return None
        rdd = dep.rdd()
    return None


def _cuts(sizes: list[tuple[int, bool]], n: int) -> list[list[tuple[int, int, int]]]:
    """``n`` parts of the files ``sizes`` (``(length, splittable)`` each, in order), as
    ``(file index, offset in its range, length)`` pieces: each part about
    ``total / n`` bytes, a file that is not splittable whole in the part where it
    starts."""
    total = sum(length for length, _ in sizes)
    target = -(-total // n)
    parts: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    part, room = 0, target
    for i, (length, splittable) in enumerate(sizes):
        offset = 0
        while offset < length:
            if room <= 0 and part < n - 1:
                part, room = part + 1, target
            take = (
                length - offset if not splittable or part == n - 1 else min(room, length - offset)
            )
            parts[part].append((i, offset, take))
            offset += take
            room -= take
    return parts


#: the most bytes of text-based files (text, JSON lines, CSV) in one cut part for the
#: part to reach its source task as one Arrow batch (:func:`split_file_scan`)
ONE_BATCH_BYTES = 16 << 20


def split_file_scan(batch_df: Any, streaming_df: Any, n: int) -> tuple[bool, bool]:
    """Cut the read of ``batch_df`` (a micro-batch of ``streaming_df``) into ``n``
    partitions of about equal bytes (module doc). Returns whether it did (if not, the
    micro-batch is as Spark planned it), and whether each part is at most
    :data:`ONE_BATCH_BYTES` of a text-based format: then each part may go to its
    source task as one Arrow batch (its values take about its bytes), which took
    0.48-0.53 s per count-10k epoch against 0.52-0.56 in batches of 50,000 values (the
    JVM's and Python's work of a task then alternate instead of four threads sharing
    two cores, docs/performance.md)."""
    if n < 2 or not split_enabled():
        return False, False
    try:
        fmt = _file_format(streaming_df)
        if fmt is None:
            return False, False
        scan = _scan_of(batch_df)
        if scan is None:
            return False, False
        partitions = scan.filePartitions()
        if partitions.size() >= n:
            return False, False
        files = [f for p in _seq(partitions) for f in p.files()]
        if not files:
            return False, False
        file_format, session, options = fmt
        sizes = [
            (int(f.length()), bool(file_format.isSplitable(session, options, f.toPath())))
            for f in files
        ]
        parts = _cuts(sizes, n)
        if sum(1 for p in parts if p) <= partitions.size():
            return False, False  # nothing gained: e.g. one file that is not splittable
        sc = batch_df.sparkSession.sparkContext
        gateway = sc._gateway
        # the classes by their full names: no lookup per name segment (slipstream.spark.jvm)
        partitioned_file = jvm_class(sc, _DS + "PartitionedFile")
        file_partition = jvm_static(sc, _DS + "FilePartition", "apply")
        fields: dict[int, list[Any]] = {}  # a file's copy arguments, asked once
        out = gateway.new_array(jvm_class(sc, "org.apache.spark.Partition"), n)
        for index, pieces in enumerate(parts):
            arr = gateway.new_array(partitioned_file, len(pieces))
            for k, (i, offset, length) in enumerate(pieces):
                f = files[i]
                if i not in fields:
                    fields[i] = [
                        f.partitionValues(),
                        f.filePath(),
                        f.start(),
                        f.locations(),
                        f.modificationTime(),
                        f.fileSize(),
                        f.otherConstantMetadataColumnValues(),
                    ]
                values, path, start, *rest = fields[i]
                arr[k] = f.copy(values, path, start + offset, length, *rest)
            out[index] = file_partition(index, arr)
        handles = _handles(sc)
        handles[2].set(scan, out)
        largest = max(sum(length for _, _, length in pieces) for pieces in parts)
        text = handles[3].isInstance(file_format)
    except Exception:  # noqa: BLE001 - not this Spark's internals: Spark's own plan
        log.debug("could not split the micro-batch's file read", exc_info=True)
        return False, False
    return True, bool(text) and largest <= ONE_BATCH_BYTES


def plan_enabled() -> bool:
    """Whether :func:`micro_batch_plan` may give the plan (``SLIPSTREAM_SPARK_SCAN_PLAN``)."""
    return os.environ.get("SLIPSTREAM_SPARK_SCAN_PLAN", "1") not in ("0", "false", "no")


def micro_batch_plan(query: Any, epoch_id: int, streaming_df: Any) -> Any | None:
    """The physical plan micro-batch ``epoch_id`` of ``query`` (a ``StreamingQuery``
    over ``streaming_df``) was read with, to make its Arrow batches from, or ``None``.

    ``foreachBatch`` hands over the micro-batch as a ``LogicalRDD`` over the rows that
    plan makes, and a DataFrame over a ``LogicalRDD`` is planned as a scan of the RDD that
    copies every row (``RDDScanExec``'s unsafe projection, in a code-generated stage of
    its own): the JVM's Arrow read of a 500,000-line micro-batch took 0.17 s where the
    same read of the file as a batch DataFrame took 0.13 (docs/performance.md, "Fixed
    cost per epoch: ... the micro-batch's Arrow batches from its own plan"). Where the stream is a file source
    with only row-wise operators on it (:func:`_find_file_format`: executing its plan
    again is another read of the same files, with no exchange or state in it), the
    query's current execution's plan makes the batches itself: the same scan (its
    ``FileScanRDD`` is made once per plan, so :func:`split_file_scan`'s cut holds), the
    same rows, and the plan's own metrics count them (the query's progress). The
    execution must be this epoch's (its batch id); anything unexpected (another
    Spark's internals) leaves the micro-batch as it came.
    ``SLIPSTREAM_SPARK_SCAN_PLAN=0`` turns this off (to compare)."""
    if query is None or not plan_enabled():
        return None
    try:
        if _file_format(streaming_df) is None:
            return None
        execution = query._jsq.streamingQuery().lastExecution()
        if execution is None or int(execution.currentBatchId()) != int(epoch_id):
            return None
        return execution.executedPlan()
    except Exception:  # noqa: BLE001 - not this Spark's internals: the LogicalRDD
        log.debug("could not find the micro-batch's plan", exc_info=True)
        return None


def _seq(seq: Any) -> list[Any]:
    """A Scala ``Seq`` through py4j, as a list."""
    out = []
    it = seq.iterator()
    while it.hasNext():
        out.append(it.next())
    return out
