"""Frame arithmetic of slipstream.core.time (docs/semantics.md §6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK, floor_frame_ts, higher_frame_ts

MIN = NO_WATERMARK
MAX = MAX_TIMESTAMP


def test_constants_are_java_long_extremes() -> None:
    assert NO_WATERMARK == -9223372036854775808
    assert MAX_TIMESTAMP == 9223372036854775807


@pytest.mark.parametrize(
    ("ts", "size", "offset", "expected"),
    [
        (0, 10, 0, 0),
        (9, 10, 0, 0),
        (10, 10, 0, 10),
        (11, 10, 0, 10),
        (-1, 10, 0, -10),
        (-10, 10, 0, -10),
        (-11, 10, 0, -20),
        # offset 3: boundaries ... -17, -7, 3, 13 ...
        (3, 10, 3, 3),
        (2, 10, 3, -7),
        (12, 10, 3, 3),
        (13, 10, 3, 13),
        (-7, 10, 3, -7),
        (-8, 10, 3, -17),
        (5, 1, 0, 5),
        (-5, 1, 0, -5),
    ],
)
def test_floor_frame_ts(ts: int, size: int, offset: int, expected: int) -> None:
    assert floor_frame_ts(ts, size, offset) == expected


@pytest.mark.parametrize(
    ("ts", "size", "offset", "expected"),
    [
        (0, 10, 0, 10),
        (9, 10, 0, 10),
        (10, 10, 0, 20),
        (-1, 10, 0, 0),
        (-10, 10, 0, 0),
        (-11, 10, 0, -10),
        (2, 10, 3, 3),
        (3, 10, 3, 13),
        (-8, 10, 3, -7),
        (-7, 10, 3, 3),
        (5, 1, 0, 6),
    ],
)
def test_higher_frame_ts(ts: int, size: int, offset: int, expected: int) -> None:
    assert higher_frame_ts(ts, size, offset) == expected


def test_floor_clamps_to_no_watermark() -> None:
    # MIN = -922337203685477581 * 10 + 2, so the boundary below MIN is MIN - 2.
    assert floor_frame_ts(MIN, 10) == MIN
    assert floor_frame_ts(MIN + 1, 10) == MIN
    assert floor_frame_ts(MIN + 7, 10) == MIN
    assert floor_frame_ts(MIN + 8, 10) == MIN + 8  # the first boundary in range
    assert floor_frame_ts(MIN, 1) == MIN
    assert floor_frame_ts(MIN, 10, 3) == MIN


def test_higher_near_min_uses_the_true_grid() -> None:
    # Not clamped-floor + size (MIN + 10): the real next boundary is MIN - 2 + 10.
    assert higher_frame_ts(MIN, 10) == MIN + 8
    assert higher_frame_ts(MIN + 8, 10) == MIN + 18


def test_higher_clamps_to_max_timestamp() -> None:
    # MAX = ...07, so the floor of MAX is MAX - 7 and the next boundary overflows.
    assert floor_frame_ts(MAX, 10) == MAX - 7
    assert higher_frame_ts(MAX, 10) == MAX
    assert higher_frame_ts(MAX - 7, 10) == MAX
    assert higher_frame_ts(MAX - 8, 10) == MAX - 7
    assert higher_frame_ts(MAX - 1, 1) == MAX
    assert higher_frame_ts(MAX, 1) == MAX


def test_invalid_frame_arguments() -> None:
    with pytest.raises(ValueError, match="frame_size"):
        floor_frame_ts(5, 0)
    with pytest.raises(ValueError, match="frame_size"):
        higher_frame_ts(5, -10)
    with pytest.raises(ValueError, match="frame_offset"):
        floor_frame_ts(5, 10, 10)
    with pytest.raises(ValueError, match="frame_offset"):
        higher_frame_ts(5, 10, -1)


frames = st.integers(min_value=1, max_value=10**6).flatmap(
    lambda size: st.tuples(st.just(size), st.integers(min_value=0, max_value=size - 1))
)
timestamps = st.integers(min_value=MIN, max_value=MAX)


@given(ts=timestamps, frame=frames)
def test_floor_is_largest_boundary_at_or_below(ts: int, frame: tuple[int, int]) -> None:
    size, offset = frame
    floor = floor_frame_ts(ts, size, offset)
    assert MIN <= floor <= ts
    if floor != MIN or (MIN - offset) % size == 0:
        assert (floor - offset) % size == 0
        assert ts - floor < size
    else:
        # Clamped: the true boundary lies below the 64-bit range.
        assert ts - (ts - offset) % size < MIN


@given(ts=timestamps, frame=frames)
def test_higher_is_smallest_boundary_above(ts: int, frame: tuple[int, int]) -> None:
    size, offset = frame
    higher = higher_frame_ts(ts, size, offset)
    true_higher = ts - (ts - offset) % size + size
    if true_higher > MAX:
        assert higher == MAX
    else:
        assert higher == true_higher
        assert ts < higher <= ts + size
        assert (higher - offset) % size == 0
        # The frame of ts is labelled by its end, and that end is its own floor.
        assert floor_frame_ts(higher, size, offset) == higher


@given(a=timestamps, b=timestamps, frame=frames)
def test_floor_and_higher_are_monotonic(a: int, b: int, frame: tuple[int, int]) -> None:
    size, offset = frame
    lo, hi = min(a, b), max(a, b)
    assert floor_frame_ts(lo, size, offset) <= floor_frame_ts(hi, size, offset)
    assert higher_frame_ts(lo, size, offset) <= higher_frame_ts(hi, size, offset)
