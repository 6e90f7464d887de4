"""Compiling a batch DAG into Spark RDDs (driver side).

Every vertex becomes one RDD with one partition per processor: partition ``i`` runs the
processor with global index ``i`` through :class:`slipstream.spark.task.VertexTask`,
which drives it with the embedded engine's ``ProcessorTasklet``. How a vertex's RDD gets
its input:

* a source vertex (no inbound edge): ``sc.parallelize(range(n), n)``, one dummy element
  per partition; a DataFrame/RDD source (:mod:`slipstream.spark.io`): the Spark data
  itself, coalesced or repartitioned to ``n`` partitions (a stream source's micro-batch
  as serialized Arrow batches where it can, :mod:`slipstream.spark.arrow`);
* a vertex whose only inbound edge is *narrow* (member-local unicast or isolated between
  equal parallelism): the producer's RDD, partition ``i`` feeding processor ``i``. No
  shuffle; PySpark pipelines both tasks into one Python worker. (Unicast lets any
  consumer take an item, so keeping it on the producer's index is a valid choice);
* any other vertex: the records of all its inbound edges (each producer already routed
  them with the embedded engine's collectors, so a record names its target processor)
  are unioned and shuffled to their target by an *ordered* shuffle
  (:mod:`slipstream.spark.shuffle`): Spark sorts each partition on the JVM (spilling
  to disk as needed) so that higher-priority edges come first and each producer's
  records keep their order, and the task streams them into its tasklet. Priority
  between edges stays the tasklet's job, exactly as on the embedded engine.

Each task also yields one result record (metrics, the lists/maps it wrote). Results
travel downstream along each vertex's ordinal-0 outbound edge and are collected from the
DAG's terminal vertices by one ``collect()``, so a Spark task retry never counts twice
(unlike accumulators updated in transformations).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slipstream.core.config import JobConfig
from slipstream.core.dag import DAG, Edge, RoutingPolicy, Vertex
from slipstream.core.errors import DagError
from slipstream.core.pickling import cloudpickle
from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)
from slipstream.core.traits import all_sources_bounded
from slipstream.execution.plan import (
    VertexPlan,
    edge_label,
    edge_targets,
    effective_parallelism,
    item_error_route,
)
from slipstream.spark.arrow import arrow_partitions
from slipstream.spark.feed import RESULT_TAG, ROWS_TAG
from slipstream.spark.file_splits import split_file_scan
from slipstream.spark.io import SparkDataFrameSink, SparkRowSource, SparkStreamSource
from slipstream.spark.shuffle import ordered_shuffle
from slipstream.spark.task import InboundSpec, OutboundSpec, RunMode, VertexTask
from slipstream.state.restore import custom_partitioners

__all__ = ["CompiledDag", "EpochInput", "compile_dag", "is_narrow", "plan_vertices", "validate"]


class _StubMetaSupplier(ProcessorMetaSupplier):
    """Stands in for a vertex's supplier in the routing-only copies of edges shipped to
    executors (the real suppliers travel separately, one per member)."""


def _stub_vertex(vertex: Vertex, lp: int) -> Vertex:
    stub = Vertex(vertex.name, _StubMetaSupplier())
    stub.local_parallelism(lp)
    return stub


def _is_result(record: tuple[int, tuple[Any, ...]]) -> bool:
    return record[1][0] == RESULT_TAG


def _is_rows(record: tuple[int, tuple[Any, ...]]) -> bool:
    return record[1][0] == ROWS_TAG


def _rows_of(record: tuple[int, tuple[Any, ...]]) -> list[Any]:
    return record[1][1]  # type: ignore[no-any-return]


class _EdgeFilter:
    """Keeps the records of some edges of a producer (and, for the one consumer that
    forwards them, the upstream task results)."""

    def __init__(self, edge_ids: frozenset[int], keep_results: bool) -> None:
        self.edge_ids = edge_ids
        self.keep_results = keep_results

    def __call__(self, record: tuple[int, tuple[Any, ...]]) -> bool:
        tag = record[1][0]
        if tag >= 0:
            return tag in self.edge_ids
        return self.keep_results and tag == RESULT_TAG


@dataclass
class CompiledDag:
    """The Spark side of one job: ``result_rdd.collect()`` runs it."""

    order: list[str]
    total_parallelism: dict[str, int]
    result_rdd: Any
    persisted: list[Any] = field(default_factory=list)
    #: DataFrame sink name -> (rows RDD, schema, the persisted vertex RDD behind it)
    dataframes: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)
    #: DataFrame sinks that write their rows (a path or a table), by name
    writers: dict[str, SparkDataFrameSink] = field(default_factory=dict)
    meta_suppliers: list[tuple[str, ProcessorMetaSupplier]] = field(default_factory=list)
    #: each vertex's task function (what Spark pickles into its stage's closure)
    tasks: list[VertexTask] = field(default_factory=list)
    #: the stream source vertices whose rows come as Arrow batches (slipstream.spark.arrow)
    arrow_sources: list[str] = field(default_factory=list)


def is_narrow(edge: Edge, src: VertexPlan, dst: VertexPlan, in_degree: int) -> bool:
    """Whether ``edge`` can keep processor ``i``'s output on consumer ``i`` (no shuffle):
    the consumer's only inbound edge is member-local between equal parallelism, and
    either unicast or isolated (consumer ``i`` is a valid choice for producer ``i``), or
    of any routing with one processor per member (``i`` is the only target)."""
    if in_degree != 1 or edge.is_distributed:
        return False
    if src.local_parallelism != dst.local_parallelism or src.member_count != dst.member_count:
        return False
    if edge.routing in (RoutingPolicy.UNICAST, RoutingPolicy.ISOLATED):
        return True
    return dst.local_parallelism == 1


def _member_suppliers(
    vertex: Vertex,
    meta: ProcessorMetaSupplier,
    sctx: SupplierContext,
    addresses: Sequence[MemberAddress],
) -> list[ProcessorSupplier]:
    """Run the coordinator half of the supplier chain on the driver: one supplier per
    member, checked to pickle (they are shipped to executors)."""
    meta.init(sctx)
    by_address = meta.get(list(addresses))
    suppliers: list[ProcessorSupplier] = []
    for address in addresses:
        s: Any = by_address(address)
        if not isinstance(s, ProcessorSupplier):
            if not callable(s):
                raise DagError(
                    f"vertex {vertex.name!r}: the meta-supplier returned {type(s).__name__} "
                    f"for member {address}, expected a ProcessorSupplier or a callable"
                )
            s = FactorySupplier(s)
        suppliers.append(s)
    try:
        cloudpickle.dumps(suppliers)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's
        raise DagError(
            f"vertex {vertex.name!r}: the processor supplier its meta-supplier returned "
            f"cannot be pickled ({type(exc).__name__}: {exc}); it must be picklable with "
            "cloudpickle to run on Spark executors"
        ) from exc
    return suppliers


@dataclass
class EpochInput:
    """What makes a compilation one epoch of a streaming job: the epoch's rows for each
    stream source vertex (``streams``: vertex name -> RDD) and the state carried from
    the previous epoch (a broadcast of ``{"restore": {(vertex, index): entries} | None,
    "watermarks": {...}, "store": {"directory", "key"}, "restore_id", "chains",
    "rescaled", "write_id"}``: the entries the driver routed, the chains of the
    committed snapshot ``restore_id`` the tasks read themselves, the chunks rerouted by
    key after a change of parallelism and the snapshot they write, see
    :mod:`slipstream.spark.epoch_state`).

    Without ``streams`` the epoch belongs to a driver-driven micro-batch job whose
    sources are slipstream processors: each source processor runs for up to
    ``epoch_ms`` (:class:`~slipstream.spark.task.EpochSourceGate`). ``final`` makes it
    that job's last run: processors restore the state, then complete as in a batch job
    (windows flush) and take no snapshot."""

    streams: Mapping[str, Any] | None
    state: Any = None
    epoch_ms: float | None = None
    final: bool = False
    #: a micro-batch job's bound on the items a source processor emits per epoch
    epoch_max_items: int | None = None
    #: per stream source vertex, the physical plan its micro-batch's rows came from
    #: (:func:`slipstream.spark.file_splits.micro_batch_plan`), where known
    plans: Mapping[str, Any] | None = None

    @property
    def mode(self) -> RunMode:
        if self.streams is not None:
            return RunMode.STREAM_EPOCH
        return RunMode.FINAL if self.final else RunMode.MICRO_EPOCH


def validate(dag: DAG, default_parallelism: int, member_count: int = 1) -> None:
    """``dag.validate`` with the pickle check, minus the priority-diamond check: a
    diamond can deadlock the embedded engine's bounded queues, but here every shuffle
    has all of its producers' output before its consumers start and a task's own
    queues are unbounded, so it cannot."""
    dag.validate(
        default_parallelism=default_parallelism,
        check_pickle=True,
        member_count=member_count,
        bounded_queues=False,
    )


def plan_vertices(
    dag: DAG, member_count: int, default_parallelism: int, validate_keys: bool = False
) -> dict[str, VertexPlan]:
    """Parallelism of every vertex (topological order), as routing-only plans whose
    vertices are stubs (no suppliers); ``validate_keys`` is ``JobConfig.validate_keys``."""
    plans: dict[str, VertexPlan] = {}
    for v in dag.topological_order():
        lp = effective_parallelism(v, default_parallelism)
        plans[v.name] = VertexPlan(
            _stub_vertex(v, lp), lp, member_count, validate_keys=validate_keys
        )
    return plans


def _check_vertex(v: Vertex, has_inbound: bool, mode: RunMode) -> None:
    """Which sources and sinks a run mode allows (a DagError otherwise)."""
    meta = v.meta_supplier
    stream_source = isinstance(meta, SparkStreamSource)
    row_source = isinstance(meta, SparkRowSource) and not stream_source
    if (row_source or stream_source) and has_inbound:
        raise DagError(f"vertex {v.name!r}: a Spark DataFrame/RDD source cannot have inbound edges")
    if mode is RunMode.BATCH:
        if stream_source:
            raise DagError(
                f"vertex {v.name!r}: a Spark streaming source needs a streaming job "
                "(SparkEngine.new_job starts one when the DAG has a spark_stream_source)"
            )
        return
    if mode is not RunMode.STREAM_EPOCH:
        if stream_source or row_source:
            raise DagError(
                f"vertex {v.name!r}: a micro-batch job (new_job(..., streaming=True)) "
                "reads slipstream's own replayable sources only, not a Spark "
                "DataFrame/RDD or stream source (a DAG with a spark_stream_source runs "
                "as a Structured Streaming query)"
            )
    elif not has_inbound and not stream_source:
        raise DagError(
            f"vertex {v.name!r}: in a streaming job on Spark every source must be a "
            "spark_stream_source (other sources would run again in every micro-batch)"
        )
    if isinstance(meta, SparkDataFrameSink) and not meta.writes:
        raise DagError(
            f"vertex {v.name!r}: in a streaming job a spark_dataframe_sink must write its "
            "rows each epoch (give it path= or table=); get_dataframe is for batch jobs"
        )


class _Compiler:
    """One compilation: the DAG's plans and edge ids, and the RDDs built so far."""

    def __init__(
        self,
        sc: Any,
        dag: DAG,
        config: JobConfig,
        job_name: str,
        member_count: int,
        default_parallelism: int,
        addresses: Sequence[MemberAddress],
        services: Any,
        epoch: EpochInput | None,
        failure_key: bytes,
    ) -> None:
        self.sc = sc
        self.failure_key = failure_key
        self.dag = dag
        self.config = config
        self.job_name = job_name
        self.member_count = member_count
        self.addresses = addresses
        self.services = services
        self.epoch = epoch
        self.mode = epoch.mode if epoch is not None else RunMode.BATCH
        # a batch job's watermark inserters hold their watermarks, as on the embedded
        # engine (JobConfig.batch_watermarks)
        self.hold_watermarks = (
            self.mode is RunMode.BATCH
            and not config.batch_watermarks
            and all_sources_bounded(dag)
        )
        self.edge_ids = {id(e): i for i, e in enumerate(dag.edges)}
        self.plans = plan_vertices(dag, member_count, default_parallelism, config.validate_keys)
        self.stubs = {name: p.vertex for name, p in self.plans.items()}
        self.rdds: dict[str, Any] = {}
        #: stream source vertices fed Arrow batches (slipstream.spark.arrow): their columns
        self.arrow: dict[str, tuple[str, ...]] = {}
        #: ... and the serialized schema of those whose batches the JVM made
        self.arrow_schema: dict[str, bytes] = {}

    def in_specs(self, v: Vertex, inbound: list[Edge]) -> list[InboundSpec]:
        """For each inbound edge, which producers feed each of ``v``'s processors."""
        plan = self.plans[v.name]
        specs = []
        for e in inbound:
            src = self.plans[e.source.name]
            producers: list[list[int]] = [[] for _ in range(plan.total_parallelism)]
            narrow = is_narrow(e, src, plan, len(inbound))
            for p in range(src.total_parallelism):
                for c in [p] if narrow else edge_targets(e, src, plan, p):
                    producers[c].append(p)
            specs.append(
                InboundSpec(
                    self.edge_ids[id(e)],
                    e.dest_ordinal,
                    e.get_priority(),
                    edge_label(e),
                    producers,
                )
            )
        return specs

    def out_specs(self, v: Vertex) -> list[OutboundSpec]:
        """Routing-only copies of ``v``'s outbound edges (stub vertices, no suppliers)."""
        plan = self.plans[v.name]
        specs = []
        for e in self.dag.outbound_edges(v):
            dst = self.plans[e.dest.name]  # type: ignore[union-attr]
            routing_edge = copy.copy(e)
            routing_edge.source = self.stubs[e.source.name]
            routing_edge.dest = self.stubs[dst.vertex.name]
            in_degree = len(self.dag.inbound_edges(dst.vertex.name))
            specs.append(
                OutboundSpec(
                    self.edge_ids[id(e)],
                    e.source_ordinal,
                    routing_edge,
                    plan,
                    dst,
                    is_narrow(e, plan, dst, in_degree),
                    edge_label(e),
                )
            )
        return specs

    def task(self, v: Vertex, inbound: list[Edge]) -> VertexTask:
        plan = self.plans[v.name]
        meta = v.meta_supplier
        row_source = isinstance(meta, SparkRowSource)
        suppliers = None
        if not row_source:
            sctx = SupplierContext(
                v.name,
                self.job_name,
                plan.local_parallelism,
                plan.total_parallelism,
                self.member_count,
            )
            suppliers = _member_suppliers(v, meta, sctx, self.addresses)
        epoch = self.epoch
        row_column, row_map_fn = _source_items(meta)
        return VertexTask(
            vertex=v.name,
            job_name=self.job_name,
            local_parallelism=plan.local_parallelism,
            member_count=self.member_count,
            guarantee=self.config.processing_guarantee,
            suppliers=suppliers,
            inbound=self.in_specs(v, inbound),
            outbound=self.out_specs(v),
            mode=self.mode,
            row_source=row_source,
            row_map_fn=row_map_fn,
            row_column=row_column,
            row_arrow=self.arrow.get(v.name),
            row_arrow_schema=self.arrow_schema.get(v.name),
            dataframe_sink=meta.name if isinstance(meta, SparkDataFrameSink) else None,
            services=self.services,
            epoch_state=epoch.state if epoch is not None else None,
            restore_partitioner=custom_partitioners(self.dag).get(v.name)
            if epoch is not None
            else None,
            epoch_ms=epoch.epoch_ms
            if epoch is not None and self.mode is RunMode.MICRO_EPOCH
            else None,
            epoch_max_items=epoch.epoch_max_items
            if epoch is not None and self.mode is RunMode.MICRO_EPOCH
            else None,
            failure_key=self.failure_key,
            hold_watermarks=self.hold_watermarks,
            item_errors=item_error_route(self.dag, v, self.config.on_item_error),
        )

    def input_rdd(self, v: Vertex, inbound: list[Edge]) -> Any:
        """The RDD whose partition ``i`` feeds processor ``i`` of ``v`` (module doc)."""
        n = self.plans[v.name].total_parallelism
        meta = v.meta_supplier
        if not inbound:
            if isinstance(meta, SparkStreamSource):
                assert self.epoch is not None
                assert self.epoch.streams is not None
                rdd, fields, schema = _stream_partitions(
                    self.epoch.streams[v.name],
                    n,
                    column=meta.items()[0],
                    origin=meta.streaming_df,
                    plan=(self.epoch.plans or {}).get(v.name),
                )
                if fields is not None:
                    self.arrow[v.name] = fields
                if schema is not None:
                    self.arrow_schema[v.name] = schema
                return rdd
            if isinstance(meta, SparkRowSource):
                return _with_partitions(meta.spark_rdd(), n)
            return self.sc.parallelize(range(n), n)
        first = inbound[0]
        if is_narrow(first, self.plans[first.source.name], self.plans[v.name], len(inbound)):
            return _input_from(first.source.name, v.name, self.dag, self.rdds, self.edge_ids)
        parts = [
            _input_from(name, v.name, self.dag, self.rdds, self.edge_ids)
            for name in dict.fromkeys(e.source.name for e in inbound)
        ]
        union = parts[0] if len(parts) == 1 else self.sc.union(parts)
        priorities = sorted({e.get_priority() for e in inbound})
        ranks = {self.edge_ids[id(e)]: priorities.index(e.get_priority()) for e in inbound}
        return ordered_shuffle(union, n, ranks)


