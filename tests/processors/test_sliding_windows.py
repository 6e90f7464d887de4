"""Sliding/tumbling window processors (docs/semantics.md §6) against a brute-force oracle.

The oracle knows nothing of frames: a window ``[E - size, E)`` contains an event iff
``E - size <= ts < E``, for every ``E`` on the grid ``offset + k * slide``. The only frame
notion the tests use is the lateness rule of docs/semantics.md §6 (an event is dropped iff the first
window containing it ends at or below the last watermark), which defines *which* events
count; the results over those events come from the oracle.

Most tests run through ``slipstream.testing.verify_processor`` (outbox capacity 1, and
snapshot + restore after every item), with an output checker that compares the output
segment by segment between watermarks (order inside a segment is not defined).
"""

from __future__ import annotations

import functools
import operator
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from window_test_support import (
    HARNESS_SETTINGS,
    CollectSink,
    Event,
    ListSource,
    assert_same_per_watermark,
    drive,
    expected_output,
    key_of,
    max_disorder,
    new_processor,
    same_per_watermark,
    saved_entries,
    sorted_values,
    ts_of,
    with_fixed_lag_watermarks,
)

import slipstream as ss
from slipstream import DAG, Edge
from slipstream import processors as P
from slipstream.aggregate import AggregateOperation, counting, summing
from slipstream.core.groups import KeyedGroup
from slipstream.core.inbox import Inbox
from slipstream.core.items import NO_WATERMARK, Watermark
from slipstream.state.keys import BroadcastKey, KeyedStateKey, expand_entries
from slipstream.testing import verify_processor
from slipstream.watermark import with_fixed_lag
from slipstream.window import (
    KeyedWindowResult,
    SlidingWindowDef,
    sliding_window_def,
    tumbling_window_def,
)

R = KeyedWindowResult
WM = Watermark


def value_of(e: Event) -> int:
    return e[2]


# -- aggregate operations under test ----------------------------------------------------


def sum_with_deduct() -> AggregateOperation[Any, Any, Any]:
    return summing(value_of)


def sum_without_deduct() -> AggregateOperation[Any, Any, Any]:
    return AggregateOperation(int, lambda a, e: a + e[2], operator.add)


OPS: dict[str, tuple[Callable[[], AggregateOperation[Any, Any, Any]], Callable[[list[Event]], Any]]] = {
    "sum_deduct": (sum_with_deduct, lambda evs: sum(e[2] for e in evs)),
    "sum_no_deduct": (sum_without_deduct, lambda evs: sum(e[2] for e in evs)),
    "sorted_list": (sorted_values, lambda evs: sorted(e[2] for e in evs)),
    "count": (counting, len),
}


# -- the oracle --------------------------------------------------------------------------


def grid_floor(t: int, wd: SlidingWindowDef) -> int:
    return t - (t - wd.frame_offset) % wd.frame_size


def oracle_windows(
    events: list[Event], wd: SlidingWindowDef, agg: Callable[[list[Event]], Any]
) -> list[KeyedWindowResult]:
    """Every (window, key) with at least one event, by brute force."""
    if not events:
        return []
    lo = grid_floor(min(e[0] for e in events), wd)
    hi = max(e[0] for e in events) + wd.window_size + wd.frame_size
    out = []
    for end in range(lo, hi, wd.frame_size):
        start = end - wd.window_size
        members: dict[str, list[Event]] = defaultdict(list)
        for e in events:
            if start <= e[0] < end:
                members[e[1]].append(e)
        for k, evs in members.items():
            out.append(R(start, end, k, agg(evs)))
    return out


def first_window_end(t: int, wd: SlidingWindowDef) -> int:
    """End of the first window that contains ``t`` (smallest grid value > t)."""
    return grid_floor(t, wd) + wd.frame_size


def expected_stream(
    stream: list[Any], wd: SlidingWindowDef, agg: Callable[[list[Event]], Any]
) -> tuple[list[Any], int]:
    """Late: the first window containing the event ended at or below the watermark
    (frame granularity); a window goes out at the first watermark ``>=`` its end."""
    return expected_output(
        stream,
        lambda ts, wm: first_window_end(ts, wd) <= wm,
        lambda kept: oracle_windows(kept, wd, agg),
        lambda end, wm: end <= wm,
    )


# -- strategies ---------------------------------------------------------------------------


