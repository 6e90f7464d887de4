"""What runs inside one Spark task: one processor, driven by the shared tasklet.

A compiled vertex becomes an RDD with one partition per processor (partition index =
global processor index). Its task function, :class:`VertexTask`, is called by
``mapPartitionsWithIndex`` on the executor and

1. builds the processor from the member's shipped supplier (``supplier.get(lp)``, taking
   the one at this local index and closing the others);
2. wraps it in :class:`slipstream.execution.tasklet.ProcessorTasklet` with the inbound
   queues of a :class:`~slipstream.spark.feed.InputFeed` (one ``SpscQueue`` per (edge,
   producer)) and collectors from :func:`slipstream.execution.plan.make_collector` (so
   routing is the embedded engine's);
3. calls ``tasklet.call()`` until it reports ``DONE``, moving the partition's next
   record into its queue whenever the tasklet has consumed the last one: the input
   arrives already ordered (Spark sorts a shuffled edge, :mod:`slipstream.spark.shuffle`),
   so the task holds the current record, not its partition;
4. turns what the collectors pushed into the output queues into records for the next
   stage as it goes, and finally yields one result record with the task's metrics and
   the lists and maps the processor wrote.

How the job runs (batch, an epoch of a streaming job, ...) is one :class:`RunMode`,
chosen on the driver.

Records are ``(target_global_index, payload)``. Data payloads are
``(edge_id, producer_index, seq, entry)`` where ``entry`` is a chunk (a ``list`` of
items) or one special item (``Watermark``, ``IDLE_MESSAGE``, ``DONE_ITEM``); chunks are
merged up to :data:`MAX_RECORD_ITEMS` so shuffles move few, big records. ``seq``
numbers the records of one (edge, producer, target) queue. Result payloads are
``(RESULT_TAG, dict)``; DataFrame-sink rows are ``(ROWS_TAG, list)``.
"""

from __future__ import annotations

import enum
import functools
import gc
import itertools
import operator
import os
import pickle
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.dag import Edge
from slipstream.core.item_errors import ItemErrors
from slipstream.core.items import SnapshotBarrier, Watermark
from slipstream.core.outbox import DEFAULT_BUCKET_CAPACITY
from slipstream.core.partition import key_routing
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.core.services import InMemoryServices
from slipstream.core.suppliers import ProcessorSupplier, SupplierContext
from slipstream.execution.collectors import Collector
from slipstream.execution.plan import (
    VertexPlan,
    edge_targets,
    make_collector,
    member_processors,
    single_target_collector,
)
from slipstream.execution.queues import UNBOUNDED, SpscQueue
from slipstream.execution.remote import pack_text, unpack_text
from slipstream.execution.tasklet import DONE, NO_PROGRESS, ProcessorTasklet
from slipstream.spark.arrow import arrow_column, arrow_rows
from slipstream.spark.epoch_state import remember_state, restore_entries, write_epoch_chunk
from slipstream.spark.failures import ProcessorFailure, encode_failure
from slipstream.spark.feed import RESULT_TAG, ROWS_TAG, InputFeed

__all__ = [
    "RESULT_TAG",
    "ROWS_TAG",
    "MAX_RECORD_ITEMS",
    "InboundSpec",
    "OutboundSpec",
    "RunMode",
    "VertexTask",
    "TaskServices",
    "RowSourceP",
    "StreamRowSourceP",
    "EpochSnapshotSink",
    "EpochSourceGate",
    "EPOCH_BARRIER",
    "capture_watermarks",
    "restore_watermarks",
]

#: Consecutive chunks of one queue are merged into records of up to this many items.
MAX_RECORD_ITEMS = 16384
#: Output is turned into records once this many items wait in the output queues.
_DRAIN_THRESHOLD = 65536
#: How often (in tasklet calls) the output queues are measured.
_DRAIN_CHECK_EVERY = 2
#: The outbox's bucket capacity inside a Spark task: a record's chunk of up to
#: :data:`MAX_RECORD_ITEMS`, so a processor takes an input record in one call. With the
#: engine's 2048 a rolling count took a 16,384-item record in 8 calls, and each call
#: dropped its items from the inbox by copying the rest of it (~4x the items copied;
#: docs/performance.md, "count-10k's per-item path"). The task's output queues are
#: unbounded, so the bucket only sets how much one call may emit before a flush. A
#: micro-batch job's gated source keeps the engine's (:class:`EpochSourceGate`).
TASK_OUTBOX_CAPACITY = MAX_RECORD_ITEMS

Record = tuple[int, tuple[Any, ...]]

#: Tasks this Python worker process has started (0: the next is its first; with
#: ``spark.python.worker.reuse`` a worker runs many).
_tasks_in_process = 0
#: The first Spark task (attempt id) this worker process ran, and whether its heap is
#: frozen (:func:`_freeze_worker_heap`).
_first_task: int | None = None
_heap_frozen = False


@dataclass
class InboundSpec:
    """One inbound edge of the vertex: for each consumer (global index) the producers
    feeding it, ascending (the order of the embedded engine's queues)."""

    edge_id: int
    ordinal: int
    priority: int
    label: str
    producers: list[list[int]]


@dataclass
class OutboundSpec:
    """One outbound edge: a routing-only copy of the edge (its vertices are stubs) and the
    plans of both ends, enough for ``edge_targets``/``make_collector``. A ``narrow`` edge
    keeps every item on the producer's own index (no shuffle); ``label`` names the edge
    in errors."""

    edge_id: int
    ordinal: int
    edge: Edge
    src: VertexPlan
    dst: VertexPlan
    narrow: bool
    label: str = ""