def compile_dag(
    sc: Any,
    dag: DAG,
    config: JobConfig,
    *,
    job_name: str,
    member_count: int,
    default_parallelism: int,
    addresses: Sequence[MemberAddress],
    services: Any = None,
    persist_level: Any = None,
    epoch: EpochInput | None = None,
    failure_key: bytes = b"",
) -> CompiledDag:
    """Validate ``dag`` and build its RDDs (lazily: nothing runs until the caller
    collects ``result_rdd``). Raises :class:`DagError` for an invalid DAG or a supplier
    that does not pickle.

    With ``epoch``, the DAG is compiled as one micro-batch of a streaming job: the stream
    sources read ``epoch.streams``, processors restore the previous epoch's state and
    end with a terminal snapshot instead of completing (see :mod:`slipstream.spark.task`).
    ``failure_key`` signs the tasks' failure markers (:mod:`slipstream.spark.failures`).
    """
    from pyspark import StorageLevel

    level = persist_level if persist_level is not None else StorageLevel.MEMORY_AND_DISK
    validate(dag, default_parallelism, member_count)
    c = _Compiler(
        sc,
        dag,
        config,
        job_name,
        member_count,
        default_parallelism,
        addresses,
        services,
        epoch,
        failure_key,
    )
    order = dag.topological_order()
    compiled = CompiledDag(
        order=[v.name for v in order],
        total_parallelism={name: p.total_parallelism for name, p in c.plans.items()},
        result_rdd=None,
    )
    consumers = {v.name: {e.dest.name for e in dag.outbound_edges(v)} for v in order}  # type: ignore[union-attr]
    for v in order:
        inbound = dag.inbound_edges(v)
        _check_vertex(v, bool(inbound), c.mode)
        input_rdd = c.input_rdd(v, inbound)
        task = c.task(v, inbound)
        compiled.tasks.append(task)
        compiled.meta_suppliers.append((v.name, v.meta_supplier))
        rdd = input_rdd.mapPartitionsWithIndex(task)
        df_sink = task.dataframe_sink
        if len(consumers[v.name]) > 1 or df_sink is not None:
            # named only here, where persist() makes its JVM RDD anyway: naming a
            # PySpark RDD makes its JVM RDD (pickling its whole pipelined function),
            # and a vertex pipelined into the next vertex's task would make one that
            # never runs (docs/performance.md, "The driver's share of an epoch")
            rdd.setName(f"slipstream vertex {v.name!r}")
            rdd = rdd.persist(level)
            compiled.persisted.append(rdd)
        c.rdds[v.name] = rdd
        if df_sink is not None:
            meta = v.meta_supplier
            assert isinstance(meta, SparkDataFrameSink)
            rows = rdd.filter(_is_rows).flatMap(_rows_of)
            compiled.dataframes[df_sink] = (rows, meta.schema, rdd)
            if meta.writes:
                compiled.writers[df_sink] = meta

    compiled.arrow_sources = sorted(c.arrow)
    terminal = [c.rdds[v.name] for v in order if not consumers[v.name]]
    results = terminal[0] if len(terminal) == 1 else sc.union(terminal)
    compiled.result_rdd = results.filter(_is_result)
    return compiled


