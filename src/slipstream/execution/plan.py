"""Turns a DAG into processors, queues and tasklets (the execution plan, docs/semantics.md §1).

For each vertex the meta-supplier is asked once for a supplier per member, each supplier
for ``local_parallelism`` processors. For each edge every connected (producer, consumer)
pair gets its own bounded queue; the producer gets a collector that routes into its
queues, the consumer an inbound stream over the queues that feed it. The embedded
engine and the Spark engine both build their tasklets here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slipstream.core.config import JobConfig, ProcessingGuarantee
from slipstream.core.dag import DAG, Edge, RoutingPolicy, Vertex, effective_parallelism
from slipstream.core.dead_letters import is_dead_letter_edge, policy_of
from slipstream.core.errors import DagError
from slipstream.core.item_errors import FAIL, ItemErrorReport, ItemErrors
from slipstream.core.partition import DEFAULT_PARTITION_COUNT, key_routing, partition_table
from slipstream.core.processor import Context, Processor
from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)
from slipstream.core.traits import all_sources_bounded
from slipstream.execution.channels import Channel, ChannelFactory, ChannelWriter
from slipstream.execution.collectors import Collector, PerTargetCollector, RoundRobinCollector
from slipstream.execution.fusion import FusedPairP, fusable_pairs
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import CrossMemberQueue, SpscQueue

log = logging.getLogger("slipstream.plan")


def member_addresses(member_count: int) -> list[MemberAddress]:
    return [MemberAddress("127.0.0.1", 5701 + i) for i in range(member_count)]


def member_processors(
    supplier: Any, context: SupplierContext
) -> tuple[ProcessorSupplier, list[Processor]]:
    """Create one member's processors of a vertex: ``supplier`` (what the vertex's
    meta-supplier returned for the member: a :class:`ProcessorSupplier`, or a callable
    that makes one processor) is initialised with ``context`` (its ``member_index`` is the
    member's) and asked for ``context.local_parallelism`` processors, checked to be that
    many :class:`Processor` instances. Returns the supplier (closed by the engine at the
    end) and the processors by local index.

    The one place processors are created: the embedded engine calls it for every member
    at job start (:func:`processors_of`), a Spark task for its own member on the
    executor."""
    if not isinstance(supplier, ProcessorSupplier):
        supplier = FactorySupplier(supplier) if callable(supplier) else supplier
    supplier.init(context)
    lp = context.local_parallelism
    procs = list(supplier.get(lp))
    if len(procs) != lp:
        raise ValueError(
            f"vertex {context.vertex_name!r}: supplier returned {len(procs)} "
            f"processors, expected local parallelism {lp}"
        )
    for p in procs:
        if not isinstance(p, Processor):
            raise TypeError(
                f"vertex {context.vertex_name!r}: supplier returned "
                f"{type(p).__name__}, which is not a slipstream Processor"
            )
    return supplier, procs


def processors_of(
    meta: ProcessorMetaSupplier,
    supplier_context: SupplierContext,
    addresses: Sequence[MemberAddress],
) -> list[tuple[ProcessorSupplier, list[Processor]]]:
    """Run the start-up sequence of one vertex: per member ``(supplier, processors)``."""
    meta.init(supplier_context)
    by_address = meta.get(list(addresses))
    return [
        member_processors(by_address(address), supplier_context._replace(member_index=index))
        for index, address in enumerate(addresses)
    ]


@dataclass
class VertexPlan:
    vertex: Vertex
    local_parallelism: int
    member_count: int
    suppliers: list[ProcessorSupplier] = field(default_factory=list)
    processors: list[Processor] = field(default_factory=list)  # by global index
    contexts: list[Context] = field(default_factory=list)
    #: ``JobConfig.validate_keys``: the vertex's partitioned outbound edges call their
    #: key function on every item even with one consumer
    validate_keys: bool = False
    #: the inbound edge whose producer runs inside this vertex's tasklets (a stateless
    #: built-in vertex fused into its only consumer, execution/fusion.py), if any
    fused_edge: Edge | None = None

    @property
    def total_parallelism(self) -> int:
        return self.local_parallelism * self.member_count

    def member_of(self, global_index: int) -> int:
        return global_index // self.local_parallelism


def close_suppliers(plans: Mapping[str, VertexPlan], error: BaseException | None) -> None:
    """Close every vertex's processor suppliers at the end of an execution (the local
    job's and a member process's alike), passing the execution's failure, ``None`` if it
    did not fail. A close error is only logged, so every other supplier still closes."""
    for vp in plans.values():
        for s in vp.suppliers:
            try:
                s.close(error)
            except Exception:  # noqa: BLE001 - close errors are only logged
                log.exception("closing supplier of %s failed", vp.vertex.name)


def edge_targets(edge: Edge, src: VertexPlan, dst: VertexPlan, producer: int) -> list[int]:
    """Global indices of the consumers that ``producer`` (a global index) sends to."""
    member = src.member_of(producer)
    d = dst.local_parallelism
    if edge.routing is RoutingPolicy.ISOLATED:
        u_local = producer - member * src.local_parallelism
        u = src.local_parallelism
        return [member * d + i for i in range(d) if i % u == u_local % d]
    if edge.routing is RoutingPolicy.ALL_TO_ONE:
        table = partition_table(
            DEFAULT_PARTITION_COUNT, dst.member_count, d, edge.is_distributed, member
        )
        return [table[0]]
    if edge.is_distributed:
        return list(range(dst.total_parallelism))
    return [member * d + i for i in range(d)]


def edge_label(edge: Edge) -> str:
    """How errors name an edge: ``edge 'a' -> 'b' (ordinal 0)`` (the ordinal at ``b``)."""
    dest = edge.dest.name if edge.dest is not None else "?"
    return f"edge {edge.source.name!r} -> {dest!r} (ordinal {edge.dest_ordinal})"


def single_target_collector(edge: Edge, src: VertexPlan, queue: ChannelWriter) -> Collector:
    """The collector of an edge whose producer sends to one consumer only, through
    ``queue`` (the Spark engine's narrow edges): round robin over that queue, except
    that a partitioned edge still checks its key function as :func:`make_collector`'s
    collectors do with one consumer."""
    if edge.routing is RoutingPolicy.PARTITIONED:
        return PerTargetCollector(
            [queue],
            key_fn=edge.key_fn,
            partitioner=edge.partitioner,
            partition_to_target=[0] * DEFAULT_PARTITION_COUNT,
            label=edge_label(edge),
            validate_keys=src.validate_keys,
        )
    return RoundRobinCollector([queue])


def make_collector(
    edge: Edge, src: VertexPlan, dst: VertexPlan, producer: int, queues: Sequence[ChannelWriter]
) -> Collector:
    targets = edge_targets(edge, src, dst, producer)
    routing = edge.routing
    if routing is RoutingPolicy.PARTITIONED:
        keys = key_routing(
            edge.partitioner,
            dst.member_count,
            dst.local_parallelism,
            distributed=edge.is_distributed,
            member_index=src.member_of(producer),
        )
        position = {t: i for i, t in enumerate(targets)}
        return PerTargetCollector(
            queues,
            key_fn=edge.key_fn,
            partitioner=keys.partitioner,
            partition_count=keys.partition_count,
            partition_to_target=[position[t] for t in keys.table],
            label=edge_label(edge),
            validate_keys=src.validate_keys,
        )
    if routing is RoutingPolicy.BROADCAST:
        return PerTargetCollector(queues)
    c = RoundRobinCollector(queues)
    c.cursor = producer % len(queues)
    return c


@dataclass
class TaskletSpec:
    """Everything needed to build one processor's tasklet."""

    vertex: VertexPlan
    global_index: int
    processor: Processor
    context: Context
    inbound: list[InboundEdgeStream] = field(default_factory=list)
    outbound: list[Collector] = field(default_factory=list)


def build_vertex_plans(
    dag: DAG,
    config: JobConfig,
    member_count: int,
    default_parallelism: int,
    services: Any,
    job_name: str,
    item_error_report: ItemErrorReport | None = None,
    check_pickle: bool = True,
    snapshots: bool = True,
) -> dict[str, VertexPlan]:
    """Each vertex's plan (processors, contexts) for ``member_count`` members, after
    validating ``dag``. ``check_pickle=False`` skips the check that everything pickles:
    a member process's DAG was checked by its coordinator and has just been unpickled
    (checking again would pickle each of the user's functions by reference, importing
    its module in the member: a module registered with ``register_pickle_by_value``
    need not be importable there, and importing it cost a test module's member ~0.1 s
    of CPU a job). ``snapshots=False``: the execution neither saves nor restores a
    snapshot, so a sink may run in a stateful producer's tasklet
    (:func:`~slipstream.execution.fusion.fusable_pairs`)."""
    # the embedded engine ships nothing: the data a supplier holds is sampled, not pickled
    dag.validate(
        default_parallelism=default_parallelism,
        check_pickle=check_pickle,
        member_count=member_count,
        sample_data=True,
    )
    addresses = member_addresses(member_count)
    # a batch job's watermark inserters hold their watermarks (JobConfig.batch_watermarks)
    hold_watermarks = not config.batch_watermarks and all_sources_bounded(dag)
    plans: dict[str, VertexPlan] = {}
    for v in dag.topological_order():
        lp = effective_parallelism(v, default_parallelism)
        vp = VertexPlan(v, lp, member_count, validate_keys=config.validate_keys)
        sctx = SupplierContext(v.name, job_name, lp, lp * member_count, member_count)
        for m, (supplier, procs) in enumerate(processors_of(v.meta_supplier, sctx, addresses)):
            vp.suppliers.append(supplier)
            for i, p in enumerate(procs):
                vp.processors.append(p)
                vp.contexts.append(
                    Context(
                        vertex_name=v.name,
                        global_processor_index=m * lp + i,
                        local_processor_index=i,
                        local_parallelism=lp,
                        total_parallelism=lp * member_count,
                        member_index=m,
                        member_count=member_count,
                        processing_guarantee=config.processing_guarantee,
                        job_name=job_name,
                        services=services,
                    )
                )
                vp.contexts[-1].hold_watermarks = hold_watermarks
                if config.processing_guarantee is not ProcessingGuarantee.NONE:
                    # sinks commit after the store: their own records show a rollback
                    vp.contexts[-1].allow_rollback = config.allow_rollback
                vp.contexts[-1].pipeline_stage = getattr(v, "pipeline_stage", None)
                set_item_errors(vp.contexts[-1], dag, v, config.on_item_error, item_error_report)
        plans[v.name] = vp
    for name, e in fusable_pairs(dag, plans, config, snapshots).items():
        plans[name].fused_edge = e
    return plans


def set_item_errors(
    context: Context, dag: DAG, vertex: Vertex, default: Any, report: ItemErrorReport | None
) -> None:
    """Give a processor of ``vertex`` its bad-record policy (``context.item_errors``):
    the vertex's own ``on_item_error`` or the job's; a sink means the vertex's
    dead-letter edge (added by :func:`~slipstream.core.dead_letters.with_dead_letters`)."""
    policy = item_error_route(dag, vertex, default)
    if policy is None:
        return
    side, target = policy
    context.item_errors = ItemErrors(
        context, skip=side is None, side_ordinal=side, target=target, report=report
    )


def item_error_route(
    dag: DAG, vertex: Vertex, default: Any
) -> tuple[int | None, str | None] | None:
    """Where ``vertex``'s processors put an item their code raised on: ``None`` under
    ``"fail"``; ``(None, None)`` under ``"skip"``; ``(ordinal, vertex name)`` of its
    dead-letter edge under a sink. Plain values, so the Spark engine ships them to its
    tasks and builds the same :class:`ItemErrors` there."""
    policy = policy_of(vertex, default)
    if isinstance(policy, str) and policy == FAIL:
        return None
    if isinstance(policy, str):
        return None, None
    for e in dag.outbound_edges(vertex):
        if is_dead_letter_edge(e):
            return e.source_ordinal, e.dest.name  # type: ignore[union-attr]
    raise DagError(
        f"vertex {vertex.name!r} sends dead letters (on_item_error={policy!r}) but "
        "has no dead-letter edge: the DAG was not prepared with with_dead_letters()"
    )


def wire(
    dag: DAG,
    plans: dict[str, VertexPlan],
    guarantee: ProcessingGuarantee,
    queue_factory: ChannelFactory | None = None,
    member: int | None = None,
) -> list[TaskletSpec]:
    """Create channels, collectors and inbound streams for every edge.

    One channel per connected (producer, consumer) pair: ``queue_factory(edge, producer,
    consumer)`` (global processor indices) when given (the seam where a channel whose
    consumer lives in another process plugs in, :mod:`slipstream.execution.channels`),
    else an in-process :class:`SpscQueue` (a :class:`CrossMemberQueue` between two
    simulated members).

    ``member``: wire only that member's side, as a member process does (its queue factory,
    e.g. :class:`~slipstream.execution.remote.MemberChannels`, gives a pair with a remote
    end a lane of a cross-process channel): only the member's processors get specs, a
    collector for each of its producers, an inbound stream for each of its consumers; a
    pair between two other members gets no channel."""
    if member is not None and queue_factory is None:
        raise ValueError("wire(member=...) needs a queue_factory for the cross-member pairs")
    specs: dict[tuple[str, int], TaskletSpec] = {}
    for name, vp in plans.items():
        for g, (p, ctx) in enumerate(zip(vp.processors, vp.contexts, strict=True)):
            specs[(name, g)] = TaskletSpec(vp, g, p, ctx)
    exactly_once = guarantee is ProcessingGuarantee.EXACTLY_ONCE
    for v in dag.topological_order():
        for e in dag.outbound_edges(v):
            src = plans[e.source.name]
            dst = plans[e.dest.name]  # type: ignore[union-attr]
            if dst.fused_edge is e:  # no channel: the two run in one tasklet
                continue
            feeding: dict[int, list[Channel]] = {c: [] for c in range(dst.total_parallelism)}
            label = edge_label(e)
            for producer in range(src.total_parallelism):
                local_p = member is None or src.member_of(producer) == member
                targets = edge_targets(e, src, dst, producer)
                queues: list[Channel] = []
                for c in targets:
                    local_c = member is None or dst.member_of(c) == member
                    if not (local_p or local_c):
                        continue
                    if queue_factory is not None:
                        q = queue_factory(e, producer, c)
                    elif src.member_of(producer) != dst.member_of(c):
                        q = CrossMemberQueue(
                            e.get_queue_size(),
                            f"{label}, processor {producer} (member {src.member_of(producer)}) "
                            f"-> {c} (member {dst.member_of(c)})",
                        )
                    else:
                        q = SpscQueue(
                            e.get_queue_size(),
                            f"{e.source.name}#{producer}->{dst.vertex.name}#{c}",
                        )
                    queues.append(q)
                    if local_c:
                        feeding[c].append(q)
                if local_p:
                    specs[(src.vertex.name, producer)].outbound.append(
                        make_collector(e, src, dst, producer, queues)
                    )
            for c, qs in feeding.items():
                if not qs:
                    continue
                specs[(dst.vertex.name, c)].inbound.append(
                    InboundEdgeStream(
                        e.dest_ordinal,
                        e.get_priority(),
                        qs,
                        exactly_once=exactly_once,
                        label=label,
                    )
                )
    for v in dag.topological_order():  # a chain's upstream pairs first
        fused_edge = plans[v.name].fused_edge
        if fused_edge is not None:
            _fuse(specs, fused_edge)
    if member is not None:
        return [s for s in specs.values() if s.vertex.member_of(s.global_index) == member]
    return list(specs.values())


def _fuse(specs: dict[tuple[str, int], TaskletSpec], edge: Edge) -> None:
    """Each processor of ``edge``'s producer goes into the consumer's spec with its own
    index: one :class:`FusedPairP` over the producer's inbound streams."""
    producer = edge.source.name
    consumer = edge.dest.name  # type: ignore[union-attr]
    for (name, g), spec in list(specs.items()):
        if name != consumer:
            continue
        first = specs.pop((producer, g))
        spec.processor = FusedPairP(
            first.processor,
            first.context,
            spec.processor,
            edge,
            first.vertex.validate_keys,
            first.vertex.vertex.get_state_backend(),
        )
        spec.inbound = first.inbound
