"""Compiles a :class:`~slipstream.pipeline.Pipeline` to a Core API DAG.

The choices a Core API user has to get right, made once here:

* **Fusion.** Consecutive ``map``/``filter``/``flat_map``/``peek`` stages (a *chain*)
  run as one function in one processor. A chain whose only consumer is stage 1 of a
  two-stage aggregation, a watermark inserter or the probe side of a hash join runs
  *inside* that consumer's processor (no queue hop at all); any other chain gets a
  vertex of its own, joined to its producer by an isolated edge when both have the same
  parallelism (no reshuffling, so each substream keeps its order).
* **Two-stage aggregation.** ``group_by(k).aggregate(op)`` with ``op.combine`` becomes
  ``accumulate_by_key`` (local; its accumulators leave as ``KeyedGroup`` items,
  ``accumulate_by_key_groups``) then ``combine_by_key`` behind a distributed edge
  partitioned by key; windows become ``accumulate_by_frame`` (each frame as one
  ``KeyedGroup``, split by key on the edge: ``accumulate_rows_by_frame``) then
  ``combine_to_sliding_window`` the same way. Without ``combine`` (and for session
  windows, ``map_stateful`` and ``rolling_aggregate``) one keyed stage sits behind a
  distributed partitioned edge.
* **One shape everywhere.** The DAG depends on the pipeline alone, never on the engine
  that runs it: the same vertices and names on the embedded engine with any members and
  threads, in the CLI and on Spark, so metric keys agree and a snapshot store written
  by one entry point resumes in another.
* **Watermarks** are inserted where ``with_timestamps`` stands, with a fixed lag
  throttled to the frame of the windows downstream (the GCD of their slides): windows
  change only at frame boundaries, so finer watermarks would be wasted work.
* **Parallelism.** Sinks get one processor per member (set another with
  ``set_local_parallelism``); the unkeyed combining stage funnels into one processor;
  vertices that follow their producer through an isolated edge inherit its parallelism.
* **Joins.** The build side of ``hash_join`` reaches every joining processor (broadcast,
  distributed) at a higher priority, so it is complete before the first probe item. A
  self-join (both sides from one vertex) holds the probe side in a vertex of its own
  until it is complete, or the shared vertex would wait for the join for good.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from slipstream import processors as P
from slipstream.core.dag import DAG, Edge, Vertex
from slipstream.core.item_errors import handles_item_errors
from slipstream.core.traits import BUFFERS_INPUT, declare
from slipstream.pipeline.fused import STATELESS_KINDS, ChainFn, fused_chain, input_fused, pipe
from slipstream.pipeline.stages import Pipeline, PipelineError, Stage

# slipstream.pipeline.keyed, .watermark and .window are imported by the stages that use
# them: compiling a pipeline of maps and filters does not import them (start-up time).

__all__ = ["compile_pipeline"]

_CHAIN_KINDS = (*STATELESS_KINDS, "merge")
_DEFAULT_NAMES = {
    "timestamps": "with_timestamps",
    "aggregate": "aggregate",
    "rolling_aggregate": "rolling_aggregate",
    "map_stateful": "map_stateful",
    "window": "window",
}
_entry_key = operator.itemgetter(0)
#: the key of a ``(start, end, key, acc)`` frame row; the Pipeline's stage 1
#: (processors.windows.accumulate_rows_by_frame) emits ``KeyedGroup`` items, which the
#: edge's collector splits by their entries' keys without calling it
_frame_key = operator.itemgetter(2)


class LagPolicy:
    """``policy_factory`` of the watermark inserter: ``with_fixed_lag(lag)``, throttled
    by frames of ``frame`` ms when ``frame`` is set (a class, so it pickles)."""

    def __init__(self, lag: int, frame: int | None) -> None:
        self.lag = lag
        self.frame = frame

    def __call__(self) -> Any:
        from slipstream.watermark import with_fixed_lag
        from slipstream.window import tumbling_window_def

        policy = with_fixed_lag(self.lag)
        if self.frame:
            policy = policy.throttle_by_frame(tumbling_window_def(self.frame))
        return policy

    def __repr__(self) -> str:
        return f"LagPolicy(lag={self.lag}, frame={self.frame})"


def _same_key(item: Any) -> int:
    """Every item's sort key when a sort only holds items (a stable sort keeps order)."""
    return 0


