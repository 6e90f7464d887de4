"""Operator fusion: consecutive stateless stages run as one function in one processor.

A chain of ``map``/``filter``/``flat_map``/``peek`` stages compiles to one
:class:`ChainFn`, a function from a list of items to the list of their results, built
from C-level iterators (``map``, ``filter``, ``itertools.chain``) so that the per-item
cost is the user functions and little else. No queue hop separates the stages.

A chain runs either

* in its own vertex, :class:`FusedChainP`, or
* inside the processor it feeds, :class:`InputFusedP`, which transforms the items of one
  inbound ordinal before the wrapped processor sees them (e.g. ``flat_map(tokenize)``
  inside stage 1 of a word count). The compiler does this only where the edge into the
  wrapped processor needs no key of the chain's output (stage 1 of a two-stage
  aggregation, watermark insertion, the probe side of a hash join).

Both keep the upstream inbox untouched until every result of its items was handed on:
the engine takes a snapshot (or forwards a watermark) only once the inbox is empty, so
no result is ever lost in between, and each user function runs exactly once per item.

:class:`PipeP` goes one step further and runs two processors back to back in one
processor, the first one's output (items and watermarks) being the second one's input:
the compiler uses it for a watermark inserter followed by stage 1 of a window.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, islice
from typing import Any, NamedTuple

from slipstream.core.counting import count_flat_mapped
from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import ItemErrors, failed_position
from slipstream.core.items import Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context, Processor, drain_between
from slipstream.execution.pair import PairP
from slipstream.state.keys import BroadcastKey, KeyedStateKey, is_broadcast, routing_key

__all__ = ["ChainFn", "FusedChainP", "InputFusedP", "PipeP", "STATELESS_KINDS"]

STATELESS_KINDS = ("map", "filter", "flat_map", "peek", "project")
"""Step kinds: ``project`` is an internal ``map`` that keeps ``None`` results."""

_not_none = functools.partial(operator.is_not, None)
_from_iterables = chain.from_iterable


class _Peek:
    """``peek``'s step: call ``fn(item)`` for its side effect, pass the item on."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: Any) -> Any:
        self.fn(item)
        return item


class ChainFn:
    """``list of items -> list of results`` of a chain of stateless steps.

    Steps are ``(kind, fn)`` with kind in :data:`STATELESS_KINDS`. ``map`` drops a
    ``None`` result (as Jet's pipeline ``map`` does); ``flat_map``'s ``fn`` returns an
    iterable. A class rather than a closure so it pickles plainly where it can.

    :meth:`run` applies the bad-record policy: the steps pull the input items one at a
    time (C-level iterators all the way), so when a step raises, the input item it was
    on is the last one the input iterator handed out.
    """

    __slots__ = ("steps", "one_to_one")

    def __init__(self, steps: Sequence[tuple[str, Callable[[Any], Any]]]) -> None:
        for kind, _fn in steps:
            if kind not in STATELESS_KINDS:
                raise ValueError(f"ChainFn: unknown step kind {kind!r}")
        self.steps = tuple(steps)
        #: no step makes several results of one item: when a step raises on an item,
        #: the results so far are exactly those of the items before it
        self.one_to_one = all(kind != "flat_map" for kind, _ in self.steps)

    def _apply(self, it: Any) -> Any:
        for kind, fn in self.steps:
            if kind == "map":
                it = filter(_not_none, map(fn, it))
            elif kind == "filter":
                it = filter(fn, it)
            elif kind == "flat_map":
                it = _from_iterables(map(fn, it))
            elif kind == "project":
                it = map(fn, it)
            else:
                it = map(_Peek(fn), it)
        return it

    def flat_map_fn(self) -> Callable[[Any], Any] | None:
        """The function of a chain that is one ``flat_map`` step, else ``None`` (what
        :class:`InputFusedP` can count line by line into a counting consumer)."""
        if len(self.steps) == 1 and self.steps[0][0] == "flat_map":
            return self.steps[0][1]
        return None

    def __call__(self, items: Iterable[Any]) -> list[Any]:
        if not self.steps:
            return list(items)
        return list(self._apply(items))

    def run(self, items: Sequence[Any], errors: ItemErrors) -> list[Any]:
        """The results of ``items`` (a sequence: an inbox or a list). When a step raises
        on an item: under ``"fail"`` the error goes on, naming the item; otherwise the
        item is set aside and the others' results come out, once, in order: the chain
        goes on with the same input iterator. In a chain with a ``flat_map`` the results
        so far may hold some of the bad item's, so the items before it (since the last
        bad one) go through the chain again instead."""
        results: list[Any] = []
        if not self.steps:
            results.extend(items)
            return results
        n = len(items)
        src = iter(items)
        if self.one_to_one:
            while True:
                try:
                    results.extend(self._apply(src))
                    return results
                except Exception as e:
                    if not errors.handle(items[failed_position(n, src)], e):
                        raise
        start = 0
        while True:
            out: list[Any] = []
            try:
                out.extend(self._apply(src))
                results.extend(out)
                return results
            except Exception as e:
                k = failed_position(n, src)
                if not errors.handle(items[k], e):
                    raise
                results.extend(self.run(list(islice(items, start, k)), errors))
                start = k + 1

    def __repr__(self) -> str:
        return "ChainFn(" + ", ".join(kind for kind, _ in self.steps) + ")"


