"""Watermark policies: how a source turns event timestamps into watermarks.

A policy follows ONE substream (e.g. one source partition). ``report_event(ts)`` records
an event's timestamp and returns the current watermark; ``current_watermark()`` returns
it without an event, which lets time-based policies move the watermark forward during
a lull. The watermark of a policy never decreases and is ``NO_WATERMARK`` until the policy
knows anything.

The four policies and the two throttling decorators follow Hazelcast Jet's
punctuation-era API (docs/semantics.md §4). Time-based policies
take an injectable ``clock`` (a zero-argument callable returning milliseconds as an int)
so that tests can drive time by hand.

Throttling exists because emitting a watermark per event is expensive downstream. Note
that ``throttle_by_frame`` rounds the watermark *down* to a frame boundary, so the value
actually emitted is lower than the raw one and lateness is judged against it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from slipstream.core.items import IDLE_MESSAGE as IDLE
from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK
from slipstream.core.validation import int_value
from slipstream.window import SlidingWindowDef

__all__ = [
    "IDLE",
    "MAX_TIMESTAMP",
    "NO_WATERMARK",
    "TimestampHistory",
    "WatermarkPolicy",
    "limiting_lag_and_delay",
    "limiting_lag_and_lull",
    "limiting_timestamp_and_wall_clock_lag",
    "with_fixed_lag",
]

Clock = Callable[[], int]


def monotonic_millis() -> int:
    """Default clock of the delay and lull policies: a monotonic clock in milliseconds."""
    return time.monotonic_ns() // 1_000_000


def wall_clock_millis() -> int:
    """Default clock of the wall-clock policy: epoch milliseconds."""
    return time.time_ns() // 1_000_000


def _int_arg(name: str, value: Any, *, minimum: int) -> int:
    """Validate an int argument ``>= minimum`` with an error that names it."""
    as_int = int_value(value)
    if as_int is None:
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if as_int < minimum:
        bound = "non-negative" if minimum == 0 else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {as_int}")
    return as_int


class WatermarkPolicy(ABC):
    """Tracks one substream's event timestamps and derives its watermark."""

    __slots__ = ()

    @abstractmethod
    def report_event(self, ts: int) -> int:
        """Record an event with timestamp ``ts``; return the current watermark."""

    @abstractmethod
    def current_watermark(self) -> int:
        """Return the current watermark (``NO_WATERMARK`` while nothing is known)."""

    def throttle_by_min_step(self, min_step: int) -> WatermarkPolicy:
        """A new policy that only lets the watermark change in steps of ``>= min_step``."""
        return _ThrottleByMinStep(self, min_step)

    def report_threshold(self) -> int:
        """Events with a timestamp below this cannot change what ``report_event`` or
        ``current_watermark`` return, now or later, so a caller may skip reporting them
        (the fast path of ``insert_watermarks``). ``NO_WATERMARK`` (the default) means
        every event must be reported, as for policies whose state moves with each event
        or with the clock. A policy that has a threshold must keep it above every
        timestamp it was given: an event at or below one already reported cannot move
        it either (``insert_watermarks`` reports only new maxima)."""
        return NO_WATERMARK

    def timestamp_for(self, watermark: int) -> int | None:
        """The smallest event timestamp whose report makes the watermark at least
        ``watermark``, if the policy can tell (``None``: it cannot). Throttles use it to
        skip events that cannot reach their next step."""
        return None

    def watermark_after(self, top: int) -> int | None:
        """The watermark after reporting events up to ``top`` (their highest timestamp),
        without changing the policy, for policies whose watermark depends on the highest
        timestamp alone (``None``: it depends on more). Lets ``insert_watermarks`` handle
        a chunk with one report of its maximum."""
        return None

    def lag_bound(self) -> int | None:
        """An ``L >= 0`` such that, for a policy with :meth:`watermark_after`, the
        watermark after events whose highest timestamp is ``top`` never exceeds the
        larger of ``top - L`` and the current watermark (``None``: no such bound). An
        event at least ``top - L`` for every ``top`` before it can then not be behind
        any watermark that the events before it produce, which ``insert_watermarks``
        checks for a whole chunk at C speed."""
        return None

    def throttle_by_frame(self, window_def: SlidingWindowDef) -> WatermarkPolicy:
        """A new policy whose watermark is this one floored to ``window_def``'s frames."""
        return _ThrottleByFrame(self, window_def)


