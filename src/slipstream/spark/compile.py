"""Compiling a batch DAG into Spark RDDs (driver side).

Every vertex becomes one RDD with one partition per processor: partition ``i`` runs the
processor with global index ``i`` through :class:`slipstream.spark.task.VertexTask`,
which drives it with the embedded engine's ``ProcessorTasklet``. How a vertex's RDD gets
its input:

* a source vertex (no inbound edge): ``sc.parallelize(range(n), n)``, one dummy element
  per partition; a DataFrame/RDD source (:mod:`slipstream.spark.io`): the Spark data
  itself, coalesced or repartitioned to ``n`` partitions;
* a vertex whose only inbound edge is *narrow* (member-local unicast or isolated between
  equal parallelism): the producer's RDD, partition ``i`` feeding processor ``i``. No
  shuffle; PySpark pipelines both tasks into one Python worker. (Unicast lets any
  consumer take an item, so keeping it on the producer's index is a valid choice);
* any other vertex: the records of all its inbound edges (each producer already routed
  them with the embedded engine's collectors, so a record names its target processor)
  are unioned and shuffled with ``partitionBy(n, identity)``. Priority between edges is
  the tasklet's job, exactly as on the embedded engine: the whole input is present, so
  the high-priority edge is drained completely first.

Each task also yields one result record (metrics, the lists/maps it wrote). Results
travel downstream along each vertex's ordinal-0 outbound edge and are collected from the
DAG's terminal vertices by one ``collect()``, so a Spark task retry never counts twice
(unlike accumulators updated in transformations).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from slipstream.core.config import JobConfig
from slipstream.core.dag import DAG, DagWarning, Edge, RoutingPolicy, Vertex
from slipstream.core.errors import DagError
from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)
from slipstream.engine.plan import VertexPlan, edge_targets, effective_parallelism
from slipstream.spark.io import SparkDataFrameSink, SparkRowSource, SparkStreamSource
from slipstream.spark.task import (
    RESULT_TAG,
    ROWS_TAG,
    InboundSpec,
    OutboundSpec,
    VertexTask,
)

__all__ = ["CompiledDag", "EpochInput", "compile_dag", "is_narrow", "plan_vertices", "validate"]


class _StubMetaSupplier(ProcessorMetaSupplier):
    """Stands in for a vertex's supplier in the routing-only copies of edges shipped to
    executors (the real suppliers travel separately, one per member)."""


def _stub_vertex(vertex: Vertex, lp: int) -> Vertex:
    stub = Vertex(vertex.name, _StubMetaSupplier())
    stub.local_parallelism(lp)
    return stub


def _identity(key: int) -> int:
    return key


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
    meta_suppliers: list[tuple[str, ProcessorMetaSupplier]] = field(default_factory=list)


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


def _edge_label(edge: Edge) -> str:
    dest = edge.dest.name  # type: ignore[union-attr]
    return f"edge {edge.source.name!r} -> {dest!r} (ordinal {edge.dest_ordinal})"


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
    """What makes a compilation one epoch of a streaming job: the epoch's rows for the
    stream source vertex and the state carried from the previous epoch (a broadcast of
    ``{"restore": {(vertex, index): entries} | None, "watermarks": {...}}``).

    Without ``stream_rdd`` the epoch belongs to a driver-driven micro-batch job whose
    sources are slipstream processors: each source processor runs for up to
    ``epoch_ms`` (:class:`~slipstream.spark.task.EpochSourceGate`). ``final`` makes it
    that job's last run: processors restore the state, then complete as in a batch job
    (windows flush) and take no snapshot."""

    stream_rdd: Any
    state: Any = None
    epoch_ms: float | None = None
    final: bool = False

    @property
    def driver_driven(self) -> bool:
        return self.stream_rdd is None


def validate(dag: DAG, default_parallelism: int) -> None:
    """``dag.validate`` with the pickle check, minus the priority-diamond warning: a
    diamond can deadlock the embedded engine's bounded queues, but here every stage has
    its whole input before it starts, so it cannot."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*different priorities", category=DagWarning)
        dag.validate(default_parallelism=default_parallelism, check_pickle=True)


