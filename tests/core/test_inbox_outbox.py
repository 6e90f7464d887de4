"""Inbox and Outbox contracts."""

from __future__ import annotations

import pytest

from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox


def test_inbox_operations() -> None:
    ib = Inbox([1, 2, 3])
    assert ib.peek() == 1 and len(ib) == 3
    assert ib.poll() == 1 and ib.remove() == 2
    got: list[int] = []
    assert ib.drain(got.append) == 1 and got == [3]
    assert ib.is_empty() and ib.peek() is None and ib.poll() is None
    with pytest.raises(IndexError):
        ib.remove()
    ib.add_all([4, 5])
    target: list[int] = []
    assert ib.drain_to(target) == 2 and target == [4, 5] and not ib


def test_outbox_refuses_when_full_and_is_all_or_nothing() -> None:
    ob = Outbox(2, capacity=1)
    assert ob.offer("a", 0)
    assert not ob.offer("b", 0)
    assert not ob.offer("c")  # ordinal 0 full: nothing added to ordinal 1 either
    assert ob.buckets == [["a"], []]
    assert ob.offer("d", 1) and ob.buckets == [["a"], ["d"]]
    ob.buckets[0].clear()
    assert not ob.offer("e", [0, 1]) and ob.buckets[0] == []
    ob.buckets[1].clear()
    assert ob.offer("e", [0, 1]) and ob.buckets == [["e"], ["e"]]


def test_outbox_bad_ordinal_and_snapshot_bucket() -> None:
    ob = Outbox(1, capacity=2, snapshot_capacity=1)
    with pytest.raises(IndexError, match="ordinals 0..0, offered to ordinal 3"):
        ob.offer(1, 3)
    assert ob.offer_to_snapshot("k", 1)
    assert not ob.offer_to_snapshot("k2", 2)
    assert ob.snapshot_bucket == [("k", 1)]
    assert not ob.is_empty()


def test_offer_many_returns_rest() -> None:
    ob = Outbox(1, capacity=3)
    rest = ob.offer_many(range(5))
    assert ob.buckets[0] == [0, 1, 2]
    assert list(rest) == [3, 4]
    ob.buckets[0].clear()
    assert ob.offer_many([7]) is None and ob.room(0) == 2


def test_blocking_outbox_flushes_instead_of_refusing() -> None:
    flushed: list[list[int]] = []
    ob: Outbox

    def flush() -> None:
        flushed.append(ob.buckets[0].copy())
        ob.buckets[0].clear()

    ob = Outbox(1, capacity=2, flush_fn=flush)
    for i in range(5):
        assert ob.offer(i)
    assert flushed == [[0, 1], [2, 3]] and ob.buckets[0] == [4]
