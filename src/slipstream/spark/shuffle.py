"""Ordered shuffles: the records of a shuffled edge reach each consumer task already in
the order the task consumes them, sorted by Spark on the JVM (which spills to disk), so
the task streams its input instead of holding it (see :mod:`slipstream.spark.feed`).

A record ``(target, payload)`` gets a 63-bit sort key: the high 31 bits are the edge's
*priority rank* among the consumer's inbound edges (3 bits) and the record's sequence
number on its (edge, producer, target) queue (28 bits); the low 32 bits are
``high ^ target``, so Java's ``Long.hashCode`` (``high ^ low``) is exactly the target
and Spark's plain ``HashPartitioner(n)`` sends the record to partition ``target``.
``repartitionAndSortWithinPartitions`` then orders each partition by key: every record
of a higher-priority edge comes before any of a lower one (the tasklet drains priority
groups in order), and each queue's records come in their producer's order (records of
different producers interleave by sequence number, as concurrent producers would).

Only records travel: the payload is pickled in the producer's task and unpickled in
the consumer's, like any record Spark shuffles for PySpark.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["MAX_SEQ", "ordered_shuffle", "shuffle_key", "target_of_key"]

RANK_BITS = 3
SEQ_BITS = 28
MAX_RANK = (1 << RANK_BITS) - 1
MAX_SEQ = (1 << SEQ_BITS) - 1
_LOW = 0xFFFFFFFF
_pack_long = struct.Struct(">q").pack
_PYTHON = "org.apache.spark.api.python."


def shuffle_key(target: int, rank: int, seq: int) -> int:
    """The sort key of a record for consumer ``target`` (see the module doc). Ranks
    beyond :data:`MAX_RANK` share the last one (their edges then interleave, which is
    correct but buffers the lower-priority edge in the task)."""
    if seq > MAX_SEQ:
        raise RuntimeError(
            f"more than {MAX_SEQ} records on one queue of a shuffled edge; raise the "
            "record size (slipstream.spark.task.MAX_RECORD_ITEMS)"
        )
    high = (min(rank, MAX_RANK) << SEQ_BITS) | seq
    return (high << 32) | ((high ^ target) & _LOW)


def target_of_key(key: int) -> int:
    """The consumer index a key was made for (what ``Long.hashCode`` gives on the JVM)."""
    return ((key >> 32) ^ key) & _LOW


class KeyRecords:
    """Map-side function: gives each record its sort key. ``ranks`` maps an edge id to
    its priority rank at the consumer; upstream task results sort first."""

    def __init__(self, ranks: Mapping[int, int]) -> None:
        self.ranks = dict(ranks)

    def key(self, record: tuple[int, tuple[Any, ...]]) -> int:
        target, payload = record
        tag = payload[0]
        if tag < 0:
            return shuffle_key(target, 0, 0)
        return shuffle_key(target, self.ranks[tag], payload[2])

    def pairs(self, records: Iterable[tuple[int, tuple[Any, ...]]]) -> Iterator[Any]:
        """Alternating packed key and pickled record: the stream PySpark's
        ``PairwiseRDD`` reads on the JVM (as ``RDD.partitionBy`` writes it)."""
        dumps = pickle.dumps
        protocol = pickle.HIGHEST_PROTOCOL
        key = self.key
        for record in records:
            yield _pack_long(key(record))
            yield dumps(record, protocol)

    def keyed(self, record: tuple[int, tuple[Any, ...]]) -> tuple[int, Any]:
        return (self.key(record), record)


def _value(pair: tuple[int, Any]) -> Any:
    return pair[1]


def ordered_shuffle(rdd: Any, partitions: int, ranks: Mapping[int, int]) -> Any:
    """``rdd``'s records, shuffled to partition ``target`` and sorted there by their
    key (module doc). On PySpark the sort runs on the JVM; elsewhere (the in-process
    stand-in the tests use) through the RDD API's ``repartitionAndSortWithinPartitions``."""
    keys = KeyRecords(ranks)
    if not hasattr(rdd, "_jrdd"):
        return (
            rdd.map(keys.keyed)
            .repartitionAndSortWithinPartitions(partitions, target_of_key)
            .map(_value)
        )
    from pyspark import RDD
    from pyspark.serializers import CPickleSerializer

    from slipstream.spark.jvm import jvm_class, jvm_static

    sc = rdd.context

    def pairs(_index: int, records: Iterator[Any]) -> Iterator[Any]:
        return keys.pairs(records)

    keyed = rdd.mapPartitionsWithIndex(pairs)
    keyed._bypass_serializer = True  # the function writes bytes itself
    # the classes by their full names: no lookup per name segment (slipstream.spark.jvm)
    pair_rdd = jvm_class(sc, _PYTHON + "PairwiseRDD")(keyed._jrdd.rdd()).asJavaPairRDD()
    ordered = pair_rdd.repartitionAndSortWithinPartitions(
        jvm_class(sc, "org.apache.spark.HashPartitioner")(partitions)
    )
    value_of_pair = jvm_static(sc, _PYTHON + "PythonRDD", "valueOfPair")
    return RDD(value_of_pair(ordered), sc, CPickleSerializer())