class _FixedLag(WatermarkPolicy):
    __slots__ = ("_lag", "_wm")

    def __init__(self, lag: int) -> None:
        self._lag = _int_arg("lag", lag, minimum=0)
        self._wm = NO_WATERMARK

    def report_event(self, ts: int) -> int:
        candidate = ts - self._lag
        # A candidate below NO_WATERMARK would be an underflow in Jet: ignore it.
        if candidate > self._wm:
            self._wm = candidate
        return self._wm

    def current_watermark(self) -> int:
        return self._wm

    def report_threshold(self) -> int:
        # ts - lag > wm  <=>  ts > wm + lag
        return self._wm + self._lag + 1

    def timestamp_for(self, watermark: int) -> int | None:
        return watermark + self._lag

    def watermark_after(self, top: int) -> int | None:
        candidate = top - self._lag
        return candidate if candidate > self._wm else self._wm

    def lag_bound(self) -> int | None:
        return self._lag

    def __repr__(self) -> str:
        return f"with_fixed_lag({self._lag})"


def with_fixed_lag(lag: int) -> WatermarkPolicy:
    """Watermark = highest timestamp seen minus ``lag``.

    Items more than ``lag`` behind the top timestamp are late. The watermark stands still
    while no events arrive, so it suits streams that never pause.
    """
    return _FixedLag(lag)


class TimestampHistory:
    """Remembers what a value was roughly ``max_delay`` ago, in ``n + 1`` slots.

    A ring of ``n + 1`` samples, one per ``interval = max_delay // n`` time units. Each
    :meth:`sample` first advances the ring to ``now`` (every new slot starts as a copy of
    the previous newest one), stores ``value`` in the newest slot and returns the oldest
    slot. The oldest slot holds the last value sampled before a point in time between
    ``max_delay`` and ``max_delay - interval`` ago: every value sampled at least
    ``max_delay`` ago is reflected, none sampled less than ``max_delay - interval`` ago
    is. Memory stays bounded however often it is called. The answer is ``NO_WATERMARK``
    until sampling has covered ``max_delay``.
    """

    __slots__ = ("_advance_at", "_interval", "_slots", "_tail")

    def __init__(self, max_delay: int, n: int = 16) -> None:
        n = _int_arg("n (number of stored samples)", n, minimum=1)
        max_delay = _int_arg("max_delay", max_delay, minimum=0)
        interval = max_delay // n
        if interval < 1:
            raise ValueError(
                f"max_delay ({max_delay}) must be >= n ({n}) so that the sampling "
                f"interval max_delay // n is at least 1"
            )
        self._interval = interval
        self._slots = [NO_WATERMARK] * (n + 1)
        self._tail = 0
        self._advance_at = NO_WATERMARK

    def sample(self, now: int, value: int) -> int:
        """Store ``value`` as of time ``now``; return the value of ``max_delay`` ago."""
        slots = self._slots
        size = len(slots)
        tail = self._tail
        steps = 0
        while self._advance_at <= now and steps < size:
            previous = slots[tail]
            tail = tail + 1 if tail + 1 < size else 0
            slots[tail] = previous
            self._advance_at += self._interval
            steps += 1
        if steps == size:
            # A gap longer than the whole ring: restart the schedule from now.
            self._advance_at = now + self._interval
        self._tail = tail
        slots[tail] = value
        return slots[tail + 1 if tail + 1 < size else 0]


class _LagAndDelay(WatermarkPolicy):
    __slots__ = ("_clock", "_history", "_lag", "_max_delay", "_top_ts", "_wm")

    def __init__(self, lag: int, max_delay_ms: int, clock: Clock) -> None:
        self._lag = _int_arg("lag", lag, minimum=0)
        self._max_delay = _int_arg("max_delay_ms", max_delay_ms, minimum=1)
        self._clock = clock
        # Jet samples 16 times per max_delay on a nanosecond clock; with a millisecond
        # clock a delay below 16 ms gets one sample per millisecond instead.
        self._history = TimestampHistory(self._max_delay, min(16, self._max_delay))
        self._top_ts = NO_WATERMARK
        self._wm = NO_WATERMARK

    def report_event(self, ts: int) -> int:
        if ts > self._top_ts:
            self._top_ts = ts
        wm = self._wm
        candidate = ts - self._lag
        if candidate > wm:  # also ignores an underflowing candidate
            wm = candidate
        delayed = self._history.sample(self._clock(), self._top_ts)
        if delayed > wm:
            wm = delayed
        self._wm = wm
        return wm

    def current_watermark(self) -> int:
        delayed = self._history.sample(self._clock(), self._top_ts)
        if delayed > self._wm:
            self._wm = delayed
        return self._wm

    def __repr__(self) -> str:
        return f"limiting_lag_and_delay({self._lag}, {self._max_delay})"


