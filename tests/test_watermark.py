"""Watermark policies and throttling (docs/semantics.md §4).

Expected sequences are computed by hand from the reference formulas; each step is
written as (clock time, call, expected watermark).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK
from slipstream.watermark import (
    TimestampHistory,
    WatermarkPolicy,
    limiting_lag_and_delay,
    limiting_lag_and_lull,
    limiting_timestamp_and_wall_clock_lag,
    with_fixed_lag,
)
from slipstream.window import sliding_window_def, tumbling_window_def

MIN = NO_WATERMARK
CURRENT = None  # marks a current_watermark() call in step tables


class FakeClock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


Step = tuple[int, int | None, int]  # (clock time, event ts or CURRENT, expected wm)


def run_steps(policy: WatermarkPolicy, clock: FakeClock, steps: list[Step]) -> None:
    for index, (now, ts, expected) in enumerate(steps):
        clock.now = now
        got = policy.current_watermark() if ts is None else policy.report_event(ts)
        call = "current_watermark()" if ts is None else f"report_event({ts})"
        assert got == expected, f"step {index}: at {now}, {call} -> {got}, expected {expected}"


def run_events(policy: WatermarkPolicy, steps: list[tuple[int | None, int]]) -> None:
    run_steps(policy, FakeClock(), [(0, ts, wm) for ts, wm in steps])


# -- with_fixed_lag ------------------------------------------------------------------


def test_fixed_lag_sequence() -> None:
    run_events(
        with_fixed_lag(3),
        [
            (CURRENT, MIN),
            (10, 7),
            (8, 7),  # out of order: wm never decreases
            (CURRENT, 7),
            (15, 12),
            (12, 12),
            (CURRENT, 12),
            (16, 13),
        ],
    )


def test_fixed_lag_zero_and_negative_timestamps() -> None:
    run_events(with_fixed_lag(0), [(-100, -100), (-150, -100), (-1, -1), (0, 0)])
    run_events(with_fixed_lag(5), [(-100, -105), (-50, -55)])


def test_fixed_lag_ignores_underflow() -> None:
    run_events(
        with_fixed_lag(10),
        [(MIN + 5, MIN), (MIN + 10, MIN), (MIN + 11, MIN + 1), (0, -10)],
    )


# -- TimestampHistory ----------------------------------------------------------------


def test_timestamp_history_sequence() -> None:
    # max_delay 10, n 2: interval 5, a ring of 3 slots.
    h = TimestampHistory(10, 2)
    expected = [
        (100, 1, MIN),  # first call: 3 steps, then advance_at = 105; ring [1, MIN, MIN]
        (102, 2, MIN),  # no step; ring [2, MIN, MIN]
        (105, 3, MIN),  # step (tail 1, copies 2); advance_at 110; ring [2, 3, MIN]
        (109, 4, MIN),  # ring [2, 4, MIN]
        (110, 5, 2),  # step (tail 2, copies 4); ring [2, 4, 5]; oldest is slot 0
        (130, 6, 5),  # 3 steps (all): advance_at reset to 135; ring [5, 5, 6]
        (134, 7, 5),  # ring [5, 5, 7]
        (135, 8, 5),  # step (tail 0); ring [8, 5, 7]
        (140, 9, 7),  # step (tail 1); ring [8, 9, 7]
        (145, 10, 8),  # step (tail 2); ring [8, 9, 10]
        (1000, 11, 10),  # long gap: every slot now holds 10, tail gets 11
        (1004, 12, 10),
        (1005, 13, 10),
    ]
    for now, value, oldest in expected:
        assert h.sample(now, value) == oldest, (now, value)


def test_timestamp_history_restarts_schedule_after_full_turn() -> None:
    h = TimestampHistory(10, 2)
    assert h.sample(100, 1) == MIN  # advance_at = 105
    # Steps at 105, 110, 115 use the whole ring, so advance_at restarts at 117 + 5 = 122
    # (not 120, where stepping on from 105 would have left it).
    assert h.sample(117, 2) == 1
    assert h.sample(121, 3) == 1  # no step yet at 121
    assert h.sample(122, 4) == 1  # step: the oldest slot still holds 1
    assert h.sample(127, 5) == 3  # slot 0's last value, sampled at 121


def test_timestamp_history_validation() -> None:
    with pytest.raises(ValueError, match="max_delay"):
        TimestampHistory(15, 16)
    with pytest.raises(ValueError, match="n "):
        TimestampHistory(10, 0)
    with pytest.raises(ValueError, match="max_delay"):
        TimestampHistory(-1, 1)
    TimestampHistory(16)  # the default n is 16


# -- limiting_lag_and_delay -----------------------------------------------------------


def test_lag_and_delay_reaches_top_ts_after_max_delay() -> None:
    # max_delay 32 ms, 16 samples: interval 2 ms, 17 slots.
    clock = FakeClock()
    policy = limiting_lag_and_delay(5, 32, clock=clock)
    run_steps(
        policy,
        clock,
        [
            (1000, CURRENT, MIN),
            (1000, 100, 95),  # top 100 seen at 1000; lag gives 95
            (1010, CURRENT, 95),
            (1031, CURRENT, 95),  # 31 ms later: not yet
            (1032, CURRENT, 100),  # exactly max_delay later: the top timestamp
            (1040, 110, 105),  # lag: 105; history gives 100
            (1041, 108, 105),  # late-ish event, top stays 110
            (1071, CURRENT, 105),
            (1072, CURRENT, 110),  # 110 was observed at 1040, 32 ms ago
            (5000, CURRENT, 110),  # never beyond the top timestamp
        ],
    )


def test_lag_and_delay_history_dominates_a_large_lag() -> None:
    clock = FakeClock()
    policy = limiting_lag_and_delay(1000, 32, clock=clock)
    run_steps(
        policy,
        clock,
        [
            (1000, 100, -900),
            (1020, 200, -800),
            # Top as of ~32 ms ago (observed at 1000) beats 300 - 1000.
            (1040, 300, 100),
            (1052, CURRENT, 200),  # 200 observed at 1020
            (1060, 250, 200),
        ],
    )


def test_lag_and_delay_with_delay_below_sixteen_ms() -> None:
    # max_delay 10 ms: one sample per ms (10 samples) instead of 16.
    clock = FakeClock()
    policy = limiting_lag_and_delay(100, 10, clock=clock)
    run_steps(
        policy,
        clock,
        [(0, 50, -50), (9, CURRENT, -50), (10, CURRENT, 50)],
    )


def test_lag_and_delay_ignores_underflow() -> None:
    clock = FakeClock(0)
    policy = limiting_lag_and_delay(10, 32, clock=clock)
    assert policy.report_event(MIN + 3) == MIN
    clock.now = 32
    assert policy.current_watermark() == MIN + 3  # the top timestamp itself


def test_lag_and_delay_validation() -> None:
    with pytest.raises(ValueError, match="lag must be non-negative"):
        limiting_lag_and_delay(-1, 100)
    with pytest.raises(ValueError, match="max_delay_ms must be >= 1"):
        limiting_lag_and_delay(1, 0)
    with pytest.raises(ValueError, match="max_delay_ms must be an int"):
        limiting_lag_and_delay(1, 1.5)  # type: ignore[arg-type]


# -- limiting_lag_and_lull -----------------------------------------------------------


def test_lag_and_lull_sequence() -> None:
    clock = FakeClock()
    policy = limiting_lag_and_lull(2, 10, clock=clock)
    run_steps(
        policy,
        clock,
        [
            (0, CURRENT, MIN),  # nothing known yet, and no advancing from MIN
            (1000, CURRENT, MIN),
            (1000, 100, 98),  # lull deadline 1010
            (1005, CURRENT, 98),
            (1010, CURRENT, 98),
            (1013, CURRENT, 101),  # 3 ms past the deadline
            (1020, CURRENT, 108),  # 1:1 with the clock
            (1021, 105, 108),  # event resets the deadline to 1031; wm never decreases
            (1030, CURRENT, 108),
            (1031, CURRENT, 108),
            (1035, CURRENT, 112),
            (1036, 200, 198),  # deadline 1046
            (1046, CURRENT, 198),
            (1050, CURRENT, 202),
            (3050, CURRENT, 2202),  # a long lull: still 1:1
        ],
    )


def test_lag_and_lull_with_zero_lull() -> None:
    clock = FakeClock()
    policy = limiting_lag_and_lull(0, 0, clock=clock)
    run_steps(policy, clock, [(10, 5, 5), (10, CURRENT, 5), (13, CURRENT, 8), (14, 20, 20)])


def test_lag_and_lull_validation() -> None:
    with pytest.raises(ValueError, match="max_lull_ms must be non-negative"):
        limiting_lag_and_lull(0, -1)
    with pytest.raises(ValueError, match="lag"):
        limiting_lag_and_lull(-5, 10)


# -- limiting_timestamp_and_wall_clock_lag ---------------------------------------------


def test_timestamp_and_wall_clock_lag_sequence() -> None:
    clock = FakeClock()
    policy = limiting_timestamp_and_wall_clock_lag(10, 100, clock=clock)
    run_steps(
        policy,
        clock,
        [
            (1000, CURRENT, 900),  # moves with the wall clock without any event
            (1000, 950, 940),
            (1050, CURRENT, 950),
            (1050, 980, 970),
            (1200, 500, 1100),  # an old event cannot hold the wall clock back
            (1200, CURRENT, 1100),
            (1150, CURRENT, 1100),  # clock went backwards: wm does not
            (1150, 2000, 1990),
        ],
    )


def test_timestamp_and_wall_clock_lag_default_clock_is_epoch_millis() -> None:
    before = time.time_ns() // 1_000_000
    wm = limiting_timestamp_and_wall_clock_lag(0, 0).current_watermark()
    after = time.time_ns() // 1_000_000
    assert before <= wm <= after


def test_timestamp_and_wall_clock_lag_validation() -> None:
    with pytest.raises(ValueError, match="max_delay_ms must be non-negative"):
        limiting_timestamp_and_wall_clock_lag(0, -1)
    with pytest.raises(ValueError, match="lag"):
        limiting_timestamp_and_wall_clock_lag(-1, 0)


def test_default_monotonic_clocks_work() -> None:
    assert limiting_lag_and_lull(0, 1000).report_event(5) == 5
    assert limiting_lag_and_delay(0, 1000).report_event(5) == 5


# -- throttling ----------------------------------------------------------------------


def test_throttle_by_min_step() -> None:
    run_events(
        with_fixed_lag(0).throttle_by_min_step(10),
        [
            (CURRENT, MIN),
            (0, 0),
            (5, 0),
            (9, 0),
            (10, 10),
            (25, 25),
            (30, 25),
            (CURRENT, 25),
            (34, 25),
            (35, 35),
        ],
    )


def test_throttle_by_min_step_negative_timestamps() -> None:
    run_events(
        with_fixed_lag(0).throttle_by_min_step(10),
        [(-5, -5), (0, -5), (4, -5), (5, 5)],
    )


def test_throttle_by_frame() -> None:
    run_events(
        with_fixed_lag(0).throttle_by_frame(tumbling_window_def(10)),
        [
            (CURRENT, MIN),  # NO_WATERMARK stays NO_WATERMARK
            (7, 0),
            (9, 0),
            (CURRENT, 0),
            (10, 10),
            (19, 10),
            (25, 20),
        ],
    )


def test_throttle_by_frame_uses_the_frame_not_the_window() -> None:
    run_events(
        with_fixed_lag(1).throttle_by_frame(sliding_window_def(100, 10)),
        [(12, 10), (33, 30)],
    )


def test_throttle_by_frame_negative_timestamps() -> None:
    run_events(
        with_fixed_lag(0).throttle_by_frame(tumbling_window_def(10)),
        [(-15, -20), (-11, -20), (-10, -10), (-1, -10), (0, 0)],
    )


def test_throttle_by_frame_with_offset() -> None:
    wd = sliding_window_def(30, 10).with_offset(3)  # boundaries ... -17, -7, 3, 13 ...
    run_events(
        with_fixed_lag(0).throttle_by_frame(wd),
        [(-8, -17), (-7, -7), (2, -7), (3, 3), (12, 3), (13, 13)],
    )


def test_throttles_compose() -> None:
    run_events(
        with_fixed_lag(0).throttle_by_frame(tumbling_window_def(10)).throttle_by_min_step(20),
        [(5, 0), (15, 0), (25, 20), (35, 20), (45, 40)],
    )
    run_events(
        with_fixed_lag(0).throttle_by_min_step(7).throttle_by_frame(tumbling_window_def(5)),
        [(3, 0), (9, 0), (10, 10), (16, 10), (17, 15)],
    )


def test_throttled_lull_policy() -> None:
    clock = FakeClock()
    policy = limiting_lag_and_lull(0, 10, clock=clock).throttle_by_frame(tumbling_window_def(5))
    run_steps(
        policy,
        clock,
        [
            (0, CURRENT, MIN),
            (0, 12, 10),
            (10, CURRENT, 10),
            (12, CURRENT, 10),  # raw 14
            (13, CURRENT, 15),  # raw 15
            (24, CURRENT, 25),  # raw 26
        ],
    )


def test_throttle_returns_a_new_policy() -> None:
    base = with_fixed_lag(0)
    by_step = base.throttle_by_min_step(5)
    by_frame = base.throttle_by_frame(tumbling_window_def(5))
    assert by_step is not base and by_frame is not base
    assert isinstance(by_step, WatermarkPolicy) and isinstance(by_frame, WatermarkPolicy)
    assert base.current_watermark() == MIN


def test_throttle_validation() -> None:
    with pytest.raises(ValueError, match="min_step must be >= 1"):
        with_fixed_lag(0).throttle_by_min_step(0)
    with pytest.raises(ValueError, match="SlidingWindowDef"):
        with_fixed_lag(0).throttle_by_frame(10)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, True])
def test_fixed_lag_validation(bad: object) -> None:
    with pytest.raises(ValueError, match="lag"):
        with_fixed_lag(bad)  # type: ignore[arg-type]


# -- properties ----------------------------------------------------------------------

PolicyFactory = Callable[[FakeClock], WatermarkPolicy]

POLICIES: list[PolicyFactory] = [
    lambda c: with_fixed_lag(7),
    lambda c: limiting_lag_and_delay(7, 40, clock=c),
    lambda c: limiting_lag_and_lull(7, 20, clock=c),
    lambda c: limiting_timestamp_and_wall_clock_lag(7, 50, clock=c),
    lambda c: with_fixed_lag(3).throttle_by_min_step(10),
    lambda c: limiting_lag_and_lull(2, 5, clock=c).throttle_by_frame(
        sliding_window_def(20, 10).with_offset(4)
    ),
    lambda c: (
        limiting_lag_and_delay(0, 16, clock=c)
        .throttle_by_frame(tumbling_window_def(8))
        .throttle_by_min_step(3)
    ),
]

actions = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=30),  # clock advance
        st.one_of(st.none(), st.integers(min_value=-500, max_value=500)),  # event or CURRENT
    ),
    max_size=60,
)


@pytest.mark.parametrize("factory", POLICIES)
@given(steps=actions)
def test_watermark_never_decreases(
    factory: PolicyFactory, steps: list[tuple[int, int | None]]
) -> None:
    clock = FakeClock(1000)
    policy = factory(clock)
    last = policy.current_watermark()
    for advance, ts in steps:
        clock.now += advance
        wm = policy.current_watermark() if ts is None else policy.report_event(ts)
        assert wm >= last
        assert NO_WATERMARK <= wm <= MAX_TIMESTAMP
        last = wm
        assert policy.current_watermark() >= last


@given(events=st.lists(st.integers(min_value=-(10**12), max_value=10**12), min_size=1))
def test_fixed_lag_is_top_minus_lag(events: list[int]) -> None:
    policy = with_fixed_lag(42)
    for ts in events:
        policy.report_event(ts)
    assert policy.current_watermark() == max(events) - 42


@given(
    events=st.lists(st.integers(min_value=-(10**6), max_value=10**6), min_size=1),
    slide=st.integers(min_value=1, max_value=100),
    offset_seed=st.integers(min_value=0),
)
def test_throttle_by_frame_is_floor_of_raw(events: list[int], slide: int, offset_seed: int) -> None:
    wd = tumbling_window_def(slide).with_offset(offset_seed % slide)
    raw = with_fixed_lag(1)
    throttled = with_fixed_lag(1).throttle_by_frame(wd)
    for ts in events:
        assert throttled.report_event(ts) == wd.floor_frame_ts(raw.report_event(ts))


@given(
    events=st.lists(st.integers(min_value=-(10**6), max_value=10**6), min_size=1),
    step=st.integers(min_value=1, max_value=1000),
)
def test_throttle_by_min_step_properties(events: list[int], step: int) -> None:
    raw = with_fixed_lag(0)
    throttled = with_fixed_lag(0).throttle_by_min_step(step)
    emitted = []
    for ts in events:
        r = raw.report_event(ts)
        t = throttled.report_event(ts)
        assert t <= r and r - t < step  # never ahead, never a full step behind
        emitted.append(t)
    changes = [b - a for a, b in zip(emitted, emitted[1:], strict=False) if b != a]
    assert all(change >= step for change in changes)
