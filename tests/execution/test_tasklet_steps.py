"""execution/tasklet.py: one ``ProcessorTasklet.call`` takes several [watermark, chunk]
steps while its input keeps stopping at watermarks (``MAX_STEPS``), and the output is
the one of a step per call: the items before a watermark, the watermark, the items after
it, on every consumer; outbox capacity and the consumers' back-pressure hold; a snapshot
barrier still ends the call's steps."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.items import DONE_ITEM, SnapshotBarrier, Watermark
from slipstream.core.partition import DEFAULT_PARTITION_COUNT, default_partitioner
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.execution.collectors import PerTargetCollector, RoundRobinCollector
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import SpscQueue
from slipstream.execution.tasklet import DONE, MAX_STEPS, ProcessorTasklet
from slipstream.processors.basic import FilterP


def _feed(q: SpscQueue, entries: list[Any]) -> None:
    for e in entries:
        q.entries.append(e)
        q.put_count += len(e) if type(e) is list else 1


def _chunks_and_watermarks(chunks: int, size: int) -> list[Any]:
    """[chunk 0, watermark 1, chunk 1, watermark 2, ...]: what a source with a watermark
    every ``size`` records puts on its edge (the Kafka source of bench/kafka.py's K2)."""
    out: list[Any] = []
    for c in range(chunks):
        out.append(list(range(c * size, (c + 1) * size)))
        out.append(Watermark(c + 1))
    return out


def _tasklet(
    processor: Any, outs: list[SpscQueue], capacity: int = 2048, key_fn: Any = None, **kw: Any
) -> tuple[ProcessorTasklet, SpscQueue]:
    q_in = SpscQueue(1 << 30)
    if key_fn is None:
        collector: Any = RoundRobinCollector(outs)
    else:
        table = [p % len(outs) for p in range(DEFAULT_PARTITION_COUNT)]
        collector = PerTargetCollector(outs, key_fn=key_fn, partition_to_target=table)
    guarantee = kw.pop("guarantee", ProcessingGuarantee.NONE)
    t = ProcessorTasklet(
        processor,
        Context(processing_guarantee=guarantee),
        [
            InboundEdgeStream(
                0, 0, [q_in], exactly_once=guarantee is ProcessingGuarantee.EXACTLY_ONCE
            )
        ],
        [collector],
        guarantee=guarantee,
        outbox_capacity=capacity,
        **kw,
    )
    t.init()
    return t, q_in


def _take(q: SpscQueue, into: list[Any]) -> None:
    """The consumer takes everything: items flattened, a watermark as ``("wm", ts)``,
    other specials by their type's name."""
    for e in q.entries:
        if type(e) is list:
            into.extend(e)
        elif type(e) is Watermark:
            into.append(("wm", e.timestamp))
        else:
            into.append(type(e).__name__)
    q.take_count = q.put_count
    q.entries.clear()


def test_a_filter_takes_many_watermarks_in_few_calls() -> None:
    """40 chunks of 80 records, each followed by a watermark: one call per watermark
    before (the drain stops at each), now one per MAX_STEPS of them."""
    out = SpscQueue(1 << 20)
    t, q_in = _tasklet(FilterP(lambda x: x % 3 != 0), [out])
    _feed(q_in, _chunks_and_watermarks(40, 80))
    calls = 0
    while q_in.entries:
        t.call()
        calls += 1
    assert calls <= -(-40 // MAX_STEPS) + 1
    got: list[Any] = []
    _take(out, got)
    expected: list[Any] = []
    for e in _chunks_and_watermarks(40, 80):
        expected.extend([x for x in e if x % 3 != 0] if type(e) is list else [("wm", e.timestamp)])
    assert got == expected


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(st.integers(0, 40), st.just(-1), st.just(-2)), max_size=30),
    st.sampled_from([1, 2, 3, 8, 2048]),
    st.sampled_from([1, 4, 1024]),
    st.integers(1, 2),
)
def test_output_order_with_watermarks_between_chunks(
    plan: list[int], capacity: int, queue_size: int, consumers: int
) -> None:
    """Random chunks (n >= 0: a chunk of n items) and watermarks (-1; -2: two in a row),
    through a filter, to one or two consumers (partitioned by the item), with outbox
    capacity down to 1 and small consumer queues: each consumer gets exactly the items
    it owns, in order, with every watermark between the same items as in the input."""
    entries: list[Any] = []
    wm = 0
    item = 0
    for p in plan:
        if p >= 0:
            entries.append(list(range(item, item + p)) or [item])
            item += max(p, 1)
        else:
            for _ in range(-p):
                wm += 1
                entries.append(Watermark(wm))
    entries.append(DONE_ITEM)
    outs = [SpscQueue(queue_size) for _ in range(consumers)]
    key_fn = (lambda x: x) if consumers > 1 else None
    t, q_in = _tasklet(FilterP(lambda x: x % 2 == 0), outs, capacity, key_fn)
    _feed(q_in, entries)
    got: list[list[Any]] = [[] for _ in outs]
    for _ in range(100_000):
        r = t.call()
        for q, g in zip(outs, got, strict=True):
            _take(q, g)
        if r == DONE:
            break
    assert r == DONE
    for q_i, g in enumerate(got):
        expected: list[Any] = []
        for e in entries:
            if type(e) is list:
                expected.extend(x for x in e if x % 2 == 0 and _owner(x, consumers) == q_i)
            elif type(e) is Watermark:
                expected.append(("wm", e.timestamp))
        assert g == [*expected, "DoneItem"]


def _owner(item: int, consumers: int) -> int:
    """The consumer a partitioned collector built by _tasklet routes ``item`` to."""
    return default_partitioner(item, DEFAULT_PARTITION_COUNT) % consumers if consumers > 1 else 0


class _Log(AbstractProcessor):
    """Notes items, watermarks and saves in the order the tasklet hands them over."""

    def __init__(self) -> None:
        self.log: list[Any] = []

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.log.append(item)
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.log.append(("wm", watermark.timestamp))
        return True

    def save_to_snapshot(self) -> bool:
        self.log.append("save")
        return True


def test_a_barrier_ends_the_steps_of_a_call() -> None:
    """Under exactly-once the steps of one call stop at an aligned barrier: the items
    behind it are processed only after the snapshot was saved, in a later call."""
    p = _Log()
    out = SpscQueue(1 << 20)
    t, q_in = _tasklet(p, [out], guarantee=ProcessingGuarantee.EXACTLY_ONCE)
    _feed(q_in, [[1, 2], Watermark(1), [3], SnapshotBarrier(1), [4], Watermark(2), [5]])
    t.call()
    assert p.log == [1, 2, ("wm", 1), 3]
    for _ in range(10):
        t.call()
    assert p.log == [1, 2, ("wm", 1), 3, "save", 4, ("wm", 2), 5]
    got: list[Any] = []
    _take(out, got)
    assert got == ["SnapshotBarrier"]  # _Log keeps its watermarks
