"""The DAG model: vertices (a processor supplier plus a parallelism) joined by edges.

Validation happens in two places: ``DAG.edge`` rejects what is wrong on its own (an edge
to a vertex not in the DAG, a reused ordinal); ``DAG.validate`` checks the whole graph
(cycles, gaps in ordinals, isolated edges between unequal parallelism, suppliers that
cannot be pickled) and, from the vertices' traits (:mod:`slipstream.core.traits`), the
graphs that would run but give silently wrong results: a keyed processor fed so that a
key reaches several processors, an edge out of a sink (errors), a window with no
watermark source upstream (a :class:`DagWarning`), and one that would hang: a *priority
diamond* (:meth:`DAG._check_priority_diamonds`). Both engines call ``validate`` at
``new_job``. Every error is a :class:`DagError` naming the vertex, edge or ordinal.
"""

from __future__ import annotations

import enum
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from slipstream.core.describe import short_repr
from slipstream.core.errors import DagError
from slipstream.core.partition import Partitioner
from slipstream.core.suppliers import ProcessorMetaSupplier, to_meta_supplier
from slipstream.core.traits import (
    BUFFERS_INPUT,
    KEYED,
    SINK,
    WATERMARK_SOURCE,
    WINDOWED,
    traits_of,
)

__all__ = [
    "DAG",
    "Vertex",
    "Edge",
    "RoutingPolicy",
    "DEFAULT_QUEUE_SIZE",
    "DagWarning",
    "as_dag",
    "effective_parallelism",
]


class DagWarning(UserWarning):
    """A DAG that is valid but likely to misbehave (e.g. a window no watermark reaches)."""


DEFAULT_QUEUE_SIZE = 1024


class RoutingPolicy(enum.Enum):
    """How an edge picks the consumer of each item."""

    UNICAST = "unicast"
    PARTITIONED = "partitioned"
    BROADCAST = "broadcast"
    ISOLATED = "isolated"
    ALL_TO_ONE = "all-to-one"


class Vertex:
    """A named step of the DAG: ``local_parallelism`` processors per member."""

    def __init__(self, name: str, supplier: Any) -> None:
        if not isinstance(name, str) or not name:
            raise DagError(f"vertex name must be a non-empty string, got {name!r}")
        self.name = name
        self.supplier = supplier
        try:
            self.meta_supplier: ProcessorMetaSupplier = to_meta_supplier(supplier)
        except TypeError as e:
            raise DagError(f"vertex {name!r}: {e}") from None
        self._local_parallelism = -1
        self._on_item_error: Any = None
        self._state_backend: str | None = None

    def on_item_error(self, policy: Any) -> Vertex:
        """This vertex's bad-record policy, overriding ``JobConfig.on_item_error``:
        ``"fail"``, ``"skip"`` or a sink (a sink supplier, or a sink vertex of the DAG) to
        send :class:`~slipstream.core.item_errors.DeadLetter` records to. Only for
        vertices whose processors handle item errors (``P.map``, ``P.filter``,
        ``P.flat_map``, service calls, aggregations, ...). Returns the vertex."""
        from slipstream.core.item_errors import check_policy, handles_item_errors

        try:
            check_policy(policy, f"vertex {self.name!r}")
        except (TypeError, ValueError) as e:
            raise DagError(str(e)) from None
        if not handles_item_errors(self.supplier):
            raise DagError(
                f"vertex {self.name!r}: on_item_error needs processors that handle item "
                f"errors (map, filter, flat_map, service calls, aggregations, a Pipeline's "
                f"stages; a processor of your own declares handles_item_errors = True), "
                f"and {short_repr(self.supplier)} does not"
            )
        self._on_item_error = policy
        return self

    def get_on_item_error(self) -> Any:
        """The vertex's own ``on_item_error`` (``None``: the job's)."""
        return self._on_item_error

    def state_backend(self, backend: str) -> Vertex:
        """Where this vertex's keyed processors keep their state, overriding
        ``JobConfig.state_backend``: ``"memory"`` or ``"sqlite"`` (on disk, behind a
        cache of the hot keys). Returns the vertex."""
        from slipstream.core.config import check_state_backend

        try:
            check_state_backend(backend, f"vertex {self.name!r}")
        except ValueError as e:
            raise DagError(str(e)) from None
        self._state_backend = backend
        return self

    def get_state_backend(self) -> str | None:
        """The vertex's own ``state_backend`` (``None``: the job's)."""
        return getattr(self, "_state_backend", None)

    def local_parallelism(self, n: int) -> Vertex:
        """Processors per member; -1 means the engine's default (its cooperative thread
        count). Returns the vertex so calls chain."""
        if not isinstance(n, int) or isinstance(n, bool) or (n < 1 and n != -1):
            raise DagError(
                f"vertex {self.name!r}: local parallelism must be >= 1 or -1 (default), got {n!r}"
            )
        self._local_parallelism = n
        return self

    def get_local_parallelism(self) -> int:
        return self._local_parallelism

    def __repr__(self) -> str:
        lp = self._local_parallelism
        return f"Vertex({self.name!r}, local_parallelism={'default' if lp == -1 else lp})"