class TaskServices(InMemoryServices):
    """The named lists and maps a processor sees inside a Spark task.

    Starts as a copy of the driver's structures (shipped as a broadcast, read lazily:
    only for names a processor asks for), so ``list_source``-style readers work on
    executors. :meth:`changes` reports what the task appended to lists and changed in
    maps, which the driver applies to its own store.
    """

    def __init__(self, initial: Any = None) -> None:
        super().__init__()
        self._initial = initial
        self._initial_value: tuple[dict[str, list[Any]], dict[str, dict[Any, Any]]] | None = None
        self._base_len: dict[str, int] = {}
        self._base_maps: dict[str, dict[Any, Any]] = {}

    def _base(self) -> tuple[dict[str, list[Any]], dict[str, dict[Any, Any]]]:
        if self._initial_value is None:
            if self._initial is None:
                self._initial_value = ({}, {})
            else:
                value = getattr(self._initial, "value", self._initial)
                self._initial_value = (dict(value[0]), dict(value[1]))
        return self._initial_value

    def get_list(self, name: str) -> list[Any]:
        with self._lock:
            lst = self.lists.get(name)
            if lst is None:
                base = self._base()[0].get(name, [])
                lst = self.lists[name] = list(base)
                self._base_len[name] = len(base)
            return lst

    def get_map(self, name: str) -> dict[Any, Any]:
        with self._lock:
            m = self.maps.get(name)
            if m is None:
                base = self._base()[1].get(name, {})
                m = self.maps[name] = dict(base)
                self._base_maps[name] = base
            return m

    def changes(
        self, exclude_lists: Iterable[str] = ()
    ) -> tuple[dict[str, list[Any]], dict[str, tuple[dict[Any, Any], list[Any]]]]:
        """``(appended items per list, (updated entries, deleted keys) per map)``."""
        skip = set(exclude_lists)
        lists = {}
        for name, lst in self.lists.items():
            if name in skip:
                continue
            added = lst[self._base_len.get(name, 0) :]
            if added:
                lists[name] = added
        maps = {}
        for name, m in self.maps.items():
            base = self._base_maps.get(name, {})
            missing = object()
            updates = {k: v for k, v in m.items() if base.get(k, missing) != v}
            deleted = [k for k in base if k not in m]
            if updates or deleted:
                maps[name] = (updates, deleted)
        return lists, maps


