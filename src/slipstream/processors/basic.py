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

When the user function raises, the job fails naming the item, or the item is set aside
under ``JobConfig(on_item_error=...)`` (:mod:`slipstream.core.item_errors`); finding the
item costs nothing until then.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any

from slipstream.core.inbox import Inbox, drop_head
from slipstream.core.item_errors import failed_position
from slipstream.core.processor import AbstractProcessor, Context
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
    which is only known once the outbox is there.

    When the user function raises, the bulk path finds the item from how far the
    chunk's iterator got, and hands it to the bad-record policy
    (``context.item_errors``): under ``"fail"`` the error goes on, naming the item;
    otherwise the results of the items before it are already in the bucket, the item is
    dropped and the rest of the inbox goes on in the next call. No function runs twice
    for one item."""

    _single = False
    handles_item_errors = True

    def init_processor(self, context: Context) -> None:
        self._single = self.outbox.data_ordinal_count == 1

    def _all_results(self, items: Iterator[Any]) -> Iterator[Any]:
        """The results of ``items`` as a C-level iterator."""
        raise NotImplementedError

    def process_all(self, items: Sequence[Any]) -> list[Any]:
        """Every result of ``items`` at C speed, with no outbox: what a fused pair runs
        in place of :meth:`process` under ``"fail"`` (execution/fusion.py; the consumer
        bounds what waits for it). The item a raising function was on is found from how
        far the iterator got and named on the error, as :meth:`process` names it."""
        n = len(items)
        it = iter(items)
        try:
            return list(self._all_results(it))
        except Exception as e:
            self.context.item_errors.handle(items[failed_position(n, it)], e)
            raise

    def _drop_failed(self, inbox: Inbox, k: int, error: Exception) -> bool:
        """User code raised ``error`` on ``inbox[k]``, the items before it are done: under
        the policy drop them and it (``True``); ``False``: re-raise."""
        if not self.context.item_errors.handle(inbox[k], error):
            return False
        drop_head(inbox, k + 1)
        return True


class MapP(_BulkP):
    """Emits ``fn(item)`` for every item, in order, except ``None`` results: as with
    Jet's ``mapP``, a function returning ``None`` drops the item (map and filter in one
    step). A ``None`` would otherwise flow on and fail somewhere downstream, far from
    its cause.
    """

    #: stateless: the engine may run it inside its only consumer's tasklet
    #: (execution/fusion.py; read from this class's own namespace, not a subclass's)
    fuses_into_consumer = True

    def _all_results(self, items: Iterator[Any]) -> Iterator[Any]:
        return _builtin_filter(_not_none, _builtin_map(self._fn, items))

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
                items: Any = inbox
            else:
                popleft = inbox.popleft
                items = [popleft() for _ in range(room)]
                n = room
            it = iter(items)
            while True:
                try:
                    bucket.extend(_builtin_filter(_not_none, _builtin_map(self._fn, it)))
                    break
                except Exception as e:  # set aside, or raise: then on with the same iterator
                    if not self.context.item_errors.handle(items[failed_position(n, it)], e):
                        raise
            if items is inbox:
                inbox.clear()
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
            try:
                result = fn(inbox[0])
            except Exception as e:
                if not self._drop_failed(inbox, 0, e):
                    raise
                continue
            if result is None:
                inbox.popleft()
                continue
            if not offer(result):
                self._pending = result
                return
            inbox.popleft()


class FilterP(_BulkP):
    """Emits the items for which ``predicate(item)`` is truthy, in order."""

    fuses_into_consumer = True  # see MapP

    def _all_results(self, items: Iterator[Any]) -> Iterator[Any]:
        return _builtin_filter(self._predicate, items)

    def __init__(self, predicate: Callable[[Any], Any]) -> None:
        self._predicate = predicate
        self._head_passed = False

    def _filter_into(
        self, extend: Callable[[Any], None], pred: Callable[[Any], Any], items: Any, n: int
    ) -> None:
        """``extend`` with the ``n`` items that pass ``pred`` at C speed; an item whose
        predicate raises goes to the policy (or the error on), the rest goes on."""
        it = iter(items)
        while True:
            try:
                extend(_builtin_filter(pred, it))
                return
            except Exception as e:
                if not self.context.item_errors.handle(items[failed_position(n, it)], e):
                    raise

    def process(self, ordinal: int, inbox: Inbox) -> None:
        pred = self._predicate
        if self._single:
            bucket = self.outbox.buckets[0]
            room = self.outbox.capacity - len(bucket)
            n = len(inbox)
            if n <= room:
                self._filter_into(bucket.extend, pred, inbox, n)
                inbox.clear()
                return
            # more items than room: each input yields at most one output, so taking
            # `room` inputs can never overflow; repeat while the filter frees room
            popleft = inbox.popleft
            extend = bucket.extend
            while room > 0 and inbox:
                take = room if room < len(inbox) else len(inbox)
                before = len(bucket)
                self._filter_into(extend, pred, [popleft() for _ in range(take)], take)
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
            try:
                passed = pred(item)
            except Exception as e:
                if not self._drop_failed(inbox, 0, e):
                    raise
                continue
            if passed and not offer(item):
                self._head_passed = True
                return
            inbox.popleft()


class FlatMapP(_BulkP):
    """Emits every item of ``fn(item)`` (an iterable) for every item, in order.

    When the outbox fills up in the middle of one item's results, the rest of that
    item's iterator is kept and emitted first on the next call; the input item stays in
    the inbox until all its results are out, so ``fn`` runs exactly once per item.
    Under a bad-record policy other than ``"fail"`` the results of each item are taken
    whole (``list``) before any goes out, so an iterator that raises half-way emits
    nothing of its item.
    """

    fuses_into_consumer = True  # see MapP

    def _all_results(self, items: Iterator[Any]) -> Iterator[Any]:
        return chain.from_iterable(_builtin_map(self._fn, items))

    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self._fn = fn
        self._rest: Iterator[Any] | None = None
        self._it: Iterator[Any] | None = None
        self._whole = False

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        self._whole = not context.item_errors.fails

    def flat_map_fn(self) -> Callable[[Any], Iterable[Any]]:
        """Its function: a fused pair runs it line by line into a counting consumer
        (core/counting.py, ``count_flat_mapped``)."""
        return self._fn

    def _results(self, item: Any) -> Any:
        results = self._fn(item)
        if self._whole and type(results) is not list and type(results) is not tuple:
            results = list(results)
        return results

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._single:
            self._process_general(inbox)
            return
        bucket = self.outbox.buckets[0]
        room = self.outbox.capacity - len(bucket)
        if room <= 0:
            return
        extend = bucket.extend
        popleft = inbox.popleft
        rest = self._rest
        if rest is not None:
            try:
                chunk = list(islice(rest, room))
            except Exception as e:  # the item's iterator raised after results went out
                self._rest = None
                if not self._drop_failed(inbox, 0, e):
                    raise
                return
            extend(chunk)
            room -= len(chunk)
            if room <= 0:
                # maybe exhausted, maybe not: find out on the next call
                return
            self._rest = None
            popleft()
        # the function itself unless results are taken whole (no extra call per item)
        results_of = self._results if self._whole else self._fn
        while inbox:
            try:
                results: Any = results_of(inbox[0])
                t = type(results)
                if t is not list and t is not tuple:
                    it = iter(results)
                    chunk = list(islice(it, room))
            except Exception as e:
                if not self._drop_failed(inbox, 0, e):
                    raise
                continue
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
            extend(chunk)
            room -= len(chunk)
            if room <= 0:
                self._rest = it
                return
            popleft()

    def _process_general(self, inbox: Inbox) -> None:
        """Several outbound ordinals (or none): every result offered to each."""
        while inbox:
            it = self._it
            if it is None:
                try:
                    it = iter(self._results(inbox[0]))
                except Exception as e:
                    if not self._drop_failed(inbox, 0, e):
                        raise
                    continue
                self._it = it
            try:
                done = self.emit_from(it)
            except Exception as e:  # the item's iterator raised
                self._it = None
                if not self._drop_failed(inbox, 0, e):
                    raise
                continue
            if not done:
                return
            self._it = None
            inbox.popleft()


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
