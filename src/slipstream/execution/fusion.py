"""Engine fusion: a stateless built-in vertex runs inside its only consumer's tasklet.

A hand-wired DAG often puts a ``P.map`` / ``P.filter`` / ``P.flat_map`` vertex in front
of the vertex that does the work (word count's ``tokenize`` -> ``accumulate``). Each item
then crosses a queue between two tasklets: ~10 words a line, a worker pass per ~1,000
words, 20-30 % of word count's CPU (docs/performance.md, "Word count: why the Core API
DAG is ~20-30 % slower"). The Pipeline compiler avoids the hop by fusing such a chain
into its consumer; this module does the same for any DAG, in the execution plan, so the
DAG, its vertices and its snapshot names stay the user's.

A pair is fused (:func:`fusable_pairs`) when

* every processor of the producer is exactly a ``MapP``, ``FilterP`` or ``FlatMapP``
  (``P.map``, ``P.filter``, ``P.flat_map``: stateless, nothing to snapshot; the class
  says so with ``fuses_into_consumer``, a subclass does not);
* the producer has one outbound edge, member-local, and it is the consumer's only
  inbound edge;
* each producer sends to exactly one consumer, the one with its own index (an isolated
  edge between equal local parallelism, or one processor on each side per member);
* the consumer is cooperative.

Each keeps its own bad-record policy (its context's ``item_errors``), so the two may
differ; a producer that sends dead letters has a second outbound edge and never fuses.

In a job that takes no snapshots (no processing guarantee, no restore) a pair is also
fused the other way round, the consumer inside its producer's (:func:`runs_in_producer`):
when every processor of the consumer is exactly a ``map_sink``, ``list_sink`` or ``noop``
sink (its class says ``runs_in_producer``: it takes every inbox whole, swallows
watermarks, and keeps no state in such a job), the consumer has no other inbound edge
and no outbound edge, and the producer is cooperative and not a source, with the same
one-to-one member-local edge as above. The producer may keep state (a user's
``AbstractProcessor``): with no snapshot there is nothing to save or restore, so the
pair needs only what a stateless one needs (the hand-over of items and watermarks,
back-pressure, each vertex's figures and errors). The running sum's ``running-sum ->
sink`` hop is what it saves (docs/performance.md, "A sink in its producer's tasklet").
A snapshot would need the producer's state saved and restored under its own vertex, and
a sink's two-phase output under exactly-once: not done, so any job with snapshots keeps
the hop.

Chains of such vertices fuse too. The pair runs as one tasklet of the consumer whose
processor, :class:`FusedPairP`, runs the two back to back; each keeps its own
:class:`~slipstream.core.processor.Context` (vertex name, index, counters, bad-record
policy). What users see stays per vertex: :func:`stage_figures` gives each vertex its
``items_in``/``items_out``, an error raised by the producer's function names the
producer (:func:`failed_stage`), the removed edge's key function is still checked as its
collector would (a broken one fails the job with ``KeyFunctionError``), and the
tasklet reports the producer's processor to the snapshot coordinator as saved and
completed along with its own (:class:`FusedStage`), so a snapshot written fused is the
one written unfused, and either restores the other.

``JobConfig(fuse_vertices=False)`` (or ``SLIPSTREAM_FUSE_VERTICES=0`` in the
environment) turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slipstream.core.config import JobConfig
from slipstream.core.counting import count_flat_mapped
from slipstream.core.dag import DAG, Edge, RoutingPolicy
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.partition import DEFAULT_PARTITION_COUNT
from slipstream.core.processor import Context, Processor
from slipstream.execution.collectors import PerTargetCollector
from slipstream.execution.pair import PairP

__all__ = [
    "FusedPairP",
    "FusedStage",
    "failed_stage",
    "running_stage",
    "fusable_pairs",
    "fusion_enabled",
    "runs_in_producer",
    "stage_figures",
]


def _none(*args: Any) -> None:
    """What a processor without ``flat_map_fn`` / ``counting_map`` answers."""
    return None


def is_stateless_builtin(processor: Processor) -> bool:
    """``processor`` is a ``P.map``, ``P.filter`` or ``P.flat_map`` processor (its own
    class says ``fuses_into_consumer``: a subclass, which may keep state, does not)."""
    return bool(type(processor).__dict__.get("fuses_into_consumer", False))


ENV = "SLIPSTREAM_FUSE_VERTICES"


def fusion_enabled(config: JobConfig) -> bool:
    """``JobConfig.fuse_vertices``, unless ``SLIPSTREAM_FUSE_VERTICES=0`` is set."""
    return bool(getattr(config, "fuse_vertices", True)) and os.environ.get(ENV, "1") != "0"


def runs_in_producer(processor: Processor) -> bool:
    """``processor`` is a ``map_sink``, ``list_sink`` or ``noop`` sink (its own class says
    ``runs_in_producer``; a subclass, which may do more, does not)."""
    return bool(type(processor).__dict__.get("runs_in_producer", False))


def fusable_pairs(
    dag: DAG, plans: Mapping[str, Any], config: JobConfig, snapshots: bool = True
) -> dict[str, Edge]:
    """The edges to fuse, by consumer name (see the module docstring). ``plans``: the
    :class:`~slipstream.execution.plan.VertexPlan` of each vertex, processors created.
    ``snapshots``: the execution may save or restore a snapshot (then a sink never runs
    in a stateful producer's tasklet)."""
    if not fusion_enabled(config):
        return {}
    from slipstream.execution.plan import edge_targets  # plan imports this module

    out: dict[str, Edge] = {}
    for v in dag.topological_order():
        src = plans[v.name]
        if not src.processors:
            continue
        outbound = dag.outbound_edges(v)
        if len(outbound) != 1:
            continue
        e = outbound[0]
        if e.is_distributed or e.source_ordinal != 0 or e.dest is None:
            continue
        if len(dag.inbound_edges(e.dest)) != 1:
            continue
        dst = plans[e.dest.name]
        if dst.local_parallelism != src.local_parallelism or dst.member_count != src.member_count:
            continue
        # each producer feeds the consumer with its own index, and only that one (the
        # edge's own routing: isolated at equal parallelism, or one processor a side)
        if any(edge_targets(e, src, dst, p) != [p] for p in range(src.total_parallelism)):
            continue
        if all(map(is_stateless_builtin, src.processors)):
            if all(p.is_cooperative() for p in dst.processors):
                out[e.dest.name] = e
        elif _sink_runs_in_producer(dag, e, src, dst, snapshots):
            out[e.dest.name] = e
    return out


def _sink_runs_in_producer(dag: DAG, edge: Edge, src: Any, dst: Any, snapshots: bool) -> bool:
    """``edge``'s consumer, a sink, may run in its (stateful) producer's tasklet: the
    module docstring's second rule. The consumer's vertex keeps no state backend of its
    own (the tasklet's context is the sink's; the producer's backend is its vertex's or
    the job's, :class:`FusedPairP`)."""
    dest = edge.dest
    assert dest is not None
    return (
        not snapshots
        and all(map(runs_in_producer, dst.processors))
        and not dag.outbound_edges(dest)
        and bool(dag.inbound_edges(edge.source))  # not a source: its progress() and
        # complete() loop stay in a tasklet of its own
        and dest.get_state_backend() is None
        and all(p.is_cooperative() for p in src.processors)
    )


class FusedStage:
    """A producer's processor fused into its consumer's tasklet, as the snapshot
    coordinator and the figures see it: its vertex and index, counted as saved and
    completed when the tasklet is (it holds no state)."""

    __slots__ = ("vertex_name", "index", "processor", "context", "completion_snapshot_id")

    last_save_seconds = 0.0
    state_name = "FUSED"

    def __init__(self, processor: Processor, context: Context) -> None:
        self.vertex_name = context.vertex_name
        self.index = context.global_processor_index
        self.processor = processor
        self.context = context
        self.completion_snapshot_id = 0

    def __repr__(self) -> str:
        return f"FusedStage({self.vertex_name}#{self.index})"


def _key_checker(edge: Edge, validate_keys: bool) -> PerTargetCollector | None:
    """What the removed edge's collector checked with one consumer: its key function
    (and partitioner) on each chunk's first item (every item with ``validate_keys``)."""
    if edge.routing is not RoutingPolicy.PARTITIONED:
        return None
    from slipstream.execution.plan import edge_label

    return PerTargetCollector(
        [],
        key_fn=edge.key_fn,
        partitioner=edge.partitioner,
        partition_to_target=[0] * DEFAULT_PARTITION_COUNT,
        label=edge_label(edge),
        validate_keys=validate_keys,
    )


class FusedPairP(PairP):
    """``first`` (a stateless built-in, or a fused chain of them) feeding ``second``
    through ``edge``, in one processor; the tasklet's context is ``second``'s.

    The hand-over is :class:`~slipstream.execution.pair.PairP`'s (nothing is between
    the two when the engine takes a snapshot, completes or forwards an idle mark). What
    is this pair's own: ``first`` keeps its own context (figures, bad-record policy), an
    error its code raises names it (:attr:`failed_stage`), the removed edge's key check,
    ``passed`` counts the items handed over (the producer's ``items_out``, the
    consumer's ``items_in``), and the commit phase and the restore are the consumer's
    alone (the producers hold no state)."""

    def __init__(
        self,
        first: Processor,
        first_context: Context,
        second: Processor,
        edge: Edge,
        validate_keys: bool = False,
        first_state_backend: str | None = None,
    ) -> None:
        super().__init__(first, second, edge.dest_ordinal)
        self.first_context = first_context
        #: the producer's vertex's own state backend (else it takes the job's, which the
        #: tasklet's context holds: a sink run in its producer has no backend of its own)
        self._first_state_backend = first_state_backend
        self.passed = 0
        inner = getattr(first, "fused_stages", None)
        #: the producers' processors, upstream first (a chain: the first one's too)
        self.fused_stages: list[FusedStage] = [
            *(inner or ()),
            FusedStage(first if inner is None else first.second, first_context),  # type: ignore[attr-defined]
        ]
        #: the stage whose code raised the error going on, if it was a producer's
        self.failed_stage: FusedStage | None = None
        #: ``first`` is in a call now (what the slow-call watchdog names)
        self.in_first = False
        self._checker = _key_checker(edge, validate_keys)
        # the producer's function over whole inboxes (set at init under "fail"): the
        # processor's own process() takes what its outbox bucket has room for, a line at
        # a time for a flat_map; the consumer bounds what waits here instead
        self._process_all: Callable[[Sequence[Any]], list[Any]] | None = None
        # set with it when the producer is a flat_map (its function) and the consumer
        # may count into a map (GroupByKeyP.counting_map): see _count
        self._flat_map_fn: Callable[[Any], Any] | None = None
        self._counting_map: Callable[[int], dict[Any, Any] | None] = _none
        # which of the two drops late input: the consumer when the producer is a
        # stateless built-in, the producer when the consumer is a sink run in it
        relevant = getattr(
            first if runs_in_producer(second) else second, "min_relevant_watermark", None
        )
        if getattr(relevant, "__func__", None) is not Processor.min_relevant_watermark:
            self.min_relevant_watermark = relevant  # type: ignore[method-assign,assignment]
        progress = getattr(second, "progress", None)
        if callable(progress):
            self.progress = progress
        # the consumer's commit phase, if it has one (the tasklet runs one only for a
        # processor that overrides these; the producers have none)
        for name in ("snapshot_commit_prepare", "snapshot_commit_finish"):
            fn = getattr(second, name)
            if getattr(fn, "__func__", None) is not getattr(Processor, name):
                setattr(self, name, fn)

    def init(self, outbox: Outbox, context: Context) -> None:
        self.outbox = outbox
        self.context = context
        fc = self.first_context
        # what the execution gave the consumer's context (engine/workers.prepare_context)
        for name in ("metric_listener", "sink_outage_timeout", "state_dir", "state_backend"):
            if hasattr(context, name):
                setattr(fc, name, getattr(context, name))
        if self._first_state_backend is not None:
            fc.state_backend = self._first_state_backend
        self._init_pair(outbox, fc, context)
        if is_stateless_builtin(self.first) and fc.item_errors.fails:
            self._process_all = self.first.process_all  # type: ignore[attr-defined]
            checker = self._checker
            if checker is None or not checker.validate_keys:
                self._flat_map_fn = getattr(self.first, "flat_map_fn", _none)()
                self._counting_map = getattr(self.second, "counting_map", _none)

    def _first(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, one of ``first``'s callbacks: an error it raises is the
        producer's (:func:`failed_stage`)."""
        self.in_first = True
        try:
            return call(*args)
        except BaseException:
            inner = getattr(self.first, "failed_stage", None)
            self.failed_stage = inner if inner is not None else self.fused_stages[-1]
            raise
        finally:
            self.in_first = False

    def _hand_over(self, items: list[Any]) -> None:
        checker = self._checker
        if checker is not None and items:
            try:
                checker.check_keys(items)
            except BaseException:
                self.failed_stage = self.fused_stages[-1]  # the removed edge's producer
                raise
        self.passed += len(items)
        self._inbox.extend(items)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        process_all = self._process_all
        if process_all is None:
            super().process(ordinal, inbox)
            return
        if not self._drain():
            return
        fn = self._flat_map_fn
        if fn is not None:
            counts = self._counting_map(self.ordinal)
            if counts is not None:
                self._count(fn, inbox, counts)
                inbox.clear()
                return
        out = self._first(process_all, inbox)
        inbox.clear()  # nothing is lost: every callback drains first
        self._hand_over(out)
        self._drain()

    def _count(self, fn: Callable[[Any], Any], inbox: Inbox, counts: dict[Any, Any]) -> None:
        """A ``flat_map`` into a counting consumer (``counting()`` by the item itself):
        each item's results counted as they are made (``count_flat_mapped``), with no
        chunk of results in between. An error of ``fn`` names the producer and its
        item, as :meth:`process`'s path does; one of the removed edge's key check names
        the producer; one of the counting, the consumer."""

        def failed(item: Any, error: Exception) -> None:
            self.failed_stage = self.fused_stages[-1]
            self.first_context.item_errors.handle(item, error)

        checker = self._checker
        check = None
        if checker is not None:

            def check(results: list[Any]) -> None:
                try:
                    checker.check_keys(results)
                except BaseException:
                    self.failed_stage = self.fused_stages[-1]  # the removed edge's producer
                    raise

        self.in_first = True  # the producer's code runs in it (the slow-call watchdog)
        try:
            self.passed += count_flat_mapped(fn, inbox, counts, failed, check)
        finally:
            self.in_first = False

    def close(self) -> None:
        try:
            super().close()
        finally:
            # what the tasklet does for its own context (a stateful producer's
            # disk-backed keyed state: its files go)
            self.first_context.run_closers()

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        self.second.restore_from_snapshot(inbox)

    def finish_snapshot_restore(self) -> bool:
        return bool(self.second.finish_snapshot_restore())


def failed_stage(tasklet: Any) -> Any:
    """What an error raised in ``tasklet``'s call names: the fused producer whose code
    raised it, else the tasklet."""
    stage = getattr(getattr(tasklet, "processor", None), "failed_stage", None)
    return stage if stage is not None else tasklet


def running_stage(tasklet: Any) -> Any:
    """Whose code ``tasklet``'s call is running now: the fused producer's while the
    call is in it, else the tasklet (what the slow-call watchdog names)."""
    p = getattr(tasklet, "processor", None)
    stage = tasklet
    while type(p) is FusedPairP and p.in_first:
        stage = p.fused_stages[-1]
        p = p.first
    return stage


def stage_figures(tasklet: Any) -> list[tuple[str, int, int, Context]]:
    """``(vertex, items_in, items_out, context)`` of each vertex ``tasklet`` runs: one
    for a plain tasklet; for a fused one each producer (its ``items_out`` the items it
    handed on) and the consumer (its ``items_in`` those items)."""
    out = sum(c.items_out for c in tasklet.collectors)
    p = getattr(tasklet, "processor", None)
    if type(p) is not FusedPairP:
        return [(tasklet.vertex_name, tasklet.items_in, out, tasklet.context)]
    rows: list[tuple[str, int, int, Context]] = []
    items_in = tasklet.items_in
    pairs: list[FusedPairP] = []
    while type(p) is FusedPairP:
        pairs.append(p)
        p = p.first
    pairs.reverse()  # the most upstream pair first
    for pair, stage in zip(pairs, pairs[-1].fused_stages, strict=True):
        rows.append((stage.vertex_name, items_in, pair.passed, stage.context))
        items_in = pair.passed
    rows.append((tasklet.vertex_name, items_in, out, tasklet.context))
    return rows
