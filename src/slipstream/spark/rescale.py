"""Rerouting a streaming job's keyed state through Spark when its parallelism changed
(issue 23, item 1): the driver never holds the entries.

At the same parallelism each task of an epoch reads its own processor's chain from the
checkpoint (:mod:`slipstream.spark.epoch_state`). A vertex restored at another
parallelism (or one whose processors saved entries another one owns: the ``spill``
flag) needs its entries routed by key first, as the embedded engine's restore does
(:func:`~slipstream.state.restore.restore_plan`). That runs as one Spark job before the
epoch (:func:`reroute`):

1. one task per committed chain reads it from the checkpoint (signed, verified) and
   emits ``(new partition, (old index, position, entry))`` for every entry: a keyed
   entry to the processor that owns its key, by
   :func:`~slipstream.core.partition.key_routing` with the vertex's own partitioner (the
   routing of a live item on a distributed partitioned edge), a ``BroadcastKey`` entry
   to every processor of the vertex;
2. ``partitionBy`` moves them to one partition per new processor (of every rerouted
   vertex, in one shuffle);
3. each task puts its entries back in the order the driver-side routing gives them
   (old index, then position in the chain) and writes them as one signed full chunk of
   the snapshot the epoch writes, under a name of its own (``rescale`` + the task
   attempt); the driver collects only the chunks' refs.

The epoch's tasks then restore from those chunks (``rescaled`` in the epoch's state,
see :func:`~slipstream.spark.epoch_state.restore_entries`) and save a full chunk, so the
epoch's manifest names none of them: the store's garbage collection removes them at the
epoch's commit (they carry its snapshot id), as it removes a failed attempt's chunks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from slipstream.core.partition import key_routing
from slipstream.spark.failures import encode_failure
from slipstream.spark.task import _attempt_token
from slipstream.state import format as fmt
from slipstream.state.keys import expand_entries, is_broadcast, routing_key
from slipstream.state.store import (
    ChunkRef,
    chunk_file_name,
    encode_chunk,
    read_chain_files,
    write_chunk_file,
)

__all__ = ["RerouteTarget", "reroute"]


@dataclass(frozen=True)
class RerouteTarget:
    """A vertex to reroute: its committed chains (``old index -> [ref json, ...]``) and
    the shape it restores into (``member_count * local_parallelism`` processors, keys
    routed with ``partitioner``, ``None``: the default one). ``offset`` is its first
    partition in the rerouting shuffle."""

    vertex: str
    chains: Mapping[int, list[dict[str, Any]]]
    member_count: int
    local_parallelism: int
    partitioner: Any
    offset: int = 0

    @property
    def total(self) -> int:
        return self.member_count * self.local_parallelism


@dataclass
class _RouteChain:
    """Map side: read one committed chain, emit each entry towards its new processor."""

    store: Mapping[str, Any]
    snapshot_id: int
    targets: dict[str, RerouteTarget]
    failure_key: bytes = b""

    def __call__(self, _index: int, specs: Iterator[tuple[str, int]]) -> Iterator[Any]:
        for vertex, old in specs:
            t = self.targets[vertex]
            try:
                refs = [ChunkRef.from_json(r) for r in t.chains[old]]
                entries = read_chain_files(
                    self.store["directory"], self.store["key"], refs, vertex, old, self.snapshot_id
                )
            except Exception as exc:
                # reported as the processor's failure (a damaged or missing chunk names it)
                raise encode_failure(vertex, old, exc, self.failure_key) from exc
            owner = key_routing(t.partitioner, t.member_count, t.local_parallelism).owner
            everyone = range(t.offset, t.offset + t.total)
            for pos, entry in enumerate(expand_entries(entries)):
                if is_broadcast(entry[0]):
                    for p in everyone:
                        yield (p, (old, pos, entry))
                else:
                    yield (t.offset + owner(routing_key(entry[0])), (old, pos, entry))


@dataclass
class _WriteChunk:
    """Reduce side: one new processor's entries, in restore order, as one chunk."""

    store: Mapping[str, Any]
    write_id: int
    #: per shuffle partition: (vertex, new global index)
    owners: list[tuple[str, int]]
    failure_key: bytes = b""

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[Any]:
        items = [value for _p, value in records]
        if not items:
            return
        items.sort(key=_order)
        entries = [entry for _old, _pos, entry in items]
        del items
        vertex, index = self.owners[partition]
        try:
            payload = encode_chunk(entries, self.write_id, vertex, index)
            name = chunk_file_name(
                self.write_id, vertex, index, attempt="rescale." + _attempt_token()
            )
            ref = write_chunk_file(
                self.store["directory"],
                self.store["key"],
                name,
                self.write_id,
                vertex,
                index,
                fmt.CHUNK_FULL,
                payload,
            )
        except Exception as exc:
            raise encode_failure(vertex, index, exc, self.failure_key) from exc
        yield (vertex, index, ref.as_json())


def _order(item: tuple[int, int, Any]) -> tuple[int, int]:
    return (item[0], item[1])


def _partition(p: int) -> int:
    return p


def reroute(
    sc: Any,
    store: Mapping[str, Any],
    snapshot_id: int,
    write_id: int,
    targets: list[RerouteTarget],
    failure_key: bytes = b"",
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Route the committed chains of ``targets`` (snapshot ``snapshot_id`` of ``store``,
    ``{"directory", "key"}``) to their new processors through one Spark shuffle and write
    each new processor's share as a full chunk of snapshot ``write_id`` (module doc).
    Returns the chains the epoch's tasks restore from: per vertex, new index -> [ref
    json] (a processor that gets no entry has none). The driver handles refs only. A
    task's error (a damaged or missing chunk, a disk full) fails the job as the failure
    of the processor whose chain or chunk it was (signed with ``failure_key``, see
    :mod:`slipstream.spark.failures`)."""
    placed: dict[str, RerouteTarget] = {}
    owners: list[tuple[str, int]] = []
    specs: list[tuple[str, int]] = []
    for t in targets:
        placed[t.vertex] = RerouteTarget(
            t.vertex, t.chains, t.member_count, t.local_parallelism, t.partitioner, len(owners)
        )
        owners.extend((t.vertex, g) for g in range(t.total))
        specs.extend((t.vertex, old) for old in sorted(t.chains))
    out: dict[str, dict[int, list[dict[str, Any]]]] = {t.vertex: {} for t in targets}
    if not specs:
        return out
    written = (
        sc.parallelize(specs, len(specs))
        .mapPartitionsWithIndex(_RouteChain(store, snapshot_id, placed, failure_key))
        .partitionBy(len(owners), _partition)
        .mapPartitionsWithIndex(_WriteChunk(store, write_id, owners, failure_key))
        .collect()
    )
    for vertex, index, ref in written:
        out[vertex][index] = [ref]
    return out
