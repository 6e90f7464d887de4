"""Restore routing: which processor of a new execution gets which entry of a snapshot.

A keyed entry goes where a live item with its key goes on a distributed partitioned edge
(the vertex's custom partitioner if its inbound edge has one): both are routed by
:func:`~slipstream.core.partition.key_routing`, so a job restores at
another parallelism or member count; a :class:`~slipstream.state.keys.BroadcastKey` entry
goes to every processor of the vertex. Both engines restore through :func:`restore_plan`
(the embedded engine's :mod:`~slipstream.engine.job`, the Spark engine's
:mod:`~slipstream.spark.streaming`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from slipstream.core.dag import DAG, RoutingPolicy
from slipstream.core.errors import SnapshotError
from slipstream.core.partition import key_routing
from slipstream.state.keyed import StateMap
from slipstream.state.keys import (
    KeyedStateBatch,
    KeyedStateKey,
    expand_entries,
    is_broadcast,
    routing_key,
)
from slipstream.state.store import Manifest, SnapshotData

__all__ = [
    "PlanShape",
    "check_no_lost_state",
    "chains_to_read",
    "custom_partitioners",
    "entry_flags",
    "recovering_completed",
    "restore_plan",
]


class PlanShape(Protocol):
    """What restore routing needs of a vertex's plan (an engine's ``VertexPlan``): how many
    processors it has, on how many members."""

    @property
    def local_parallelism(self) -> int: ...

    @property
    def member_count(self) -> int: ...

    @property
    def total_parallelism(self) -> int: ...


def restore_plan(
    data: SnapshotData,
    plans: Mapping[str, PlanShape],
    partitioners: dict[str, Any],
    own_chains: set[tuple[str, int]] | None = None,
) -> tuple[dict[tuple[str, int], list[Any]], set[tuple[str, int]]]:
    """Route a snapshot's entries to the processors of the new execution.

    Keyed entries go to the processor owning ``partition(routing_key(key))`` on a
    distributed partitioned edge (the vertex's own partitioner if its inbound edge has a
    custom one), broadcast entries to every processor. Returns the entries per (vertex,
    global index) and the processors to restore as already completed.

    ``own_chains`` (if given) receives the processors that get back exactly the entries
    saved: the vertex has the same total parallelism, every key the processor saved
    routes back to it and no other processor's key to it (so with the same member count
    and the same partitioner). Broadcast entries (every processor gets all of them) do
    not count: they are not keyed-state map entries, and a processor saves all of its
    other entries in each chunk. Their keyed state may continue their chain
    (:func:`~slipstream.state.keyed.continue_restored_chain`, which checks that the maps
    it restored equal the chain's).
    """
    check_no_lost_state(
        data.snapshot_id,
        data.job_name,
        [n for n, vs in data.vertices.items() if any(vs.entries.values())],
        plans,
    )
    routed: dict[tuple[str, int], list[Any]] = {}
    completed: set[tuple[str, int]] = set()
    for name, vp in plans.items():
        total = vp.total_parallelism
        for g in range(total):
            routed[(name, g)] = []
        vs = data.vertices.get(name)
        if vs is None:
            continue
        if vs.completed:
            if len(vs.completed) == vs.total_parallelism:
                completed.update((name, g) for g in range(total))
            elif vs.total_parallelism == total:
                completed.update((name, g) for g in vs.completed)
            else:
                raise SnapshotError(
                    f"vertex {name!r}: {len(vs.completed)} of {vs.total_parallelism} processors "
                    f"had finished when the snapshot was taken; it cannot be restored with "
                    f"parallelism {total}"
                )
        # the routing of a live item on a distributed partitioned edge into this vertex
        owner = key_routing(partitioners.get(name), vp.member_count, vp.local_parallelism).owner
        everyone = [routed[(name, g)] for g in range(total)]
        track = own_chains is not None and vs.total_parallelism == total
        moved: set[int] = set()  # processors that lose or gain a key (with track)
        for i, entries in vs.entries.items():
            for entry in expand_entries(entries):
                k = entry[0]
                if is_broadcast(k):
                    for lst in everyone:
                        lst.append(entry)
                else:
                    g = owner(routing_key(k))
                    routed[(name, g)].append(entry)
                    if track and g != i:
                        moved.add(i)
                        moved.add(g)
        if track:
            assert own_chains is not None
            own_chains.update(
                (name, i) for i in vs.entries if i not in moved and i not in vs.completed
            )
    return routed, completed


def check_no_lost_state(
    snapshot_id: int, job_name: str | None, with_state: Iterable[str], plans: Mapping[str, Any]
) -> None:
    """Refuse a restore that would drop state: ``with_state`` (the vertices of snapshot
    ``snapshot_id`` that hold entries) names a vertex the new DAG (``plans``) lacks."""
    lost = sorted(n for n in with_state if n not in plans)
    if lost:
        # Jet refuses a restore into a changed DAG too: the state would be dropped silently
        raise SnapshotError(
            f"snapshot {snapshot_id} of job {job_name!r} holds state of "
            f"vertices {lost} that this DAG does not have (its vertices: "
            f"{sorted(plans)}); the DAG changed since the snapshot. Restore into the DAG "
            "that wrote it, or start fresh with another snapshot store. A Pipeline "
            "compiles to the same vertices on every engine and entry point; they change "
            "with its stages and stage names (a store written by an earlier slipstream on "
            "one member with one thread holds a one-stage window: vertices "
            "'with_timestamps' and 'window')"
        )


def recovering_completed(
    data: SnapshotData, plans: Mapping[str, PlanShape], completed: set[tuple[str, int]]
) -> set[tuple[str, int]]:
    """The processors restored as completed that must still see their routed entries
    (``restore_from_snapshot`` and ``finish_snapshot_restore``, then the end): those whose
    completion state the snapshot holds, so that they commit their last output; at another
    parallelism (the whole vertex had completed) all of the vertex's processors."""
    out: set[tuple[str, int]] = set()
    for name, vp in plans.items():
        vs = data.vertices.get(name)
        final = getattr(vs, "final", None) if vs is not None else None
        if not final:
            continue
        same = vs is not None and vs.total_parallelism == vp.total_parallelism
        for g in range(vp.total_parallelism):
            if (name, g) in completed and (g in final or not same):
                out.add((name, g))
    return out


def custom_partitioners(dag: DAG) -> dict[str, Any]:
    """Each vertex's custom partitioner (from its first partitioned inbound edge), so that
    restored keyed state lands where live items with that key go."""
    out = {}
    for v in dag.vertices:
        for e in dag.inbound_edges(v):
            if e.routing is RoutingPolicy.PARTITIONED and e.partitioner is not None:
                out[v.name] = e.partitioner
                break
    return out


def _keys(entries: Iterable[tuple[Any, Any]]) -> Iterable[Any]:
    """The routing key of every keyed entry (``BroadcastKey`` entries are skipped)."""
    for k, v in entries:
        t = type(k)
        if t is StateMap:
            yield from v.upserts
        elif t is KeyedStateBatch:
            yield from v
        elif t is KeyedStateKey:
            yield k.key
        elif not is_broadcast(k):
            yield k


def entry_flags(
    entries: list[tuple[Any, Any]], index: int, owner: Callable[[Any], int]
) -> tuple[bool, bool]:
    """``(spill, broadcast)`` of a processor's saved entries: whether one keyed entry
    belongs to another processor than ``index`` (``owner``: the vertex's restore
    routing), and whether one is a ``BroadcastKey`` entry. A restore at the same shape
    reads a chain without either only for its own processor (:func:`chains_to_read`;
    the Spark engine's executors and the embedded engine's member processes record
    them with each chain)."""
    broadcast = any(is_broadcast(k) for k, _v in entries)
    spill = any(owner(key) != index for key in _keys(entries))
    return spill, broadcast


def chains_to_read(
    manifest: Manifest,
    flags: Mapping[str, Any],
    plans: Mapping[str, PlanShape],
    mine: set[tuple[str, int]],
) -> set[tuple[str, int]]:
    """The chains of ``manifest`` that processors ``mine`` (``(vertex, global
    index)``, a member process's share of the new execution, ``plans``) need for their
    restore: per vertex restored at the shape it was saved at (``flags[vertex]``:
    ``{"shape": [member count, local parallelism], "chains": {index: [spill,
    broadcast]}}``, the same total parallelism) whose chains hold no keyed entry of
    another processor, their own chains and those holding ``BroadcastKey`` entries
    (which every processor of the vertex gets); every chain of any other vertex (its
    keys move, or nothing tells where they go). :func:`restore_plan` over what these
    chains hold gives ``mine`` exactly what it gives them over the whole snapshot."""
    out: set[tuple[str, int]] = set()
    for name, vm in manifest.vertices.items():
        plan = plans.get(name)
        f = flags.get(name)
        chains = (f or {}).get("chains", {})
        same = (
            plan is not None
            and f is not None
            and list(f.get("shape", ())) == [plan.member_count, plan.local_parallelism]
            and vm.total_parallelism == plan.total_parallelism
            and all(str(i) in chains for i in vm.chains)
            and not any(chains[str(i)][0] for i in vm.chains)
        )
        for i in vm.chains:
            if not same or (name, i) in mine or chains[str(i)][1]:
                out.add((name, i))
    return out