@st.composite
def window_defs(draw: st.DrawFn) -> SlidingWindowDef:
    slide = draw(st.integers(1, 4))
    frames = draw(st.integers(1, 4))
    offset = draw(st.integers(0, slide - 1))
    return SlidingWindowDef(slide, offset, slide * frames)


@st.composite
def event_lists(draw: st.DrawFn, max_size: int = 30) -> list[Event]:
    """Events in roughly increasing time order with bounded disorder; values in
    [-2, 2] so that windows summing to 0 are common."""
    n = draw(st.integers(0, max_size))
    disorder = draw(st.integers(0, 6))
    step = draw(st.integers(0, 3))
    start = draw(st.integers(-20, 20))
    return [
        (
            start + i * step + draw(st.integers(0, disorder)),
            draw(st.sampled_from("abc")),
            draw(st.integers(-2, 2)),
        )
        for i in range(n)
    ]


def single_stage(wd: SlidingWindowDef, op: AggregateOperation[Any, Any, Any]) -> Any:
    return P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of, window_def=wd, agg_op=op
    )


def stage1(wd: SlidingWindowDef, op: AggregateOperation[Any, Any, Any]) -> Any:
    return P.accumulate_by_frame(key_fn=key_of, timestamp_fn=ts_of, window_def=wd, agg_op=op)


def stage2(wd: SlidingWindowDef, op: AggregateOperation[Any, Any, Any]) -> Any:
    return P.combine_to_sliding_window(window_def=wd, agg_op=op)


# -- oracle tests --------------------------------------------------------------------------