class Edge:
    """A data stream ``(source, source_ordinal) -> (dest, dest_ordinal)``.

    Defaults: unicast routing, member-local, priority 0, queue size 1024 items.
    """

    def __init__(self, source: Vertex, source_ordinal: int = 0) -> None:
        if not isinstance(source, Vertex):
            raise DagError(f"edge source must be a Vertex, got {type(source).__name__}")
        _check_ordinal(source_ordinal, f"edge from {source.name!r}")
        self.source = source
        self.source_ordinal = source_ordinal
        self.dest: Vertex | None = None
        self.dest_ordinal = 0
        self.routing = RoutingPolicy.UNICAST
        self.key_fn: Callable[[Any], Any] | None = None
        self.partitioner: Partitioner | None = None
        self.is_distributed = False
        self.unpartitioned_ok = False
        self.priority_diamond_ok = False
        self._priority = 0
        self._queue_size = DEFAULT_QUEUE_SIZE

    # -- construction ------------------------------------------------------------------
    @staticmethod
    def between(source: Vertex, dest: Vertex) -> Edge:
        """An edge from ordinal 0 of ``source`` to ordinal 0 of ``dest``."""
        return Edge(source, 0).to(dest, 0)

    @staticmethod
    def from_(source: Vertex, ordinal: int = 0) -> Edge:
        """Start an edge at ``ordinal`` of ``source``; finish it with ``.to(dest)``."""
        return Edge(source, ordinal)

    def to(self, dest: Vertex, ordinal: int = 0) -> Edge:
        if not isinstance(dest, Vertex):
            raise DagError(f"edge destination must be a Vertex, got {type(dest).__name__}")
        _check_ordinal(ordinal, f"edge to {dest.name!r}")
        self.dest = dest
        self.dest_ordinal = ordinal
        return self

    # -- routing -----------------------------------------------------------------------
    def unicast(self) -> Edge:
        """Each item to one consumer (round robin over consumers with room)."""
        self.routing = RoutingPolicy.UNICAST
        self.key_fn = self.partitioner = None
        return self

    def partitioned(
        self, key_fn: Callable[[Any], Any], partitioner: Partitioner | None = None
    ) -> Edge:
        """Items with equal keys go to the same consumer. ``partitioner(key, count)``
        returns a partition in ``range(count)``; the default hashes the key stably."""
        if not callable(key_fn):
            raise DagError(f"{self._label()}: partitioned() needs a callable key function")
        if partitioner is not None and not callable(partitioner):
            raise DagError(f"{self._label()}: partitioner must be callable")
        self.routing = RoutingPolicy.PARTITIONED
        self.key_fn = key_fn
        self.partitioner = partitioner
        return self

    def broadcast(self) -> Edge:
        """Every item to every consumer."""
        self.routing = RoutingPolicy.BROADCAST
        self.key_fn = self.partitioner = None
        return self

    def isolated(self) -> Edge:
        """Producer ``i`` feeds only consumer ``i`` (equal parallelism, local edge)."""
        self.routing = RoutingPolicy.ISOLATED
        self.key_fn = self.partitioner = None
        return self

    def all_to_one(self) -> Edge:
        """Every item to one consumer (per member, or in the cluster if distributed)."""
        self.routing = RoutingPolicy.ALL_TO_ONE
        self.key_fn = self.partitioner = None
        return self

    def allow_unpartitioned(self) -> Edge:
        """Opt out of the check that a keyed processor (``aggregate_by_key``, keyed
        windows, ...) with several processors gets each key on one processor only. Use
        it when partial results per processor are what you want, or when the items
        already arrive partitioned (e.g. an isolated edge from a vertex partitioned by
        the same key)."""
        self.unpartitioned_ok = True
        return self

    def allow_priority_diamond(self) -> Edge:
        """Opt out of the priority diamond check (see :meth:`DAG.validate`) for this
        edge, the lower-priority one: use it when fewer items ever take the path to it
        from the vertex the two edges share upstream than the queues on that path hold
        (``queue_size`` per edge), so they wait there while the higher-priority edge is
        drained. With more the job hangs."""
        self.priority_diamond_ok = True
        return self

    def distributed(self) -> Edge:
        """Consumers on every member, not just the producer's own."""
        self.is_distributed = True
        return self

    def local(self) -> Edge:
        self.is_distributed = False
        return self

    def priority(self, n: int) -> Edge:
        """Lower numbers are consumed first: a consumer drains all edges of the highest
        priority before it looks at lower ones (e.g. the build side of a hash join).
        Two edges of different priority into one vertex that share an upstream vertex
        can hang the job: :meth:`DAG.validate` refuses that (a priority diamond)."""
        if not isinstance(n, int):
            raise DagError(f"{self._label()}: priority must be an int, got {n!r}")
        self._priority = n
        return self

    def queue_size(self, n: int) -> Edge:
        """Capacity (items) of each producer→consumer queue of this edge."""
        if not isinstance(n, int) or n < 1:
            raise DagError(f"{self._label()}: queue size must be an int >= 1, got {n!r}")
        self._queue_size = n
        return self

    def get_priority(self) -> int:
        return self._priority

    def get_queue_size(self) -> int:
        return self._queue_size

    def _label(self) -> str:
        d = self.dest.name if self.dest is not None else "?"
        return f"edge {self.source.name!r}[{self.source_ordinal}] -> {d!r}[{self.dest_ordinal}]"

    def __repr__(self) -> str:
        extra = [self.routing.value]
        if self.is_distributed:
            extra.append("distributed")
        if self._priority:
            extra.append(f"priority={self._priority}")
        return f"Edge({self._label()[5:]}, {', '.join(extra)})"