class FusedChainP(AbstractProcessor):
    """A vertex running a :class:`ChainFn` over its input, every result to every
    outbound ordinal. Watermarks pass through (the chain keeps event time: it may drop
    items, never delay them)."""

    handles_item_errors = True

    def __init__(self, fn: ChainFn) -> None:
        self._fn = fn
        self._out: list[Any] | None = None  # results of the inbox not handed on yet
        self._pos = 0

    def process(self, ordinal: int, inbox: Inbox) -> None:
        out = self._out
        if out is None:
            out = self._fn.run(inbox, self.context.item_errors)
            self._pos = 0
        if self._emit(out):
            self._out = None
            inbox.clear()
        else:
            self._out = out

    def _emit(self, out: list[Any]) -> bool:
        """Hand ``out[_pos:]`` on as far as the outbox takes it; ``True`` when done."""
        outbox = self.outbox
        pos = self._pos
        end = len(out)
        if outbox.data_ordinal_count == 1 and outbox.is_cooperative_outbox():
            bucket = outbox.buckets[0]
            room = outbox.capacity - len(bucket)
            if room <= 0:
                return pos >= end
            if pos == 0 and end <= room:
                bucket.extend(out)
                return True
            stop = min(end, pos + room)
            bucket.extend(out[pos:stop])
            self._pos = stop
            return stop >= end
        offer = outbox.offer
        while pos < end:
            if not offer(out[pos]):
                self._pos = pos
                return False
            pos += 1
        self._pos = pos
        return True


class InputFusedP(Processor):
    """Runs ``transforms[ordinal]`` over the items of inbound ``ordinal`` and feeds the
    results to ``inner``; everything else is ``inner``'s (watermarks, completion,
    snapshots, cooperativeness).

    The results wait in a private inbox until ``inner`` took them all; only then are the
    upstream items removed, so the engine never sees an empty inbox (and never starts a
    snapshot or forwards a watermark) while results are still in between.

    The chains apply the bad-record policy; the wrapped processor applies it to its own
    functions if it handles item errors.
    """

    handles_item_errors = True

    def __init__(
        self, inner_supplier: Callable[[], Processor], transforms: dict[int, ChainFn]
    ) -> None:
        self.inner = inner_supplier()
        if not isinstance(self.inner, Processor):
            raise TypeError(
                f"InputFusedP: the supplier made {type(self.inner).__name__}, not a Processor"
            )
        self._transforms = transforms
        self._pending = Inbox()

    def init(self, outbox: Outbox, context: Context) -> None:
        super().init(outbox, context)
        self.inner.init(outbox, context)

    def is_cooperative(self) -> bool:
        return self.inner.is_cooperative()

    def process(self, ordinal: int, inbox: Inbox) -> None:
        fn = self._transforms.get(ordinal)
        inner = self.inner
        if fn is None:
            inner.process(ordinal, inbox)
            return
        pending = self._pending
        if pending:
            inner.process(ordinal, pending)
            if pending:
                return
            inbox.clear()  # every result of these items was taken
            return
        if not inbox:
            return
        errors = self.context.item_errors
        flat = fn.flat_map_fn()
        if flat is not None and errors.fails:
            counting_map = getattr(inner, "counting_map", None)
            counts = counting_map(ordinal) if counting_map is not None else None
            if counts is not None:
                # a word count's stage 1: each item's results counted as they are
                # made, with no inbox in between (core/counting.py, count_flat_mapped)
                count_flat_mapped(flat, inbox, counts, errors.handle)
                inbox.clear()
                return
        pending.extend(fn.run(inbox, errors))
        if pending:
            inner.process(ordinal, pending)
            if pending:
                return
        inbox.clear()

    def try_process(self) -> bool:
        return self.inner.try_process()

    def drain_between(self) -> bool:
        # the results in between keep the upstream inbox non-empty (the tasklet handles
        # no idle mark before it is empty); only what ``inner`` holds can be left
        return drain_between(self.inner)

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return self.inner.try_process_watermark(watermark)

    def complete_edge(self, ordinal: int) -> bool:
        return self.inner.complete_edge(ordinal)

    def complete(self) -> bool:
        return self.inner.complete()

    def save_to_snapshot(self) -> bool:
        return self.inner.save_to_snapshot()

    def snapshot_commit_prepare(self) -> bool:
        return self.inner.snapshot_commit_prepare()

    def snapshot_commit_finish(self, success: bool) -> bool:
        return self.inner.snapshot_commit_finish(success)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        self.inner.restore_from_snapshot(inbox)

    def finish_snapshot_restore(self) -> bool:
        return self.inner.finish_snapshot_restore()

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"InputFusedP({self.inner!r}, {self._transforms!r})"


