"""Helpers shared by the tests of the window processors and of ``insert_watermarks``:
the event accessors, the fixed-lag watermark oracle, comparing output between
watermarks, driving a processor by hand, and a source and a sink for engine runs.

Test modules import it by its plain name (pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hypothesis import HealthCheck, settings

from slipstream import AbstractProcessor
from slipstream.aggregate import AggregateOperation, to_list
from slipstream.core.inbox import Inbox
from slipstream.core.items import NO_WATERMARK, Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context, Processor
from slipstream.window import KeyedWindowResult

Event = tuple[int, str, int]  # (timestamp, key, value)

HARNESS_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def ts_of(e: Sequence[Any]) -> int:
    return e[0]


def key_of(e: Sequence[Any]) -> str:
    return e[1]


def sorted_values() -> AggregateOperation[Any, Any, Any]:
    # mutable list accumulators, no deduct; sorted so that the result doesn't depend on
    # the order accumulators were combined in
    return to_list().and_then(lambda items: sorted(e[2] for e in items))


# -- watermarks --------------------------------------------------------------------------


def with_fixed_lag_watermarks(events: Sequence[Sequence[Any]], lag: int) -> list[Any]:
    """The stream insert_watermarks(with_fixed_lag(lag)) produces for ``events`` (whose
    timestamp is ``event[0]``)."""
    out: list[Any] = []
    top = None
    last = NO_WATERMARK
    for e in events:
        top = e[0] if top is None else max(top, e[0])
        if top - lag > last:
            last = top - lag
            out.append(Watermark(last))
        out.append(e)
    return out


def same_lateness(expected: list[Any], actual: list[Any]) -> bool:
    """An output checker for ``insert_watermarks``: ``actual`` gives every consumer the
    results ``expected`` (a watermark before every item that advanced it) gives.

    The same items in the same order; strictly increasing watermarks, each one that
    ``expected`` has too, and the same last one; and before every item, the last
    watermark is the one ``expected`` has there whenever the item is behind that one
    (``ts < W``: it is late for a window), else one at or below it.
    """

    def walk(stream: list[Any]) -> tuple[list[Any], list[int], list[int]]:
        items: list[Any] = []
        seen: list[int] = []
        wms: list[int] = []
        w = NO_WATERMARK
        for x in stream:
            if isinstance(x, Watermark):
                w = x.timestamp
                wms.append(w)
            else:
                items.append(x)
                seen.append(w)
        return items, seen, wms

    e_items, e_seen, e_wms = walk(expected)
    a_items, a_seen, a_wms = walk(actual)
    if e_items != a_items or a_wms[-1:] != e_wms[-1:] or not set(a_wms) <= set(e_wms):
        return False
    if any(b <= a for a, b in zip(a_wms, a_wms[1:], strict=False)):
        return False
    for item, e, a in zip(e_items, e_seen, a_seen, strict=True):
        if (a != e) if ts_of(item) < e else (a > e):
            return False
    return True


def max_disorder(events: list[Event]) -> int:
    top = None
    worst = 0
    for e in events:
        if top is not None:
            worst = max(worst, top - e[0])
        top = e[0] if top is None else max(top, e[0])
    return worst


def expected_output(
    stream: list[Any],
    is_late: Callable[[int, int], bool],
    results_of: Callable[[list[Event]], list[KeyedWindowResult]],
    is_released: Callable[[int, int], bool],
) -> tuple[list[Any], int]:
    """The output a window processor must give for ``stream`` (events and watermarks),
    and the number of late events it must drop.

    An event at ``ts`` is dropped when ``is_late(ts, W)`` for the last watermark ``W``
    before it; ``results_of`` gives the results over the other events. A result goes
    out just before the first watermark ``W`` with ``is_released(result.end, W)``, the
    results never released at the end (``complete()``).
    """
    wm = NO_WATERMARK
    kept: list[Event] = []
    dropped = 0
    for item in stream:
        if isinstance(item, Watermark):
            wm = item.timestamp
        elif is_late(item[0], wm):
            dropped += 1
        else:
            kept.append(item)
    results = results_of(kept)
    out: list[Any] = []
    emitted: set[int] = set()
    for item in stream:
        if isinstance(item, Watermark):
            for i, r in enumerate(results):
                if i not in emitted and is_released(r.end, item.timestamp):
                    out.append(r)
                    emitted.add(i)
            out.append(item)
    out.extend(r for i, r in enumerate(results) if i not in emitted)
    return out, dropped


# -- output comparison -------------------------------------------------------------------


def _segments(items: Iterable[Any]) -> tuple[list[Any], list[list[str]]]:
    wms: list[Any] = []
    segs: list[list[str]] = []
    cur: list[Any] = []
    for it in items:
        if isinstance(it, Watermark):
            wms.append(it)
            segs.append(sorted(map(repr, cur)))
            cur = []
        else:
            cur.append(it)
    segs.append(sorted(map(repr, cur)))
    return wms, segs


def same_per_watermark(expected: list[Any], actual: list[Any]) -> bool:
    """Same watermarks in the same order, and between two watermarks the same items in
    any order."""
    return _segments(expected) == _segments(actual)


def assert_same_per_watermark(expected: list[Any], actual: list[Any]) -> None:
    e_wms, e_segs = _segments(expected)
    a_wms, a_segs = _segments(actual)
    assert a_wms == e_wms
    for i, (es, as_) in enumerate(zip(e_segs, a_segs, strict=True)):
        assert as_ == es, f"segment {i} (before watermark #{i}) differs"


# -- driving a processor by hand -----------------------------------------------------------


def new_processor(
    supplier: Callable[[], Processor], capacity: int = 1, ordinals: int = 1
) -> tuple[Any, Outbox]:
    p = supplier()
    outbox = Outbox(ordinals, capacity)
    p.init(outbox, Context(vertex_name="test"))
    return p, outbox


def drive(
    supplier: Callable[[], Processor],
    stream: list[Any],
    *,
    capacity: int = 1,
    snapshot_every_item: bool = False,
    complete: bool = True,
) -> tuple[list[Any], int]:
    """Feed ``stream`` one item per call with a bounded outbox (draining it after each
    call); optionally save, drop and restore the processor after every item. Returns the
    output and the late-drop count summed over every processor instance."""
    p, outbox = new_processor(supplier, capacity)
    out: list[Any] = []
    late = 0

    def drain() -> None:
        out.extend(outbox.buckets[0])
        outbox.buckets[0].clear()

    def call_until_true(fn: Callable[[], bool]) -> None:
        for _ in range(100_000):
            done = fn()
            drain()
            if done:
                return
        raise AssertionError("processor never finished")

    def snapshot_and_restore() -> None:
        nonlocal p, outbox, late
        entries: list[Any] = []

        def save() -> bool:
            done = p.save_to_snapshot()
            entries.extend(outbox.snapshot_bucket)
            outbox.snapshot_bucket.clear()
            return done

        call_until_true(save)
        late += p.context.metrics.get("late_items_dropped", 0)
        p, outbox = new_processor(supplier, capacity)
        inbox = Inbox(entries)
        while inbox:
            p.restore_from_snapshot(inbox)
        call_until_true(p.finish_snapshot_restore)

    for item in stream:
        if isinstance(item, Watermark):
            call_until_true(functools.partial(p.try_process_watermark, item))
        else:
            inbox = Inbox([item])
            while inbox:
                p.process(0, inbox)
                drain()
        if snapshot_every_item:
            snapshot_and_restore()
    if complete:
        call_until_true(p.complete)
    late += p.context.metrics.get("late_items_dropped", 0)
    return out, late


def saved_entries(p: Processor, outbox: Outbox) -> list[tuple[Any, Any]]:
    """Everything ``p.save_to_snapshot()`` saves, called until it returns ``True``."""
    entries: list[tuple[Any, Any]] = []
    while True:
        done = p.save_to_snapshot()
        entries.extend(outbox.snapshot_bucket)
        outbox.snapshot_bucket.clear()
        if done:
            return entries


# -- through the engine ------------------------------------------------------------------------


class ListSource(AbstractProcessor):
    """Emits its share of ``items`` (round robin by global index) from complete()."""

    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self._it: Any = None

    def complete(self) -> bool:
        if self._it is None:
            c = self.context
            self._it = iter(self._items[c.global_processor_index :: c.total_parallelism])
        return self.emit_from(self._it)


class CollectSink(AbstractProcessor):
    """Appends every item to the named list; swallows watermarks."""

    def __init__(self, name: str) -> None:
        self._name = name

    def init_processor(self, context: Context) -> None:
        self._list = context.get_list(self._name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._list.extend(inbox)
        inbox.clear()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True