def limiting_lag_and_delay(
    lag: int, max_delay_ms: int, *, clock: Clock | None = None
) -> WatermarkPolicy:
    """Watermark lags the top timestamp by at most ``lag`` and catches up with any top
    timestamp at most ``max_delay_ms`` (of ``clock`` time) after it was observed.

    Unlike :func:`with_fixed_lag` the watermark keeps moving after the stream pauses, up
    to the highest timestamp seen, so the last windows get emitted. ``clock`` defaults to
    a monotonic millisecond clock.
    """
    return _LagAndDelay(lag, max_delay_ms, clock if clock is not None else monotonic_millis)


class _LagAndLull(WatermarkPolicy):
    __slots__ = ("_clock", "_lag", "_max_lull", "_max_lull_at", "_seen_event", "_wm")

    def __init__(self, lag: int, max_lull_ms: int, clock: Clock) -> None:
        self._lag = _int_arg("lag", lag, minimum=0)
        self._max_lull = _int_arg("max_lull_ms", max_lull_ms, minimum=0)
        self._clock = clock
        self._wm = NO_WATERMARK
        self._max_lull_at = 0
        self._seen_event = False

    def report_event(self, ts: int) -> int:
        self._max_lull_at = self._clock() + self._max_lull
        self._seen_event = True
        candidate = ts - self._lag
        if candidate > self._wm:  # also ignores an underflowing candidate
            self._wm = candidate
        return self._wm

    def current_watermark(self) -> int:
        # Deliberate difference from Jet: before the first event Jet would start advancing
        # from Long.MIN_VALUE, emitting meaningless huge negative watermarks; here the
        # watermark stays NO_WATERMARK until an event gives it a base (idle detection is
        # the tool for substreams that never see events).
        if not self._seen_event:
            return NO_WATERMARK
        past = self._clock() - self._max_lull_at
        if past > 0:
            self._max_lull_at += past
            wm = self._wm + past
            self._wm = wm if wm < MAX_TIMESTAMP else MAX_TIMESTAMP
        return self._wm

    def __repr__(self) -> str:
        return f"limiting_lag_and_lull({self._lag}, {self._max_lull})"


def limiting_lag_and_lull(
    lag: int, max_lull_ms: int, *, clock: Clock | None = None
) -> WatermarkPolicy:
    """Like :func:`with_fixed_lag`, but after ``max_lull_ms`` without events the
    watermark advances one-for-one with ``clock`` (a monotonic millisecond clock by
    default) until the next event.

    Stays ``NO_WATERMARK`` until the first event.
    """
    return _LagAndLull(lag, max_lull_ms, clock if clock is not None else monotonic_millis)


class _TimestampAndWallClockLag(WatermarkPolicy):
    __slots__ = ("_clock", "_lag", "_wall_lag", "_wm")

    def __init__(self, lag: int, wall_lag: int, clock: Clock) -> None:
        self._lag = _int_arg("lag", lag, minimum=0)
        self._wall_lag = _int_arg("max_delay_ms", wall_lag, minimum=0)
        self._clock = clock
        self._wm = NO_WATERMARK

    def _from_wall_clock(self) -> int:
        candidate = self._clock() - self._wall_lag
        if candidate > self._wm:
            self._wm = candidate
        return self._wm

    def report_event(self, ts: int) -> int:
        wm = self._from_wall_clock()
        candidate = ts - self._lag
        if candidate > wm:
            self._wm = wm = candidate
        return wm

    def current_watermark(self) -> int:
        return self._from_wall_clock()

    def __repr__(self) -> str:
        return f"limiting_timestamp_and_wall_clock_lag({self._lag}, {self._wall_lag})"


