"""Session windows (docs/semantics.md §7, half-open) against a brute-force oracle.

Oracle: per key, sort the events by timestamp; a new session starts at an event whose
timestamp is at or after the current session's end (``max ts + timeout``), so two events
exactly ``timeout`` apart are in different sessions. Late events (``ts <`` the last
watermark) are dropped. A session is emitted at the first watermark ``W`` with
``end < W``, the rest by ``complete()``.
"""

from __future__ import annotations

import functools
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from window_test_support import (
    HARNESS_SETTINGS,
    CollectSink,
    Event,
    ListSource,
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
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.state.keys import BroadcastKey, KeyedStateKey, expand_entries
from slipstream.testing import verify_processor
from slipstream.watermark import with_fixed_lag
from slipstream.window import KeyedWindowResult

R = KeyedWindowResult
WM = Watermark
WM_KEY = BroadcastKey("session_window.current_watermark")


OPS: dict[str, tuple[Callable[[], AggregateOperation[Any, Any, Any]], Callable[[list[Event]], Any]]] = {
    "sum": (lambda: summing(lambda e: e[2]), lambda evs: sum(e[2] for e in evs)),
    "count": (counting, len),
    "sorted_list": (sorted_values, lambda evs: sorted(e[2] for e in evs)),
}


def sessions(timeout: int, op: AggregateOperation[Any, Any, Any]) -> Any:
    return P.aggregate_to_session_window(
        session_timeout=timeout, key_fn=key_of, timestamp_fn=ts_of, agg_op=op
    )


# -- oracle ------------------------------------------------------------------------------


def oracle_sessions(
    events: list[Event], timeout: int, agg: Callable[[list[Event]], Any]
) -> list[KeyedWindowResult]:
    by_key: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e[1]].append(e)
    out = []
    for key, evs in by_key.items():
        evs = sorted(evs)
        current: list[Event] = []
        end = 0
        for e in evs:
            if current and e[0] >= end:
                out.append(R(current[0][0], end, key, agg(current)))
                current = []
            current.append(e)
            end = e[0] + timeout  # events are sorted: the last one sets the end
        if current:
            out.append(R(current[0][0], end, key, agg(current)))
    return out


def expected_stream(
    stream: list[Any], timeout: int, agg: Callable[[list[Event]], Any]
) -> tuple[list[Any], int]:
    """Late: ``ts <`` the watermark; a session goes out at the first watermark ``>`` its
    end."""
    return expected_output(
        stream,
        lambda ts, wm: ts < wm,
        lambda kept: oracle_sessions(kept, timeout, agg),
        lambda end, wm: end < wm,
    )


# -- oracle tests --------------------------------------------------------------------------


@st.composite
def event_lists(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(0, 30))
    disorder = draw(st.integers(0, 12))
    step = draw(st.integers(0, 4))
    return [
        (
            i * step + draw(st.integers(0, disorder)),
            draw(st.sampled_from("ab")),
            draw(st.integers(-2, 2)),
        )
        for i in range(n)
    ]


