"""Stateless one-to-one / one-to-many processors: ``map``, ``filter``, ``flat_map``,
``no_op`` (which swallows items).

These sit on the hot path of almost every DAG (word count: every word passes through
``flat_map``), so each processor has two paths:

* a **bulk path** for the common case of exactly one outbound ordinal: the processor
  writes straight into that ordinal's outbox bucket (``bucket.extend``), taking at most
  as many input items as the bucket has room for. The per-item work is then one call of
  the user function inside a C-level ``map``/``filter``/``extend``, with no per-item
  ``offer`` call;
* a **general path** (several outbound ordinals, or none) that offers each result with
  ``outbox.offer(result)`` (ordinal ``None``: every outbound ordinal) and keeps a refused
  result for the next call, so the user function never runs twice for one item.

Every outbound ordinal receives every result (Jet's ``offer(item)`` with ordinal -1).
The bulk path never puts more into a bucket than ``outbox.capacity`` allows, so it
honours back-pressure exactly like ``offer``. The processors are stateless, so they
save nothing to snapshots (they need no at-least-once caveats of their own).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.processor import AbstractProcessor, Context, FlatMapper
from slipstream.core.validation import check_callable

__all__ = ["map", "filter", "flat_map", "no_op"]

_builtin_map = map
_builtin_filter = filter

# Sentinel for "no pending result".
_NOTHING: Any = object()

# ``x is not None`` at C speed, for filter()
_not_none = functools.partial(operator.is_not, None)


class _BulkP(AbstractProcessor):
    """Takes the bulk path when there is exactly one outbound ordinal (``_single``),
    which is only known once the outbox is there."""

    _single = False

    def init_processor(self, context: Context) -> None:
        self._single = len(self.outbox.buckets) == 1


class MapP(_BulkP):
    """Emits ``fn(item)`` for every item, in order, except ``None`` results: as with
    Jet's ``mapP``, a function returning ``None`` drops the item (map and filter in one
    step). A ``None`` would otherwise flow on and fail somewhere downstream, far from
    its cause.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self._fn = fn
        self._pending: Any = _NOTHING

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._single:
            bucket = self.outbox.buckets[0]
            room = self.outbox.capacity - len(bucket)
            if room <= 0:
                return
            n = len(inbox)
            if n <= room:
                bucket.extend(_builtin_filter(_not_none, _builtin_map(self._fn, inbox)))
                inbox.clear()
            else:
                popleft = inbox.popleft
                fn = self._fn
                bucket.extend(_builtin_filter(_not_none, [fn(popleft()) for _ in range(room)]))
            return
        # general path: all outbound ordinals (or none), one offer per item
        offer = self.outbox.offer
        pending = self._pending
        if pending is not _NOTHING:
            if not offer(pending):
                return
            self._pending = _NOTHING
            inbox.popleft()
        fn = self._fn
        while inbox:
            result = fn(inbox[0])
            if result is None:
                inbox.popleft()
                continue
            if not offer(result):
                self._pending = result
                return
            inbox.popleft()


class FilterP(_BulkP):
    """Emits the items for which ``predicate(item)`` is truthy, in order."""

    def __init__(self, predicate: Callable[[Any], Any]) -> None:
        self._predicate = predicate
        self._head_passed = False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        pred = self._predicate
        if self._single:
            bucket = self.outbox.buckets[0]
            room = self.outbox.capacity - len(bucket)
            n = len(inbox)
            if n <= room:
                bucket.extend(_builtin_filter(pred, inbox))
                inbox.clear()
                return
            # more items than room: each input yields at most one output, so taking
            # `room` inputs can never overflow; repeat while the filter frees room
            popleft = inbox.popleft
            extend = bucket.extend
            while room > 0 and inbox:
                take = room if room < len(inbox) else len(inbox)
                before = len(bucket)
                extend(_builtin_filter(pred, [popleft() for _ in range(take)]))
                room -= len(bucket) - before
            return
        offer = self.outbox.offer
        if self._head_passed:
            # the head item passed the predicate but was refused last time
            if not offer(inbox[0]):
                return
            self._head_passed = False
            inbox.popleft()
        while inbox:
            item = inbox[0]
            if pred(item) and not offer(item):
                self._head_passed = True
                return
            inbox.popleft()


class FlatMapP(_BulkP):
    """Emits every item of ``fn(item)`` (an iterable) for every item, in order.

    When the outbox fills up in the middle of one item's results, the rest of that
    item's iterator is kept and emitted first on the next call; the input item stays in
    the inbox until all its results are out, so ``fn`` runs exactly once per item.
    """

    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self._fn = fn
        self._rest: Iterator[Any] | None = None
        self._flat_mapper: FlatMapper | None = None

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        if not self._single:
            self._flat_mapper = self.flat_mapper(self._fn)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._single:
            try_process = self._flat_mapper.try_process  # type: ignore[union-attr]
            while inbox:
                if not try_process(inbox[0]):
                    return
                inbox.popleft()
            return
        bucket = self.outbox.buckets[0]
        room = self.outbox.capacity - len(bucket)
        if room <= 0:
            return
        extend = bucket.extend
        popleft = inbox.popleft
        rest = self._rest
        if rest is not None:
            chunk = list(islice(rest, room))
            extend(chunk)
            room -= len(chunk)
            if room <= 0:
                # maybe exhausted, maybe not: find out on the next call
                return
            self._rest = None
            popleft()
        fn = self._fn
        while inbox:
            results: Any = fn(inbox[0])
            t = type(results)
            if t is list or t is tuple:
                n = len(results)
                if n <= room:
                    extend(results)
                    popleft()
                    room -= n
                    if room == 0:
                        return
                    continue
                extend(results[:room])
                self._rest = iter(results[room:])
                return
            it = iter(results)
            chunk = list(islice(it, room))
            extend(chunk)
            room -= len(chunk)
            if room <= 0:
                self._rest = it
                return
            popleft()


class NoOpP(AbstractProcessor):
    """Swallows every item and forwards watermarks (Jet's ``noopP``): a placeholder
    vertex, or a sink that only needs to consume its input."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        inbox.clear()


def map(fn: Callable[[Any], Any]) -> Callable[[], MapP]:  # noqa: A001
    """A vertex that emits ``fn(item)`` for each item, to every outbound edge; a ``None``
    result drops the item (as Jet's ``mapP``)."""
    check_callable(fn, "fn", "map")
    return functools.partial(MapP, fn)


def filter(predicate: Callable[[Any], Any]) -> Callable[[], FilterP]:  # noqa: A001
    """A vertex that emits the items for which ``predicate(item)`` is truthy."""
    check_callable(predicate, "predicate", "filter")
    return functools.partial(FilterP, predicate)


def flat_map(fn: Callable[[Any], Iterable[Any]]) -> Callable[[], FlatMapP]:
    """A vertex that emits every element of the iterable ``fn(item)`` for each item."""
    check_callable(fn, "fn", "flat_map")
    return functools.partial(FlatMapP, fn)


def no_op() -> Callable[[], NoOpP]:
    """A vertex that consumes its input and emits nothing but the watermarks it
    receives (Jet's ``noopP``)."""
    return functools.partial(NoOpP)