def limiting_timestamp_and_wall_clock_lag(
    lag: int, max_delay_ms: int, *, clock: Clock | None = None
) -> WatermarkPolicy:
    """Watermark = max(top timestamp - ``lag``, wall clock - ``max_delay_ms``).

    For timestamps in epoch milliseconds: the watermark moves with the wall clock even on
    a substream that never sees an event, at the cost of depending on the clocks being
    in sync (a clock jump moves the watermark). ``clock`` defaults to epoch milliseconds.
    """
    return _TimestampAndWallClockLag(
        lag, max_delay_ms, clock if clock is not None else wall_clock_millis
    )


class _ThrottleByMinStep(WatermarkPolicy):
    """Holds the watermark until the raw one is at least ``min_step`` past the last one
    handed out, so a slowly creeping watermark is emitted in coarse steps."""

    __slots__ = ("_curr", "_min_step", "_next", "_wrapped")

    def __init__(self, wrapped: WatermarkPolicy, min_step: int) -> None:
        self._wrapped = wrapped
        self._min_step = _int_arg("min_step", min_step, minimum=1)
        self._curr = NO_WATERMARK
        self._next = NO_WATERMARK

    def _throttle(self, raw: int) -> int:
        if raw < self._next:
            return self._curr
        self._curr = raw
        self._next = raw + self._min_step
        return raw

    def report_event(self, ts: int) -> int:
        return self._throttle(self._wrapped.report_event(ts))

    def current_watermark(self) -> int:
        return self._throttle(self._wrapped.current_watermark())

    def report_threshold(self) -> int:
        # the output moves only once the raw watermark reaches _next; for a max-based
        # inner policy skipped events below that leave every later output unchanged
        if self._curr != NO_WATERMARK:
            t = self._wrapped.timestamp_for(self._next)
            if t is not None:
                return max(t, self._wrapped.report_threshold())
        return self._wrapped.report_threshold()

    def timestamp_for(self, watermark: int) -> int | None:
        return self._wrapped.timestamp_for(max(watermark, self._next))

    def __repr__(self) -> str:
        return f"{self._wrapped!r}.throttle_by_min_step({self._min_step})"


class _ThrottleByFrame(WatermarkPolicy):
    """Floors the watermark to a frame boundary: windows only change state at frame
    boundaries, so watermarks in between carry no news for them."""

    __slots__ = ("_last_raw", "_last_throttled", "_window_def", "_wrapped")

    def __init__(self, wrapped: WatermarkPolicy, window_def: SlidingWindowDef) -> None:
        if not isinstance(window_def, SlidingWindowDef):
            raise ValueError(f"throttle_by_frame needs a SlidingWindowDef, got {window_def!r}")
        self._wrapped = wrapped
        self._window_def = window_def
        self._last_raw = NO_WATERMARK
        self._last_throttled = NO_WATERMARK

    def _throttle(self, raw: int) -> int:
        if raw != self._last_raw:
            self._last_raw = raw
            # floor_frame_ts clamps, so NO_WATERMARK stays NO_WATERMARK.
            self._last_throttled = self._window_def.floor_frame_ts(raw)
        return self._last_throttled

    def report_event(self, ts: int) -> int:
        return self._throttle(self._wrapped.report_event(ts))

    def current_watermark(self) -> int:
        return self._throttle(self._wrapped.current_watermark())

    def report_threshold(self) -> int:
        # the output moves only when the raw watermark reaches the next frame boundary
        if self._last_throttled != NO_WATERMARK:
            t = self._wrapped.timestamp_for(self._last_throttled + self._window_def.frame_size)
            if t is not None:
                return max(t, self._wrapped.report_threshold())
        return self._wrapped.report_threshold()

    def timestamp_for(self, watermark: int) -> int | None:
        boundary = self._window_def.floor_frame_ts(watermark)
        if boundary < watermark:
            boundary += self._window_def.frame_size
        return self._wrapped.timestamp_for(boundary)

    def watermark_after(self, top: int) -> int | None:
        raw = self._wrapped.watermark_after(top)
        return None if raw is None else self._window_def.floor_frame_ts(raw)

    def lag_bound(self) -> int | None:
        # flooring only lowers the watermark
        return self._wrapped.lag_bound()

    def __repr__(self) -> str:
        return f"{self._wrapped!r}.throttle_by_frame({self._window_def!r})"
