"""Sliding and tumbling window definitions and window result records.

A window definition splits the time axis into *frames* of ``frame_size`` (the slide
step) whose boundaries are ``frame_offset + k * frame_size``; a window is
``frames_per_window`` consecutive frames. Frames and windows are labelled by their
**exclusive end**: an event at ``t`` belongs to the frame ending at ``higher_frame_ts(t)``,
and window ``E`` covers ``[E - window_size, E)``. Keeping the size a whole number of
frames is what lets a window be assembled from (and, with ``deduct``, slid over)
per-frame accumulators.

Results are NamedTuples rather than classes: they pickle cheaply (snapshots, Spark),
compare by value in tests, and sort by ``(start, end, key, value)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK
from slipstream.core.validation import int_value

__all__ = [
    "KeyedWindowResult",
    "SessionWindowDef",
    "SlidingWindowDef",
    "WindowResult",
    "session_window_def",
    "sliding_window_def",
    "tumbling_window_def",
]


def _positive_int(name: str, value: Any) -> int:
    as_int = int_value(value)
    if as_int is None:
        raise ValueError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if as_int <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return as_int


@dataclass(frozen=True, slots=True)
class SlidingWindowDef:
    """A sliding window of ``window_size`` that advances by ``frame_size``.

    ``frame_offset`` (in ``[0, frame_size)``) shifts every boundary; a tumbling window is
    the special case ``window_size == frame_size``. Construct through
    :func:`sliding_window_def` / :func:`tumbling_window_def` in normal use.
    """

    frame_size: int
    frame_offset: int
    window_size: int

    def __post_init__(self) -> None:
        frame_size = _positive_int("frame_size (slide)", self.frame_size)
        window_size = _positive_int("window_size", self.window_size)
        frame_offset = int_value(self.frame_offset)
        if frame_offset is None:
            raise ValueError(
                f"frame_offset must be an int, got {self.frame_offset!r} "
                f"({type(self.frame_offset).__name__})"
            )
        if window_size % frame_size != 0:
            raise ValueError(
                f"window_size ({window_size}) must be a multiple of the slide / frame_size "
                f"({frame_size})"
            )
        if not 0 <= frame_offset < frame_size:
            raise ValueError(
                f"frame_offset must be in [0, frame_size={frame_size}), got {frame_offset}"
            )
        # Normalise int-like values (e.g. numpy integers) to plain ints.
        object.__setattr__(self, "frame_size", frame_size)
        object.__setattr__(self, "window_size", window_size)
        object.__setattr__(self, "frame_offset", frame_offset)

    @property
    def frames_per_window(self) -> int:
        """Number of frames in one window (``window_size // frame_size``)."""
        return self.window_size // self.frame_size

    @property
    def is_tumbling(self) -> bool:
        """True when windows do not overlap (one frame per window)."""
        return self.window_size == self.frame_size

    def floor_frame_ts(self, ts: int) -> int:
        """Largest frame boundary ``<= ts`` (clamped to ``NO_WATERMARK``).

        Same result as :func:`slipstream.core.time.floor_frame_ts`, inlined because window
        processors call it once per item and the arguments were validated already.
        """
        result = ts - (ts - self.frame_offset) % self.frame_size
        return result if result >= NO_WATERMARK else NO_WATERMARK

    def higher_frame_ts(self, ts: int) -> int:
        """Smallest frame boundary ``> ts`` (clamped to ``MAX_TIMESTAMP``): the frame label."""
        size = self.frame_size
        result = ts - (ts - self.frame_offset) % size + size
        if result > MAX_TIMESTAMP:
            return MAX_TIMESTAMP
        return result if result >= NO_WATERMARK else NO_WATERMARK

    def to_tumbling_by_frame(self) -> SlidingWindowDef:
        """The tumbling window of one frame (same frame size and offset).

        Stage 1 of a two-stage sliding aggregation accumulates with this definition.
        """
        return SlidingWindowDef(self.frame_size, self.frame_offset, self.frame_size)

    def with_offset(self, offset: int) -> SlidingWindowDef:
        """The same window shape with every boundary shifted by ``offset``."""
        return SlidingWindowDef(self.frame_size, offset, self.window_size)


def sliding_window_def(size: int, slide: int) -> SlidingWindowDef:
    """A window of ``size`` sliding by ``slide``; ``size`` must be a multiple of ``slide``."""
    slide = _positive_int("slide", slide)
    size = _positive_int("size", size)
    return SlidingWindowDef(frame_size=slide, frame_offset=0, window_size=size)


def tumbling_window_def(size: int) -> SlidingWindowDef:
    """Non-overlapping windows of ``size`` (a sliding window whose slide equals its size)."""
    size = _positive_int("size", size)
    return SlidingWindowDef(frame_size=size, frame_offset=0, window_size=size)


@dataclass(frozen=True, slots=True)
class SessionWindowDef:
    """Session windows: a key's session closes after ``timeout`` without its events.

    Used by the Pipeline API's ``window()``; the Core API passes ``session_timeout`` to
    ``P.aggregate_to_session_window`` directly.
    """

    timeout: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout", _positive_int("session timeout", self.timeout))


def session_window_def(timeout: int) -> SessionWindowDef:
    """Session windows closed by a gap of ``timeout`` (timestamp units) between events."""
    return SessionWindowDef(timeout)


class KeyedWindowResult(NamedTuple):
    """The result for one key in window ``[start, end)``."""

    start: int
    end: int
    key: Any
    value: Any


class WindowResult(NamedTuple):
    """The result of an unkeyed window ``[start, end)``."""

    start: int
    end: int
    value: Any