def two_stage_window(stage: Stage) -> bool:
    from slipstream.window import SlidingWindowDef

    wd = stage.params["window_def"]
    return isinstance(wd, SlidingWindowDef) and stage.params["op"].combine is not None


class _Compiler:
    def __init__(self, pipeline: Pipeline) -> None:
        self.stages = pipeline.stages
        self.dag = DAG()
        self.names = self._stage_names()
        self.out: dict[int, Vertex] = {}  # id(stage) -> the vertex emitting its items
        self.chain_of: dict[int, list[Stage]] = {}
        self.fused_into: dict[int, Stage] = {}  # id(chain head) -> consumer stage
        # id(with_timestamps stage) -> the two-stage window whose stage 1 runs it inline
        self.piped_into: dict[int, Stage] = {}
        self._in_ordinal: dict[str, int] = {}
        self._out_ordinal: dict[str, int] = {}
        self._building: Stage | None = None  # the stage whose vertices are being made

    # -- checks and names ----------------------------------------------------------------
    def check(self) -> None:
        if not self.stages:
            raise PipelineError("the pipeline is empty: start it with p.read_from(source)")
        for s in self.stages:
            if s.kind != "sink" and not s.downstream:
                raise PipelineError(
                    f"stage {self.names[id(s)]!r} ({s.kind}) leads to no sink: end it with "
                    ".write_to(sink)"
                )

    def _stage_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        seen: dict[str, int] = {}
        for s in self.stages:
            owner = s._owner
            if owner is not s:
                base = names.get(id(owner)) or owner.name or owner.kind
                base = f"{base}-result"
            else:
                default = s.params["kind"] if s.kind == "service" else s.kind
                base = s.name or _DEFAULT_NAMES.get(s.kind, default)
            n = seen.get(base, 0) + 1
            seen[base] = n
            names[id(s)] = base if n == 1 else f"{base}-{n}"
        return names

    # -- chains ------------------------------------------------------------------------------
    def find_chains(self) -> None:
        for s in self.stages:
            if s.kind not in _CHAIN_KINDS:
                continue
            if s.kind != "merge" and len(s.upstream) == 1:
                u = s.upstream[0]
                chain = self.chain_of.get(id(u))
                if (
                    chain is not None
                    and len(u.downstream) == 1
                    and u.local_parallelism == s.local_parallelism
                    and same_policy(u, s)
                ):
                    chain.append(s)
                    self.chain_of[id(s)] = chain
                    continue
            self.chain_of[id(s)] = [s]
        for s in self.stages:
            if s.kind == "timestamps" and len(s.downstream) == 1:
                w = s.downstream[0]
                if (
                    w.kind == "window"
                    and self.two_stage(w)
                    and w.local_parallelism == -1
                    and same_policy(s, w)
                ):
                    self.piped_into[id(s)] = w
        for chain in {id(c[0]): c for c in self.chain_of.values()}.values():
            tail = chain[-1]
            if len(tail.downstream) != 1 or chain[0].local_parallelism != -1:
                continue
            consumer = tail.downstream[0]
            if self._fusible(chain, consumer):
                self.fused_into[id(chain[0])] = consumer

    def two_stage(self, window: Stage) -> bool:
        """Whether ``window`` compiles to two stages: whenever it can (a sliding or
        tumbling window whose operation has ``combine``), on every engine. A snapshot
        names its vertices, so a shape that followed the engine (it once did: one stage
        on one member with one thread) would keep a store written by one entry point
        from resuming in another, and metric keys would differ by engine. Measured cost
        of the second stage on one thread: docs/performance.md, "One shape"."""
        return two_stage_window(window)

    def _fusible(self, chain: list[Stage], consumer: Stage) -> bool:
        kind = consumer.kind
        if not same_policy(chain[0], consumer):
            return False  # a vertex runs one bad-record policy
        if consumer.local_parallelism != -1 or chain[0].kind == "merge":
            # a merge stays a vertex of its own: processors treat their inbound ordinals
            # as different inputs (co-aggregation takes one function per ordinal)
            return False
        if kind == "timestamps":
            return True
        if kind == "aggregate":
            return consumer.params["op"].combine is not None
        if kind == "window":
            return self.two_stage(consumer)
        if kind == "rolling_aggregate":
            return bool(consumer.params.get("per_epoch"))  # runs inside its partials
        if kind == "hash_join":
            return (
                consumer.upstream[0] is chain[-1]
                and consumer.upstream[1] is not chain[-1]
            )
        return False

    def _inputs(self, u: Stage, consumer: Stage) -> list[tuple[Vertex, ChainFn | None]]:
        """The vertices that feed ``consumer`` with ``u``'s items, each with the chain
        function the consumer must run on them (``None``: none)."""
        chain = self.chain_of.get(id(u))
        if chain is not None and self.fused_into.get(id(chain[0])) is consumer:
            steps = [(s.kind, s.params["fn"]) for s in chain if s.kind != "merge"]
            fn = ChainFn(steps) if steps else None
            return [(self.out[id(x)], fn) for x in chain[0].upstream]
        return [(self.out[id(u)], None)]

    def _chain_name(self, u: Stage, consumer: Stage) -> str:
        chain = self.chain_of.get(id(u))
        if chain is not None and self.fused_into.get(id(chain[0])) is consumer:
            return "+".join(self.names[id(s)] for s in chain) + "+"
        return ""

    # -- vertices and edges ------------------------------------------------------------------
    def vertex(self, name: str, supplier: Any, lp: int = -1) -> Vertex:
        taken = {v.name for v in self.dag.vertices}
        base, n = name, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        v = self.dag.new_vertex(name, supplier)
        if lp != -1:
            v.local_parallelism(lp)
        building = self._building
        if building is not None:
            # what advice names when the vertex blocks (Context.pipeline_stage)
            v.pipeline_stage = f"{building.kind} {self.names[id(building)]!r}"  # type: ignore[attr-defined]
            policy = building._owner.item_error
            if policy is not None and handles_item_errors(supplier):
                v.on_item_error(policy)  # Stage.on_item_error: the stage's vertices
        return v

    def connect(self, src: Vertex, dst: Vertex, configure: Callable[[Edge], Edge]) -> int:
        """Add an edge on the next free ordinals; returns the destination ordinal."""
        o_out = self._out_ordinal.get(src.name, 0)
        o_in = self._in_ordinal.get(dst.name, 0)
        self._out_ordinal[src.name] = o_out + 1
        self._in_ordinal[dst.name] = o_in + 1
        self.dag.edge(configure(Edge.from_(src, o_out).to(dst, o_in)))
        return o_in

    @staticmethod
    def inherited_lp(producers: list[Vertex]) -> int:
        """The parallelism a vertex following ``producers`` through a local edge takes:
        its single producer's (explicit or preferred), else the engine default (-1)."""
        if len(producers) != 1:
            return -1
        v = producers[0]
        lp = v.get_local_parallelism()
        if lp != -1:
            return lp
        preferred = v.meta_supplier.preferred_local_parallelism()
        return preferred if preferred > 0 else -1

    def local_inputs(
        self,
        stage: Stage,
        inputs: list[tuple[Vertex, ChainFn | None]],
        name: str,
        supplier: Any,
        *,
        lp: int | None = None,
        key_fn: Callable[[Any], Any] | None = None,
    ) -> Vertex:
        """A vertex fed by ``inputs`` through member-local edges (isolated between equal
        parallelism, else round robin; partitioned by ``key_fn`` where no chain runs
        inside the vertex), with the chains of ``inputs`` fused into its processors."""
        producers = [v for v, _ in inputs]
        if lp is None:
            lp = stage.local_parallelism
            if lp == -1 and (key_fn is None or any(fn is not None for _, fn in inputs)):
                # follows its producer through an isolated edge (a partitioned edge
                # reshuffles anyway, so the vertex keeps the engine's default)
                lp = self.inherited_lp(producers)
        transforms: dict[int, ChainFn] = {}
        for o, (_v, fn) in enumerate(inputs):  # a new vertex: its ordinals start at 0
            if fn is not None:
                transforms[o] = fn
        if transforms:
            supplier = input_fused(supplier, transforms)
        v = self.vertex(name, supplier, lp)
        for producer, fn in inputs:
            if fn is None and key_fn is not None:
                self.connect(producer, v, lambda e: e.partitioned(key_fn))  # noqa: B023
            elif producer.get_local_parallelism() == lp and (
                lp != -1 or producer.meta_supplier.preferred_local_parallelism() <= 0
            ):
                self.connect(producer, v, Edge.isolated)
            else:
                self.connect(producer, v, lambda e: e)
        return v

    def keyed_inputs(
        self, stage: Stage, name: str, supplier: Any, key_fn: Callable[[Any], Any]
    ) -> Vertex:
        """A vertex behind distributed edges partitioned by ``key_fn``."""
        v = self.vertex(name, supplier, stage.local_parallelism)
        for u in stage.upstream:
            for producer, fn in self._inputs(u, stage):
                assert fn is None  # keyed consumers never take a chain inside
                self.connect(producer, v, lambda e: e.distributed().partitioned(key_fn))
        return v

    # -- stages -------------------------------------------------------------------------------
    def build(self) -> DAG:
        self.check()
        self.find_chains()
        for s in self.stages:
            self._building = s
            getattr(self, f"_build_{s.kind}" if s.kind not in _CHAIN_KINDS else "_build_chain")(s)
        self._building = None
        return self.dag

    def _build_source(self, s: Stage) -> None:
        self.out[id(s)] = self.vertex(self.names[id(s)], s.params["supplier"], s.local_parallelism)

    def _build_chain(self, s: Stage) -> None:
        chain = self.chain_of[id(s)]
        if chain[0] is not s:
            return  # built with its head
        if id(s) in self.fused_into:
            return  # runs inside its consumer
        steps = [(c.kind, c.params["fn"]) for c in chain if c.kind != "merge"]
        name = "+".join(self.names[id(c)] for c in chain)
        inputs: list[tuple[Vertex, ChainFn | None]] = []
        for u in s.upstream:
            inputs.extend(self._inputs(u, s))
        v = self.local_inputs(s, inputs, name, fused_chain(ChainFn(steps)))
        for c in chain:
            self.out[id(c)] = v

    def _build_service(self, s: Stage) -> None:
        """A service call (``map_using_service`` ...): a vertex of its own, fed like a
        chain (isolated from its producer where the parallelism allows), so that its
        thread, not the cooperative ones, waits for the calls."""
        inputs: list[tuple[Vertex, ChainFn | None]] = []
        for u in s.upstream:
            inputs.extend(self._inputs(u, s))
        self.out[id(s)] = self.local_inputs(s, inputs, self.names[id(s)], s.params["supplier"])

    def _build_timestamps(self, s: Stage) -> None:
        if id(s) in self.piped_into:
            return  # runs inside stage 1 of its window
        (u,) = s.upstream
        inputs = self._inputs(u, s)
        name = self._chain_name(u, s) + self.names[id(s)]
        self.out[id(s)] = self.local_inputs(s, inputs, name, self._watermarks(s))

    def _watermarks(self, s: Stage) -> Any:
        """The watermark inserter of ``with_timestamps`` stage ``s``: a fixed lag, throttled
        by the frame that every window downstream of it shares (the GCD of their slides),
        unless a session window (or a shifted frame) follows, which needs every
        watermark."""
        from slipstream.window import SessionWindowDef

        frames: list[int] = []
        session = False
        for w in self.stages:
            if w.kind == "window" and w.params["timestamps"] is s:
                wd = w.params["window_def"]
                if isinstance(wd, SessionWindowDef) or wd.frame_offset != 0:
                    session = True
                else:
                    frames.append(wd.frame_size)
        frame = math.gcd(*frames) if frames and not session else None
        return P.insert_watermarks(s.params["ts_fn"], LagPolicy(s.params["lag"], frame))

    def _build_aggregate(self, s: Stage) -> None:
        key_fn, op = s.params["key_fn"], s.params["op"]
        name = self.names[id(s)]
        (u,) = s.upstream
        if op.combine is None:
            self.out[id(s)] = self.keyed_inputs(s, name, P.aggregate_by_key(key_fn, op), key_fn)
            return
        from slipstream.processors.aggregation import accumulate_by_key_groups

        s1 = self.local_inputs(
            s,
            self._inputs(u, s),
            self._chain_name(u, s) + f"{name}-accumulate",
            # its accumulators are seen by stage 2 only: KeyedGroup items, not a pair per key
            accumulate_by_key_groups(key_fn, op),
            key_fn=key_fn,
        )
        s2 = self.vertex(f"{name}-combine", P.combine_by_key(op), s.local_parallelism)
        self.connect(s1, s2, lambda e: e.distributed().partitioned(_entry_key))
        self.out[id(s)] = s2

    def _build_rolling_aggregate(self, s: Stage) -> None:
        from slipstream.pipeline import keyed

        key_fn, op = s.params["key_fn"], s.params["op"]
        name = self.names[id(s)]
        if s.params.get("per_epoch"):
            # per key and epoch: partials on the producers' side (no shuffle to them),
            # one per key through the distributed edge
            (u,) = s.upstream
            s1 = self.local_inputs(
                s,
                self._inputs(u, s),
                self._chain_name(u, s) + f"{name}-partials",
                keyed.rolling_partials(key_fn, op),
            )
            s2 = self.vertex(name, keyed.rolling_latest(op), s.local_parallelism)
            self.connect(s1, s2, lambda e: e.distributed().partitioned(_entry_key))
            self.out[id(s)] = s2
            return
        supplier = keyed.rolling_aggregate(key_fn, op)
        self.out[id(s)] = self.keyed_inputs(s, name, supplier, key_fn)

    def _build_map_stateful(self, s: Stage) -> None:
        from slipstream.pipeline import keyed

        key_fn = s.params["key_fn"]
        supplier = keyed.map_stateful(key_fn, s.params["create"], s.params["fn"])
        self.out[id(s)] = self.keyed_inputs(s, self.names[id(s)], supplier, key_fn)

    def _build_window(self, s: Stage) -> None:
        from slipstream.window import SessionWindowDef

        key_fn, ts_fn = s.params["key_fn"], s.params["ts_fn"]
        wd, op = s.params["window_def"], s.params["op"]
        name = self.names[id(s)]
        (u,) = s.upstream
        supplier: Any
        if isinstance(wd, SessionWindowDef):
            supplier = P.aggregate_to_session_window(
                session_timeout=wd.timeout, key_fn=key_fn, timestamp_fn=ts_fn, agg_op=op
            )
            self.out[id(s)] = self.keyed_inputs(s, name, supplier, key_fn)
            return
        if not self.two_stage(s):
            supplier = P.aggregate_to_sliding_window(
                key_fn=key_fn, timestamp_fn=ts_fn, window_def=wd, agg_op=op
            )
            self.out[id(s)] = self.keyed_inputs(s, name, supplier, key_fn)
            return
        from slipstream.processors.windows import accumulate_rows_by_frame

        # its frames are seen by stage 2 only: one KeyedGroup per frame, not a named
        # tuple per key
        stage1 = accumulate_rows_by_frame(
            key_fn=key_fn, timestamp_fn=ts_fn, window_def=wd, agg_op=op
        )
        if self.piped_into.get(id(u)) is s:
            # watermarks inserted inside stage 1: no hop between them, and the edge in is
            # isolated, so each inserter keeps its producer's substream in order
            (before,) = u.upstream
            s1 = self.local_inputs(
                s,
                self._inputs(before, u),
                self._chain_name(before, u) + f"{self.names[id(u)]}+{name}-accumulate",
                pipe(self._watermarks(u), stage1),
            )
        else:
            s1 = self.local_inputs(
                s,
                self._inputs(u, s),
                self._chain_name(u, s) + f"{name}-accumulate",
                stage1,
                key_fn=key_fn,
            )
        s2 = self.vertex(
            f"{name}-combine",
            P.combine_to_sliding_window(window_def=wd, agg_op=op),
            s.local_parallelism,
        )
        self.connect(s1, s2, lambda e: e.distributed().partitioned(_frame_key))
        self.out[id(s)] = s2

    def _build_hash_join(self, s: Stage) -> None:
        from slipstream.pipeline import keyed

        main, other = s.upstream
        p = s.params
        supplier = keyed.hash_join([p["key_fn"]], [p["other_key_fn"]], p["output_fn"], p["inner"])
        name = self._chain_name(main, s) + self.names[id(s)]
        probes, builds = self._inputs(main, s), self._inputs(other, s)
        if self._lineage([v for v, _ in probes]) & self._lineage([v for v, _ in builds]):
            name, held = self.names[id(s)], f"{name}-probe-held"
            # both sides come from one vertex (a self-join): the join reads the probe side
            # only once the build side has ended, so the shared vertex would wait on the
            # full probe queues for good (a priority diamond). A vertex that holds the
            # whole probe side (a stable sort on a constant key keeps the order) frees it.
            hold = self.local_inputs(s, probes, held, P.sort(_same_key))
            declare(hold.supplier, BUFFERS_INPUT)  # also when a chain runs inside it
            probes = [(hold, None)]
        v = self.local_inputs(s, probes, name, supplier)
        for producer, _fn in builds:
            self.connect(producer, v, lambda e: e.broadcast().distributed().priority(-1))
        self.out[id(s)] = v

    def _lineage(self, vertices: list[Vertex]) -> set[str]:
        """The names of ``vertices`` and of every vertex upstream of them."""
        seen: set[str] = set()
        todo = [v.name for v in vertices]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(e.source.name for e in self.dag.inbound_edges(n))
        return seen

    def _build_sink(self, s: Stage) -> None:
        lp = s.local_parallelism if s.local_parallelism != -1 else 1
        v = self.vertex(self.names[id(s)], s.params["supplier"], lp)
        (u,) = s.upstream
        for producer, fn in self._inputs(u, s):
            assert fn is None
            self.connect(producer, v, lambda e: e)
        self.out[id(s)] = v


def same_policy(a: Stage, b: Stage) -> bool:
    """Whether two stages run under the same ``on_item_error`` (a vertex runs one)."""
    pa, pb = a._owner.item_error, b._owner.item_error
    return pa is pb or (isinstance(pa, str) and pa == pb)


def compile_pipeline(
    pipeline: Pipeline, *, members: int | None = None, default_parallelism: int | None = None
) -> DAG:
    """The Core API DAG of ``pipeline`` (a new one on every call), the same whatever
    engine runs it. ``members`` and ``default_parallelism`` are accepted for callers of
    the earlier signature and do not change the DAG."""
    del members, default_parallelism
    return _Compiler(pipeline).build()