def effective_parallelism(vertex: Vertex, default: int) -> int:
    """The local parallelism an engine gives ``vertex`` when its default is ``default``
    (a meta-supplier's preferred parallelism caps the default)."""
    lp = vertex.get_local_parallelism()
    if lp != -1:
        return lp
    preferred = vertex.meta_supplier.preferred_local_parallelism()
    return min(preferred, default) if preferred > 0 else default


def _check_keyed_edge(e: Edge, total: int, member_count: int) -> None:
    """A keyed consumer with ``total`` > 1 processors: ``e`` must send every key to one
    of them (partitioned, or all to one; across members only if distributed)."""
    if e.unpartitioned_ok:
        return
    keyed_routing = e.routing in (RoutingPolicy.PARTITIONED, RoutingPolicy.ALL_TO_ONE)
    if keyed_routing and (e.is_distributed or member_count == 1):
        return
    dest = e.dest.name  # type: ignore[union-attr]
    how = e.routing.value
    if keyed_routing:
        how += f" but member-local on {member_count} members"
    raise DagError(
        f"{e._label()}: vertex {dest!r} keeps state per key and runs {total} processors, "
        f"but this edge is {how}, so one key would reach several processors and give "
        "several partial results. Use .partitioned(key_fn)"
        + (" with .distributed()" if member_count > 1 else "")
        + ", or call .allow_unpartitioned() on the edge if that is what you want"
    )


def _check_ordinal(ordinal: Any, where: str) -> None:
    if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
        raise DagError(f"{where}: ordinal must be an int >= 0, got {ordinal!r}")


