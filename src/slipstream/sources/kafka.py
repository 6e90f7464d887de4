"""Kafka source (``sources.kafka``), on confluent-kafka.

Partitions, not consumer groups: every processor reads a fixed share of the partitions of
all ``topics`` with ``assign()`` (group rebalancing would move partitions behind the
engine's back, and the snapshot, not the group, owns the offsets). Partition ``p`` of
``topic`` belongs to processor ``(crc32(topic) + p) % N`` of the vertex's ``N``: stable
when partitions are added (a sorted global list would move every later partition to
another processor) and spread over the processors topic by topic. The metadata is read
again every ``partition_refresh_ms``; new partitions (and topics that did not exist yet)
are read from their beginning.

Offsets are the snapshot state: each partition's next offset under a broadcast key, so a
restore with another parallelism gives every partition's offset to its new owner. Both
guarantees seek every partition to its saved offset on restore. ``commit_offsets=True``
also commits the offsets of each committed snapshot to the consumer group (for
monitoring tools); the engine never reads them back.

Event time, per partition: with ``policy`` (a factory of watermark policies, e.g.
``lambda: with_fixed_lag(2000)``) the source emits watermarks through an
:class:`~slipstream.sources.event_time.EventTimeMapper`: one policy per partition, the
minimum over the partitions emitted, partitions with no record for ``idle_timeout_ms``
left out. An event's time is the record's timestamp, or ``timestamp_fn(item)``.

The processor is cooperative: polls never wait (``consume(timeout=0)``); only the
metadata refresh waits for one round trip. Back-pressure: the processor stops polling
while its outbox is full, so memory is bounded by the client's prefetch queue
(``queued.max.messages.kbytes``, 16 MiB by default here) whatever the topic holds; a
partition whose queue was full is fetched again 10 ms later (``fetch.queue.backoff.ms``,
:data:`FETCH_QUEUE_BACKOFF_MS`; librdkafka's 1 s left a source that drains its queue idle
for the rest of the second). A record that ``projection`` rejects fails the job with an
error naming topic, partition and offset, or, with ``on_error="skip"``, is counted
(metric ``kafka_records_skipped``) and skipped.
"""

from __future__ import annotations

import functools
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK
from slipstream.core.traits import WATERMARK_SOURCE, declare
from slipstream.core.validation import check_callable
from slipstream.sources.batch import _emit_room
from slipstream.sources.event_time import (
    DEFAULT_IDLE_TIMEOUT_MS,
    EventTimeMapper,
    checked_timestamp,
)
from slipstream.state.keys import BroadcastKey, tagged_broadcast_name

__all__ = ["kafka", "KafkaSourceP", "partition_owner"]

#: Records fetched in one poll at the most (one cooperative call stays short).
POLL_BATCH = 1000

#: librdkafka's ``fetch.queue.backoff.ms`` unless the config sets it: how long the client
#: waits to fetch again for a partition whose prefetch queue was over its thresholds.
#: Its default, 1000 ms, left a source that drains its queue faster than that idle for
#: the rest of the second: one consumer of 1M JSON records with ``json.loads`` took 6.4 s
#: wall for 2.3 s of CPU, 2.3 s with 10 ms (docs/performance.md, "Kafka rows: the
#: client's fetch backoff, and the watcher's waits"; bench/processes.py's K rows, the
#: Kafka source's backoff in "The exchange between member processes"). Memory stays
#: bounded by the same thresholds.
FETCH_QUEUE_BACKOFF_MS = 10


def partition_owner(topic: str, partition: int, total_parallelism: int) -> int:
    """The global index of the processor that reads ``partition`` of ``topic``."""
    return (zlib.crc32(topic.encode("utf-8")) + partition) % total_parallelism


