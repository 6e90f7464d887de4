"""Streaming a Spark task's input into its tasklet, one record at a time.

A task's partition iterator yields ``(target, payload)`` records, already in the order
the task consumes them: a shuffled input is sorted by Spark
(:mod:`slipstream.spark.shuffle`), a narrow input is the producer's own output in its
order. :class:`InputFeed` owns the tasklet's inbound queues (one per edge and producer,
as on the embedded engine) and moves the next record into its queue only when the
tasklet needs more input, so the task holds the current record or two, never its
whole partition. The tasklet (:class:`~slipstream.execution.tasklet.ProcessorTasklet`)
does everything else exactly as on the embedded engine.

In an epoch of a Structured Streaming query (``micro_batch_watermarks``) an edge whose
producers are all watermark inserters ends at the *micro-batch's* watermark, as Spark's
append mode: each inserter's terminal barrier comes flagged (``payload[4]``: its
watermark is its split's maximum minus the lag and it holds no item), the feed holds
the barriers until every producer of the edge has sent its own, then puts the highest
of their watermarks into every queue of the edge before the barriers. The processor
thus sees the batch's watermark once every input of the epoch is in, and emits the
windows it closes in this epoch instead of the next (docs/spark.md, "Event time").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from slipstream.core.items import DONE_ITEM, SnapshotBarrier, Watermark
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import UNBOUNDED, SpscQueue

__all__ = ["InputFeed", "RESULT_TAG", "ROWS_TAG"]

RESULT_TAG = -1
ROWS_TAG = -2

Record = tuple[int, tuple[Any, ...]]


class InputFeed:
    """The inbound side of one task: its queues, their streams, and the record stream.

    ``specs`` are the vertex's :class:`~slipstream.spark.task.InboundSpec`\\ s;
    ``epoch`` accepts the terminal snapshot barrier as the end of a queue (an epoch of
    a streaming job ends with it instead of end-of-stream); ``micro_batch_watermarks``
    ends an edge of watermark inserters at their highest watermark (module doc)."""

    def __init__(
        self,
        specs: Sequence[Any],
        index: int,
        records: Iterable[Record],
        *,
        exactly_once: bool,
        epoch: bool,
        micro_batch_watermarks: bool = False,
    ) -> None:
        self.index = index
        self.epoch = epoch
        self.micro_batch_watermarks = micro_batch_watermarks
        self._records = iter(records)
        self.exhausted = False
        self.queues: dict[tuple[int, int], SpscQueue] = {}
        self._labels: dict[tuple[int, int], str] = {}
        self._last_seq: dict[tuple[int, int], int] = {}
        self._ended: set[tuple[int, int]] = set()
        self._last: SpscQueue | None = None
        self.streams: list[InboundEdgeStream] = []
        # micro_batch_watermarks: per queue its stream's coalescer and input, the highest
        # watermark put into it (read from the coalescer, which the epoch's restore
        # primed, until one is put), and per edge the barriers held back
        self._coalescer_of: dict[tuple[int, int], tuple[Any, int]] = {}
        self._floor: dict[tuple[int, int], int] = {}
        self._edge_keys: dict[int, list[tuple[int, int]]] = {}
        self._held: dict[int, dict[tuple[int, int], tuple[SnapshotBarrier, bool]]] = {}
        for spec in specs:
            producers = spec.producers[index]
            if not producers:
                # nothing feeds this processor on this edge (e.g. all-to-one): like the
                # embedded engine's plan, it gets no stream for the edge at all
                continue
            queues = []
            for producer in producers:
                q = SpscQueue(UNBOUNDED, f"{spec.label}, producer {producer}")
                self.queues[(spec.edge_id, producer)] = q
                self._labels[(spec.edge_id, producer)] = spec.label
                queues.append(q)
            stream = InboundEdgeStream(
                spec.ordinal, spec.priority, queues, exactly_once=exactly_once, label=spec.label
            )
            self.streams.append(stream)
            keys = [(spec.edge_id, producer) for producer in producers]
            self._edge_keys[spec.edge_id] = keys
            for qi, key in enumerate(keys):
                self._coalescer_of[key] = (stream.coalescer, qi)

    def starved(self) -> bool:
        """Whether the tasklet has consumed the last record fed (more is needed)."""
        last = self._last
        return not self.exhausted and (last is None or not last.entries)

    def pull(self) -> Record | None:
        """Move the next record into its queue. Returns a record the task must pass on
        unchanged (an upstream task's result), else ``None``."""
        try:
            record = next(self._records)
        except StopIteration:
            self.exhausted = True
            self._check_complete()
            return None
        payload = record[1]
        tag = payload[0]
        if tag < 0:
            return record if tag == RESULT_TAG else None
        key = (tag, payload[1])
        q = self.queues.get(key)
        if q is None or key in self._ended:
            what = "unexpected" if q is None else "after the end of its queue"
            raise RuntimeError(
                f"processor {self.index} received a record of (edge, producer) {key} "
                f"{what}; this is a bug in the Spark engine"
            )
        seq = payload[2]
        if seq <= self._last_seq.get(key, -1):
            raise RuntimeError(
                f"{self._labels[key]}: records from producer {key[1]} to processor "
                f"{self.index} arrived out of order; this is a bug in the Spark engine"
            )
        self._last_seq[key] = seq
        entry = payload[3]
        if self.micro_batch_watermarks and type(entry) is not list:
            if type(entry) is Watermark:
                if entry.timestamp <= self._floor_of(key):
                    # the vertex's watermark an inserter repeats when an epoch starts:
                    # this queue was brought to it at the end of the last epoch
                    return None
                self._floor[key] = entry.timestamp
            elif type(entry) is SnapshotBarrier:
                self._ended.add(key)
                self._hold(key, entry, len(payload) > 4 and payload[4] is True)
                return None
        q.entries.append(entry)
        q.put_count += len(entry) if type(entry) is list else 1
        if entry is DONE_ITEM or (self.epoch and type(entry) is SnapshotBarrier):
            self._ended.add(key)
        self._last = q
        return None

    def _floor_of(self, key: tuple[int, int]) -> int:
        """The highest watermark queue ``key`` has had: put into it in this epoch, or
        else its coalescer's from the last epoch."""
        floor = self._floor.get(key)
        if floor is None:
            coalescer, qi = self._coalescer_of[key]
            floor = self._floor[key] = coalescer.wm[qi]
        return floor

    def _hold(self, key: tuple[int, int], barrier: SnapshotBarrier, split_wm: bool) -> None:
        """Hold the terminal barrier of producer ``key`` until every producer of its edge
        has sent one; then, if all are watermark inserters (``split_wm``), bring every
        queue of the edge to their highest watermark, and put the barriers in."""
        edge = key[0]
        held = self._held.setdefault(edge, {})
        held[key] = (barrier, split_wm)
        keys = self._edge_keys[edge]
        if len(held) < len(keys):
            return
        top = None
        if all(flag for _b, flag in held.values()):
            top = max(self._floor_of(k) for k in keys)
        for k in keys:
            q = self.queues[k]
            if top is not None and self._floor_of(k) < top:
                q.entries.append(Watermark(top))
                q.put_count += 1
                self._floor[k] = top
            q.entries.append(held[k][0])
            q.put_count += 1
            self._last = q
        del self._held[edge]

    def rest(self) -> Iterator[Record]:
        """After the tasklet is done: the remaining records to pass on (there must be no
        more data)."""
        while not self.exhausted:
            passed = self.pull()
            if passed is not None:
                yield passed

    def _check_complete(self) -> None:
        for key in self.queues:
            if key not in self._ended:
                raise RuntimeError(
                    f"{self._labels[key]}: the input from producer {key[1]} to processor "
                    f"{self.index} is incomplete (no end-of-stream mark); this is a bug "
                    "in the Spark engine"
                )
