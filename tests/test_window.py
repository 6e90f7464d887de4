"""Window definitions and window results (docs/semantics.md §6)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK, floor_frame_ts, higher_frame_ts
from slipstream.window import (
    KeyedWindowResult,
    SlidingWindowDef,
    WindowResult,
    sliding_window_def,
    tumbling_window_def,
)


def test_sliding_window_def_shape() -> None:
    wd = sliding_window_def(10, 2)
    assert (wd.frame_size, wd.frame_offset, wd.window_size) == (2, 0, 10)
    assert wd.frames_per_window == 5
    assert not wd.is_tumbling


def test_tumbling_window_def_shape() -> None:
    wd = tumbling_window_def(5)
    assert (wd.frame_size, wd.frame_offset, wd.window_size) == (5, 0, 5)
    assert wd.frames_per_window == 1
    assert wd.is_tumbling
    assert sliding_window_def(5, 5) == wd


def test_to_tumbling_by_frame_keeps_frame_and_offset() -> None:
    wd = sliding_window_def(12, 4).with_offset(1)
    tumbling = wd.to_tumbling_by_frame()
    assert tumbling == SlidingWindowDef(frame_size=4, frame_offset=1, window_size=4)
    assert tumbling.is_tumbling


def test_with_offset_shifts_boundaries() -> None:
    wd = sliding_window_def(30, 10).with_offset(3)
    assert wd.frame_offset == 3
    assert wd.window_size == 30
    assert wd.floor_frame_ts(12) == 3
    assert wd.floor_frame_ts(13) == 13
    assert wd.floor_frame_ts(2) == -7
    assert wd.higher_frame_ts(2) == 3
    assert wd.higher_frame_ts(3) == 13
    assert wd.higher_frame_ts(-8) == -7
    assert wd.with_offset(0) == sliding_window_def(30, 10)


def test_frame_labelling_examples() -> None:
    wd = sliding_window_def(4, 2)
    # An event at t belongs to the frame labelled by its end.
    assert [wd.higher_frame_ts(t) for t in (-3, -2, -1, 0, 1, 2, 3)] == [-2, 0, 0, 2, 2, 4, 4]
    assert [wd.floor_frame_ts(t) for t in (-3, -2, -1, 0, 1, 2, 3)] == [-4, -2, -2, 0, 0, 2, 2]


def test_frame_clamping() -> None:
    wd = tumbling_window_def(10)
    assert wd.floor_frame_ts(NO_WATERMARK) == NO_WATERMARK
    assert wd.higher_frame_ts(NO_WATERMARK) == NO_WATERMARK + 8
    assert wd.higher_frame_ts(MAX_TIMESTAMP) == MAX_TIMESTAMP


@pytest.mark.parametrize(
    ("size", "slide", "message"),
    [
        (10, 3, "multiple"),
        (2, 4, "multiple"),
        (0, 1, "size must be a positive int"),
        (-10, 5, "size must be a positive int"),
        (10, 0, "slide must be a positive int"),
        (10, -2, "slide must be a positive int"),
        (10.0, 2, "size must be a positive int"),
        (10, 2.5, "slide must be a positive int"),
        (True, 1, "size must be a positive int"),
        ("10", 2, "size must be a positive int"),
    ],
)
def test_sliding_window_def_validation(size: object, slide: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sliding_window_def(size, slide)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, 1.5, None, False])
def test_tumbling_window_def_validation(size: object) -> None:
    with pytest.raises(ValueError, match="size must be a positive int"):
        tumbling_window_def(size)  # type: ignore[arg-type]


@pytest.mark.parametrize("offset", [-1, 2, 5, 1.0, True])
def test_offset_validation(offset: object) -> None:
    with pytest.raises(ValueError, match="frame_offset"):
        sliding_window_def(10, 2).with_offset(offset)  # type: ignore[arg-type]


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValueError, match="multiple"):
        SlidingWindowDef(frame_size=3, frame_offset=0, window_size=10)
    with pytest.raises(ValueError, match="frame_offset"):
        SlidingWindowDef(frame_size=3, frame_offset=3, window_size=9)
    with pytest.raises(ValueError, match="window_size"):
        SlidingWindowDef(frame_size=3, frame_offset=0, window_size=0)


def test_window_def_is_frozen_hashable_and_picklable() -> None:
    wd = sliding_window_def(10, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wd.frame_size = 3  # type: ignore[misc]
    assert hash(wd) == hash(sliding_window_def(10, 2))
    assert pickle.loads(pickle.dumps(wd)) == wd
    assert not hasattr(wd, "__dict__")


def test_int_like_values_are_normalised() -> None:
    class IntLike:
        def __index__(self) -> int:
            return 4

    wd = tumbling_window_def(IntLike())  # type: ignore[arg-type]
    assert wd.frame_size == 4 and type(wd.frame_size) is int


frames = st.integers(min_value=1, max_value=1000).flatmap(
    lambda slide: st.tuples(
        st.just(slide),
        st.integers(min_value=0, max_value=slide - 1),
        st.integers(min_value=1, max_value=20),
    )
)


@given(ts=st.integers(min_value=NO_WATERMARK, max_value=MAX_TIMESTAMP), frame=frames)
def test_window_def_matches_core_frame_functions(ts: int, frame: tuple[int, int, int]) -> None:
    slide, offset, per_window = frame
    wd = sliding_window_def(slide * per_window, slide).with_offset(offset)
    assert wd.floor_frame_ts(ts) == floor_frame_ts(ts, slide, offset)
    assert wd.higher_frame_ts(ts) == higher_frame_ts(ts, slide, offset)
    assert wd.frames_per_window == per_window


def test_keyed_window_result() -> None:
    r = KeyedWindowResult(start=0, end=10, key="a", value=3)
    assert (r.start, r.end, r.key, r.value) == (0, 10, "a", 3)
    assert isinstance(r, tuple) and tuple(r) == (0, 10, "a", 3)
    assert r == KeyedWindowResult(0, 10, "a", 3)
    assert pickle.loads(pickle.dumps(r)) == r
    unsorted = [
        KeyedWindowResult(10, 20, "a", 1),
        KeyedWindowResult(0, 10, "b", 2),
        KeyedWindowResult(0, 10, "a", 5),
    ]
    assert sorted(unsorted) == [
        KeyedWindowResult(0, 10, "a", 5),
        KeyedWindowResult(0, 10, "b", 2),
        KeyedWindowResult(10, 20, "a", 1),
    ]


def test_window_result() -> None:
    r = WindowResult(start=-5, end=5, value=[1, 2])
    assert r.value == [1, 2]
    assert tuple(r) == (-5, 5, [1, 2])
    assert pickle.loads(pickle.dumps(r)) == r
    assert sorted([WindowResult(5, 15, 0), WindowResult(-5, 5, 9)])[0].start == -5