class KafkaSourceP(AbstractProcessor):
    """Reads its share of the partitions; see the module doc."""

    snapshot_tag = "kafka-offset"

    def __init__(
        self,
        topics: tuple[str, ...],
        config: dict[str, Any],
        projection: Callable[[Any], Any] | None,
        timestamp_fn: Callable[[Any], int] | None,
        policy: Callable[[], Any] | None,
        idle_timeout_ms: int | None,
        on_error: str,
        commit_offsets: bool,
        partition_refresh_ms: int,
    ) -> None:
        self._topics = topics
        self._config = config
        self._projection = projection
        self._timestamp_fn = timestamp_fn
        self._policy = policy
        self._idle_timeout_ms = idle_timeout_ms
        self._on_error = on_error
        self._commit_offsets = commit_offsets
        self._refresh_s = partition_refresh_ms / 1000.0
        self._consumer: Any = None
        self._mapper: EventTimeMapper | None = None
        self._parts: list[tuple[str, int]] = []  # owned partitions, in mapper order
        self._index: dict[tuple[str, int], int] = {}
        self._offsets: list[int] = []  # next offset to read; < 0: a librdkafka sentinel
        self._restored: dict[tuple[str, int], tuple[int, int]] = {}
        self._next_refresh = 0.0
        self._to_commit: list[tuple[str, int, int]] | None = None
        # what the last poll brought and the outbox has not taken yet: (item, partition
        # index or -1 for a watermark, next offset); offsets advance as items go out
        self._pending: list[tuple[Any, int, int]] = []
        self._pos = 0

    def is_cooperative(self) -> bool:
        # consume(timeout=0) never blocks; only the metadata refresh (every
        # partition_refresh_ms) waits for one round trip to the broker
        return True

    def init_processor(self, context: Context) -> None:
        from confluent_kafka import Consumer

        conf = {
            "group.id": f"slipstream-{context.job_name}-{context.vertex_name}",
            "auto.offset.reset": "earliest",
            "queued.max.messages.kbytes": 16384,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            **self._config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        self._start = (
            -2 if conf["auto.offset.reset"] in ("earliest", "smallest", "beginning") else -1
        )
        self._consumer = Consumer(conf)
        if self._policy is not None:
            self._mapper = EventTimeMapper(
                self._policy, timestamp_fn=self._timestamp_fn, idle_timeout_ms=self._idle_timeout_ms
            )

    # -- partitions ----------------------------------------------------------------
    def _refresh(self) -> None:
        from confluent_kafka import TopicPartition

        ctx = self.context
        metadata = self._consumer.list_topics(timeout=10)
        new: list[Any] = []
        for topic in self._topics:
            tm = metadata.topics.get(topic)
            if tm is None or tm.error is not None:
                continue  # not created yet: picked up by a later refresh
            for p in sorted(tm.partitions):
                tp = (topic, p)
                if tp in self._index:
                    continue
                if partition_owner(topic, p, ctx.total_parallelism) != ctx.global_processor_index:
                    continue
                offset, wm = self._restored.pop(tp, (self._start, None))
                self._index[tp] = len(self._parts)
                self._parts.append(tp)
                self._offsets.append(offset)
                if self._mapper is not None:
                    self._mapper.add_partitions(1)
                    if wm is not None:
                        self._mapper.restore_watermark(len(self._parts) - 1, wm)
                new.append(TopicPartition(topic, p, offset))
        if new:
            self._consumer.incremental_assign(new)
        self._next_refresh = time.monotonic() + self._refresh_s

    # -- reading ---------------------------------------------------------------------
    def complete(self) -> bool:
        if self._pending and not self._drain():
            return False
        if time.monotonic() >= self._next_refresh:
            self._refresh()
        room = _emit_room(self.outbox)
        if room <= 0:
            return False
        # a record brings at most one watermark: ask for what surely fits, so the batch
        # goes into the buckets whole; a bucket of capacity 1 takes the slow path
        slow = room < 2
        n = 1 if slow else min(room // 2, POLL_BATCH)
        records = self._consumer.consume(n, 0) if self._parts else None
        if not records:
            if self._mapper is not None:
                self._pending = [(x, -1, 0) for x in self._mapper.flat_map_idle()]
                self._pos = 0
                self._drain()
            return False
        items: list[Any] = []
        entries: list[tuple[Any, int, int]] = []  # the slow path's (item, index, offset)
        last: dict[int, int] = {}  # partition index -> next offset
        index = self._index
        projection = self._projection
        mapper = self._mapper
        watermarks = False
        now = int(time.monotonic() * 1000)
        # a batch holds runs of one partition's records (a fetch's): the partition's
        # index is looked up where a run starts and its next offset noted where it ends
        # (the run's last record), not per record
        one_topic = self._topics[0] if len(self._topics) == 1 else None
        run_p = -1  # the current run's partition
        i = -1  # its index
        prev: Any = None  # the run's last record so far
        for m in records:
            err = m.error()
            if err is not None:
                if err.code() == -191:  # _PARTITION_EOF: informational
                    continue
                raise RuntimeError(
                    f"vertex {self.context.vertex_name!r}: Kafka error on {m.topic()}"
                    f"[{m.partition()}]: {err}"
                )
            p = m.partition()
            if p != run_p or one_topic is None:
                if prev is not None:
                    last[i] = prev.offset() + 1
                run_p = p
                i = index[(one_topic or m.topic(), p)]
            prev = m
            if projection is None:
                item = (m.key(), m.value())
            else:
                try:
                    item = projection(m)
                except Exception as e:
                    if self._on_error != "skip":
                        raise ValueError(
                            f"vertex {self.context.vertex_name!r}: cannot read the record at "
                            f"topic {m.topic()!r}, partition {m.partition()}, offset "
                            f"{m.offset()}: {type(e).__name__}: {e}"
                        ) from e
                    self.context.increment_metric("kafka_records_skipped")
                    continue
            if mapper is not None:
                wm = mapper.observe_event(i, self._event_time(m, item), now)
                if wm is not None:
                    items.append(wm)
                    watermarks = True
                    if slow:
                        entries.append((wm, -1, 0))
            items.append(item)
            if slow:
                entries.append((item, i, m.offset() + 1))
        if prev is not None:
            last[i] = prev.offset() + 1
        if not slow:
            # the whole batch fits: straight into the buckets, offsets at once
            for b in self.outbox.buckets:
                b.extend(items)
            if watermarks:
                self.outbox.specials = True
            offsets = self._offsets
            for i, off in last.items():
                offsets[i] = off
            return False
        self._pending = entries
        self._pos = 0
        self._drain()
        return False

    def _drain(self) -> bool:
        offer = self.outbox.offer
        offsets = self._offsets
        pending = self._pending
        k = self._pos
        while k < len(pending):
            item, i, off = pending[k]
            if not offer(item):
                self._pos = k
                return False
            if i >= 0:
                offsets[i] = off
            k += 1
        self._pending = []
        self._pos = 0
        return True

    def _event_time(self, message: Any, item: Any) -> int:
        if self._timestamp_fn is not None:
            ts = self._timestamp_fn(item)
            if type(ts) is not int or not NO_WATERMARK <= ts <= MAX_TIMESTAMP:
                ts = checked_timestamp(
                    ts,
                    f"kafka (vertex {self.context.vertex_name!r}): the record at topic "
                    f"{message.topic()!r}, partition {message.partition()}, offset "
                    f"{message.offset()}",
                    item,
                )
            return ts
        ts_type, ts = message.timestamp()
        if ts_type == 0:  # TIMESTAMP_NOT_AVAILABLE
            raise ValueError(
                f"vertex {self.context.vertex_name!r}: the record at topic {message.topic()!r}, "
                f"partition {message.partition()}, offset {message.offset()} has no "
                "timestamp: give the source a timestamp_fn"
            )
        return int(ts)

    # -- snapshots -------------------------------------------------------------------
    def _state(self) -> list[tuple[Any, Any]]:
        mapper = self._mapper
        out = [
            (
                BroadcastKey((self.snapshot_tag, t, p)),
                (self._offsets[i], mapper.watermark(i) if mapper is not None else None),
            )
            for i, (t, p) in enumerate(self._parts)
        ]
        # restored partitions that the metadata has not shown yet stay in the state
        out.extend(
            (BroadcastKey((self.snapshot_tag, t, p)), v) for (t, p), v in self._restored.items()
        )
        return out

    def save_to_snapshot(self) -> bool:
        if self._commit_offsets:
            offsets = [
                (t, p, o) for (t, p), o in zip(self._parts, self._offsets, strict=True) if o >= 0
            ]
            # committed to the group in snapshot_commit_finish, once this snapshot is
            self._to_commit = offsets or None
        return self.save_state(self._state)

    def snapshot_commit_finish(self, success: bool) -> bool:
        if success and self._to_commit is not None:
            self._commit()
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        _, topic, partition = tagged_broadcast_name(
            key, self.snapshot_tag, 3, self.context.vertex_name, "the Kafka source"
        )
        ctx = self.context
        if partition_owner(topic, partition, ctx.total_parallelism) == ctx.global_processor_index:
            self._restored[(topic, partition)] = value

    def _commit(self) -> None:
        from confluent_kafka import TopicPartition

        offsets, self._to_commit = self._to_commit, None
        if offsets:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=True
            )

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def kafka(
    topics: str | Sequence[str],
    config: dict[str, Any],
    *,
    projection: Callable[[Any], Any] | None = None,
    timestamp_fn: Callable[[Any], int] | None = None,
    policy: Callable[[], Any] | None = None,
    idle_timeout_ms: int | None = DEFAULT_IDLE_TIMEOUT_MS,
    on_error: str = "fail",
    commit_offsets: bool = False,
    partition_refresh_ms: int = 5000,
) -> functools.partial[KafkaSourceP]:
    """Reads ``topics`` with a confluent-kafka consumer configured by ``config`` (at least
    ``bootstrap.servers``) and emits ``(key, value)`` bytes tuples, or
    ``projection(message)``; see the module doc for partitions, offsets, event time and
    errors."""
    if isinstance(topics, str):
        topics = [topics]
    topic_tuple = tuple(topics)
    if not topic_tuple or not all(isinstance(t, str) and t for t in topic_tuple):
        raise TypeError(f"kafka(): 'topics' must be a topic name or a list of them, got {topics!r}")
    if not isinstance(config, dict) or "bootstrap.servers" not in config:
        raise TypeError("kafka(): 'config' must be a dict with at least 'bootstrap.servers'")
    check_callable(projection, "projection", "kafka", optional=True)
    check_callable(timestamp_fn, "timestamp_fn", "kafka", optional=True)
    check_callable(policy, "policy", "kafka", optional=True)
    if on_error not in ("fail", "skip"):
        raise ValueError(f"kafka(): on_error must be 'fail' or 'skip', got {on_error!r}")
    if not isinstance(partition_refresh_ms, int) or partition_refresh_ms <= 0:
        raise ValueError(
            f"kafka(): partition_refresh_ms must be an int > 0, got {partition_refresh_ms!r}"
        )
    supplier = functools.partial(
        KafkaSourceP,
        topic_tuple,
        dict(config),
        projection,
        timestamp_fn,
        policy,
        idle_timeout_ms,
        on_error,
        commit_offsets,
        partition_refresh_ms,
    )
    # with a policy the source emits watermarks itself: a window downstream needs no
    # insert_watermarks (DAG validation would otherwise warn that it never sees one)
    return declare(supplier, WATERMARK_SOURCE) if policy is not None else supplier
