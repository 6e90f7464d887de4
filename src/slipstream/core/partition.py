"""Partitioning: which processor receives a keyed item.

Keys hash to one of ``DEFAULT_PARTITION_COUNT`` partitions with a hash that is the same
in every process (Python's ``hash`` of a ``str`` is randomised per process, which would
break Spark executors and restoring a snapshot in another process). Partitions are owned
by members (``p % member_count``) and dealt round-robin to a member's processors, like
Jet's ``PartitionArrangement``. :func:`key_routing` is the one place that decides which
processor a key goes to: a partitioned edge's collector routes live items with it, and
restoring keyed state routes a snapshot's entries with it
(:func:`slipstream.state.restore.restore_plan`), so restored state lands where the
items with its key arrive, at any parallelism and member count.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import and_
from typing import Any

DEFAULT_PARTITION_COUNT = 271

Partitioner = Callable[[Any, int], int]

_pack_double = struct.Struct("<d").pack


def stable_hash(key: Any) -> int:
    """A non-negative hash of ``key`` that does not depend on the process."""
    t = type(key)
    if t is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if t is int or t is bool:
        return key & 0x7FFFFFFF if key >= 0 else (-key * 31 + 7) & 0x7FFFFFFF
    if t is bytes:
        return zlib.crc32(key)
    if t is tuple:
        h = 0x345678
        for part in key:
            h = (h * 1000003 ^ stable_hash(part)) & 0x7FFFFFFF
        return h
    if key is None:
        return 0
    if t is float:
        if key.is_integer():
            return stable_hash(int(key))
        return zlib.crc32(_pack_double(key))
    from slipstream.core.pickling import cloudpickle  # only for keys of other types

    return zlib.crc32(cloudpickle.dumps(key))


def default_partitioner(key: Any, partition_count: int) -> int:
    """The partition of ``key``: its stable hash modulo ``partition_count``."""
    if type(key) is str:  # stable_hash's first case, without its call: a partitioned
        # edge routes each new key through here (word count's partial counts: all new)
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partition_count
    return stable_hash(key) % partition_count


def default_partitions(keys: list[Any], partition_count: int) -> list[int] | None:
    """:func:`default_partitioner` of each of ``keys`` without a Python call per key,
    when they are all non-negative ``int`` or all ``str`` without a lone surrogate (exact
    types; the values :func:`stable_hash` gives them), else ``None``: what a partitioned
    edge's collector routes a chunk of new keys with (execution/collectors.py) and
    :meth:`KeyRouting.spills` checks a save's keys with."""
    if not keys:
        return []
    kind = type(keys[0])
    if (kind is not int and kind is not str) or list(map(type, keys)).count(kind) != len(keys):
        return None
    mod = partition_count.__rmod__
    if kind is int:
        if min(keys) < 0:
            return None
        if max(keys) <= 0x7FFFFFFF:  # its own stable hash
            return list(map(mod, keys))
        return list(map(mod, map(and_, keys, repeat(0x7FFFFFFF))))
    try:
        return list(map(mod, map(zlib.crc32, map(str.encode, keys))))
    except UnicodeEncodeError:  # a lone surrogate: stable_hash's own way
        return None


def partition_owner_member(partition: int, member_count: int) -> int:
    return partition % member_count


def assign_partitions(partitions: Sequence[int], processor_count: int) -> list[list[int]]:
    """Deal ``partitions`` (ascending) to processors round-robin: processor ``i`` gets list
    positions ``i, i + n, i + 2n, ...``."""
    return [list(partitions[i::processor_count]) for i in range(processor_count)]


def partition_table(
    partition_count: int,
    member_count: int,
    local_parallelism: int,
    distributed: bool,
    member_index: int,
) -> list[int]:
    """For every partition, the *global* index of the processor that owns it, as seen by a
    producer on member ``member_index``.

    On a distributed edge a partition goes to the processor owning it on the member that
    owns it; on a member-local edge all partitions are dealt to the member's own
    processors.
    """
    table = [0] * partition_count
    if distributed:
        for m in range(member_count):
            owned = [p for p in range(partition_count) if p % member_count == m]
            for i, parts in enumerate(assign_partitions(owned, local_parallelism)):
                for p in parts:
                    table[p] = m * local_parallelism + i
    else:
        for i, parts in enumerate(assign_partitions(range(partition_count), local_parallelism)):
            for p in parts:
                table[p] = member_index * local_parallelism + i
    return table


class KeyRouting:
    """Where keys go on one partitioned edge, seen from one producer's member:
    ``table[partitioner(key, partition_count)]`` is the global index of the consumer
    processor that receives ``key`` (:meth:`owner`). Collectors keep the table and the
    partitioner (their hot loop caches the target per key); restore calls :meth:`owner`."""

    __slots__ = ("partitioner", "partition_count", "table")

    def __init__(self, partitioner: Partitioner, partition_count: int, table: list[int]) -> None:
        self.partitioner = partitioner
        self.partition_count = partition_count
        self.table = table

    def owner(self, key: Any) -> int:
        """The global index of the processor that receives ``key``."""
        return self.table[self.partitioner(key, self.partition_count)]

    def spills(self, keys: list[Any], index: int) -> bool:
        """Whether one of ``keys`` goes to another processor than ``index`` (a copy-on-write
        save checks every key it saves, state/live.py). With the default partitioner,
        keys that are all non-negative ``int`` or all ``str`` (without lone surrogates)
        are hashed without a Python call per key (:func:`stable_hash`'s values; several
        times faster than :meth:`owner` per key), and only their distinct partitions
        are looked up."""
        table, count = self.table, self.partition_count
        if self.partitioner is default_partitioner and keys:
            parts = default_partitions(keys, count)
            if parts is not None:
                return any(table[p] != index for p in set(parts))
        return any(map(index.__ne__, map(self.owner, keys)))


def key_routing(
    partitioner: Partitioner | None,
    member_count: int,
    local_parallelism: int,
    *,
    distributed: bool = True,
    member_index: int = 0,
    partition_count: int = DEFAULT_PARTITION_COUNT,
) -> KeyRouting:
    """The routing of keys to the ``member_count * local_parallelism`` consumers of a
    partitioned edge: ``partitioner`` (the edge's custom one, ``None`` for
    :func:`default_partitioner`) and the :func:`partition_table` of a producer on member
    ``member_index``. On a distributed edge every producer routes a key alike; snapshot
    restore routes keyed entries as such an edge does."""
    table = partition_table(
        partition_count, member_count, local_parallelism, distributed, member_index
    )
    return KeyRouting(partitioner or default_partitioner, partition_count, table)
