"""AbstractProcessor's fast paths (``try_emit`` writing straight into a plain outbox's
single bucket, the default ``process`` loop) behave exactly like ``Outbox.offer`` and the
item-by-item loop: same answers, same buckets, same flags, same inbox afterwards."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream.core.inbox import Inbox
from slipstream.core.items import IdleMessage, Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.testing import verify_processor


class _SlowOutbox(Outbox):
    """Not a plain Outbox: AbstractProcessor must route every offer through offer()."""

    __slots__ = ()


class _Emitter(ss.AbstractProcessor):
    pass


def _pair(capacity: int, ordinals: int = 1) -> tuple[_Emitter, _Emitter]:
    fast, slow = _Emitter(), _Emitter()
    fast.init(Outbox(ordinals, capacity), Context())
    slow.init(_SlowOutbox(ordinals, capacity), Context())
    assert (fast._emit_capacity > 0) == (ordinals == 1) and slow._emit_capacity == 0
    return fast, slow


def _state(p: ss.AbstractProcessor) -> tuple[Any, ...]:
    ob = p.outbox
    return ([list(b) for b in ob.buckets], ob.specials, ob.unfinished)


_items = st.one_of(
    st.integers(0, 9),
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.builds(Watermark, st.integers(0, 100)),
    st.just(IdleMessage()),
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("emit"), _items, st.sampled_from([None, 0])),
        st.tuples(st.just("drain"), st.none(), st.none()),
        # the outbox's own offers: a refusal there must not leave try_emit's fast path
        # appending without clearing ``unfinished``
        st.tuples(st.just("offer"), _items, st.sampled_from([None, 0])),
        st.tuples(st.just("offer_many"), st.lists(_items, max_size=4), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.sampled_from([1, 2, 3, 1 << 30]), ops=_ops)
def test_try_emit_fast_path_matches_offer(capacity: int, ops: list[Any]) -> None:
    fast, slow = _pair(capacity)
    for op, item, ordinal in ops:
        if op == "drain":
            for p in (fast, slow):
                p.outbox.buckets[0].clear()
                p.outbox.specials = False
            continue
        if op == "offer":
            assert fast.outbox.offer(item, ordinal) == slow.outbox.offer(item, ordinal)
        elif op == "offer_many":
            left = [fast.outbox.offer_many(item), slow.outbox.offer_many(item)]
            fast_rest, slow_rest = (None if r is None else list(r) for r in left)
            assert fast_rest == slow_rest
        else:
            assert fast.try_emit(item, ordinal) == slow.try_emit(item, ordinal)
        assert _state(fast) == _state(slow)


def test_try_emit_with_several_ordinals_uses_offer() -> None:
    fast, slow = _pair(1, ordinals=2)
    assert fast._emit_capacity == 0
    assert fast.try_emit("a") and not fast.try_emit("b")
    assert fast.outbox.buckets == [["a"], ["a"]] and fast.outbox.unfinished


class _TakeWhileRoom(ss.AbstractProcessor):
    """Emits each item once; items equal to ``stop`` are refused while they are met for
    the first time (a processor that is not ready for an item yet)."""

    def __init__(self, stop: int) -> None:
        self.stop = stop
        self.seen_stop = False
        self.calls: list[Any] = []

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.calls.append(item)
        if item == self.stop and not self.seen_stop:
            self.seen_stop = True
            return False
        return self.try_emit(item)


class _NoHintInbox(Inbox):
    """An inbox whose iterator gives no length hint (``process`` then finds what is
    left by reading the rest of the iterator)."""

    __slots__ = ()

    def __iter__(self) -> Any:
        return (x for x in super().__iter__())


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(st.integers(0, 5), max_size=30),
    capacity=st.sampled_from([1, 2, 3, 4, 1 << 30]),
    stop=st.integers(0, 6),
    hint=st.booleans(),
)
def test_default_process_removes_exactly_the_processed_items(
    items: list[int], capacity: int, stop: int, hint: bool
) -> None:
    """Model: the item-by-item loop (peek, try, remove on True, return on False), with
    outbox capacity 1 to 4 and one that never fills (the refusals then come from the
    processor only)."""
    p = _TakeWhileRoom(stop)
    p.init(Outbox(1, capacity), Context())
    inbox = Inbox(items) if hint else _NoHintInbox(items)
    out: list[int] = []
    rounds = 0
    while inbox and rounds < 100:
        rounds += 1
        expected_calls: list[int] = []
        model = list(inbox)
        room = capacity
        seen_stop = p.seen_stop
        while model:
            head = model[0]
            expected_calls.append(head)
            if head == stop and not seen_stop:
                seen_stop = True
                break
            if room == 0:
                break
            room -= 1
            model.pop(0)
        p.calls.clear()
        p.process(0, inbox)
        assert p.calls == expected_calls
        assert list(inbox) == model
        out.extend(p.outbox.buckets[0])
        p.outbox.buckets[0].clear()
    assert not inbox and out == items


def test_harness_with_outbox_capacity_one_still_checks_documented_processors() -> None:
    """The test harness's checking outbox is not a plain Outbox: try_emit goes through
    its offer(), so its semantic checks (capacity 1, re-offer) apply."""

    class Double(ss.AbstractProcessor):
        def try_process_item(self, ordinal: int, item: Any) -> bool:
            return self.try_emit(item * 2)

    verify_processor(Double).input([1, 2, 3]).expect_output([2, 4, 6])


def test_processors_sharing_an_outbox_each_leave_the_fast_path_on_a_refusal() -> None:
    """A wrapper that inits its inner processor with its own outbox: a refusal of the
    inner's offer stops the wrapper's fast path too, so the wrapper's next emit clears
    ``unfinished`` as Outbox.offer does."""
    outer, inner = _Emitter(), _Emitter()
    ob = Outbox(1, 1)
    outer.init(ob, Context())
    inner.init(ob, Context())
    assert inner.try_emit("a") and not inner.try_emit("b") and ob.unfinished
    ob.buckets[0].clear()
    assert outer.try_emit("c") and not ob.unfinished
    assert not outer.try_emit("d") and ob.unfinished
    ob.buckets[0].clear()
    assert inner.try_emit("d") and not ob.unfinished
