"""``insert_watermarks``: items pass unchanged; a watermark goes out at the end of the
input chunk, or before the first item behind it, so downstream results are those of a
watermark before every item that advanced it (checked with ``same_lateness`` and
differentially through the window processors); lulls and idleness are handled in
``try_process()``."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from window_test_support import (
    drive,
    key_of,
    new_processor,
    same_lateness,
    ts_of,
    with_fixed_lag_watermarks,
)

from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.core.inbox import Inbox
from slipstream.core.items import IDLE_MESSAGE, NO_WATERMARK, Watermark
from slipstream.core.outbox import Outbox
from slipstream.processors.watermarks import IDLE, InsertWatermarksP
from slipstream.state.keys import BroadcastKey
from slipstream.testing import verify_processor
from slipstream.watermark import limiting_lag_and_delay, with_fixed_lag
from slipstream.window import sliding_window_def, tumbling_window_def

WM = Watermark
WM_KEY = BroadcastKey("insert_watermarks.wm")


class FakeClock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def take(outbox: Outbox, ordinal: int = 0) -> list[Any]:
    out = list(outbox.buckets[ordinal])
    outbox.buckets[ordinal].clear()
    return out


def test_an_item_sees_the_watermark_it_is_late_for() -> None:
    items = [(0, "a"), (3, "b"), (1, "late"), (3, "same"), (5, "c"), (-10, "very late")]
    verify_processor(P.insert_watermarks(ts_of, lambda: with_fixed_lag(2))).input(
        items
    ).output_checker(same_lateness).expect_output(
        [WM(-2), (0, "a"), WM(1), (3, "b"), (1, "late"), (3, "same"), WM(3), (5, "c"), (-10, "very late")]
    )


def test_one_watermark_per_in_order_chunk() -> None:
    p, outbox = new_processor(P.insert_watermarks(ts_of, lambda: with_fixed_lag(2)), 100)
    p.process(0, Inbox([(0, "a"), (3, "b"), (5, "c")]))
    assert take(outbox) == [(0, "a"), (3, "b"), (5, "c"), WM(3)]
    # an item behind the owed watermark gets it first; the chunk's last one follows
    p.process(0, Inbox([(9, "d"), (6, "late"), (12, "e")]))
    assert take(outbox) == [(9, "d"), WM(7), (6, "late"), (12, "e"), WM(10)]


@settings(max_examples=80, deadline=None)
@given(
    ts=st.lists(st.integers(-50, 50), max_size=40),
    lag=st.integers(0, 10),
)
def test_matches_the_fixed_lag_oracle(ts: list[int], lag: int) -> None:
    """Every item passes, in order, nothing is dropped; watermarks are strictly
    increasing and equal to the oracle's; also after snapshot + restore at every item
    (the restored floor is the last emitted watermark, so nothing is re-emitted)."""
    items = [(t, f"item{i}") for i, t in enumerate(ts)]
    verify_processor(P.insert_watermarks(ts_of, functools.partial(with_fixed_lag, lag))).input(
        items
    ).output_checker(same_lateness).expect_output(with_fixed_lag_watermarks(items, lag))


def test_every_ordinal_gets_the_items_and_the_watermarks() -> None:
    items = [(10, "a"), (12, "b")]
    expected = [WM(10), (10, "a"), WM(12), (12, "b")]
    verify_processor(P.insert_watermarks(ts_of, lambda: with_fixed_lag(0))).input(
        items
    ).expect_outputs([expected, expected, expected])


def test_throttled_policy() -> None:
    wd = tumbling_window_def(10)
    items = [(3, "a"), (12, "b"), (19, "c"), (25, "d"), (21, "e")]
    verify_processor(
        P.insert_watermarks(ts_of, lambda: with_fixed_lag(1).throttle_by_frame(wd))
    ).input(items).output_checker(same_lateness).expect_output(
        [WM(0), (3, "a"), WM(10), (12, "b"), (19, "c"), WM(20), (25, "d"), (21, "e")]
    )


def test_each_processor_gets_its_own_policy() -> None:
    supplier = P.insert_watermarks(ts_of, lambda: with_fixed_lag(0))
    p1, o1 = new_processor(supplier, capacity=10)
    p2, o2 = new_processor(supplier, capacity=10)
    p1.process(0, Inbox([(100, "x")]))
    p2.process(0, Inbox([(5, "y")]))
    assert take(o1) == [(100, "x"), WM(100)]
    assert take(o2) == [(5, "y"), WM(5)]


def delay_policy_after_one_item() -> tuple[FakeClock, InsertWatermarksP, Outbox, Inbox]:
    """A processor with ``limiting_lag_and_delay(5, 100)`` on a fake clock at 0 and
    outbox capacity 1, after one ``process()`` of the inbox ``[(50, "a")]``."""
    clock = FakeClock(0)
    supplier = P.insert_watermarks(
        ts_of, lambda: limiting_lag_and_delay(5, 100, clock=clock), clock=clock
    )
    p, outbox = new_processor(supplier, capacity=1)
    inbox = Inbox([(50, "a")])
    p.process(0, inbox)
    return clock, p, outbox, inbox


def test_lull_advances_the_watermark_from_try_process() -> None:
    clock, p, outbox, inbox = delay_policy_after_one_item()
    # capacity 1: the watermark went out, the item was refused and stays in the inbox
    assert take(outbox) == [WM(45)] and len(inbox) == 1
    p.process(0, inbox)
    assert not inbox and take(outbox) == [(50, "a")]
    assert p.try_process() and take(outbox) == []  # nothing new
    clock.now = 200  # the delay passed: the watermark catches up with the top timestamp
    assert p.try_process()
    assert take(outbox) == [WM(50)]
    assert p.try_process() and take(outbox) == []  # not emitted twice


def test_try_process_keeps_a_refused_watermark() -> None:
    clock, p, outbox, inbox = delay_policy_after_one_item()
    take(outbox)
    p.process(0, inbox)
    # the item is still in the outbox: the lull watermark is refused
    clock.now = 200
    assert not p.try_process()
    assert not p.try_process()  # called again with the outbox still full
    assert take(outbox) == [(50, "a")]
    assert p.try_process()
    assert take(outbox) == [WM(50)]


def test_idle_message_after_timeout_then_resume() -> None:
    clock = FakeClock(1000)
    supplier = P.insert_watermarks(
        ts_of, lambda: with_fixed_lag(0), idle_timeout_ms=100, clock=clock
    )
    p, outbox = new_processor(supplier, capacity=5)
    clock.now = 1099
    assert p.try_process() and take(outbox) == []
    clock.now = 1100  # no item since init for 100 ms
    assert p.try_process() and take(outbox) == [IDLE_MESSAGE]
    clock.now = 5000
    assert p.try_process() and take(outbox) == []  # IDLE only once
    p.process(0, Inbox([(7, "a")]))
    assert take(outbox) == [(7, "a"), WM(7)]
    clock.now = 5099
    assert p.try_process() and take(outbox) == []
    p.process(0, Inbox([(3, "b")]))  # no advance: no watermark; still an item
    assert take(outbox) == [(3, "b")]
    clock.now = 5199
    assert p.try_process() and take(outbox) == [IDLE]
    assert IDLE is IDLE_MESSAGE


def test_idle_message_respects_outbox_capacity() -> None:
    clock = FakeClock(0)
    p, outbox = new_processor(
        P.insert_watermarks(ts_of, lambda: with_fixed_lag(0), idle_timeout_ms=10, clock=clock),
        capacity=1,
    )
    outbox.buckets[0].append("something already there")
    clock.now = 10
    assert not p.try_process()
    take(outbox)
    assert p.try_process()
    assert take(outbox) == [IDLE_MESSAGE]


def test_without_idle_timeout_no_idle_message() -> None:
    clock = FakeClock(0)
    p, outbox = new_processor(P.insert_watermarks(ts_of, lambda: with_fixed_lag(0), clock=clock))
    clock.now = 10**9
    assert p.try_process() and take(outbox) == []


def test_snapshot_saves_the_last_watermark_and_restore_takes_the_minimum() -> None:
    supplier = P.insert_watermarks(ts_of, lambda: with_fixed_lag(0))
    p, outbox = new_processor(supplier, capacity=10)
    p.process(0, Inbox([(42, "a")]))
    assert p.save_to_snapshot()
    assert outbox.snapshot_bucket == [(WM_KEY, 42)]

    q, qout = new_processor(supplier, capacity=10)
    q.restore_from_snapshot(Inbox([(WM_KEY, 42), (WM_KEY, 30), (WM_KEY, 35)]))
    assert q.finish_snapshot_restore()
    q.process(0, Inbox([(25, "replayed"), (30, "equal"), (31, "new")]))
    # never at or below the restored minimum 30
    assert take(qout) == [(25, "replayed"), (30, "equal"), (31, "new"), WM(31)]


def test_snapshot_before_any_item() -> None:
    verify_processor(P.insert_watermarks(ts_of, lambda: with_fixed_lag(0))).input(
        []
    ).expect_output([])


def test_bad_timestamp_names_the_item() -> None:
    p, _ = new_processor(P.insert_watermarks(ts_of, lambda: with_fixed_lag(0)))
    with pytest.raises(TypeError) as info:
        p.process(0, Inbox([(None, "x")]))
    assert str(info.value) == (
        "insert_watermarks (vertex 'test'): the timestamp of item (None, 'x') is None, "
        "not an int: timestamps are int milliseconds (invalid_timestamps='late' passes such "
        "items on to be counted as late)"
    )


def test_argument_validation() -> None:
    with pytest.raises(TypeError, match="timestamp_fn must be callable"):
        P.insert_watermarks(5, lambda: with_fixed_lag(0))
    with pytest.raises(TypeError, match="got a policy instance"):
        P.insert_watermarks(ts_of, with_fixed_lag(0))
    with pytest.raises(TypeError, match="policy_factory must be a zero-argument callable"):
        P.insert_watermarks(ts_of, 3)
    with pytest.raises(ValueError, match="idle_timeout_ms must be > 0"):
        P.insert_watermarks(ts_of, lambda: with_fixed_lag(0), idle_timeout_ms=0)
    with pytest.raises(TypeError, match="idle_timeout_ms must be an int"):
        P.insert_watermarks(ts_of, lambda: with_fixed_lag(0), idle_timeout_ms="10")
    with pytest.raises(TypeError, match="clock must be callable"):
        P.insert_watermarks(ts_of, lambda: with_fixed_lag(0), clock=3)
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        P.insert_watermarks(ts_of)  # type: ignore[call-arg]
    supplier = P.insert_watermarks(ts_of, lambda: "not a policy")
    with pytest.raises(TypeError, match="policy_factory\\(\\) returned 'not a policy'"):
        new_processor(supplier)


class RecordingPolicy:
    """Fixed lag 0 that records every reported timestamp."""

    def __init__(self) -> None:
        self.reported: list[int] = []
        self.wm = NO_WATERMARK

    def report_event(self, ts: int) -> int:
        self.reported.append(ts)
        self.wm = max(self.wm, ts)
        return self.wm

    def current_watermark(self) -> int:
        return self.wm


def test_each_item_is_reported_to_the_policy_once_despite_refusals() -> None:
    p, outbox = new_processor(P.insert_watermarks(ts_of, RecordingPolicy), capacity=1)
    inbox = Inbox([(1, "a"), (2, "b"), (2, "c"), (3, "d")])
    out: list[Any] = []
    calls = 0
    while inbox:
        p.process(0, inbox)
        out.extend(take(outbox))
        calls += 1
    assert out == [WM(1), (1, "a"), WM(2), (2, "b"), (2, "c"), WM(3), (3, "d")]
    assert calls == len(out)  # one offer accepted per call with capacity 1
    assert p._policy.reported == [1, 2, 2, 3]


# -- results downstream are those of a watermark per advancing item ------------------------

WINDOW_KINDS = {
    "tumbling": lambda: P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of, window_def=tumbling_window_def(10), agg_op=counting()
    ),
    "sliding": lambda: P.aggregate_to_sliding_window(
        key_fn=key_of,
        timestamp_fn=ts_of,
        window_def=sliding_window_def(20, 5),
        agg_op=counting(),
    ),
    "session": lambda: P.aggregate_to_session_window(
        key_fn=key_of, timestamp_fn=ts_of, session_timeout=7, agg_op=counting()
    ),
}


@settings(max_examples=120, deadline=None)
@given(
    ts=st.lists(st.integers(0, 300), max_size=80).map(sorted),
    disorder=st.lists(st.integers(0, 40), min_size=80, max_size=80),
    keys=st.lists(st.sampled_from("abc"), min_size=80, max_size=80),
    lag=st.integers(0, 20),
    chunks=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    capacity=st.integers(2, 64),
    kind=st.sampled_from(sorted(WINDOW_KINDS)),
)
def test_window_results_equal_those_of_a_watermark_per_advancing_item(
    ts: list[int],
    disorder: list[int],
    keys: list[str],
    lag: int,
    chunks: list[int],
    capacity: int,
    kind: str,
) -> None:
    """Differential: the chunked output of insert_watermarks (random chunk sizes and
    outbox capacities, disorder beyond the lag so some items are late) through each
    window kind gives the same results and the same late count as the per-item
    watermark stream of the plain-Python oracle."""
    events = [(t - d, k, i) for i, (t, d, k) in enumerate(zip(ts, disorder, keys, strict=False))]
    p, outbox = new_processor(
        P.insert_watermarks(ts_of, functools.partial(with_fixed_lag, lag)), capacity
    )
    stream: list[Any] = []
    pos = 0
    for size in chunks * (len(events) // max(1, sum(chunks)) + 1):
        inbox = Inbox(events[pos : pos + size])
        pos += size
        while inbox:
            p.process(0, inbox)
            stream.extend(take(outbox))
        if pos >= len(events):
            break
    assert [x for x in stream if not isinstance(x, Watermark)] == events
    oracle = with_fixed_lag_watermarks(events, lag)
    assert same_lateness(oracle, stream)
    got, got_late = drive(WINDOW_KINDS[kind](), stream, capacity=1000)
    want, want_late = drive(WINDOW_KINDS[kind](), oracle, capacity=1000)
    results = sorted(repr(x) for x in got if not isinstance(x, Watermark))
    assert results == sorted(repr(x) for x in want if not isinstance(x, Watermark))
    assert got_late == want_late


@settings(max_examples=300, deadline=None)
@given(
    ts=st.lists(st.integers(-200, 200), min_size=1, max_size=70),
    lag=st.integers(0, 60),
    frame=st.sampled_from([None, 7, 50]),
)
def test_chunk_check_for_items_behind_matches_a_running_maximum(
    ts: list[int], lag: int, frame: int | None
) -> None:
    """The block-wise C-speed check of a whole chunk (no item behind a watermark that
    the items before it produce) says yes exactly when the per-item running maximum
    does (unthrottled), and only then (throttled: the floored watermark is lower)."""
    from slipstream.processors.watermarks import _none_behind

    policy = with_fixed_lag(lag)
    if frame is not None:
        policy = policy.throttle_by_frame(tumbling_window_def(frame))
    wm_at_end = policy.watermark_after(max(ts))
    assert wm_at_end is not None
    got = _none_behind(policy, ts, NO_WATERMARK, wm_at_end)
    behind = any(t < max(ts[:j]) - lag for j, t in enumerate(ts) if j)
    if frame is None:
        assert got == (not behind)
    elif got:
        fresh = with_fixed_lag(lag).throttle_by_frame(tumbling_window_def(frame))
        wms = [fresh.report_event(t) for t in ts]
        assert all(t >= wms[j - 1] for j, t in enumerate(ts) if j)


def micro_batch_processor(
    policy: Any = None, capacity: int = 10
) -> tuple[InsertWatermarksP, Outbox]:
    """An inserter inside one epoch of a Spark Structured Streaming query."""
    from slipstream.core.processor import Context

    supplier = P.insert_watermarks(ts_of, policy or (lambda: with_fixed_lag(5)))
    p = supplier()
    outbox = Outbox(1, capacity)
    context = Context(vertex_name="test")
    context.micro_batch_watermarks = True
    p.init(outbox, context)
    return p, outbox


def test_micro_batch_epoch_holds_the_watermark_until_its_input_ends() -> None:
    p, outbox = micro_batch_processor()
    p.process(0, Inbox([(10, "a"), (30, "b"), (20, "c")]))
    p.process(0, Inbox([(50, "d"), (40, "e")]))
    assert p.try_process()
    assert take(outbox) == [(10, "a"), (30, "b"), (20, "c"), (50, "d"), (40, "e")]
    # the end of the epoch's input: the batch's maximum minus the lag, then the state
    assert p.save_to_snapshot()
    assert take(outbox) == [WM(45)]
    assert outbox.snapshot_bucket == [(WM_KEY, 45)]


def test_micro_batch_held_watermark_waits_for_outbox_room() -> None:
    p, outbox = micro_batch_processor(capacity=1)
    p.process(0, Inbox([(50, "a")]))
    assert not p.save_to_snapshot()  # the item is still in the outbox
    assert take(outbox) == [(50, "a")] and outbox.snapshot_bucket == []
    assert p.save_to_snapshot()
    assert take(outbox) == [WM(45)] and outbox.snapshot_bucket == [(WM_KEY, 45)]


def test_micro_batch_restore_takes_the_highest_and_emits_it_before_any_item() -> None:
    p, outbox = micro_batch_processor()
    # what the processors of the vertex saved: their splits ended at different times
    p.restore_from_snapshot(Inbox([(WM_KEY, 30), (WM_KEY, 42), (WM_KEY, 35)]))
    assert p.finish_snapshot_restore()
    p.process(0, Inbox([(40, "late for windows up to 42"), (44, "b")]))
    assert take(outbox) == [WM(42), (40, "late for windows up to 42"), (44, "b")]
    # its own events stay below the vertex's watermark: it never goes back
    assert p.save_to_snapshot()
    assert take(outbox) == [] and outbox.snapshot_bucket == [(WM_KEY, 42)]


def test_micro_batch_epoch_without_items_emits_the_restored_watermark() -> None:
    p, outbox = micro_batch_processor()
    p.restore_from_snapshot(Inbox([(WM_KEY, 30), (WM_KEY, 42)]))
    assert p.finish_snapshot_restore()
    assert p.save_to_snapshot()
    assert take(outbox) == [WM(42)] and outbox.snapshot_bucket == [(WM_KEY, 42)]


@pytest.mark.parametrize(
    "policy",
    [
        lambda: with_fixed_lag(5).throttle_by_frame(tumbling_window_def(10)),
        lambda: limiting_lag_and_delay(5, 100, clock=FakeClock(0)),
    ],
    ids=["throttled", "lag-and-delay"],
)
def test_micro_batch_held_watermark_is_the_policys(policy: Any) -> None:
    """Policies with and without the fast paths' hooks hold the value they would have
    emitted: the one the same policy reaches over the same events."""
    p, outbox = micro_batch_processor(policy)
    events = [(3, "a"), (27, "b"), (14, "c"), (33, "d"), (31, "e")]
    p.process(0, Inbox(events))
    reference = policy()
    for t, _k in events:
        reference.report_event(t)
    assert take(outbox) == events
    assert p.save_to_snapshot()
    assert take(outbox) == [WM(reference.current_watermark())]