class PickledList:
    """A list sink's items of one task, pickled by the C pickler once on the executor
    (:meth:`pack`). PySpark hands a task's results to ``cloudpickle``, whose
    ``reducer_override`` is a Python call per object that is not a plain ``int``,
    ``str``, ``tuple``, ... (a window result is a named tuple): 125,000 windows of an
    epoch took ~0.35 s to pickle that way against ~0.16 s with :mod:`pickle`
    (docs/performance.md, "The window row"). Only our own executors' task results are
    unpickled (:meth:`load`, on the driver), as the list was before.

    Items that are all of one named-tuple class (a window result) travel as that class
    and their plain tuples (``rows``): :mod:`pickle` reduces a named tuple through a
    Python call per item (``__getnewargs__``) and rebuilds it through another
    (``__new__``); as plain tuples they pickle at C speed and become the class's
    instances again by ``tuple.__new__`` at C speed (126,000 windows: pickled 0.20 ->
    0.05 s, unpickled 0.14 -> 0.08 s; docs/performance.md, "The window row: the
    micro-batch's watermark in its epoch")."""

    __slots__ = ("data", "rows")

    def __init__(self, data: bytes, rows: bool = False) -> None:
        self.data = data
        self.rows = rows

    @staticmethod
    def pack(items: list[Any]) -> list[Any] | PickledList:
        """``items`` pickled, or the list itself where :mod:`pickle` cannot pickle an
        item (a class defined in the driver's ``__main__`` reaches an executor by value,
        and only ``cloudpickle`` pickles it back)."""
        try:
            rows = pickle_named_rows(items)
            if rows is not None:
                return PickledList(rows, True)
            return PickledList(pickle.dumps(items, pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - cloudpickle pickles what pickle cannot
            return items

    @staticmethod
    def load(items: list[Any] | PickledList) -> list[Any]:
        """The items :meth:`pack` took (a list not packed as it is)."""
        if isinstance(items, PickledList):
            if items.rows:
                return named_rows(items.data)
            return cast(list[Any], pickle.loads(items.data))  # noqa: S301 - our executors'
        return items

    def __reduce__(self) -> tuple[Any, tuple[bytes, bool]]:
        return PickledList, (self.data, self.rows)


def pickle_named_rows(items: list[Any]) -> bytes | None:
    """``items`` pickled as their named-tuple class and plain tuples (:func:`_row_class`;
    :func:`named_rows` makes them again), or ``None`` if they are not of one such class."""
    cls = _row_class(items)
    if cls is None:
        return None
    return pickle.dumps((cls, list(map(tuple, items))), pickle.HIGHEST_PROTOCOL)


def named_rows(data: bytes) -> list[Any]:
    """The items :func:`pickle_named_rows` pickled: each plain tuple made an instance of
    the class by ``tuple.__new__``, at C speed (unpickled only from our own tasks)."""
    cls, rows = pickle.loads(data)  # noqa: S301 - our executors'
    return list(map(functools.partial(tuple.__new__, cls), rows))


def _row_class(items: list[Any]) -> type | None:
    """The class of ``items`` if they are all instances of one named-tuple class whose
    instances carry nothing but their fields (no ``__dict__``): ``tuple.__new__(cls,
    row)`` makes an equal instance of a row. ``None`` otherwise (plain tuples pickle
    fast as they are)."""
    if not items:
        return None
    cls = type(items[0])
    if (
        cls is tuple
        or not issubclass(cls, tuple)
        or not hasattr(cls, "_fields")
        or cls.__dictoffset__ != 0
    ):
        return None
    if len(set(map(type, items))) != 1:
        return None
    return cls


class RowSourceP(AbstractProcessor):
    """Emits the rows of one Spark partition (a DataFrame or RDD source vertex)."""

    def __init__(self, rows: Iterator[Any], map_fn: Callable[[Any], Any] | None = None) -> None:
        self._it = iter(rows) if map_fn is None else map(map_fn, rows)
        # a Spark row, or a value of one, is never a watermark or idle mark
        self._plain = map_fn is None

    def complete(self) -> bool:
        return self.emit_from(self._it, plain=self._plain)


class RunMode(enum.Enum):
    """How a compiled DAG runs, chosen once on the driver for the whole job.

    * ``BATCH``: a batch job; processors complete and take no snapshot;
    * ``STREAM_EPOCH``: one micro-batch of a Structured Streaming query; the stream
      source emits the epoch's rows, then every processor saves its state with the
      terminal epoch barrier instead of completing;
    * ``MICRO_EPOCH``: one epoch of a driver-driven micro-batch job; each slipstream
      source runs for up to ``epoch_ms`` (:class:`EpochSourceGate`), then as above;
    * ``FINAL``: the last run of a micro-batch job: restore, then complete as a batch.
    """

    BATCH = "batch"
    STREAM_EPOCH = "stream-epoch"
    MICRO_EPOCH = "micro-epoch"
    FINAL = "final"

    @property
    def epoch(self) -> bool:
        """The run ends with the terminal epoch snapshot (state saved, no completion)."""
        return self is RunMode.STREAM_EPOCH or self is RunMode.MICRO_EPOCH

    @property
    def restores(self) -> bool:
        """Processors first restore the state committed by the previous epoch."""
        return self is not RunMode.BATCH


@dataclass
class VertexTask:
    """The ``mapPartitionsWithIndex`` function of one vertex (pickled to executors)."""

    vertex: str
    job_name: str
    local_parallelism: int
    member_count: int
    guarantee: ProcessingGuarantee
    suppliers: list[ProcessorSupplier] | None
    inbound: list[InboundSpec] = field(default_factory=list)
    outbound: list[OutboundSpec] = field(default_factory=list)
    mode: RunMode = RunMode.BATCH
    #: a Spark DataFrame/RDD/stream source: its processor emits the partition's rows,
    #: each converted by ``row_map_fn`` if given (``suppliers`` is then ``None``)
    row_source: bool = False
    row_map_fn: Callable[[Any], Any] | None = None
    #: a stream row source whose items are this column's values (not Rows)
    row_column: str | None = None
    #: a row source fed Arrow batches: the columns (:mod:`slipstream.spark.arrow`)
    row_arrow: tuple[str, ...] | None = None
    #: ... whose batches the JVM made: their serialized Arrow schema
    row_arrow_schema: bytes | None = None
    dataframe_sink: str | None = None
    services: Any = None
    #: the state to restore (``mode.restores``): a broadcast of ``{"restore": ...,
    #: "watermarks": ...}`` (see :class:`slipstream.spark.compile.EpochInput`)
    epoch_state: Any = None
    #: the custom partitioner that restore routing uses for this vertex (``None``: the
    #: default), to tell whether a saved entry belongs to its processor
    restore_partitioner: Any = None
    #: ``MICRO_EPOCH``: how long a source processor (no inbound edge) runs per epoch
    epoch_ms: float | None = None
    #: ``MICRO_EPOCH``: how many items a source processor emits per epoch, about (None:
    #: no bound; checked between its ``complete()`` calls)
    epoch_max_items: int | None = None
    #: the job's key for signing failure markers (:mod:`slipstream.spark.failures`)
    failure_key: bytes = b""
    #: a batch job: watermark inserters emit no watermark (``Context.hold_watermarks``)
    hold_watermarks: bool = False
    #: the bad-record policy (:func:`~slipstream.execution.plan.item_error_route`):
    #: ``None`` fails the task on an item whose code raises; ``(None, None)`` skips it;
    #: ``(ordinal, vertex)`` sends a dead letter on that outbound edge
    item_errors: tuple[int | None, str | None] | None = None

    def __call__(self, index: int, records: Iterator[Any]) -> Iterator[Record]:
        return self._run(index, records)

    # ------------------------------------------------------------------ the run
    def _run(self, index: int, records: Iterator[Any]) -> Iterator[Record]:
        """Build the processor and its tasklet, drive it while streaming the input in
        (:class:`~slipstream.spark.feed.InputFeed`) and the output out, then yield the
        task's result record."""
        global _tasks_in_process
        timing: dict[str, Any] = {"pid": os.getpid(), "fresh_worker": _tasks_in_process == 0}
        if not _heap_frozen:
            _freeze_worker_heap()
        timing["heap_frozen"] = _heap_frozen
        _tasks_in_process += 1
        started = time.perf_counter()
        cpu_started = time.process_time()
        waits = _Waits()
        if self.inbound or self.row_arrow is not None:
            # records of chunks or Arrow batches (a row source's rows are not timed one
            # by one)
            records = _timed_input(records, waits)
        member, local = divmod(index, self.local_parallelism)
        services = TaskServices(self.services)
        # an epoch of a streaming job snapshots every processor's state at its end
        guarantee = ProcessingGuarantee.EXACTLY_ONCE if self.mode.epoch else self.guarantee
        context = self._context(index, member, local, guarantee, services)
        if self.mode.restores and self.guarantee is ProcessingGuarantee.EXACTLY_ONCE:
            # two-phase sinks hold an epoch's output in its snapshot (Context.epoch_commit_id)
            context.epoch_commit_id = int((_value(self.epoch_state) or {}).get("write_id") or 0)
            context.epoch_final = self.mode is RunMode.FINAL
        feed: InputFeed | None = None
        supplier: ProcessorSupplier | None = None
        processor: Processor | None = None
        tasklet: ProcessorTasklet | None = None
        error: BaseException | None = None
        run = _RunState()
        try:
            if self.inbound:
                feed = InputFeed(
                    self.inbound,
                    index,
                    records,
                    exactly_once=self.guarantee is ProcessingGuarantee.EXACTLY_ONCE,
                    epoch=self.mode.epoch,
                    micro_batch_watermarks=context.micro_batch_watermarks,
                )
            supplier, processor = self._processor(member, local, records, run)
            outputs, collectors = self._outbound(index)
            tasklet = self._tasklet(index, processor, context, feed, collectors, guarantee, run)
            pack = self._chunk_packers(index)
            # an inserter's end-of-epoch watermark is its split's: its barrier says so
            # to the consumers, which take the highest (slipstream.spark.feed)
            split_wm = context.micro_batch_watermarks and bool(
                getattr(processor, "ends_epoch_at_split_watermark", False)
            )
            ready = time.perf_counter()
            timing["setup"] = ready - started
            clock = time.perf_counter
            for record in _drive(tasklet, feed, outputs, index, run.sent_wm, pack, split_wm):
                t0 = clock()
                yield record
                waits.output += clock() - t0
            timing["run"] = time.perf_counter() - ready - run.write_time
            timing["input_wait"] = waits.input
            timing["output_wait"] = waits.output
            timing["cpu"] = time.process_time() - cpu_started
        except GeneratorExit:
            error = RuntimeError("the Spark task was stopped")
            raise
        except ProcessorFailure as exc:
            error = exc  # an upstream processor failed (PySpark pipelined it into this task)
            raise
        except Exception as exc:
            error = exc
            raise encode_failure(self.vertex, index, exc, self.failure_key) from exc
        finally:
            _close(tasklet, processor, supplier, error, self.vertex, index, self.failure_key)

        assert tasklet is not None
        timing["restore_read"] = run.restore_read
        timing["kept_state"] = run.kept.get("outcome")
        timing["write_chunk"] = run.write_time
        yield from self._result_records(index, tasklet, context, services, run, timing)

    # ------------------------------------------------------------------ steps
    def _context(
        self,
        index: int,
        member: int,
        local: int,
        guarantee: ProcessingGuarantee,
        services: TaskServices,
    ) -> Context:
        lp = self.local_parallelism
        context = Context(
            vertex_name=self.vertex,
            global_processor_index=index,
            local_processor_index=local,
            local_parallelism=lp,
            total_parallelism=lp * self.member_count,
            member_index=member,
            member_count=self.member_count,
            processing_guarantee=guarantee,
            job_name=self.job_name,
            services=services,
        )
        context.hold_watermarks = self.hold_watermarks
        # a Structured Streaming epoch: the watermark is the whole micro-batch's (Spark's
        # rule), not each source split's; slipstream's own sources keep Jet's per-partition
        # coalescing (docs/spark.md, "Event time")
        context.micro_batch_watermarks = self.mode is RunMode.STREAM_EPOCH
        if self.item_errors is not None:
            side, target = self.item_errors
            # counted in context.metrics (items_skipped), which the result record sums;
            # the driver warns from those counts (no per-item report on an executor)
            context.item_errors = ItemErrors(
                context, skip=side is None, side_ordinal=side, target=target
            )
        return context

    def _processor(
        self, member: int, local: int, records: Iterator[Any], run: _RunState
    ) -> tuple[ProcessorSupplier | None, Processor]:
        """The processor (a row source's reads the partition's rows), gated for a
        micro-batch epoch if it is a source; ``run.epoch_source`` is what ends an
        epoch (see :class:`EpochSnapshotSink`)."""
        if self.row_source:
            if self.row_arrow is not None and self.row_column is not None:
                records = arrow_column(
                    records, self.row_arrow, self.row_column, self.row_arrow_schema
                )
            elif self.row_arrow is not None:
                records = arrow_rows(records, self.row_arrow, self.row_arrow_schema)
            elif self.row_column is not None:
                records = map(operator.itemgetter(self.row_column), records)  # by name
            if self.mode.epoch:
                rows = StreamRowSourceP(records, self.row_map_fn)
                run.epoch_source = rows
                return None, rows
            return None, RowSourceP(records, self.row_map_fn)
        supplier, processor = self._make_processor(member, local)
        if self.mode is RunMode.MICRO_EPOCH and not self.inbound:
            assert self.epoch_ms is not None
            gate = EpochSourceGate(processor, self.epoch_ms, self.epoch_max_items)
            run.epoch_source = run.gate = gate
            processor = cast(Processor, gate)
        return supplier, processor

    def _tasklet(
        self,
        index: int,
        processor: Processor,
        context: Context,
        feed: InputFeed | None,
        collectors: list[Collector],
        guarantee: ProcessingGuarantee,
        run: _RunState,
    ) -> ProcessorTasklet:
        """The shared tasklet over the feed's streams, restored from the previous
        epoch's state when the mode says so."""
        restore: list[Any] | None = None
        saved_wm: Any = None
        own: dict[str, Any] = {}
        if self.mode.restores:
            state = _value(self.epoch_state) or {}
            if self.mode.epoch:
                write = functools.partial(self._write_chunk, state, index, run)
                run.epoch_sink = EpochSnapshotSink(run.epoch_source, write)
            t0 = time.perf_counter()
            restore = restore_entries(state, self.vertex, index, own, run.kept)
            run.restore_read = time.perf_counter() - t0
            if own and self.mode.epoch:
                # restored from exactly its own chain: its keyed state tracks what changes
                # and saves a delta continuing that chain (the driver appends it)
                context.incremental_snapshots = True
                context.restored_snapshot_id = own["snapshot"]
                context._restored_maps = own["maps"]
                context._restored_states = []
            saved_wm = (state.get("watermarks") or {}).get((self.vertex, index))
            run.sent_wm = dict(saved_wm["sent"]) if saved_wm is not None else {}
        tasklet = ProcessorTasklet(
            processor,
            context,
            feed.streams if feed is not None else [],
            collectors,
            guarantee=guarantee,
            snapshot_sink=run.epoch_sink,
            restore_entries=restore,
            # a gated source's epoch may overshoot its max_items by one call's output:
            # that stays the engine's bucket
            outbox_capacity=TASK_OUTBOX_CAPACITY if run.gate is None else DEFAULT_BUCKET_CAPACITY,
        )
        if context.restored_snapshot_id:
            # a delta is relative to a committed snapshot (state.keyed): the one restored
            context.committed_snapshot_id = context.restored_snapshot_id
        if saved_wm is not None:
            restore_watermarks(tasklet, saved_wm)
        tasklet.init()
        return tasklet

    def _result_records(
        self,
        index: int,
        tasklet: ProcessorTasklet,
        context: Context,
        services: TaskServices,
        run: _RunState,
        timing: dict[str, Any] | None = None,
    ) -> Iterator[Record]:
        """The DataFrame sink's rows (if any), then the one result record of the task:
        metrics, the lists/maps it changed, an epoch's snapshot, and ``timing``: where
        the task's time went (s; ``fresh_worker``: the first task of its Python worker
        process; see ``SparkStreamingJob.epoch_breakdown``)."""
        metrics = {
            "items_in": tasklet.items_in,
            "items_out": sum(c.items_out for c in tasklet.collectors),
        }
        for k, v in context.metrics.items():
            metrics[k] = metrics.get(k, 0) + v
        excluded = [self.dataframe_sink] if self.dataframe_sink is not None else []
        lists, maps = services.changes(excluded)
        if self.dataframe_sink is not None:
            rows = services.lists.get(self.dataframe_sink, [])
            for start in range(0, len(rows), MAX_RECORD_ITEMS):
                yield (0, (ROWS_TAG, rows[start : start + MAX_RECORD_ITEMS]))
        result: dict[str, Any] = {
            "vertex": self.vertex,
            "index": index,
            "metrics": metrics,
            "lists": {name: PickledList.pack(items) for name, items in lists.items()},
            "maps": maps,
        }
        if timing is not None:
            result["timing"] = timing
        if run.epoch_sink is not None:
            saved = run.epoch_sink.result
            if saved is None:
                raise RuntimeError(
                    f"{self.vertex}#{index}: the epoch ended without the processor's "
                    "snapshot; this is a bug in the Spark engine"
                )
            result["snapshot"] = saved
            result["watermarks"] = {**capture_watermarks(tasklet), "sent": run.sent_wm}
            if _epoch_output_pending(tasklet.processor):
                # a two-phase sink's output waits in its chunk for the driver's commit
                # (slipstream.spark.epoch_commit)
                result["commit_pending"] = True
        if run.gate is not None:
            result["source_done"] = run.gate.done
        yield (0, (RESULT_TAG, result))

    # ------------------------------------------------------------------ helpers
    def _write_chunk(
        self, state: Mapping[str, Any], index: int, run: _RunState, entries: list[Any]
    ) -> dict[str, Any]:
        """Write this processor's saved ``entries`` into the checkpoint as snapshot
        ``state["write_id"]`` under a name unique to this task attempt."""
        t0 = time.perf_counter()
        try:
            written = self._write_epoch_chunk(state, index, entries)
            if self.mode.epoch:
                # the state this chunk brings the chain to stays in this worker process
                # for the next epoch's task (used only if the manifest names this chunk)
                remember_state(state, self.vertex, index, run.kept, entries, written)
            run.kept.pop("merged", None)
            return written
        finally:
            run.write_time += time.perf_counter() - t0

    def _write_epoch_chunk(
        self, state: Mapping[str, Any], index: int, entries: list[Any]
    ) -> dict[str, Any]:
        owner = key_routing(
            self.restore_partitioner, self.member_count, self.local_parallelism
        ).owner
        return write_epoch_chunk(
            state["store"],
            state["write_id"],
            self.vertex,
            index,
            _attempt_token(),
            entries,
            owner,
        )

    def _make_processor(self, member: int, local: int) -> tuple[ProcessorSupplier, Processor]:
        """The processor at ``local`` of the member's shipped supplier (the same creation
        as the embedded engine's, :func:`~slipstream.execution.plan.member_processors`);
        the member's other processors are closed unused."""
        assert self.suppliers is not None
        lp = self.local_parallelism
        supplier, procs = member_processors(
            self.suppliers[member],
            SupplierContext(
                self.vertex, self.job_name, lp, lp * self.member_count, self.member_count, member
            ),
        )
        for i, p in enumerate(procs):
            if i != local:
                try:
                    p.close()
                except Exception:  # noqa: BLE001 - an unused processor's close is best effort
                    pass
        return supplier, procs[local]

    def _chunk_packers(self, index: int) -> dict[int, Callable[[list[Any]], Any]]:
        """Per shuffled outbound edge, what wraps a chunk into a :class:`ShuffleChunk`."""
        return {
            spec.edge_id: functools.partial(
                ShuffleChunk, where=(self.vertex, index, spec.label), key=self.failure_key
            )
            for spec in self.outbound
            if not spec.narrow
        }

    def _outbound(
        self, index: int
    ) -> tuple[list[tuple[int, list[int], list[SpscQueue]]], list[Collector]]:
        outputs = []
        collectors: list[Collector] = []
        for spec in self.outbound:
            if spec.narrow:
                targets = [index]
                queues = [SpscQueue(UNBOUNDED)]
                collector: Collector = single_target_collector(spec.edge, spec.src, queues[0])
            else:
                targets = edge_targets(spec.edge, spec.src, spec.dst, index)
                queues = [SpscQueue(UNBOUNDED) for _ in targets]
                collector = make_collector(spec.edge, spec.src, spec.dst, index, queues)
            outputs.append((spec.edge_id, targets, queues))
            collectors.append(collector)
        return outputs, collectors


class _Waits:
    """Where a task's run waited (s): ``input``, for its next input record (the JVM's
    read, or the upstream task PySpark pipelined into this one); ``output``, for the
    consumer of a record it yielded (the shuffle writer pickling it, or the downstream
    task pipelined into this one)."""

    __slots__ = ("input", "output")

    def __init__(self) -> None:
        self.input = 0.0
        self.output = 0.0


def _timed_input(records: Iterator[Any], waits: _Waits) -> Iterator[Any]:
    """``records``, adding the time spent waiting for each to ``waits.input``."""
    clock = time.perf_counter
    it = iter(records)
    while True:
        t0 = clock()
        try:
            record = next(it)
        except StopIteration:
            waits.input += clock() - t0
            return
        waits.input += clock() - t0
        yield record


@dataclass
class _RunState:
    """What one task's steps share beyond the tasklet (epoch bookkeeping)."""

    #: what decides when an epoch ends (a stream row source or a gated source)
    epoch_source: StreamRowSourceP | EpochSourceGate | None = None
    gate: EpochSourceGate | None = None
    epoch_sink: EpochSnapshotSink | None = None
    #: epoch modes: the last watermark sent per outbound edge, across epochs
    sent_wm: dict[int, int] | None = None
    #: seconds spent reading the restored state (restore_entries) and writing the chunk
    restore_read: float = 0.0
    write_time: float = 0.0
    #: the own chain's restored state and whether it came from the worker's cache
    #: (:func:`~slipstream.spark.epoch_state.restore_entries`)
    kept: dict[str, Any] = field(default_factory=dict)


def _drive(
    tasklet: ProcessorTasklet,
    feed: InputFeed | None,
    outputs: list[tuple[int, list[int], list[SpscQueue]]],
    index: int,
    sent_wm: dict[int, int] | None,
    pack: dict[int, Callable[[list[Any]], Any]] | None = None,
    split_wm: bool = False,
) -> Iterator[Record]:
    """Call the tasklet until it is done, feeding it the next input record whenever it
    has consumed the last one (or cannot progress without more) and turning its output
    into records whenever enough has accumulated. No threads and no waiting: the input
    is an iterator and the output queues are unbounded. ``split_wm`` flags the terminal
    barrier's records (:func:`_drain`)."""
    seqs: dict[tuple[int, int], int] = {}
    calls = 0
    idle = 0
    call = tasklet.call
    while True:
        if feed is not None and feed.starved():
            passed = feed.pull()
            if passed is not None:
                yield passed  # an upstream task's result travels on
        r = call()
        if r == DONE:
            break
        if r == NO_PROGRESS:
            if feed is not None and not feed.exhausted:
                passed = feed.pull()
                if passed is not None:
                    yield passed
                continue
            # All input is in and the output is unbounded, so only a processor waiting
            # for time (or a never-ending source) gets here: back off.
            idle += 1
            if idle > 64:
                time.sleep(min(0.001, 0.00002 * (1 << min(idle - 64, 6))))
        else:
            idle = 0
        calls += 1
        if calls % _DRAIN_CHECK_EVERY == 0 and _pending(outputs) >= _DRAIN_THRESHOLD:
            yield from _drain(outputs, index, seqs, sent_wm, pack, split_wm)
    yield from _drain(outputs, index, seqs, sent_wm, pack, split_wm)
    if feed is not None:
        yield from feed.rest()


def _close(
    tasklet: ProcessorTasklet | None,
    processor: Processor | None,
    supplier: ProcessorSupplier | None,
    error: BaseException | None,
    vertex: str,
    index: int,
    failure_key: bytes,
) -> None:
    """Close the processor on failure (the tasklet closed it on success) and the
    supplier always; a supplier's close error fails an otherwise good task."""
    if error is not None:
        try:
            if tasklet is not None:
                tasklet.close()
            elif processor is not None:
                processor.close()
        except Exception:  # noqa: BLE001 - close errors must not hide the failure
            pass
    if supplier is not None:
        try:
            supplier.close(error)
        except Exception as exc:  # noqa: BLE001
            if error is None:
                raise encode_failure(vertex, index, exc, failure_key) from exc


class StreamRowSourceP(AbstractProcessor):
    """The source of one epoch of a streaming job: emits the micro-batch's rows, then
    never completes (``exhausted`` tells :class:`EpochSnapshotSink` to end the epoch with
    a terminal snapshot, so downstream processors keep their state instead of flushing
    it as they would at the end of a batch job)."""

    def __init__(self, rows: Iterator[Any], map_fn: Callable[[Any], Any] | None = None) -> None:
        self._it = iter(rows) if map_fn is None else map(map_fn, rows)
        self._plain = map_fn is None  # as RowSourceP's
        self.exhausted = False

    def complete(self) -> bool:
        if not self.exhausted and self.emit_from(self._it, plain=self._plain):
            self.exhausted = True
        return False


class EpochSourceGate:
    """Bounds one epoch of a slipstream source in a driver-driven micro-batch job.

    Stands in for the source processor in its tasklet (everything but ``complete()`` is
    the processor's own): ``complete()`` is passed on until ``epoch_ms`` have passed
    since the first call or the source reports it is done, and never reports completion
    itself, so the tasklet ends the epoch with the terminal snapshot barrier (the source
    saves its offset) instead of emitting end-of-stream. ``done`` tells the driver the
    source has nothing more: it then runs the job's final, completing run.

    With ``max_items`` the epoch also ends once the source has emitted that many items
    (counted on its first outbound bucket between ``complete()`` calls, so one call's
    worth more may come: a bounded batch, as Spark's ``maxOffsetsPerTrigger``).
    """

    def __init__(self, processor: Processor, epoch_ms: float, max_items: int | None = None) -> None:
        self._inner = processor
        self._epoch_s = epoch_ms / 1000.0
        self._deadline: float | None = None
        self._max_items = max_items
        #: items the source emitted in this epoch (counted only with ``max_items``)
        self.items = 0
        self.done = False

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (e.g. during copying): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    def complete(self) -> bool:
        if self.done or self._full():
            return False
        if self._deadline is None:
            self._deadline = time.monotonic() + self._epoch_s
        if self._max_items is None:
            if self._inner.complete():
                self.done = True
            return False
        buckets = getattr(getattr(self._inner, "outbox", None), "buckets", None)
        before = len(buckets[0]) if buckets else 0
        if self._inner.complete():
            self.done = True
        if buckets:
            # a bucket only grows during the call; the tasklet empties it in between
            self.items += max(0, len(buckets[0]) - before)
        return False

    def _full(self) -> bool:
        return self._max_items is not None and self.items >= self._max_items

    @property
    def exhausted(self) -> bool:
        """Whether the epoch should end: the source is done, its time is up, or it
        emitted ``max_items``."""
        return (
            self.done
            or self._full()
            or (self._deadline is not None and time.monotonic() >= self._deadline)
        )


#: The one snapshot of an epoch: terminal, so every processor saves its state, forwards
#: the barrier and closes (no complete(), no end-of-stream).
EPOCH_BARRIER = SnapshotBarrier(1, is_terminal=True)


class EpochSnapshotSink:
    """The tasklet's snapshot sink inside one epoch's task (the SnapshotSink protocol).

    Requests the terminal epoch barrier from a stream source once it has emitted all its
    rows, or from a gated source (:class:`EpochSourceGate`) once its epoch is over (other
    processors receive the barrier from upstream; one without any input gets it at once).
    When the processor has saved its state (``processor_done``), ``write`` turns its
    entries into a chunk in the checkpoint (:func:`~slipstream.spark.epoch_state.
    write_epoch_chunk`) before the task closes the processor; ``result`` is what the
    task hands the driver instead of the entries."""

    committed_id = 0
    hold_sources = False  # the epoch's state goes to the checkpoint, not to a store

    def __init__(
        self,
        source: StreamRowSourceP | EpochSourceGate | None,
        write: Callable[[list[Any]], dict[str, Any]],
    ) -> None:
        self.source = source
        self._write = write
        self.entries: list[Any] = []
        self.result: dict[str, Any] | None = None

    def requested_snapshot(self) -> SnapshotBarrier | None:
        if self.source is None or self.source.exhausted:
            return EPOCH_BARRIER
        return None

    def add_entries(self, tasklet: Any, snapshot_id: int, entries: list[Any]) -> None:
        self.entries.extend(entries)

    def processor_done(self, tasklet: Any, barrier: SnapshotBarrier) -> None:
        # the terminal barrier: the processor saved all its state and processes nothing
        # more, so its entries are encoded now, before it is closed
        entries, self.entries = self.entries, []
        self.result = self._write(entries)

    def add_completion_entries(self, tasklet: Any, entries: list[Any]) -> None:
        pass  # an epoch ends with its terminal barrier, never with complete()

    def tasklet_completed(self, tasklet: Any) -> None:
        pass


def capture_watermarks(tasklet: ProcessorTasklet) -> dict[str, Any]:
    """The watermark-coalescing state of a tasklet at the end of an epoch: per inbound
    edge (by ordinal) the watermark of each upstream queue, and across edges. Restored
    into the next epoch's tasklet, so watermarks continue across micro-batches: a new
    epoch does not start from "no watermark" on inputs that are silent in it."""
    return {
        "edges": {s.ordinal: s.coalescer.save_state() for s in tasklet.streams},
        "ordinals": [s.ordinal for s in tasklet.streams],
        "tasklet": tasklet.coalescer.save_state(),
    }


def restore_watermarks(tasklet: ProcessorTasklet, state: dict[str, Any]) -> None:
    """Prime a new epoch's tasklet with :func:`capture_watermarks` of the last epoch
    (skipped if the processor's inputs changed shape)."""
    if state["ordinals"] != [s.ordinal for s in tasklet.streams]:
        return
    for s in tasklet.streams:
        s.coalescer.restore_state(state["edges"][s.ordinal])
    tasklet.coalescer.restore_state(state["tasklet"])


def _freeze_worker_heap() -> None:
    """In a PySpark worker, at the start of its second Spark task: move every object the
    garbage collector tracks (the imported modules of PySpark, pyarrow and slipstream,
    ~38,000 objects) into the permanent generation (``gc.freeze``).

    PySpark's daemon runs ``gc.collect()`` in a reused worker after every task, and that
    full collection walked all of them: 13-17 ms of CPU per task (docs/performance.md,
    "count-10k's per-item path"), on an epoch's critical path where the next stage's
    task waits for its worker. At the second task that collection has just run, so what
    is frozen is what the worker keeps (modules, the kept state) and this task's own
    closure, once; objects made later are collected as before. Only in a Spark task
    (``TaskContext``): the in-process stand-ins and the driver run tasks in processes
    whose collector this must not change."""
    global _first_task, _heap_frozen
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the engine runs under pyspark
        return
    tc = TaskContext.get()
    if tc is None:
        return
    attempt = tc.taskAttemptId()
    if _first_task is None:
        _first_task = attempt
    elif attempt != _first_task:
        gc.freeze()
        _heap_frozen = True


def _attempt_token() -> str:
    """A name part unique to this task attempt: Spark's attempt number (when run by
    Spark) and random bits (task ids restart with every SparkContext, so a replay after
    a driver restart could reuse them)."""
    attempt = ""
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None:
            attempt = f"{tc.stageId()}.{tc.attemptNumber()}."
    except ImportError:  # pragma: no cover - the engine runs under pyspark
        pass
    return attempt + secrets.token_hex(8)


def _epoch_output_pending(processor: Any) -> bool:
    """Whether a two-phase sink holds this epoch's output for the driver's commit: the
    processor, or the one a fused chain runs inside (``InputFusedP.inner``)."""
    for _ in range(4):
        if processor is None:
            return False
        if getattr(processor, "epoch_output_pending", False):
            return True
        processor = getattr(processor, "inner", None)
    return False


def _value(broadcast: Any) -> Any:
    return getattr(broadcast, "value", broadcast)


def _pending(outputs: list[tuple[int, list[int], list[SpscQueue]]]) -> int:
    n = 0
    for _e, _t, queues in outputs:
        for q in queues:
            n += q.put_count - q.take_count
    return n


class ShuffleChunk:
    """A chunk of items on a shuffled edge. It pickles its items itself, so an item that
    cannot be pickled fails the job naming the vertex, processor and edge, instead of
    failing inside the shuffle writer with no hint of where the item came from. It
    unpickles as the plain ``list`` of items (by ``pickle.loads``, or for a chunk of
    strings by :func:`~slipstream.execution.remote.unpack_text`: the consumer needs
    nothing of this class).

    A chunk whose items are all exactly ``str`` and none contains the separator (a
    text line, a word, a key) travels as one string of them joined, as on a
    cross-process edge (:func:`~slipstream.execution.remote.pack_text`): the pickler then
    writes one string, not an opcode, a length and a memo entry per item, and the
    consumer splits it at C speed (250,000 lines of the bench's count-10k: 13 ms to
    pickle item by item, 7 ms joined; docs/performance.md, "count-10k's per-line
    cost"). A chunk of one named-tuple class's items (window results) travels as the
    class and plain tuples, as a list sink's items do (:class:`PickledList`)."""

    __slots__ = ("items", "where", "key")

    def __init__(self, items: list[Any], *, where: tuple[str, int, str], key: bytes) -> None:
        self.items = items
        self.where = where
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        items = self.items
        text = pack_text(items) if items else None
        if text is not None:
            return (unpack_text, (text,))
        try:
            rows = pickle_named_rows(items)
            if rows is not None:
                # window results: as their class and plain tuples (PickledList's docstring)
                return (named_rows, (rows,))
            data = pickle.dumps(self.items, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            vertex, index, edge = self.where
            error = pickle.PicklingError(
                f"{edge}: an item cannot be pickled ({type(exc).__name__}: {exc}); items "
                "that travel between Spark tasks (shuffled edges) must pickle"
            )
            raise encode_failure(vertex, index, error, self.key) from exc
        return (pickle.loads, (data,))


def _drain(
    outputs: list[tuple[int, list[int], list[SpscQueue]]],
    index: int,
    seqs: dict[tuple[int, int], int],
    sent_wm: dict[int, int] | None = None,
    pack: dict[int, Callable[[list[Any]], Any]] | None = None,
    split_wm: bool = False,
) -> Iterator[Record]:
    """Turn everything in the output queues into records, merging consecutive chunks.

    With ``sent_wm`` (epoch mode) a watermark not above the last one this producer sent
    on the edge, in this or an earlier epoch, is dropped: a restored processor may repeat
    a lower one (e.g. ``insert_watermarks`` restores the minimum over its peers), and
    the consumers' coalescers continue from the last epoch, where watermarks on a queue
    must strictly increase. Such a watermark says nothing new.

    ``pack`` wraps the chunks of shuffled edges (:meth:`VertexTask._chunk_packers`).

    ``split_wm``: the producer is a watermark inserter of a Structured Streaming epoch
    (``ends_epoch_at_split_watermark``); its terminal barrier's records carry a fifth
    field, ``True``, so the consumers bring the edge to the highest of the inserters'
    watermarks before the barrier (:class:`~slipstream.spark.feed.InputFeed`)."""
    for edge_id, targets, queues in outputs:
        wrap = pack.get(edge_id) if pack else None
        start = sent_wm.get(edge_id) if sent_wm is not None else None
        top = start
        for target, q in zip(targets, queues, strict=True):
            entries = q.entries
            if not entries:
                continue
            # the record sequence of this (edge, target) queue: a consumer restores the
            # order from it (it is part of the shuffle's sort key)
            seq = itertools.count(seqs.get((edge_id, target), 0))
            floor = start  # every queue of the edge gets the same specials, in order
            parts: list[list[Any]] = []
            size = 0
            taken = 0
            while entries:
                entry = entries.popleft()
                if type(entry) is list:
                    n = len(entry)
                    taken += n
                    if size + n > MAX_RECORD_ITEMS and parts:
                        yield (target, (edge_id, index, next(seq), _merge(parts, wrap)))
                        parts = []
                        size = 0
                    parts.append(entry)
                    size += n
                    continue
                taken += 1
                if sent_wm is not None and type(entry) is Watermark:
                    if floor is not None and entry.timestamp <= floor:
                        continue
                    floor = entry.timestamp
                    if top is None or floor > top:
                        top = floor
                if parts:
                    yield (target, (edge_id, index, next(seq), _merge(parts, wrap)))
                    parts = []
                    size = 0
                if split_wm and type(entry) is SnapshotBarrier and entry.is_terminal:
                    yield (target, (edge_id, index, next(seq), entry, True))
                    continue
                yield (target, (edge_id, index, next(seq), entry))
            if parts:
                yield (target, (edge_id, index, next(seq), _merge(parts, wrap)))
            seqs[(edge_id, target)] = next(seq)
            q.take_count += taken
        if sent_wm is not None and top is not None:
            sent_wm[edge_id] = top


def _merge(parts: list[list[Any]], wrap: Callable[[list[Any]], Any] | None = None) -> Any:
    if len(parts) == 1:
        out = parts[0]
    else:
        out = []
        for p in parts:
            out.extend(p)
    return out if wrap is None else wrap(out)
