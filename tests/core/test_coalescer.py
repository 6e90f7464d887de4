"""Watermark coalescing rules (docs/semantics.md §3)."""

from __future__ import annotations

import pytest

from slipstream.core.inbox import Inbox
from slipstream.core.items import DONE_ITEM, IDLE_MESSAGE, Watermark
from slipstream.execution.coalescer import NO_NEW_WM, WatermarkCoalescer, WatermarkOrderError
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import SpscQueue


def test_emits_minimum_only_when_all_inputs_reached_it() -> None:
    c = WatermarkCoalescer(3)
    assert c.observe_wm(0, 10) is NO_NEW_WM
    assert c.observe_wm(1, 5) is NO_NEW_WM
    assert c.observe_wm(2, 7) == 5
    assert c.observe_wm(1, 8) == 7
    assert c.observe_wm(2, 20) == 8
    assert c.observe_wm(1, 9) == 9
    assert c.observe_wm(1, 30) == 10


def test_non_increasing_watermark_is_an_error_naming_the_input() -> None:
    c = WatermarkCoalescer(2, ["edge x queue 0", "edge x queue 1"])
    c.observe_wm(1, 5)
    with pytest.raises(WatermarkOrderError, match="edge x queue 1: 5 after 5"):
        c.observe_wm(1, 5)


def test_finished_input_no_longer_holds_back_but_all_done_gives_nothing_new() -> None:
    c = WatermarkCoalescer(2)
    c.observe_wm(0, 10)
    assert c.queue_done(1) == 10
    assert c.queue_done(0) is NO_NEW_WM  # never +infinity
    with pytest.raises(WatermarkOrderError):
        c.observe_wm(0, 11)


def test_all_done_without_watermarks_emits_nothing() -> None:
    c = WatermarkCoalescer(2)
    assert c.queue_done(0) is NO_NEW_WM
    assert c.queue_done(1) is NO_NEW_WM


def test_idle_input_is_excluded_and_reactivated_by_data() -> None:
    c = WatermarkCoalescer(2)
    assert c.observe_wm(0, 10) is NO_NEW_WM
    assert c.observe_wm(1, IDLE_MESSAGE) == 10
    assert c.observe_wm(0, 12) == 12
    c.observe_event(1)  # input 1 active again with its old watermark (-inf): holds back
    assert c.observe_wm(0, 15) is NO_NEW_WM
    assert c.observe_wm(1, 14) == 14


def test_all_idle_forwards_top_then_idle_once() -> None:
    c = WatermarkCoalescer(2)
    c.observe_wm(0, 10)
    assert c.observe_wm(1, 4) == 4
    assert c.observe_wm(0, IDLE_MESSAGE) is NO_NEW_WM
    assert c.observe_wm(1, IDLE_MESSAGE) == 10  # every input idle: top observed first
    assert c.check_pending_idle() is IDLE_MESSAGE  # ... then the idle mark
    assert c.check_pending_idle() is NO_NEW_WM
    assert c.observe_wm(0, IDLE_MESSAGE) is NO_NEW_WM  # duplicates are fine and silent


def test_all_idle_with_nothing_new_forwards_idle_immediately() -> None:
    c = WatermarkCoalescer(1)
    assert c.observe_wm(0, 3) == 3
    assert c.observe_wm(0, IDLE_MESSAGE) is IDLE_MESSAGE


def test_edge_stream_reactivates_idle_queue_on_data() -> None:
    from slipstream.core.inbox import Inbox
    from slipstream.core.items import Watermark
    from slipstream.execution.inbound import InboundEdgeStream
    from slipstream.execution.queues import SpscQueue

    q0, q1 = SpscQueue(100), SpscQueue(100)
    s = InboundEdgeStream(0, 0, [q0, q1])
    q1.offer(IDLE_MESSAGE, 1)
    q0.offer(Watermark(5), 1)
    inbox = Inbox()
    while s.wm_out is None:
        s.drain_to(inbox)
    assert s.wm_out == 5  # q1 idle: q0 alone decides
    q1.offer([1, 2], 2)  # q1 sends data: active again, its watermark (none) holds back
    q0.offer(Watermark(9), 1)
    s.drain_to(inbox)
    s.drain_to(inbox)
    assert list(inbox) == [1, 2] and s.wm_out is None


def _edge(n: int = 2) -> tuple[InboundEdgeStream, list[SpscQueue]]:
    qs = [SpscQueue(100) for _ in range(n)]
    return InboundEdgeStream(0, 0, qs), qs


def _drain(s: InboundEdgeStream) -> tuple[list[object], object]:
    inbox = Inbox()
    s.drain_to(inbox)
    return list(inbox), s.wm_out


@pytest.mark.parametrize("second_end", ["idle", "done"])
def test_edge_stream_delivers_idle_owed_after_top_watermark(second_end: str) -> None:
    """Two queues on one edge: 10 and 11, the queue of 11 goes idle, then the other goes
    idle or finishes: the drain reports 11, and the next drain the idle mark (Jet polls
    the coalescer's pending check after every drain)."""
    s, (q0, q1) = _edge()
    q0.offer(Watermark(10), 1)
    q1.offer(Watermark(11), 1)
    q1.offer(IDLE_MESSAGE, 1)
    assert _drain(s) == ([], 10)
    assert _drain(s) == ([], None)
    q0.offer(IDLE_MESSAGE if second_end == "idle" else DONE_ITEM, 1)
    assert _drain(s) == ([], 11)
    assert _drain(s) == ([], IDLE_MESSAGE)
    assert _drain(s) == ([], None)


def test_edge_stream_coalesces_like_jet() -> None:
    """Jet's ConcurrentInboundEdgeStreamTest: receiving watermarks, then coalesce; a
    watermark in one queue is released when the other queue finishes."""
    s, (q0, q1) = _edge()
    q0.offer(Watermark(1), 1)
    q1.offer(Watermark(2), 1)
    assert _drain(s) == ([], 1)
    q0.offer(Watermark(3), 1)
    q1.offer(Watermark(3), 1)
    assert _drain(s) == ([], 2)
    assert _drain(s) == ([], 3)

    s, (q0, q1) = _edge()
    q0.offer(Watermark(1), 1)
    assert _drain(s) == ([], None)
    q1.offer(DONE_ITEM, 1)
    assert _drain(s) == ([], 1)
