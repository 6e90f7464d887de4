"""Dead letters as part of the DAG: ``on_item_error=<sink>`` adds edges to that sink.

A vertex whose policy is a sink gets one more outbound edge, on its next free ordinal,
to a vertex running that sink (the job's own sink is the vertex ``dead-letters``; a
vertex's own sink supplier gets ``<vertex>-dead-letters``, shared by every vertex given
the same supplier object; a sink vertex of the DAG is used as it is). The processors
treat that ordinal as a side output (:meth:`Outbox.reserve_side_ordinal`): only the
:class:`~slipstream.core.item_errors.DeadLetter` records go there. Since dead letters are
items on edges like any others, snapshot barriers order them and a transactional sink
commits them with the snapshot that covers them: exactly once under an exactly-once job.

The job runs a copy of the DAG with those edges (``job.dag``); the same DAG and policy
give the same vertices and edges every time, so a snapshot restores into it.
"""

from __future__ import annotations

import copy
from typing import Any

from slipstream.core.dag import DAG, Edge, Vertex
from slipstream.core.errors import DagError
from slipstream.core.item_errors import FAIL, SKIP, handles_item_errors

__all__ = [
    "DEAD_LETTERS",
    "is_dead_letter_edge",
    "policy_of",
    "refuse_policies",
    "with_dead_letters",
]

DEAD_LETTERS = "dead-letters"
"""The name of the vertex running ``JobConfig(on_item_error=<sink supplier>)``."""

_MARK = "_slipstream_dead_letters"


def policy_of(vertex: Vertex, default: Any) -> Any:
    """The policy a vertex runs under: its own, else the job's (``"fail"`` for vertices
    whose processors do not handle item errors)."""
    if not handles_item_errors(vertex.supplier):
        return FAIL
    own = vertex.get_on_item_error()
    return default if own is None else own


def is_dead_letter_edge(edge: Edge) -> bool:
    """Whether ``edge`` was added by :func:`with_dead_letters`."""
    return bool(getattr(edge, _MARK, False))


def with_dead_letters(dag: DAG, default: Any) -> DAG:
    """``dag`` itself when no vertex sends dead letters; else a copy with the dead-letter
    vertices and edges (see the module docstring). ``default`` is the job's
    ``on_item_error``."""
    senders = [
        (v, p)
        for v in dag.vertices
        if not isinstance(p := policy_of(v, default), str) or p not in (FAIL, SKIP)
    ]
    if not senders:
        return dag
    out = DAG()
    copies: dict[str, Vertex] = {}
    for v in dag.vertices:
        c = copy.copy(v)
        out._vertices[v.name] = c
        copies[v.name] = c
    next_out: dict[str, int] = {}
    next_in: dict[str, int] = {}
    for e in dag.edges:
        ce = copy.copy(e)
        ce.source = copies[e.source.name]
        ce.dest = copies[e.dest.name]  # type: ignore[union-attr]
        out._edges.append(ce)
        next_out[e.source.name] = max(next_out.get(e.source.name, 0), e.source_ordinal + 1)
        dest = e.dest.name  # type: ignore[union-attr]
        next_in[dest] = max(next_in.get(dest, 0), e.dest_ordinal + 1)
    targets: dict[int, Vertex] = {}
    for v, policy in senders:
        target = targets.get(id(policy))
        if target is None:
            target = targets[id(policy)] = _target(dag, out, v, policy, default)
        o_out = next_out.get(v.name, 0)
        o_in = next_in.get(target.name, 0)
        next_out[v.name] = o_out + 1
        next_in[target.name] = o_in + 1
        edge = Edge.from_(copies[v.name], o_out).to(target, o_in)
        setattr(edge, _MARK, True)
        out.edge(edge)
    return out


def _target(dag: DAG, out: DAG, sender: Vertex, policy: Any, default: Any) -> Vertex:
    """The vertex of ``out`` that takes ``sender``'s dead letters."""
    if isinstance(policy, Vertex):
        if dag._vertices.get(policy.name) is not policy:
            raise DagError(
                f"vertex {sender.name!r}: on_item_error is vertex {policy.name!r}, which is "
                "not in this DAG (add it with dag.new_vertex first)"
            )
        return out.vertex(policy.name)
    base = DEAD_LETTERS if policy is default else f"{sender.name}-{DEAD_LETTERS}"
    name, n = base, 1
    while name in out._vertices:
        n += 1
        name = f"{base}-{n}"
    return out.new_vertex(name, policy)


def refuse_policies(dag: DAG, default: Any, engine: str) -> None:
    """For an engine that applies no bad-record policy: a ``DagError`` if the job or a
    vertex asks for one (rather than failing on the first bad item regardless)."""
    asked = [] if isinstance(default, str) and default == FAIL else ["the job"]
    for v in dag.vertices:
        own = v.get_on_item_error()
        if own is not None and not (isinstance(own, str) and own == FAIL):
            asked.append(f"vertex {v.name!r}")
    if asked:
        raise DagError(
            f"on_item_error is set ({', '.join(asked)}), but the {engine} engine does not "
            "apply a bad-record policy: an item whose code raises fails the job there. Run "
            "the job on the embedded engine (ss.local()) to skip such items or send them to "
            "a dead-letter sink"
        )