def _input_from(
    producer: str, consumer: str, dag: DAG, rdds: dict[str, Any], edge_ids: dict[int, int]
) -> Any:
    """The producer's records meant for ``consumer`` (plus upstream results if the
    consumer is the one that forwards them: the target of ordinal 0)."""
    out = dag.outbound_edges(producer)
    mine = frozenset(edge_ids[id(e)] for e in out if e.dest.name == consumer)  # type: ignore[union-attr]
    keep_results = out[0].dest.name == consumer  # type: ignore[union-attr]
    rdd = rdds[producer]
    return rdd.filter(_EdgeFilter(mine, keep_results))


def _stream_partitions(
    stream: Any, n: int, column: str | None = None, origin: Any = None, plan: Any = None
) -> tuple[Any, tuple[str, ...] | None, bytes | None]:
    """A micro-batch's rows in ``n`` partitions, and the column names when they come as
    Arrow batches (:func:`slipstream.spark.arrow.arrow_partitions`: a DataFrame of plain
    column types, pyarrow installed; with the serialized schema when the JVM made the
    batches), else ``None``: the rows of an RDD as
    :func:`_with_partitions`, of a DataFrame with fewer partitions than ``n`` (a small
    file is one) repartitioned on the JVM (``DataFrame.repartition``) before they become
    Python rows: an RDD's ``repartition`` would convert every row to a Python ``Row``,
    pickle it again in batches of ten and shuffle those, which took half of an epoch's
    time at 500k rows (docs/performance.md). ``column``: the source reads that column's
    values (``spark_stream(df, column=...)``), which takes larger Arrow batches.

    First, where the source reads a column's values, a micro-batch of ``origin`` (the
    stream's DataFrame) read in fewer partitions than ``n`` (one small file) is read in
    ``n`` byte ranges, one per source processor, where its format allows
    (:func:`slipstream.spark.file_splits.split_file_scan`): the JVM's read is then the
    longer side of the source stage, and both cores share it, with no shuffle of its
    rows. A source that makes a ``Row`` per row is not split: its Python is the longer
    side and the read's JVM thread already takes the other core (a one-file count-10k
    epoch took 0.57 s unsplit against 0.61 s split, docs/performance.md). Parts of at
    most a few MB of text go to their tasks as one Arrow batch each. ``plan``: the
    physical plan the micro-batch's rows came from, which then makes a column's Arrow
    batches (no copy of each row by a scan of the micro-batch's RDD:
    :func:`slipstream.spark.file_splits.micro_batch_plan`)."""
    if hasattr(stream, "mapPartitionsWithIndex"):
        return _with_partitions(stream, n), None, None
    one_batch = False
    if origin is not None and column is not None:
        _cut, one_batch = split_file_scan(stream, origin, n)
    arrow = arrow_partitions(
        stream,
        n,
        large_batches=column is not None,
        one_batch=one_batch,
        # measured faster for a column's values only (count-10k 0.49 -> 0.45 s/epoch);
        # a Row per line (the window row) showed no gain (docs/performance.md)
        plan=plan if column is not None else None,
    )
    if arrow is not None:
        return arrow
    rdd = stream.rdd
    if hasattr(stream, "repartition") and rdd.getNumPartitions() < n:
        return stream.repartition(n).rdd, None, None
    return _with_partitions(rdd, n), None, None


def _source_items(meta: Any) -> tuple[str | None, Any]:
    """A row source's ``(column, map_fn)``: what its items are made of
    (:meth:`SparkStreamSource.items`); ``(None, None)`` for other vertices."""
    if isinstance(meta, SparkStreamSource):
        return meta.items()
    if isinstance(meta, SparkRowSource):
        return None, meta.map_fn
    return None, None


def _with_partitions(rdd: Any, n: int) -> Any:
    have = rdd.getNumPartitions()
    if have == n:
        return rdd
    if have > n:
        return rdd.coalesce(n)
    return rdd.repartition(n)