@HARNESS_SETTINGS
@given(events=event_lists(), timeout=st.integers(1, 6), op_name=st.sampled_from(sorted(OPS)))
def test_lag_covering_disorder_gives_exactly_the_oracle(
    events: list[Event], timeout: int, op_name: str
) -> None:
    make_op, agg = OPS[op_name]
    stream = with_fixed_lag_watermarks(events, max_disorder(events))
    expected, dropped = expected_stream(stream, timeout, agg)
    assert dropped == 0
    assert sorted(r for r in expected if not isinstance(r, Watermark)) == sorted(
        oracle_sessions(events, timeout, agg)
    )
    verify_processor(sessions(timeout, make_op())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(expected)


@HARNESS_SETTINGS
@given(
    events=event_lists(),
    timeout=st.integers(1, 6),
    op_name=st.sampled_from(sorted(OPS)),
    lag=st.integers(0, 4),
)
def test_late_events_are_dropped_counted_and_the_rest_matches_the_oracle(
    events: list[Event], timeout: int, op_name: str, lag: int
) -> None:
    make_op, agg = OPS[op_name]
    stream = with_fixed_lag_watermarks(events, lag)
    expected, dropped = expected_stream(stream, timeout, agg)
    verify_processor(sessions(timeout, make_op())).input(stream).output_checker(
        same_per_watermark
    ).expect_output(expected)
    out, late = drive(sessions(timeout, make_op()), stream)
    assert same_per_watermark(expected, out)
    assert late == dropped


# -- semantics by example ---------------------------------------------------------------------


def values() -> AggregateOperation[Any, Any, Any]:
    return sorted_values()


def test_an_event_bridging_two_sessions_merges_them() -> None:
    stream = [(0, "a", 1), (8, "a", 2), (4, "a", 3)]
    verify_processor(sessions(5, values())).input(stream).expect_output([R(0, 13, "a", [1, 2, 3])])


def test_merge_of_the_earliest_session_after_a_watermark() -> None:
    # the key's deadline entry must survive the merge: the merged session is emitted
    stream = [(10, "a", 1), (18, "a", 2), (14, "a", 3), WM(12), WM(23), WM(24)]
    verify_processor(sessions(5, values())).input(stream).expect_output(
        [WM(12), WM(23), R(10, 23, "a", [1, 2, 3]), WM(24)]
    )


def test_extension_on_both_sides() -> None:
    stream = [(10, "a", 1), (13, "a", 2), (7, "a", 3), (5, "b", 4)]
    verify_processor(sessions(5, values())).input(stream).output_checker(
        same_per_watermark
    ).expect_output([R(7, 18, "a", [1, 2, 3]), R(5, 10, "b", [4])])


@pytest.mark.parametrize("order", [[0, 5], [5, 0]])
def test_touching_sessions_stay_separate(order: list[int]) -> None:
    stream = [(t, "a", t) for t in order]
    verify_processor(sessions(5, values())).input(stream).output_checker(
        same_per_watermark
    ).expect_output([R(0, 5, "a", [0]), R(5, 10, "a", [5])])


def test_one_below_the_timeout_joins() -> None:
    stream = [(0, "a", 0), (4, "a", 4)]
    verify_processor(sessions(5, values())).input(stream).expect_output([R(0, 9, "a", [0, 4])])


def test_session_is_emitted_once_the_watermark_is_past_its_end() -> None:
    # end < W: [0, 5) is not emitted at WM(5), it is at WM(6); an event at 5 is
    # not late at WM(5) and, touching, starts a new session
    stream = [(0, "a", 0), WM(5), (5, "a", 5), WM(6), WM(11)]
    verify_processor(sessions(5, values())).input(stream).expect_output(
        [WM(5), R(0, 5, "a", [0]), WM(6), R(5, 10, "a", [5]), WM(11)]
    )


def test_late_events_are_dropped_equality_is_not_late() -> None:
    stream = [WM(10), (9, "a", 1), (10, "a", 2), (3, "b", 3)]
    out, late = drive(sessions(5, values()), stream)
    assert out == [WM(10), R(10, 15, "a", [2])]
    assert late == 2


def test_complete_emits_everything_without_a_watermark() -> None:
    stream = [(0, "a", 1), (100, "a", 2), (50, "b", 3), WM(20)]
    verify_processor(sessions(10, values())).input(stream).output_checker(
        same_per_watermark
    ).expect_output([R(0, 10, "a", [1]), WM(20), R(100, 110, "a", [2]), R(50, 60, "b", [3])])


def test_many_keys_only_expired_ones_are_touched() -> None:
    events = [(i, f"k{i % 50}", 1) for i in range(1000)]
    stream = with_fixed_lag_watermarks(events, 0) + [WM(2000)]
    expected, _ = expected_stream(stream, 100, len)
    out, _ = drive(sessions(100, counting()), stream, capacity=1000)
    assert same_per_watermark(expected, out)


# -- snapshots ---------------------------------------------------------------------------------


def test_snapshot_holds_sessions_by_key_and_the_watermark() -> None:
    p, outbox = new_processor(sessions(5, summing(lambda e: e[2])))
    p.process(0, Inbox([(0, "a", 1), (20, "a", 2), (3, "b", 3)]))
    assert p.try_process_watermark(WM(-1))
    # the sessions are saved as one map of the lists (restore gets an entry per key)
    entries = expand_entries(saved_entries(p, outbox))
    assert sorted(entries, key=repr) == sorted(
        [
            (KeyedStateKey("a"), [[0, 5, 1], [20, 25, 2]]),
            (KeyedStateKey("b"), [[3, 8, 3]]),
            (WM_KEY, -1),
        ],
        key=repr,
    )


def test_restore_takes_the_minimum_watermark_and_rebuilds_deadlines() -> None:
    p, outbox = new_processor(sessions(5, summing(lambda e: e[2])), capacity=100)
    p.restore_from_snapshot(
        Inbox(
            [
                (KeyedStateKey("a"), [(0, 5, 1), (20, 25, 2)]),
                (WM_KEY, 7),
                (WM_KEY, 4),
                (KeyedStateKey("b"), [(3, 8, 3)]),
            ]
        )
    )
    assert p.finish_snapshot_restore()
    p.process(0, Inbox([(3, "c", 100), (4, "b", 10), (6, "a", 1000)]))
    assert p.context.metrics == {"late_items_dropped": 1}  # 3 < 4, 4 is not late
    assert p.try_process_watermark(WM(12))
    assert sorted(outbox.buckets[0][:-1]) == [R(0, 5, "a", 1), R(3, 9, "b", 13), R(6, 11, "a", 1000)]
    assert outbox.buckets[0][-1] == WM(12)


def test_duplicate_snapshot_entry_is_an_error() -> None:
    p, _ = new_processor(sessions(5, counting()))
    with pytest.raises(ValueError, match="duplicate snapshot entry for key 'a'"):
        p.restore_from_snapshot(Inbox([(KeyedStateKey("a"), [(0, 5, 1)]), (KeyedStateKey("a"), [])]))


# -- validation ---------------------------------------------------------------------------------


def test_argument_validation() -> None:
    ok: dict[str, Any] = dict(session_timeout=5, key_fn=key_of, timestamp_fn=ts_of, agg_op=counting())
    P.aggregate_to_session_window(**ok)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'session_timeout'"):
        P.aggregate_to_session_window(key_fn=key_of, timestamp_fn=ts_of, agg_op=counting())  # type: ignore[call-arg]
    for bad in (0, -3):
        with pytest.raises(ValueError, match="session_timeout must be > 0"):
            P.aggregate_to_session_window(**{**ok, "session_timeout": bad})
    for bad in (1.5, "5", True, None):
        with pytest.raises(TypeError, match="session_timeout must be a positive int"):
            P.aggregate_to_session_window(**{**ok, "session_timeout": bad})
    with pytest.raises(TypeError, match="key_fn must be callable"):
        P.aggregate_to_session_window(**{**ok, "key_fn": "k"})
    with pytest.raises(TypeError, match="timestamp_fn must be callable"):
        P.aggregate_to_session_window(**{**ok, "timestamp_fn": 1})
    with pytest.raises(TypeError, match="agg_op must be an AggregateOperation"):
        P.aggregate_to_session_window(**{**ok, "agg_op": len})
    with pytest.raises(ValueError, match="no combine primitive"):
        P.aggregate_to_session_window(**{**ok, "agg_op": AggregateOperation(int, lambda a, e: a + 1)})


def test_bad_timestamp_names_the_item() -> None:
    p, _ = new_processor(sessions(5, counting()))
    p.try_process_watermark(WM(0))
    with pytest.raises(TypeError, match=r"aggregate_to_session_window .*item \('x', 'a', 1\)"):
        p.process(0, Inbox([("x", "a", 1)]))


# -- through the engine ---------------------------------------------------------------------------


def test_engine_sessions_equal_the_oracle() -> None:
    rng = random.Random(11)
    events: list[Event] = []
    t = 0
    for _ in range(2000):
        t += rng.choice([0, 1, 1, 2, 9])
        events.append((t + rng.randint(0, 5), rng.choice("abcdef"), rng.randint(0, 3)))
    engine = ss.local(cooperative_threads=2, members=2)
    dag = DAG()
    src = dag.new_vertex("source", functools.partial(ListSource, events)).local_parallelism(1)
    wms = dag.new_vertex(
        "watermarks", P.insert_watermarks(ts_of, functools.partial(with_fixed_lag, 5))
    ).local_parallelism(1)
    win = dag.new_vertex("sessions", sessions(7, sorted_values())).local_parallelism(2)
    sink = dag.new_vertex("sink", functools.partial(CollectSink, "sessions")).local_parallelism(1)
    dag.edge(Edge.between(src, wms))
    dag.edge(Edge.between(wms, win).distributed().partitioned(key_of))
    dag.edge(Edge.between(win, sink))
    job = engine.new_job(dag, ss.JobConfig(name="sessions"))
    job.join(60)
    assert sorted(engine.get_list("sessions")) == sorted(
        oracle_sessions(events, 7, lambda evs: sorted(e[2] for e in evs))
    )
    assert job.metrics["sessions"].get("late_items_dropped", 0) == 0


def test_many_sessions_of_one_watermark_leave_in_order_through_a_small_outbox() -> None:
    """The results of one watermark go out a list at a time (512 a list): through an
    outbox of 7 the same results in the same order as through a big one, every result
    once, then the watermark."""
    events = [(t, f"k{t % 300}", 1) for t in range(0, 1500, 2)]

    def emitted(capacity: int) -> list[Any]:
        p, outbox = new_processor(sessions(1, counting()), capacity=capacity)
        p.process(0, Inbox(events))
        out: list[Any] = []
        for _ in range(10_000):
            done = p.try_process_watermark(WM(10_000))
            out.extend(outbox.buckets[0])
            outbox.buckets[0].clear()
            if done:
                return out
        raise AssertionError("the watermark's output never ended")

    small = emitted(7)
    assert small == emitted(1 << 20)
    assert small[-1] == WM(10_000) and len(small) == len(events) + 1
    assert {type(r) for r in small[:-1]} == {R}
    assert sorted(r.start for r in small[:-1]) == [t for t, _, _ in events]
