"""Time constants and frame arithmetic shared by watermarks and windows.

Timestamps are plain Python ints. Python ints never overflow, but Jet's timestamps are
Java ``long`` values, and several parts of the model use the two extremes of that range
as sentinels: ``NO_WATERMARK`` (``Long.MIN_VALUE``, "no watermark yet", also the value
every policy starts from) and ``MAX_TIMESTAMP`` (``Long.MAX_VALUE``, which the
coalescer uses for the IDLE message). The frame functions below therefore clamp their
results into ``[NO_WATERMARK, MAX_TIMESTAMP]`` exactly where Jet clamps on overflow, so
that a sentinel never turns into an ordinary-looking timestamp and a result never
escapes the 64-bit range that snapshots and other engines may rely on.

Frame boundaries are the values ``frame_offset + k * frame_size`` for every integer
``k``. Python's ``%`` is a floor modulo (its result has the sign of the divisor), which is
the arithmetic Jet gets from ``Math.floorMod``; it gives the right answer for negative
timestamps without special cases.
"""

from __future__ import annotations

__all__ = ["MAX_TIMESTAMP", "NO_WATERMARK", "floor_frame_ts", "higher_frame_ts"]

NO_WATERMARK: int = -(2**63)
"""Jet's ``Long.MIN_VALUE``: no watermark is known yet (acts as minus infinity)."""

MAX_TIMESTAMP: int = 2**63 - 1
"""Jet's ``Long.MAX_VALUE``: the largest representable timestamp (acts as plus infinity)."""


def _check_frame(frame_size: int, frame_offset: int) -> None:
    # Cheap guard: a non-positive frame size would silently give nonsense boundaries.
    if frame_size <= 0:
        raise ValueError(f"frame_size must be a positive int, got {frame_size!r}")
    if not 0 <= frame_offset < frame_size:
        raise ValueError(
            f"frame_offset must be in [0, frame_size={frame_size}), got {frame_offset!r}"
        )


def floor_frame_ts(ts: int, frame_size: int, frame_offset: int = 0) -> int:
    """Return the largest frame boundary ``<= ts``.

    The result is clamped to ``NO_WATERMARK`` when the true boundary lies below the 64-bit
    range; in particular ``floor_frame_ts(NO_WATERMARK, ...)`` is ``NO_WATERMARK``, so
    "no watermark" survives throttling by frame.
    """
    _check_frame(frame_size, frame_offset)
    result = ts - (ts - frame_offset) % frame_size
    if result < NO_WATERMARK:
        return NO_WATERMARK
    if result > MAX_TIMESTAMP:
        return MAX_TIMESTAMP
    return result


def higher_frame_ts(ts: int, frame_size: int, frame_offset: int = 0) -> int:
    """Return the smallest frame boundary ``> ts``: the end (label) of the frame of ``ts``.

    Equal to ``floor_frame_ts(ts + frame_size)``; clamped to ``MAX_TIMESTAMP`` when the
    true boundary lies above the 64-bit range (and to ``NO_WATERMARK`` for inputs so far
    below it that even the next boundary does not reach it).
    """
    _check_frame(frame_size, frame_offset)
    # Computed from the unclamped floor: for ts near NO_WATERMARK the clamped floor would
    # be off the boundary grid and adding frame_size to it would give a wrong boundary.
    result = ts - (ts - frame_offset) % frame_size + frame_size
    if result > MAX_TIMESTAMP:
        return MAX_TIMESTAMP
    if result < NO_WATERMARK:
        return NO_WATERMARK
    return result
