"""Per-partition event time inside one source processor (Jet's ``EventTimeMapper``,
docs/semantics.md §4).

A source processor that reads several external partitions (Kafka partitions, shards,
files) must not run ONE watermark policy over their merged stream: after a restart, or
whenever one partition is read ahead of another, the partition read first would push the
watermark past the events the other partition still holds, and they would all be late.
:class:`EventTimeMapper` keeps **one policy per partition** and coalesces them inside
the processor:

* the processor's watermark is the **minimum** of its partitions' watermarks, emitted
  only when it rises above the last one emitted (in front of the event that raised it);
* a partition with no event for ``idle_timeout_ms`` is **idle** and left out of the
  minimum; when every partition is idle, the top watermark observed is emitted once and
  then the idle mark (:data:`slipstream.watermark.IDLE`), so downstream coalescers leave
  the whole processor out until it emits again. A processor with no partition at all is
  idle at once;
* partitions can be **added while running** (a new partition is active and holds the
  minimum back until it has events or goes idle) and removed;
* an event's time is ``timestamp_fn(item)``, or the **native timestamp** the source got
  with the record (Kafka's record timestamp) when there is no ``timestamp_fn``;
* the per-partition watermarks go into snapshots; after a restore the processor never
  emits a watermark at or below the minimum restored one.

Throttling is the policy's business: pass a factory of throttled policies
(``lambda: with_fixed_lag(100).throttle_by_frame(window)``). Flooring each partition's
watermark and then taking the minimum gives the floor of the minimum, so it is the same
as throttling the processor's watermark.

Differences from Jet (docs/streaming.md, "Deliberate differences from Jet"): the
watermark is not capped at the timestamp of the event that advanced it (Jet 4.x caps it,
0.7 did not), and idleness and policies use an injectable millisecond ``clock``.

Usage in a source processor's ``complete()`` (a sketch; ``poll()`` returns
``(partition_index, record)`` pairs, each record with ``.value`` and ``.timestamp``)::

    def init_processor(self, context):
        self.mapper = EventTimeMapper(lambda: with_fixed_lag(2000), idle_timeout_ms=30_000)
        self.mapper.add_partitions(len(self.my_partitions))
        self.pending = iter(())

    def complete(self):
        if not self.emit_from(self.pending):
            return False
        records = self.poll()
        if records:
            self.pending = (out for p, r in records
                            for out in self.mapper.flat_map_event(r.value, p, r.timestamp))
        else:
            self.pending = iter(self.mapper.flat_map_idle())
        return False

    def save_to_snapshot(self):   # offsets and watermarks under each partition's own key
        return self.save_state(lambda: (
            (BroadcastKey(("part", pid)), (self.offsets[i], self.mapper.watermark(i)))
            for i, pid in enumerate(self.my_partitions)))

    def restore_from_snapshot_entry(self, key, value):   # every processor gets every entry
        i = self.index_of.get(key.name[1])
        if i is not None:
            self.offsets[i] = value[0]
            self.mapper.restore_watermark(i, value[1])

A real source should also update its offsets only after the event went out (``emit_from``
keeps a refused item and offers it again first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slipstream.core.describe import short_repr
from slipstream.core.items import IDLE_MESSAGE, Watermark
from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK
from slipstream.core.validation import int_value, timestamp_advice, timestamp_out_of_range

__all__ = ["DEFAULT_IDLE_TIMEOUT_MS", "EventTimeMapper", "checked_timestamp"]

DEFAULT_IDLE_TIMEOUT_MS = 60_000
"""Jet's default: a partition with no event for a minute no longer holds the watermark
back. Short timeouts make events of a partition that was idle for a moment late when it
speaks again (the others moved the watermark on meanwhile); long ones delay results when a
partition really is quiet."""

Clock = Callable[[], int]


def _monotonic_millis() -> int:
    return time.monotonic_ns() // 1_000_000


_NO_ITEM: Any = object()


def _threshold(policy: Any) -> int:
    """``policy.report_threshold()``; ``NO_WATERMARK`` (every event reported) for a
    policy without one (policies need only ``report_event`` and ``current_watermark``)."""
    fn = getattr(policy, "report_threshold", None)
    return NO_WATERMARK if fn is None else fn()


#: ``EventTimeMapper._fast_until`` values: no clock time is before the first, every
#: one is before the second
_NO_FAST_PATH = NO_WATERMARK
_ALWAYS = 1 << 64


def checked_timestamp(ts: Any, where: str, item: Any = _NO_ITEM) -> int:
    """``ts`` as an int timestamp: integer-like values (numpy integers) convert; one that
    is not an integer (``TypeError``) or lies outside the 64-bit range (``ValueError``)
    fails naming ``where`` and, when given, ``item``. The caller's hot path calls this
    only when ``type(ts) is not int`` or the value is out of range."""
    v = int_value(ts)
    if v is None:
        of = "" if item is _NO_ITEM else f" of item {short_repr(item)}"
        raise TypeError(
            f"{where}: bad timestamp {short_repr(ts)}{of}: not an integer (timestamps are "
            f"int milliseconds){timestamp_advice(ts, '')}"
        )
    if not NO_WATERMARK <= v <= MAX_TIMESTAMP:
        if item is _NO_ITEM:
            raise ValueError(
                f"{where}: timestamp {v} is outside the range of timestamps "
                "(64-bit: -2**63 .. 2**63 - 1)"
            )
        raise timestamp_out_of_range(where, item, v, "")
    return v


class EventTimeMapper:
    """One watermark policy per source partition, coalesced within the processor.

    ``policy_factory`` is a zero-argument callable returning a new policy (one per
    partition). ``timestamp_fn(item)`` gives an event's timestamp; without it every event
    must come with a native timestamp. ``idle_timeout_ms``: ``None`` (or 0) never marks
    a partition idle. ``clock``: milliseconds, monotonic by default; the policies take
    their own clocks. Partitions are numbered ``0 .. partition_count - 1`` in the order
    they were added.

    Every method returns what to emit, in order: ``Watermark`` objects, the item, and
    the idle mark :data:`~slipstream.watermark.IDLE`. Emit all of it before calling
    again (a refused item must be offered again first, e.g. with ``emit_from``).
    """

    __slots__ = (
        "_policy_factory",
        "_timestamp_fn",
        "_idle_timeout",
        "_clock",
        "_policies",
        "_wms",
        "_idle_at",
        "_last_emitted",
        "_top_observed",
        "_all_idle",
        "_thresholds",
        "_fast_until",
    )

    def __init__(
        self,
        policy_factory: Callable[[], Any],
        *,
        timestamp_fn: Callable[[Any], int] | None = None,
        idle_timeout_ms: int | None = DEFAULT_IDLE_TIMEOUT_MS,
        clock: Clock | None = None,
    ) -> None:
        if not callable(policy_factory) or callable(getattr(policy_factory, "report_event", None)):
            raise TypeError(
                "EventTimeMapper: policy_factory must be a zero-argument callable returning a "
                f"new watermark policy (e.g. `lambda: with_fixed_lag(100)`), got {policy_factory!r}"
            )
        if timestamp_fn is not None and not callable(timestamp_fn):
            raise TypeError(f"EventTimeMapper: timestamp_fn must be callable or None, got {timestamp_fn!r}")
        if idle_timeout_ms is not None:
            as_int = int_value(idle_timeout_ms)
            if as_int is None or as_int < 0:
                raise ValueError(
                    f"EventTimeMapper: idle_timeout_ms must be an int >= 0 or None, got {idle_timeout_ms!r}"
                )
            idle_timeout_ms = as_int or None
        if clock is not None and not callable(clock):
            raise TypeError(f"EventTimeMapper: clock must be callable or None, got {clock!r}")
        self._policy_factory = policy_factory
        self._timestamp_fn = timestamp_fn
        self._idle_timeout = idle_timeout_ms
        self._clock: Clock = clock if clock is not None else _monotonic_millis
        self._policies: list[Any] = []
        self._wms: list[int] = []
        # when each partition turns idle (clock ms); unused without an idle timeout
        self._idle_at: list[int] = []
        self._last_emitted = NO_WATERMARK
        self._top_observed = NO_WATERMARK
        self._all_idle = False
        # observe_event's fast path: each partition's policy.report_threshold() and the
        # clock time before which no partition can have turned idle, as of the last
        # coalescing (_coalesce); _NO_FAST_PATH until one ran since partitions changed
        self._thresholds: list[int] = []
        self._fast_until = _NO_FAST_PATH

    # -- partitions ------------------------------------------------------------------
    @property
    def partition_count(self) -> int:
        return len(self._policies)

    def add_partitions(self, count: int) -> None:
        """Add ``count`` partitions after the existing ones. They are active (they hold
        the watermark back until they have events, or go idle after the timeout)."""
        if int_value(count) is None or count < 0:
            raise ValueError(f"EventTimeMapper.add_partitions: count must be an int >= 0, got {count!r}")
        now = self._clock()
        timeout = self._idle_timeout or 0
        for _ in range(count):
            policy = self._policy_factory()
            if not callable(getattr(policy, "report_event", None)):
                raise TypeError(
                    f"EventTimeMapper: policy_factory() returned {policy!r}, which is not a "
                    "watermark policy (it needs report_event(ts) and current_watermark())"
                )
            self._policies.append(policy)
            self._wms.append(NO_WATERMARK)
            self._idle_at.append(now + timeout)
        self._fast_until = _NO_FAST_PATH

    def remove_partition(self, index: int) -> list[Any]:
        """Remove partition ``index`` (later partitions move down by one). Returns what to
        emit: the watermark the removed partition was holding back, if any."""
        self._check_index(index)
        del self._policies[index]
        del self._wms[index]
        del self._idle_at[index]
        self._fast_until = _NO_FAST_PATH
        out: list[Any] = []
        self._coalesce(self._clock(), out)
        return out

    # -- events and lulls --------------------------------------------------------------
    def flat_map_event(
        self, item: Any, partition: int, native_timestamp: int | None = None
    ) -> list[Any]:
        """``item`` read from ``partition``: returns ``[Watermark, item]`` when the
        event raised the processor's watermark, else ``[item]``. The event's time is
        ``timestamp_fn(item)``, or ``native_timestamp`` without a ``timestamp_fn``."""
        ts_fn = self._timestamp_fn
        if ts_fn is not None:
            ts = ts_fn(item)
        elif native_timestamp is not None:
            ts = native_timestamp
        else:
            raise ValueError(
                "EventTimeMapper: neither timestamp_fn nor a native timestamp given for "
                f"item {item!r} of partition {partition}"
            )
        if type(ts) is not int or not NO_WATERMARK <= ts <= MAX_TIMESTAMP:
            ts = checked_timestamp(ts, f"EventTimeMapper: partition {partition}", item)
        wm = self.observe_event(partition, ts)
        return [item] if wm is None else [wm, item]

    def observe_event(self, partition: int, timestamp: int, now: int | None = None) -> Watermark | None:
        """The fast path of :meth:`flat_map_event`: report an event's timestamp and get
        the watermark to emit before it (or ``None``). ``now`` saves a clock call when
        the caller has the time already.

        An event below its partition's ``policy.report_threshold()`` cannot change that
        policy's watermark, now or later; while no partition can have turned idle since
        the last coalescing (``now`` before the earliest time one would), coalescing
        again would find every watermark and every partition's idleness as it left them,
        so it would emit nothing: such an event only renews its partition's idle
        deadline. That is most events of a policy with a threshold (a fixed lag: all
        but the new maxima), ~605 -> ~225 ns an event (docs/performance.md, "K2's
        watermarks: steps per tasklet call, and events that cannot move one")."""
        if now is None:
            now = self._clock()
        if type(timestamp) is int and now < self._fast_until:
            try:
                fast = NO_WATERMARK <= timestamp < self._thresholds[partition]
            except IndexError:
                fast = False  # the slow path names the bad partition
            if fast:
                timeout = self._idle_timeout
                if timeout:
                    at = self._idle_at[partition] = now + timeout
                    if at < self._fast_until:  # a clock that went back
                        self._fast_until = at
                return None
        if type(timestamp) is not int or not NO_WATERMARK <= timestamp <= MAX_TIMESTAMP:
            timestamp = checked_timestamp(timestamp, f"EventTimeMapper: partition {partition}")
        try:
            self._policies[partition].report_event(timestamp)
        except IndexError:
            self._check_index(partition)
            raise
        except TypeError as e:
            raise TypeError(
                f"EventTimeMapper: bad timestamp {timestamp!r} for partition {partition}: {e} "
                "(timestamps are ints)"
            ) from e
        if self._idle_timeout:
            self._idle_at[partition] = now + self._idle_timeout
        self._all_idle = False
        out: list[Any] = []
        self._coalesce(now, out)
        return out[0] if out else None

    def flat_map_idle(self) -> list[Any]:
        """No event now: returns what to emit, a watermark moved on by time-based
        policies or by partitions turning idle, and the idle mark once every partition
        is idle. Call it whenever a poll brought nothing."""
        out: list[Any] = []
        self._coalesce(self._clock(), out)
        return out

    def _coalesce(self, now: int, out: list[Any]) -> None:
        wms = self._wms
        policies = self._policies
        idle_at = self._idle_at
        timed = self._idle_timeout is not None
        lo = MAX_TIMESTAMP
        top = self._top_observed
        for i in range(len(wms)):
            if timed and idle_at[i] <= now:
                continue  # idle: left out (its watermark is not refreshed meanwhile)
            # never capped at the event's timestamp (see the module docstring)
            w = policies[i].current_watermark()
            if w > wms[i]:
                wms[i] = w
            else:
                w = wms[i]
            if w > top:
                top = w
            if w < lo:
                lo = w
        self._top_observed = top
        all_idle = lo == MAX_TIMESTAMP
        if all_idle:
            if self._all_idle:
                return  # said so already
            self._all_idle = True
            lo = top
        else:
            self._all_idle = False  # e.g. a partition was added: idle again means news
        if lo > self._last_emitted:
            self._last_emitted = lo
            out.append(Watermark(lo))
        if all_idle:
            out.append(IDLE_MESSAGE)
        # what observe_event's fast path needs: the policies' thresholds as they are
        # now, and until when every partition stays active (none if one is idle now)
        self._thresholds = list(map(_threshold, policies))
        if not timed:
            self._fast_until = _ALWAYS
        elif policies:
            first_idle = min(idle_at)
            self._fast_until = first_idle if first_idle > now else _NO_FAST_PATH
        else:
            self._fast_until = _NO_FAST_PATH

    # -- snapshots ---------------------------------------------------------------------
    def watermark(self, partition: int) -> int:
        """Partition ``partition``'s watermark, to save in a snapshot (under a key of
        the external partition, so that the processor that reads it after a restart
        restores it)."""
        self._check_index(partition)
        return self._wms[partition]

    def restore_watermark(self, partition: int, watermark: int) -> None:
        """Restore a saved partition watermark. The processor emits nothing at or below
        the minimum over its partitions afterwards (a partition not restored counts as
        having no watermark)."""
        self._check_index(partition)
        self._wms[partition] = watermark
        self._last_emitted = min(self._wms)
        self._fast_until = _NO_FAST_PATH

    @property
    def last_emitted(self) -> int:
        """The last watermark returned for emission (``NO_WATERMARK`` before any)."""
        return self._last_emitted

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self._policies):
            raise IndexError(
                f"EventTimeMapper: no partition {index!r} (there are {len(self._policies)}; "
                "add them with add_partitions)"
            )

    def __repr__(self) -> str:
        return (
            f"EventTimeMapper(partitions={len(self._policies)}, last_emitted={self._last_emitted}, "
            f"all_idle={self._all_idle})"
        )