@HARNESS_SETTINGS
@given(events=event_lists(), wd=window_defs(), op_name=st.sampled_from(sorted(OPS)))
def test_lag_covering_disorder_gives_exactly_the_oracle(
    events: list[Event], wd: SlidingWindowDef, op_name: str
) -> None:
    make_op, agg = OPS[op_name]
    stream = with_fixed_lag_watermarks(events, max_disorder(events))
    expected, dropped = expected_stream(stream, wd, agg)
    assert dropped == 0
    # no late events: the results are the oracle over all events, emitted in time
    assert sorted(r for r in expected if not isinstance(r, Watermark)) == sorted(
        oracle_windows(events, wd, agg)
    )
    verify_processor(single_stage(wd, make_op())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(expected)


@HARNESS_SETTINGS
@given(
    events=event_lists(),
    wd=window_defs(),
    op_name=st.sampled_from(sorted(OPS)),
    lag=st.integers(0, 3),
)
def test_late_events_are_dropped_counted_and_the_rest_matches_the_oracle(
    events: list[Event], wd: SlidingWindowDef, op_name: str, lag: int
) -> None:
    make_op, agg = OPS[op_name]
    stream = with_fixed_lag_watermarks(events, lag)
    expected, dropped = expected_stream(stream, wd, agg)
    verify_processor(single_stage(wd, make_op())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(expected)
    out, late = drive(single_stage(wd, make_op()), stream)
    assert_same_per_watermark(expected, out)
    assert late == dropped
    # snapshot + restore after every item loses and duplicates nothing, counts the same
    out, late = drive(single_stage(wd, make_op()), stream, snapshot_every_item=True)
    assert_same_per_watermark(expected, out)
    assert late == dropped


@HARNESS_SETTINGS
@given(
    events=event_lists(),
    wd=window_defs(),
    op_name=st.sampled_from(sorted(OPS)),
    lag=st.integers(0, 4),
    snapshots=st.booleans(),
)
def test_two_stages_equal_single_stage(
    events: list[Event], wd: SlidingWindowDef, op_name: str, lag: int, snapshots: bool
) -> None:
    make_op, agg = OPS[op_name]
    stream = with_fixed_lag_watermarks(events, lag)
    expected, dropped = expected_stream(stream, wd, agg)
    single, single_late = drive(single_stage(wd, make_op()), stream)
    frames, late1 = drive(stage1(wd, make_op()), stream, snapshot_every_item=snapshots)
    windows, late2 = drive(stage2(wd, make_op()), frames, snapshot_every_item=snapshots)
    assert_same_per_watermark(expected, single)
    assert_same_per_watermark(expected, windows)
    assert single_late == late1 == dropped
    assert late2 == 0  # stage 2 never sees a late frame in a chain


# -- stage 1 ---------------------------------------------------------------------------------


def test_accumulate_by_frame_emits_unfinished_frames_when_the_watermark_passes() -> None:
    wd = sliding_window_def(4, 2)
    op = AggregateOperation(list, lambda a, e: a + [e[2]], operator.add, None, len)
    stream = [(0, "a", 1), (1, "a", 2), (3, "b", 3), WM(2), (2, "a", 4), (1, "a", 5), WM(5)]
    # frame [0,2) of "a" is complete at WM(2); ts 1 after WM(2) is late (its frame
    # ended), ts 2 is not; the accumulator (a list) is emitted, not finish(acc) = len
    verify_processor(stage1(wd, op)).disable_snapshots().input(stream).output_checker(
        same_per_watermark
    ).expect_output(
        [R(0, 2, "a", [1, 2]), WM(2), R(2, 4, "a", [4]), R(2, 4, "b", [3]), WM(5)]
    )


def _expanded(items: list[Any]) -> list[Any]:
    """Stage-1 output with each KeyedGroup as the rows of its entries."""
    out: list[Any] = []
    for x in items:
        if type(x) is KeyedGroup:
            out.extend((*x.head, k, v) for k, v in x.entries.items())
        else:
            out.append(x)
    return out


def test_the_pipelines_stage_1_emits_the_same_frames_as_keyed_groups() -> None:
    """accumulate_rows_by_frame (the Pipeline's stage 1): the frames of
    accumulate_by_frame as one KeyedGroup per frame (on watermarks and on snapshot
    flushes), and stage 2 makes the same windows of them, also of groups and rows
    mixed in one inbox."""
    from slipstream.processors.windows import accumulate_rows_by_frame

    wd = sliding_window_def(4, 2)
    op = summing(value_of)
    events = [(0, "a", 1), (1, "b", 2), (3, "a", 3), (2, "a", 4), (5, "b", 5), (7, "a", 6)]
    stream = with_fixed_lag_watermarks(events, 1)
    rows = accumulate_rows_by_frame(key_fn=key_of, timestamp_fn=ts_of, window_def=wd, agg_op=op)
    for snapshots in (False, True):
        named, _ = drive(stage1(wd, op), stream, snapshot_every_item=snapshots)
        grouped, _ = drive(rows, stream, snapshot_every_item=snapshots)
        assert _expanded(grouped) == [tuple(x) if type(x) is R else x for x in named]
        assert {type(x) for x in grouped} == {KeyedGroup, WM}
        windows, _ = drive(stage2(wd, op), grouped)
        assert windows == drive(stage2(wd, op), named)[0]
        assert {type(x) for x in windows} == {R, WM}
    # rows and groups in one inbox, either first: the same frames
    p2, _ = new_processor(stage2(wd, op))
    p2.process(0, Inbox([(0, 2, "a", 1), KeyedGroup((0, 2), {"a": 2, "b": 3}), (0, 2, "b", 4)]))
    p2.process(0, Inbox([KeyedGroup((2, 4), {"a": 5}), (2, 4, "a", 6), (2, 4, "c", 7)]))
    assert p2._frames == {2: {"a": 3, "b": 7}, 4: {"a": 11, "c": 7}}
    p = ss.Pipeline()
    p.read_from(ss.sources.items(events)).with_timestamps(ts_of, 1).group_by(key_of).window(
        wd
    ).aggregate(op).write_to(ss.sinks.list_sink("out"))
    (stage_1,) = [v for v in p.to_dag().vertices if v.name.endswith("window-accumulate")]
    assert type(stage_1.supplier()).__name__ == "PipeP"
    assert stage_1.supplier().second._grouped


def frames_checker(expected: list[Any], actual: list[Any]) -> bool:
    """Stage-1 output modulo snapshot flushes: per (frame, key) the partial frames add up
    to the expected frame, every part of a frame comes before the watermark that
    completes it, and the watermarks are the same."""
    if [w for w in actual if isinstance(w, WM)] != [w for w in expected if isinstance(w, WM)]:
        return False
    totals: dict[tuple[int, int, str], int] = defaultdict(int)
    wm = NO_WATERMARK
    for item in actual:
        if isinstance(item, WM):
            wm = item.timestamp
            continue
        if item.end <= wm:
            return False  # every part of a frame precedes the watermark completing it
        totals[(item.start, item.end, item.key)] += item.value
    exp = {(r.start, r.end, r.key): r.value for r in expected if not isinstance(r, WM)}
    return dict(totals) == exp


def test_accumulate_by_frame_flushes_its_frames_on_snapshot_instead_of_saving_them() -> None:
    wd = tumbling_window_def(10)
    p, outbox = new_processor(stage1(wd, sum_with_deduct()), capacity=1)
    p.process(0, Inbox([(1, "a", 1), (2, "b", 2), (3, "a", 3)]))
    p.try_process_watermark(WM(-5))  # nothing complete yet: only the watermark
    assert outbox.buckets[0] == [WM(-5)]
    outbox.buckets[0].clear()
    saved: list[Any] = []
    out: list[Any] = []
    while not p.save_to_snapshot():
        out.extend(outbox.buckets[0])
        outbox.buckets[0].clear()
        saved.extend(outbox.snapshot_bucket)
        outbox.snapshot_bucket.clear()
    out.extend(outbox.buckets[0])
    saved.extend(outbox.snapshot_bucket)
    assert sorted(out) == [R(0, 10, "a", 4), R(0, 10, "b", 2)]
    assert saved == [(BroadcastKey("window.next_win_to_emit"), 0)]  # higher_frame_ts(-5)


@settings(max_examples=33, deadline=None)
@given(events=event_lists(), wd=window_defs(), lag=st.integers(0, 4))
def test_accumulate_by_frame_under_the_harness(
    events: list[Event], wd: SlidingWindowDef, lag: int
) -> None:
    stream = with_fixed_lag_watermarks(events, lag)
    frame_def = wd.to_tumbling_by_frame()
    expected, _ = expected_stream(stream, frame_def, lambda evs: sum(e[2] for e in evs))
    verify_processor(stage1(wd, sum_with_deduct())).input(stream).output_checker(
        frames_checker
    ).expect_output(expected)


# -- stage 2 ---------------------------------------------------------------------------------


@HARNESS_SETTINGS
@given(events=event_lists(), wd=window_defs(), op_name=st.sampled_from(sorted(OPS)))
def test_combine_to_sliding_window_under_the_harness(
    events: list[Event], wd: SlidingWindowDef, op_name: str
) -> None:
    make_op, agg = OPS[op_name]
    stream = with_fixed_lag_watermarks(events, max_disorder(events))
    frames, _ = drive(stage1(wd, make_op()), stream)
    expected, _ = expected_stream(stream, wd, agg)
    verify_processor(stage2(wd, make_op())).input(frames).output_checker(
        same_per_watermark
    ).expect_output(expected)


def test_combine_accepts_finer_stage1_frames() -> None:
    # stage 1 with slide 1, stage 2 with slide 2: frames are combined into the frame
    # they end in (higher_frame_ts(end - 1))
    fine = sliding_window_def(2, 1)
    coarse = sliding_window_def(4, 2)
    stream = [(0, "a", 1), (1, "a", 2), (2, "a", 4), (3, "a", 8), WM(10)]
    frames, _ = drive(stage1(fine, sum_with_deduct()), stream)
    out, _ = drive(stage2(coarse, sum_with_deduct()), frames)
    assert out == [R(-2, 2, "a", 3), R(0, 4, "a", 15), R(2, 6, "a", 12), WM(10)]


def test_combine_rejects_items_that_are_not_frames() -> None:
    p, _ = new_processor(stage2(tumbling_window_def(2), summing()))
    with pytest.raises(TypeError, match="combine_to_sliding_window.*KeyedWindowResult"):
        p.process(0, Inbox([(1, "a", 1)]))


# -- semantics by example ---------------------------------------------------------------------


@pytest.mark.parametrize("op_name", ["sum_deduct", "sum_no_deduct"])
def test_zero_sum_windows_still_emit_zero(op_name: str) -> None:
    make_op, _ = OPS[op_name]
    wd = sliding_window_def(4, 2)
    stream = [(0, "a", 1), (1, "a", -1), (2, "b", 5), (3, "a", 2), (4, "a", -2), WM(12)]
    expected = [
        R(-2, 2, "a", 0),
        R(0, 4, "a", 2),
        R(0, 4, "b", 5),
        R(2, 6, "a", 0),
        R(2, 6, "b", 5),
        R(4, 8, "a", -2),
        WM(12),
    ]
    verify_processor(single_stage(wd, make_op())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(expected)


def test_a_key_whose_events_all_left_the_window_is_not_emitted() -> None:
    # "b" has an event only in frame 2; window 6 ([2, 6)) has frames 4 and 6 only
    wd = sliding_window_def(4, 2)
    stream = [(1, "b", 0), (3, "a", 1), (5, "a", 1), WM(8)]
    verify_processor(single_stage(wd, sum_with_deduct())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(
        [R(-2, 2, "b", 0), R(0, 4, "a", 1), R(0, 4, "b", 0), R(2, 6, "a", 2), R(4, 8, "a", 1), WM(8)]
    )


def test_lateness_is_judged_per_frame() -> None:
    # tumbling 4 after WM(5): ts 4 is in the open frame [4, 8) and accepted although
    # 4 < 5; ts 3 is in the frame [0, 4) that was emitted: dropped (reference B35)
    wd = tumbling_window_def(4)
    stream = [(1, "a", 1), WM(5), (4, "a", 10), (3, "a", 100), WM(8)]
    out, late = drive(single_stage(wd, sum_with_deduct()), stream)
    assert out == [R(0, 4, "a", 1), WM(5), R(4, 8, "a", 10), WM(8)]
    assert late == 1


def test_partially_late_event_is_dropped() -> None:
    # window 4 ([0, 4)) was emitted at WM(4); ts 3 would also count in window 6, which is
    # not emitted yet, but it is dropped: frame granularity
    wd = sliding_window_def(4, 2)
    stream = [(1, "a", 1), WM(4), (3, "a", 100), WM(10)]
    out, late = drive(single_stage(wd, sum_with_deduct()), stream)
    assert out == [R(-2, 2, "a", 1), R(0, 4, "a", 1), WM(4), WM(10)]
    assert late == 1


def test_first_emission_starts_at_the_first_window_containing_the_lowest_frame() -> None:
    wd = sliding_window_def(6, 2)
    stream = [(100, "a", 1), WM(1000)]
    out, _ = drive(single_stage(wd, sum_with_deduct()), stream)
    assert out == [R(96, 102, "a", 1), R(98, 104, "a", 1), R(100, 106, "a", 1), WM(1000)]


def test_a_watermark_without_frames_still_makes_older_events_late() -> None:
    wd = tumbling_window_def(10)
    stream = [WM(25), (15, "a", 1), (29, "a", 2), WM(40)]
    out, late = drive(single_stage(wd, sum_with_deduct()), stream)
    assert out == [WM(25), R(20, 30, "a", 2), WM(40)]
    assert late == 1


def test_complete_flushes_every_window_without_a_watermark() -> None:
    wd = sliding_window_def(6, 2)
    stream = [(1, "a", 1), (7, "b", 2), WM(4)]
    verify_processor(single_stage(wd, sum_with_deduct())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(
        [
            R(-4, 2, "a", 1),
            R(-2, 4, "a", 1),
            WM(4),
            R(0, 6, "a", 1),
            R(2, 8, "b", 2),
            R(4, 10, "b", 2),
            R(6, 12, "b", 2),
        ]
    )


def test_complete_with_nothing_emits_nothing() -> None:
    verify_processor(single_stage(tumbling_window_def(3), summing())).input([]).expect_output([])


def test_a_huge_watermark_jump_is_cheap() -> None:
    wd = sliding_window_def(2, 1)
    stream = [(0, "a", 1), WM(10**15), (10**15 + 5, "a", 1), WM(10**16)]
    out, _ = drive(single_stage(wd, sum_with_deduct()), stream)
    assert out == [
        R(-1, 1, "a", 1),
        R(0, 2, "a", 1),
        WM(10**15),
        R(10**15 + 4, 10**15 + 6, "a", 1),
        R(10**15 + 5, 10**15 + 7, "a", 1),
        WM(10**16),
    ]


def test_watermark_is_held_back_until_all_its_windows_are_out() -> None:
    wd = tumbling_window_def(2)
    p, outbox = new_processor(single_stage(wd, sum_with_deduct()), capacity=1)
    p.process(0, Inbox([(0, "a", 1), (0, "b", 1), (1, "c", 1)]))
    calls = 0
    out: list[Any] = []
    wm = WM(2)
    while True:
        calls += 1
        done = p.try_process_watermark(wm)
        out.extend(outbox.buckets[0])
        outbox.buckets[0].clear()
        if done:
            break
    assert out == [R(0, 2, "a", 1), R(0, 2, "b", 1), R(0, 2, "c", 1), WM(2)]
    assert calls == 4  # one item per call with capacity 1; True only with the watermark out


# -- snapshots --------------------------------------------------------------------------------


def test_snapshot_holds_frames_by_key_and_the_cursor() -> None:
    wd = sliding_window_def(4, 2)
    p, outbox = new_processor(single_stage(wd, sum_with_deduct()), capacity=100)
    p.process(0, Inbox([(1, "a", 1), (3, "b", 2), (4, "a", 3)]))
    p.try_process_watermark(WM(2))
    # frames are saved as one map each (a KeyedState); restore sees one entry per key
    entries = expand_entries(saved_entries(p, outbox))
    # frame 2 stays: window 4 still needs it
    assert sorted(entries, key=repr) == sorted(
        [
            (KeyedStateKey("a", 2), 1),
            (KeyedStateKey("b", 4), 2),
            (KeyedStateKey("a", 6), 3),
            (BroadcastKey("window.next_win_to_emit"), 4),
            # plain data for readers of the snapshot (ss.state.read tells its windows)
            (BroadcastKey("window.definition"), {"size": 4, "slide": 2, "offset": 0}),
        ],
        key=repr,
    )


def test_restore_takes_the_minimum_cursor_and_rebuilds_running_windows() -> None:
    wd = sliding_window_def(4, 2)
    p, outbox = new_processor(single_stage(wd, sum_with_deduct()), capacity=100)
    cursor = BroadcastKey("window.next_win_to_emit")
    entries = [
        (KeyedStateKey("a", 2), 1),
        (KeyedStateKey("a", 4), 5),
        (cursor, 6),
        (cursor, 4),  # another processor's cursor: the minimum wins
        (KeyedStateKey("a", -10), 99),  # every window of this frame is out: ignored
    ]
    p.restore_from_snapshot(Inbox(entries))
    assert p.finish_snapshot_restore()
    p.process(0, Inbox([(2, "a", 100)]))  # frame 4 >= cursor 4: accepted
    p.process(0, Inbox([(1, "a", 1000)]))  # frame 2 < cursor 4: late
    assert p.try_process_watermark(WM(6))
    assert outbox.buckets[0] == [R(0, 4, "a", 106), R(2, 6, "a", 105), WM(6)]
    assert p.context.metrics == {"late_items_dropped": 1}


def test_duplicate_snapshot_entry_is_an_error() -> None:
    p, _ = new_processor(single_stage(tumbling_window_def(2), summing()))
    with pytest.raises(ValueError, match="duplicate snapshot entry for key 'a' in frame 2"):
        p.restore_from_snapshot(Inbox([(KeyedStateKey("a", 2), 1), (KeyedStateKey("a", 2), 1)]))


# -- validation --------------------------------------------------------------------------------


def test_argument_validation() -> None:
    wd = sliding_window_def(4, 2)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'agg_op'"):
        P.aggregate_to_sliding_window(key_fn=key_of, timestamp_fn=ts_of, window_def=wd)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        P.aggregate_to_sliding_window(key_of, ts_of, wd, summing())  # type: ignore[misc]
    with pytest.raises(TypeError, match="aggregate_to_sliding_window: key_fn must be callable"):
        P.aggregate_to_sliding_window(key_fn="k", timestamp_fn=ts_of, window_def=wd, agg_op=summing())
    with pytest.raises(TypeError, match="accumulate_by_frame: timestamp_fn must be callable"):
        P.accumulate_by_frame(key_fn=key_of, timestamp_fn=3, window_def=wd, agg_op=summing())
    with pytest.raises(TypeError, match="window_def must be a SlidingWindowDef"):
        P.aggregate_to_sliding_window(key_fn=key_of, timestamp_fn=ts_of, window_def=10, agg_op=summing())
    with pytest.raises(TypeError, match="agg_op must be an AggregateOperation"):
        P.combine_to_sliding_window(window_def=wd, agg_op=sum)
    no_combine = AggregateOperation(int, lambda a, e: a + 1)
    with pytest.raises(ValueError, match="no combine primitive"):
        P.aggregate_to_sliding_window(key_fn=key_of, timestamp_fn=ts_of, window_def=wd, agg_op=no_combine)
    with pytest.raises(ValueError, match="no combine primitive"):
        P.combine_to_sliding_window(window_def=wd, agg_op=no_combine)
    # a tumbling window and stage 1 don't need combine
    P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of, window_def=tumbling_window_def(2), agg_op=no_combine
    )
    P.accumulate_by_frame(key_fn=key_of, timestamp_fn=ts_of, window_def=wd, agg_op=no_combine)


def test_bad_timestamp_names_the_item() -> None:
    p, _ = new_processor(single_stage(tumbling_window_def(2), summing()))
    with pytest.raises(TypeError, match=r"aggregate_to_sliding_window .*item \(None, 'a', 1\)"):
        p.process(0, Inbox([(None, "a", 1)]))


# -- through the engine ------------------------------------------------------------------------


def run_windows_job(
    events: list[Event],
    wd: SlidingWindowDef,
    make_op: Callable[[], AggregateOperation[Any, Any, Any]],
    *,
    lag: int,
    two_stage: bool,
    members: int,
    parallelism: int,
) -> tuple[list[Any], dict[str, dict[str, int]]]:
    engine = ss.local(cooperative_threads=2, members=members)
    dag = DAG()
    src = dag.new_vertex("source", functools.partial(ListSource, events)).local_parallelism(1)
    wms = dag.new_vertex(
        "watermarks", P.insert_watermarks(ts_of, functools.partial(with_fixed_lag, lag))
    ).local_parallelism(1)
    sink = dag.new_vertex("sink", functools.partial(CollectSink, "results")).local_parallelism(1)
    dag.edge(Edge.between(src, wms))
    if two_stage:
        s1 = dag.new_vertex("stage1", stage1(wd, make_op())).local_parallelism(parallelism)
        s2 = dag.new_vertex("stage2", stage2(wd, make_op())).local_parallelism(parallelism)
        dag.edge(Edge.between(wms, s1).partitioned(key_of))
        dag.edge(Edge.between(s1, s2).distributed().partitioned(lambda r: r.key))
        dag.edge(Edge.between(s2, sink))
    else:
        w = dag.new_vertex("window", single_stage(wd, make_op())).local_parallelism(parallelism)
        dag.edge(Edge.between(wms, w).distributed().partitioned(key_of))
        dag.edge(Edge.between(w, sink))
    job = engine.new_job(dag, ss.JobConfig(name="windows"))
    job.join(60)
    return sorted(engine.get_list("results")), job.metrics


@pytest.mark.parametrize("op_name", ["sum_deduct", "sorted_list"])
@pytest.mark.parametrize("members", [1, 2])
def test_engine_two_stage_equals_single_stage_equals_oracle(op_name: str, members: int) -> None:
    import random

    rng = random.Random(7 + members)
    events = [(i + rng.randint(0, 8), rng.choice("abcdefg"), rng.randint(-2, 2)) for i in range(3000)]
    wd = sliding_window_def(12, 3).with_offset(1)
    make_op, agg = OPS[op_name]
    expected = sorted(oracle_windows(events, wd, agg))
    single, m1 = run_windows_job(
        events, wd, make_op, lag=8, two_stage=False, members=members, parallelism=2
    )
    double, m2 = run_windows_job(
        events, wd, make_op, lag=8, two_stage=True, members=members, parallelism=2
    )
    assert single == expected
    assert double == expected
    assert m1["window"].get("late_items_dropped", 0) == 0
    assert m2["stage1"].get("late_items_dropped", 0) == 0


def test_engine_counts_late_events() -> None:
    import random

    rng = random.Random(3)
    events = [(i + rng.randint(0, 10), rng.choice("ab"), 1) for i in range(500)]
    wd = tumbling_window_def(5)
    stream = with_fixed_lag_watermarks(events, 2)
    expected, dropped = expected_stream(stream, wd, len)
    assert dropped > 0
    results, metrics = run_windows_job(
        events, wd, counting, lag=2, two_stage=False, members=1, parallelism=1
    )
    assert results == sorted(r for r in expected if not isinstance(r, Watermark))
    assert metrics["window"]["late_items_dropped"] == dropped


# -- restoring under another window definition (Jet's SlidingWindowP_changeWindowSizeTest) ----


def _identity(x: Any) -> Any:
    return x


def _const_key(x: Any) -> str:
    return "key"


@pytest.mark.parametrize("deduct", [True, False])
@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # shrink a sliding window: frames older than the cursor's first window go
        (sliding_window_def(3, 1), sliding_window_def(2, 1), [(3, 3), (4, 5), (5, 3)]),
        # extend a sliding window
        (sliding_window_def(2, 1), sliding_window_def(3, 1), [(3, 3), (4, 6), (5, 5), (6, 3)]),
        # a size-3 grid after size 2: frame 4 lands in frame 6
        (tumbling_window_def(2), tumbling_window_def(3), [(6, 5)]),
        (tumbling_window_def(3), tumbling_window_def(2), [(4, 3), (6, 3)]),
        # several old frames fall into one new frame: combined, none lost
        (tumbling_window_def(1), tumbling_window_def(4), [(4, 5)]),
        # slide 1 to slide 3
        (sliding_window_def(3, 1), tumbling_window_def(3), [(3, 3), (6, 3)]),
    ],
)
def test_restore_under_another_window_definition_realigns_frames(
    before: SlidingWindowDef, after: SlidingWindowDef, expected: list[tuple[int, int]], deduct: bool
) -> None:
    """Jet's SlidingWindowP_changeWindowSizeTest: items 0..3 (timestamp = value), then
    watermark 2, a snapshot, a restore into a processor with another window definition,
    and completion. Restored frames move to the frame of the new grid they end in
    (combined when several land in one), the cursor moves to the new grid, and every
    frame is emitted and evicted: no result off the new grid, no frame lost or leaked."""
    op = summing() if deduct else AggregateOperation(int, operator.add, operator.add)

    def supplier(wd: SlidingWindowDef) -> Any:
        return P.aggregate_to_sliding_window(
            key_fn=_const_key, timestamp_fn=_identity, window_def=wd, agg_op=op
        )

    p, outbox = new_processor(supplier(before), capacity=1024)
    p.process(0, Inbox([0, 1, 2, 3]))
    assert p.try_process_watermark(WM(2))
    entries = saved_entries(p, outbox)
    p, outbox = new_processor(supplier(after), capacity=1024)
    p.restore_from_snapshot(Inbox(entries))
    assert p.finish_snapshot_restore()
    assert p.complete()
    ws = after.window_size
    assert outbox.buckets[0] == [R(end - ws, end, "key", v) for end, v in expected]
    assert not p._frames, "restored frames leaked"
    assert not p._running, "running window leaked"


@pytest.mark.parametrize("kind", ["sliding", "stage1", "session"])
def test_exactly_once_restore_with_disagreeing_cursors_fails_naming_the_vertex(kind: str) -> None:
    """Under exactly-once every processor of a vertex saw the same watermarks before the
    barrier, so their saved cursors agree; entries that disagree mean a broken snapshot
    (Jet asserts). Under at-least-once the minimum is taken. So it is by stage 1 of a
    two-stage window (``stage1``): behind a local edge on several members its processors
    see their own member's watermarks (tests/state/test_incremental_rescale.py)."""
    from slipstream.core.outbox import Outbox
    from slipstream.core.processor import Context

    wd = sliding_window_def(4, 2)
    if kind == "session":
        supplier = P.aggregate_to_session_window(
            session_timeout=5, key_fn=key_of, timestamp_fn=ts_of, agg_op=summing()
        )
        key = BroadcastKey("session_window.current_watermark")
    else:
        supplier = (single_stage if kind == "sliding" else stage1)(wd, summing())
        key = BroadcastKey("window.next_win_to_emit")
    for guarantee in ss.ProcessingGuarantee:
        p = supplier()
        ctx = Context(vertex_name="win", processing_guarantee=guarantee)
        ctx.commits_snapshots = True  # the embedded engine's coordinator aligned the barrier
        p.init(Outbox(1, 10), ctx)
        inbox = Inbox([(key, 4), (key, 4), (key, 6)])
        if guarantee is ss.ProcessingGuarantee.EXACTLY_ONCE and kind != "stage1":
            with pytest.raises(ss.SnapshotError, match=r"vertex 'win'.*different .* \(4 and 6\)"):
                p.restore_from_snapshot(inbox)
        else:
            p.restore_from_snapshot(inbox)
            assert p.finish_snapshot_restore()
            if kind == "stage1":
                assert p._next_win == 4