class DAG:
    """A directed acyclic graph of vertices and edges. ``edge()`` returns the DAG."""

    def __init__(self) -> None:
        self._vertices: dict[str, Vertex] = {}
        self._edges: list[Edge] = []

    def new_vertex(self, name: str, supplier: Any) -> Vertex:
        """Add a vertex; ``supplier`` makes its processors (see ``to_meta_supplier``)."""
        if name in self._vertices:
            raise DagError(f"duplicate vertex name {name!r}")
        v = Vertex(name, supplier)
        self._vertices[name] = v
        return v

    def vertex(self, name: str) -> Vertex:
        try:
            return self._vertices[name]
        except KeyError:
            raise DagError(f"no vertex named {name!r} in the DAG") from None

    @property
    def vertices(self) -> list[Vertex]:
        return list(self._vertices.values())

    @property
    def edges(self) -> list[Edge]:
        return list(self._edges)

    def edge(self, edge: Edge) -> DAG:
        """Add ``edge``; returns the DAG so calls chain."""
        if not isinstance(edge, Edge):
            raise DagError(f"dag.edge() needs an Edge, got {type(edge).__name__}")
        if edge.dest is None:
            raise DagError(f"{edge._label()}: the edge has no destination (call .to(vertex))")
        for end, v in (("source", edge.source), ("destination", edge.dest)):
            if self._vertices.get(v.name) is not v:
                raise DagError(
                    f"{edge._label()}: {end} vertex {v.name!r} is not in this DAG "
                    "(add it with dag.new_vertex first)"
                )
        if edge.source is edge.dest:
            raise DagError(f"{edge._label()}: an edge cannot connect a vertex to itself")
        for e in self._edges:
            if e.source is edge.source and e.source_ordinal == edge.source_ordinal:
                raise DagError(
                    f"vertex {edge.source.name!r} already has an outbound edge at ordinal "
                    f"{edge.source_ordinal} (to {e.dest.name!r})"  # type: ignore[union-attr]
                )
            if e.dest is edge.dest and e.dest_ordinal == edge.dest_ordinal:
                raise DagError(
                    f"vertex {edge.dest.name!r} already has an inbound edge at ordinal "
                    f"{edge.dest_ordinal} (from {e.source.name!r})"
                )
        self._edges.append(edge)
        return self

    def inbound_edges(self, vertex: Vertex | str) -> list[Edge]:
        name = vertex if isinstance(vertex, str) else vertex.name
        return sorted(
            (e for e in self._edges if e.dest.name == name),  # type: ignore[union-attr]
            key=lambda e: e.dest_ordinal,
        )

    def outbound_edges(self, vertex: Vertex | str) -> list[Edge]:
        name = vertex if isinstance(vertex, str) else vertex.name
        return sorted(
            (e for e in self._edges if e.source.name == name), key=lambda e: e.source_ordinal
        )

    def topological_order(self) -> list[Vertex]:
        """Vertices sources-first (Kahn's algorithm, insertion order among equals);
        ``DagError`` naming the vertices on a cycle if there is one."""
        indeg = {name: 0 for name in self._vertices}
        for e in self._edges:
            indeg[e.dest.name] += 1  # type: ignore[union-attr]
        ready = [n for n, d in indeg.items() if d == 0]
        order: list[Vertex] = []
        while ready:
            n = ready.pop(0)
            order.append(self._vertices[n])
            for e in self._edges:
                if e.source.name == n:
                    d = e.dest.name  # type: ignore[union-attr]
                    indeg[d] -= 1
                    if indeg[d] == 0:
                        ready.append(d)
        if len(order) != len(self._vertices):
            stuck = sorted(n for n, d in indeg.items() if d > 0)
            raise DagError(f"the DAG has a cycle through vertices {stuck}")
        return order

    def validate(
        self,
        default_parallelism: int | None = None,
        check_pickle: bool = True,
        member_count: int = 1,
        sample_data: bool = False,
        bounded_queues: bool = True,
    ) -> None:
        """Check the whole graph; raises :class:`DagError` naming what is wrong (and
        warns, :class:`DagWarning`, about what is likely wrong). ``default_parallelism``
        and ``member_count`` are the engine's: some checks depend on a vertex's global
        parallelism. ``sample_data`` is :meth:`check_picklable`'s. ``bounded_queues``
        says that the engine's queues between processors are bounded, so that a priority
        diamond can hang it (the embedded engine; Spark's are not)."""
        if not self._vertices:
            raise DagError("the DAG has no vertices")
        self.topological_order()
        for v in self._vertices.values():
            for direction, edges, attr in (
                ("inbound", self.inbound_edges(v), "dest_ordinal"),
                ("outbound", self.outbound_edges(v), "source_ordinal"),
            ):
                ordinals = sorted(getattr(e, attr) for e in edges)
                for expected, got in enumerate(ordinals):
                    if got != expected:
                        raise DagError(
                            f"vertex {v.name!r}: {direction} ordinals must be 0..{len(ordinals) - 1} "
                            f"without gaps, but ordinal {expected} is missing (has {ordinals})"
                        )
        for e in self._edges:
            if e.routing is RoutingPolicy.ISOLATED:
                if e.is_distributed:
                    raise DagError(f"{e._label()}: isolated edges must be local, not distributed")
                a = e.source.get_local_parallelism()
                b = e.dest.get_local_parallelism()  # type: ignore[union-attr]
                if default_parallelism is not None:
                    a = default_parallelism if a == -1 else a
                    b = default_parallelism if b == -1 else b
                if a != b and (a != -1 and b != -1):
                    raise DagError(
                        f"{e._label()}: isolated edge between vertices of different local "
                        f"parallelism ({e.source.name!r}: {a}, "
                        f"{e.dest.name!r}: {b})"  # type: ignore[union-attr]
                    )
        self._check_traits(default_parallelism, member_count)
        if bounded_queues:
            self._check_priority_diamonds()
        if check_pickle:
            self.check_picklable(sample_data=sample_data)

    def _check_traits(self, default_parallelism: int | None, member_count: int) -> None:
        traits = {v.name: traits_of(v.supplier) for v in self._vertices.values()}
        for e in self._edges:
            if SINK in (traits[e.source.name] or ()):
                raise DagError(
                    f"{e._label()}: vertex {e.source.name!r} is a sink; a sink has no "
                    "outbound edges (nothing it receives would go on)"
                )
        for v in self._vertices.values():
            t = traits[v.name] or frozenset()
            if KEYED in t:
                lp = v.get_local_parallelism()
                if lp == -1 and default_parallelism is not None:
                    lp = effective_parallelism(v, default_parallelism)
                if lp != -1 and lp * member_count > 1:
                    for e in self.inbound_edges(v):
                        _check_keyed_edge(e, lp * member_count, member_count)
            if WINDOWED in t and not any(
                traits[a] is None or WATERMARK_SOURCE in traits[a]  # type: ignore[operator]
                for a in self._ancestors(v)
            ):
                warnings.warn(
                    f"vertex {v.name!r} emits windows on watermarks, but no vertex upstream "
                    "of it creates watermarks: it would accumulate and emit nothing until "
                    "the input ends. Add P.insert_watermarks(timestamp_fn, policy) between "
                    "the source and the window",
                    DagWarning,
                    stacklevel=4,
                )

    def _ancestors(self, v: Vertex) -> set[str]:
        seen: set[str] = set()
        todo = [v.name]
        while todo:
            n = todo.pop()
            for e in self._edges:
                if e.dest.name == n and e.source.name not in seen:  # type: ignore[union-attr]
                    seen.add(e.source.name)
                    todo.append(e.source.name)
        return seen

    def _check_priority_diamonds(self) -> None:
        """Refuse a vertex whose inbound edges of different priority are fed by a shared
        upstream vertex ``u``, unless every path from ``u`` to the lower-priority edge
        passes a vertex that buffers its whole input (:data:`BUFFERS_INPUT`).

        The consumer reads the lower-priority edge only once the higher-priority one has
        ended, which needs ``u`` to end; but ``u`` also feeds the lower-priority path, and
        once that path's bounded queues are full ``u`` waits for the consumer: a
        deadlock (a documented Jet pitfall), unless everything ``u`` sends that way fits
        in the queues. A buffering vertex on the path takes all of ``u``'s output
        whatever the consumer does, so the path cannot hold ``u`` back."""
        order: list[str] = []
        for v in self._vertices.values():
            inbound = self.inbound_edges(v)
            if len({e.get_priority() for e in inbound}) < 2:
                continue
            order = order or [u.name for u in self.topological_order()]
            for lo in inbound:
                if lo.priority_diamond_ok:
                    continue
                toward_v = self._unbuffered_feeders(lo)
                for hi in inbound:
                    if hi.get_priority() >= lo.get_priority():
                        continue
                    feeds_hi = self._ancestors(hi.source) | {hi.source.name}
                    # the shared vertex nearest to v: the shortest path to show
                    shared = [u for u in order if u in feeds_hi and u in toward_v]
                    if shared:
                        self._refuse_diamond(v, hi, lo, shared[-1], toward_v)

    def _unbuffered_feeders(self, lo: Edge) -> dict[str, str | None]:
        """The vertices from which a path reaches edge ``lo`` with no buffering vertex
        after its start, each mapped to its next vertex on such a path (``lo``'s source
        to ``None``)."""
        nxt: dict[str, str | None] = {lo.source.name: None}
        todo = [lo.source.name]
        while todo:
            n = todo.pop()
            if BUFFERS_INPUT in (traits_of(self._vertices[n].supplier) or ()):
                continue
            for e in self._edges:
                if e.dest.name == n and e.source.name not in nxt:  # type: ignore[union-attr]
                    nxt[e.source.name] = n
                    todo.append(e.source.name)
        return nxt

    def _refuse_diamond(
        self, v: Vertex, hi: Edge, lo: Edge, shared: str, toward_v: dict[str, str | None]
    ) -> None:
        path = [shared]
        while (n := toward_v[path[-1]]) is not None:
            path.append(n)
        path.append(v.name)
        raise DagError(
            f"vertex {v.name!r} can hang (a priority diamond): it reads {lo._label()} "
            f"(priority {lo.get_priority()}) only after {hi._label()} (priority "
            f"{hi.get_priority()}) has ended, but vertex {shared!r} feeds both, and nothing "
            f"on the path {' -> '.join(repr(n) for n in path)} takes its whole input: once "
            f"that path's queues are full, {shared!r} waits for {v.name!r}, which waits "
            f"for {shared!r} to end. Put a vertex that takes its whole input before it "
            "emits (an aggregation, P.sort) on that path, or give the two edges the same "
            "priority; if fewer items ever take that path than its queues hold, call "
            f".allow_priority_diamond() on {lo._label()}"
        )

    def check_picklable(self, *, sample_data: bool = False) -> None:
        """Every supplier and edge function must survive cloudpickle, so the same DAG can
        ship to Spark executors.

        ``sample_data=True`` is the embedded engine's check, which ships nothing: a long
        list or tuple that a ``functools.partial`` supplier holds as an argument (the
        items of ``sources.items``) is checked by its first and last
        ``_DATA_SAMPLE`` elements, not pickled whole. The code is still checked in full,
        so a DAG that runs here also ships; the Spark engine, which pickles the data to
        ship it anyway, checks everything. (Pickling 2 M small tuples only to throw the
        bytes away cost ~0.2 s per ``new_job``, a quarter of a windowed job over them.)"""
        for v in self._vertices.values():
            try:
                _check_picklable(v.meta_supplier, sample_data)
            except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's
                raise DagError(
                    f"vertex {v.name!r}: its processor supplier cannot be pickled "
                    f"({type(exc).__name__}: {exc}); suppliers must be picklable with cloudpickle"
                ) from exc
        for e in self._edges:
            for what, fn in (("key function", e.key_fn), ("partitioner", e.partitioner)):
                if fn is None:
                    continue
                try:
                    _check_picklable(fn)
                except Exception as exc:  # noqa: BLE001
                    raise DagError(
                        f"{e._label()}: the {what} cannot be pickled ({type(exc).__name__}: {exc})"
                    ) from exc

    # -- presentation ------------------------------------------------------------------
    def to_dot(self) -> str:
        """The DAG as Graphviz text."""
        lines = ["digraph DAG {"]
        for v in self._vertices.values():
            lp = v.get_local_parallelism()
            label = v.name if lp == -1 else f"{v.name} [{lp}]"
            lines.append(f'  "{_dot_escape(v.name)}" [label="{_dot_escape(label)}"];')
        for e in self._edges:
            attrs = [e.routing.value]
            if e.is_distributed:
                attrs.append("distributed")
            if e.get_priority():
                attrs.append(f"priority {e.get_priority()}")
            label = f"{e.source_ordinal}->{e.dest_ordinal} {' '.join(attrs)}"
            lines.append(
                f'  "{_dot_escape(e.source.name)}" -> "{_dot_escape(e.dest.name)}" '  # type: ignore[union-attr]
                f'[label="{_dot_escape(label)}"];'
            )
        lines.append("}")
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = ["DAG:"]
        try:
            order = self.topological_order()
        except DagError:
            order = list(self._vertices.values())
        for v in order:
            lp = v.get_local_parallelism()
            lines.append(f"  vertex {v.name!r} (local parallelism {'default' if lp == -1 else lp})")
            for e in self.outbound_edges(v):
                lines.append(f"    {e!r}")
        return "\n".join(lines)

    def __iter__(self) -> Iterator[Vertex]:
        return iter(self.topological_order())

    def __len__(self) -> int:
        return len(self._vertices)