def plan_vertices(dag: DAG, member_count: int, default_parallelism: int) -> dict[str, VertexPlan]:
    """Parallelism of every vertex (topological order), as routing-only plans whose
    vertices are stubs (no suppliers)."""
    plans: dict[str, VertexPlan] = {}
    for v in dag.topological_order():
        lp = effective_parallelism(v, default_parallelism)
        plans[v.name] = VertexPlan(_stub_vertex(v, lp), lp, member_count)
    return plans


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
    source reads ``epoch.stream_rdd``, processors restore the previous epoch's state and
    end with a terminal snapshot instead of completing (see :mod:`slipstream.spark.task`).
    ``failure_key`` signs the tasks' failure markers (:mod:`slipstream.spark.failures`).
    """
    from pyspark import StorageLevel

    level = persist_level if persist_level is not None else StorageLevel.MEMORY_AND_DISK
    validate(dag, default_parallelism)
    order = dag.topological_order()
    edges = dag.edges
    edge_ids = {id(e): i for i, e in enumerate(edges)}
    plans = plan_vertices(dag, member_count, default_parallelism)
    stubs = {name: p.vertex for name, p in plans.items()}

    compiled = CompiledDag(
        order=[v.name for v in order],
        total_parallelism={name: p.total_parallelism for name, p in plans.items()},
        result_rdd=None,
    )
    rdds: dict[str, Any] = {}
    consumers: dict[str, set[str]] = {
        v.name: {e.dest.name for e in dag.outbound_edges(v)}  # type: ignore[union-attr]
        for v in order
    }

    for v in order:
        plan = plans[v.name]
        n = plan.total_parallelism
        meta = v.meta_supplier
        inbound = dag.inbound_edges(v)
        outbound = dag.outbound_edges(v)
        sctx = SupplierContext(v.name, job_name, plan.local_parallelism, n, member_count)

        row_source = isinstance(meta, SparkRowSource)
        if row_source and inbound:
            raise DagError(
                f"vertex {v.name!r}: a Spark DataFrame/RDD source cannot have inbound edges"
            )
        stream_source = isinstance(meta, SparkStreamSource)
        if stream_source and epoch is None:
            raise DagError(
                f"vertex {v.name!r}: a Spark streaming source needs a streaming job "
                "(SparkEngine.new_job starts one when the DAG has a spark_stream_source)"
            )
        if epoch is not None and epoch.driver_driven:
            if stream_source or row_source:
                raise DagError(
                    f"vertex {v.name!r}: a micro-batch job (new_job(..., streaming=True)) "
                    "reads slipstream's own replayable sources only, not a Spark "
                    "DataFrame/RDD or stream source (a DAG with a spark_stream_source runs "
                    "as a Structured Streaming query)"
                )
        elif epoch is not None and not inbound and not stream_source:
            raise DagError(
                f"vertex {v.name!r}: in a streaming job on Spark every source must be a "
                "spark_stream_source (other sources would run again in every micro-batch)"
            )
        if epoch is not None and isinstance(meta, SparkDataFrameSink):
            raise DagError(
                f"vertex {v.name!r}: spark_dataframe_sink is for batch jobs; a streaming "
                "job's sink results go to lists/maps (or files) per micro-batch"
            )
        suppliers = None if row_source else _member_suppliers(v, meta, sctx, addresses)
        compiled.meta_suppliers.append((v.name, meta))

        in_specs = []
        for e in inbound:
            src = plans[e.source.name]
            producers: list[list[int]] = [[] for _ in range(n)]
            narrow = is_narrow(e, src, plan, len(inbound))
            for p in range(src.total_parallelism):
                for c in [p] if narrow else edge_targets(e, src, plan, p):
                    producers[c].append(p)
            in_specs.append(
                InboundSpec(
                    edge_ids[id(e)], e.dest_ordinal, e.get_priority(), _edge_label(e), producers
                )
            )
        out_specs = []
        for e in outbound:
            dst = plans[e.dest.name]  # type: ignore[union-attr]
            routing_edge = copy.copy(e)
            routing_edge.source = stubs[e.source.name]
            routing_edge.dest = stubs[dst.vertex.name]
            out_specs.append(
                OutboundSpec(
                    edge_ids[id(e)],
                    e.source_ordinal,
                    routing_edge,
                    plan,
                    dst,
                    is_narrow(e, plan, dst, len(dag.inbound_edges(dst.vertex.name))),
                )
            )

        df_sink = meta.name if isinstance(meta, SparkDataFrameSink) else None
        task = VertexTask(
            vertex=v.name,
            job_name=job_name,
            local_parallelism=plan.local_parallelism,
            member_count=member_count,
            guarantee=config.processing_guarantee,
            suppliers=suppliers,
            inbound=in_specs,
            outbound=out_specs,
            row_source=row_source,
            row_map_fn=meta.map_fn if isinstance(meta, SparkRowSource) else None,
            dataframe_sink=df_sink,
            services=services,
            epoch_mode=epoch is not None and not epoch.final,
            epoch_state=epoch.state if epoch is not None else None,
            source_epoch_ms=(
                epoch.epoch_ms
                if epoch is not None and epoch.driver_driven and not epoch.final
                else None
            ),
            final_run=epoch is not None and epoch.final,
            failure_key=failure_key,
        )

        if not inbound:
            if stream_source:
                assert epoch is not None and not epoch.driver_driven
                base = _with_partitions(epoch.stream_rdd, n)
            elif isinstance(meta, SparkRowSource):
                base = _with_partitions(meta.spark_rdd(), n)
            else:
                base = sc.parallelize(range(n), n)
        elif is_narrow(inbound[0], plans[inbound[0].source.name], plan, len(inbound)):
            base = _input_from(inbound[0].source.name, v.name, dag, rdds, edge_ids)
        else:
            parts = [
                _input_from(name, v.name, dag, rdds, edge_ids)
                for name in dict.fromkeys(e.source.name for e in inbound)
            ]
            union = parts[0] if len(parts) == 1 else sc.union(parts)
            base = union.partitionBy(n, _identity)
        rdd = base.mapPartitionsWithIndex(task)
        rdd.setName(f"slipstream vertex {v.name!r}")
        if len(consumers[v.name]) > 1 or df_sink is not None:
            rdd = rdd.persist(level)
            compiled.persisted.append(rdd)
        rdds[v.name] = rdd
        if df_sink is not None:
            assert isinstance(meta, SparkDataFrameSink)
            rows = rdd.filter(_is_rows).flatMap(_rows_of)
            compiled.dataframes[df_sink] = (rows, meta.schema, rdd)

    terminal = [rdds[v.name] for v in order if not consumers[v.name]]
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


def _with_partitions(rdd: Any, n: int) -> Any:
    have = rdd.getNumPartitions()
    if have == n:
        return rdd
    if have > n:
        return rdd.coalesce(n)
    return rdd.repartition(n)
