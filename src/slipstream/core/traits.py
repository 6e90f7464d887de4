"""What the DAG validation knows about a vertex's processors (its *traits*).

Some DAGs are valid graphs but give silently wrong results: a processor that keeps
state per key fed so that one key reaches several processors, a window that never sees
a watermark, an edge out of a sink. ``DAG.validate`` catches these from the traits of
each vertex's supplier:

* :data:`KEYED` - keeps state per key, so every key must reach exactly one processor;
* :data:`WINDOWED` - emits only when watermarks arrive;
* :data:`WATERMARK_SOURCE` - creates watermarks (``insert_watermarks``);
* :data:`SINK` - the end of the line: it has no outbound edges;
* :data:`BUFFERS_INPUT` - takes all of its input before it emits anything (batch
  aggregations, sort), so it never makes the vertices upstream of it wait (the priority
  diamond check);
* :data:`BOUNDED` - a source whose input ends (items, lists, files, SQL queries): a job
  whose every source is bounded is a *batch* job (:func:`all_sources_bounded`).

A processor class declares them as ``slipstream_traits = frozenset({...})``; a factory
whose processors' traits depend on its arguments marks the supplier it returns with
:func:`declare`. Only the library's own sources, processors and sinks are *known*: a
custom processor that declares nothing has unknown traits (``None``), and the checks
give it the benefit of the doubt (it might create watermarks, for example).
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

__all__ = [
    "BOUNDED",
    "KEYED",
    "WINDOWED",
    "WATERMARK_SOURCE",
    "SINK",
    "BUFFERS_INPUT",
    "all_sources_bounded",
    "declare",
    "traits_of",
]

KEYED = "keyed"
WINDOWED = "windowed"
WATERMARK_SOURCE = "watermark-source"
SINK = "sink"
BUFFERS_INPUT = "buffers-input"
BOUNDED = "bounded"

#: Modules whose processors declare every trait they have (no declaration: none).
_KNOWN_MODULES = (
    "slipstream.sources.",
    "slipstream.processors.",
    "slipstream.sinks.",
    "slipstream.spark.io",
)

S = TypeVar("S")


def declare(supplier: S, *traits: str) -> S:
    """Mark ``supplier`` (e.g. the ``functools.partial`` a factory returns) with
    ``traits``; returns it. The mark travels with the supplier when it is pickled."""
    supplier.slipstream_traits = frozenset(traits)  # type: ignore[attr-defined]
    return supplier


def traits_of(supplier: Any) -> frozenset[str] | None:
    """The traits of a vertex's supplier, or ``None`` when they are unknown."""
    declared = getattr(supplier, "slipstream_traits", None)
    if declared is not None:
        return frozenset(declared)
    target = supplier.func if isinstance(supplier, functools.partial) else supplier
    declared = getattr(target, "slipstream_traits", None)
    if declared is not None:
        return frozenset(declared)
    module = getattr(target, "__module__", None) or type(target).__module__
    if isinstance(module, str) and module.startswith(_KNOWN_MODULES):
        return frozenset()
    return None


def all_sources_bounded(dag: Any) -> bool:
    """Whether every source vertex of ``dag`` (no inbound edge) declares :data:`BOUNDED`:
    the job is then a batch job. A source of unknown traits (a custom processor that
    declares none) counts as unbounded."""
    sources = [v for v in dag.vertices if not dag.inbound_edges(v)]
    return bool(sources) and all(BOUNDED in (traits_of(v.supplier) or ()) for v in sources)