def as_dag(job: Any) -> DAG:
    """What ``new_job`` runs: a :class:`DAG` as it is, or anything with ``to_dag()`` (a
    ``slipstream.Pipeline``) compiled. Both engines call this, so a pipeline runs
    wherever a DAG does, as the same DAG. Duck-typed: the core layer does not import
    the pipeline layer."""
    if isinstance(job, DAG):
        return job
    to_dag = getattr(job, "to_dag", None)
    if callable(to_dag):
        dag = to_dag()
        if isinstance(dag, DAG):
            return dag
    raise TypeError(f"new_job() needs a DAG or a Pipeline, got {type(job).__name__}")


class _Discard:
    """A file that forgets what is written: checking needs no copy of the bytes."""

    def write(self, data: Any) -> int:
        return len(data)


_DATA_LENGTH = 4096
"""A list or tuple argument of a partial supplier longer than this is data (sampled)."""
_DATA_SAMPLE = 256


def _sampled(value: Any) -> Any:
    if type(value) in (list, tuple) and len(value) > _DATA_LENGTH:
        return value[:_DATA_SAMPLE] + value[-_DATA_SAMPLE:]
    return value


def _checked_parts(*parts: Any) -> None:
    """Never called: the reduce value below only has to name what the pickler walks."""


def _reduce_partial_sampled(p: functools.partial[Any]) -> tuple[Any, ...]:
    """A partial as its function, its keywords and its arguments, long data sampled."""
    keywords = {k: _sampled(v) for k, v in p.keywords.items()}
    return _checked_parts, (p.func, tuple(map(_sampled, p.args)), keywords, vars(p) or None)