class FirstKey(NamedTuple):
    """A snapshot key of :class:`PipeP`'s first processor, wrapped so that a restore can
    tell it from the second one's (and still routes it like the original key)."""

    key: Any


def _wrap_first(key: Any) -> Any:
    if is_broadcast(key):
        return BroadcastKey(FirstKey(key))
    return KeyedStateKey(routing_key(key), FirstKey(key))


def _unwrap_first(key: Any) -> Any:
    """The first processor's original key, or ``None`` if ``key`` is the second's."""
    t = type(key)
    if t is BroadcastKey and type(key.name) is FirstKey:
        return key.name.key
    if t is KeyedStateKey and type(key.detail) is FirstKey:
        return key.detail.key
    return None


class PipeP(PairP):
    """``first``'s output is ``second``'s input (ordinal 0), in one processor.

    The hand-over is :class:`~slipstream.execution.pair.PairP`'s: whatever ``first``
    emitted is handed to ``second`` (items, watermarks, in order) before ``first`` gets
    more input and before any other callback goes on, so the engine never takes a
    snapshot or completes with items between the two, and forwards an idle mark only
    after :meth:`drain_between`.

    Snapshots hold both processors' state; the first one's keys are wrapped
    (:class:`FirstKey`, routed as the original key) so a restore gives each its own.
    Both run their commit phases, the first one's first. Both processors must be
    cooperative; they share this processor's context. Each applies the bad-record
    policy to its own functions if it handles item errors (dead letters go to this
    processor's outbox).
    """

    def __init__(
        self, first_supplier: Callable[[], Processor], second_supplier: Callable[[], Processor]
    ) -> None:
        super().__init__(first_supplier(), second_supplier(), 0)
        if hasattr(self.second, "own_watermarks"):
            # a window behind its own watermark inserter: cursors may differ per processor
            self.second.own_watermarks = True
        self._first_restored = False
        self._first_prepared = False
        self._first_finished = False
        self._snapshot_rest: list[tuple[Any, Any]] = []

    def init(self, outbox: Outbox, context: Context) -> None:
        super().init(outbox, context)
        self._init_pair(outbox, context, context)

    def _save_first(self) -> bool:
        mid = self._mid
        assert mid is not None
        done = self.first.save_to_snapshot()
        self._snapshot_rest.extend((_wrap_first(k), v) for k, v in mid.snapshot_bucket)
        mid.snapshot_bucket.clear()
        return done

    def snapshot_commit_prepare(self) -> bool:
        # the second one may offer to the snapshot (the outbox is the engine's); the
        # first one's commit phase runs first, as it saves first
        if not self._first_prepared:
            if not self.first.snapshot_commit_prepare():
                return False
            self._first_prepared = True
        if not self.second.snapshot_commit_prepare():
            return False
        self._first_prepared = False
        return True

    def snapshot_commit_finish(self, success: bool) -> bool:
        if not self._first_finished:
            if not self.first.snapshot_commit_finish(success):
                return False
            self._first_finished = True
        if not self.second.snapshot_commit_finish(success):
            return False
        self._first_finished = False
        return True

    def _flush_snapshot(self) -> bool:
        rest = self._snapshot_rest
        offer = self.outbox.offer_to_snapshot
        while rest:
            k, v = rest[0]
            if not offer(k, v):
                return False
            rest.pop(0)
        return True

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        mine, theirs = Inbox(), Inbox()
        for k, v in inbox:
            original = _unwrap_first(k)
            if original is None:
                theirs.append((k, v))
            else:
                mine.append((original, v))
        inbox.clear()
        self.first.restore_from_snapshot(mine)
        self.second.restore_from_snapshot(theirs)
        if mine or theirs:
            raise RuntimeError(
                f"vertex {self.context.vertex_name!r}: a fused processor left snapshot "
                "entries unrestored"
            )

    def finish_snapshot_restore(self) -> bool:
        if not self._first_restored:
            if not self.first.finish_snapshot_restore():
                return False
            self._first_restored = True
        return self.second.finish_snapshot_restore()


def pipe(
    first_supplier: Callable[[], Processor], second_supplier: Callable[[], Processor]
) -> Callable[[], PipeP]:
    """Supplier of :class:`PipeP` processors: ``first`` feeding ``second``."""
    return functools.partial(PipeP, first_supplier, second_supplier)


def fused_chain(fn: ChainFn) -> Callable[[], FusedChainP]:
    """Supplier of a :class:`FusedChainP` vertex."""
    return functools.partial(FusedChainP, fn)


def input_fused(
    inner_supplier: Callable[[], Processor], transforms: dict[int, ChainFn]
) -> Callable[[], InputFusedP]:
    """Supplier of ``inner_supplier``'s processors with ``transforms`` on their inputs."""
    return functools.partial(InputFusedP, inner_supplier, dict(transforms))