def _check_picklable(obj: Any, sample_data: bool = False) -> None:
    """Raise if ``obj`` cannot be shipped. The C pickler is tried first: cloudpickle calls
    back into Python for every object, which costs seconds on a supplier holding millions
    of items; only what plain pickle refuses (lambdas, closures, cycles) goes to
    cloudpickle. ``sample_data``: see :meth:`DAG.check_picklable` (one dispatch-table
    entry, consulted once per partial, not per item)."""
    import copyreg
    import pickle

    def with_sampling(table: Any) -> dict[type, Any]:
        return {**table, functools.partial: _reduce_partial_sampled}

    try:
        pickler = pickle.Pickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL)
        pickler.fast = True  # no memo: 5x faster on big data; a cycle just falls through
        if sample_data:
            pickler.dispatch_table = with_sampling(copyreg.dispatch_table)
        pickler.dump(obj)
        return
    except Exception:  # noqa: BLE001 - fall back to the more capable pickler
        pass
    # imported only now: a job whose suppliers plain pickle accepts never loads it
    from slipstream.core.pickling import cloudpickle

    pickler_class = cloudpickle.CloudPickler
    if sample_data:
        # the C pickler reads a subclass's table when it is created: a class attribute
        class SamplingPickler(cloudpickle.CloudPickler):
            dispatch_table = with_sampling(cloudpickle.CloudPickler.dispatch_table)

        pickler_class = SamplingPickler
    pickler_class(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)


def _dot_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')
