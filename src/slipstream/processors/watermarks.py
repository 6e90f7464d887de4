"""``insert_watermarks``: turn event timestamps into watermarks (docs/semantics.md §5).

The processor passes every item through unchanged and, in front of the items, inserts a
:class:`~slipstream.core.items.Watermark` whenever its policy's watermark advances. It
**never drops late items** (as in Jet 0.7+): deciding what is late is the business of the
windowing processors downstream, which can count what they drop. Keeping the two concerns
apart also means an item is never lost just because a policy was tuned too tight.

In a batch job (every source bounded) it emits no watermark at all unless
``JobConfig(batch_watermarks=True)``: the windows then see every item and emit when the
input ends, as Spark's and Flink's batch modes do (``Context.hold_watermarks``).

During a lull (empty inbox) the engine calls ``try_process()``; time-based policies
(``limiting_lag_and_delay`` and friends) then move the watermark forward without events,
which is what lets the last windows of a paused stream be emitted.

An item whose timestamp is not an integer (NaN, infinite, fractional, a string) fails the
job with an error naming the vertex and the item; with ``invalid_timestamps="late"`` it is
passed on without being reported to the policy (it must not move the watermark: an
infinite one would end every window) and the windowing processor downstream, given the
same option, drops it and counts it as late.

In an epoch of a Spark Structured Streaming query (``Context.micro_batch_watermarks``, set
by the Spark engine) the watermark is the whole micro-batch's, as in Spark: the policy
follows the epoch's events but the processor holds its watermark until the epoch's input
ends, then emits it (before the epoch's closing barrier) and saves it. A consumer of
every split takes the highest of these once all are in (``ends_epoch_at_split_watermark``,
slipstream.spark.feed). The next epoch restores the **highest** value saved by the
processors of the vertex (the batch's maximum event time minus the lag, never lower than
before) and emits it before any item, so a split of the batch that happened to hold older
events does not hold the others' windows back (docs/spark.md, "Event time").

Optionally (``idle_timeout_ms``) a processor that saw no item for that long declares its
substream *idle* by emitting :data:`IDLE` once: downstream coalescers then leave it out of
the minimum, so one silent partition does not hold back every window (docs/semantics.md §3). The next item
makes it active again and ordinary watermarks resume.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from itertools import accumulate, compress, islice, repeat
from operator import ge, sub
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import failed_position
from slipstream.core.items import IDLE_MESSAGE, MAX_TIMESTAMP, NO_WATERMARK, Watermark
from slipstream.core.outbox import SPECIAL_AT_TAIL
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.traits import WATERMARK_SOURCE
from slipstream.core.validation import (
    check_fn,
    check_invalid_timestamps,
    int_value,
    not_a_timestamp,
    only_int_timestamps,
    timestamp_out_of_range,
)
from slipstream.state.keys import BroadcastKey

__all__ = ["IDLE", "InsertWatermarksP", "insert_watermarks"]

IDLE = IDLE_MESSAGE
"""The idle message (``slipstream.core.items.IDLE_MESSAGE``) as a public name."""

WM_SNAPSHOT_KEY = BroadcastKey("insert_watermarks.wm")
"""Snapshot key of the last emitted watermark (broadcast: restore takes the minimum, or
the maximum in a Spark micro-batch epoch)."""

Clock = Callable[[], int]


def _monotonic_millis() -> int:
    return time.monotonic_ns() // 1_000_000


class InsertWatermarksP(AbstractProcessor):
    """Inserts watermarks into the stream; see the module docstring.

    One policy per processor, made by ``policy_factory()`` in ``init``: a policy tracks
    one substream, and each processor sees its own substream.

    Emission rules: a watermark is emitted (to every ordinal, by the engine) only when
    the policy's value is strictly greater than the last one emitted, and always *before*
    the item that made it advance, so an item is never behind a watermark that its own
    timestamp produced. Items and watermarks are offered under the outbox's capacity: a
    refused offer is kept and offered first on the next call.

    At-least-once behaviour: the snapshot holds the last emitted watermark. On restore
    every processor takes the **minimum** over all saved values and never emits a
    watermark at or below it, so the downstream stream stays strictly increasing across
    the restart even though the fresh policy starts from nothing. Items replayed after
    the restore are passed on again (duplicates downstream); items that were processed
    after the barrier under at-least-once had already pushed the watermark further
    before the failure, so replayed items may arrive downstream behind a watermark that
    was emitted before the failure — the downstream windows see them as late and drop
    (and count) them. Nothing is ever dropped here.

    Spark micro-batch epochs (``Context.micro_batch_watermarks``): see the module
    docstring. Watermarks then depend on the micro-batch only, not on how Spark split
    it across the processors: an item is late only behind the watermark of the earlier
    micro-batches, whichever split it is in.
    """

    slipstream_traits = frozenset({WATERMARK_SOURCE})
    # a timestamp function that raises, or gives a timestamp that is not an int (with
    # invalid_timestamps="fail"): the item is set aside under JobConfig.on_item_error
    handles_item_errors = True

    def __init__(
        self,
        timestamp_fn: Callable[[Any], int],
        policy_factory: Callable[[], Any],
        idle_timeout_ms: int | None = None,
        clock: Clock | None = None,
        invalid_timestamps: str = "fail",
    ) -> None:
        self._invalid_timestamps = invalid_timestamps
        self._timestamp_fn = timestamp_fn
        self._policy_factory = policy_factory
        self._idle_timeout = idle_timeout_ms
        self._clock: Clock = clock if clock is not None else _monotonic_millis
        self._policy: Any = None
        self._last_emitted = NO_WATERMARK
        # a Watermark or IDLE refused by the outbox: offered before anything else
        self._pending: Any = None
        # the head item of the inbox was already reported to the policy
        self._head_reported = False
        self._last_item_at = 0
        self._idle = False
        self._restored_wm: int | None = None
        # the last chunk moved the watermark: compute block maxima first (_none_behind)
        self._blockwise = False
        # a Spark micro-batch epoch: the policy is a _MicroBatchPolicy
        self._micro_batch = False

    @property
    def ends_epoch_at_split_watermark(self) -> bool:
        """In a Spark micro-batch epoch: the watermark this processor emits when the
        epoch's input ends is its split's maximum minus the lag, and it holds no item
        (it never does), so a consumer of every split may take the highest of these as
        the micro-batch's watermark once all of them are in (slipstream.spark.feed)."""
        return self._micro_batch

    def init_processor(self, context: Context) -> None:
        policy = self._policy_factory()
        if not (
            callable(getattr(policy, "report_event", None))
            and callable(getattr(policy, "current_watermark", None))
        ):
            raise TypeError(
                f"insert_watermarks (vertex {context.vertex_name!r}): policy_factory() "
                f"returned {policy!r}, which is not a watermark policy (it needs "
                "report_event(ts) and current_watermark())"
            )
        self._policy = policy
        if context.hold_watermarks:
            # a batch job: no watermark before the input ends, so no item is late
            # (JobConfig.batch_watermarks); the items still go through the checks above
            self._policy = _HeldPolicy()
            self._idle_timeout = None
        elif context.micro_batch_watermarks:
            # the watermark moves between epochs only; idleness by the clock has no
            # meaning inside one micro-batch
            self._micro_batch = True
            self._policy = _MicroBatchPolicy(policy)
            self._idle_timeout = None
        if self._idle_timeout is not None:
            self._last_item_at = self._clock()

    # -- items -----------------------------------------------------------------------
    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._pending is not None and not self._offer_pending():
            return
        outbox = self.outbox
        if len(outbox.buckets) == 1 and outbox.is_cooperative_outbox() and not self._head_reported:
            self._process_fast(inbox)
        else:
            self._process_items(inbox)
        if self._idle_timeout is not None:
            self._last_item_at = self._clock()
            self._idle = False

    def _process_fast(self, inbox: Inbox) -> None:
        """One outbound bucket with room: append a chunk of items (and the watermarks
        they cause) straight into it, reporting to the policy only the events that can
        move it.

        Watermarks are emitted lazily: the policy's latest value is *owed* and goes out
        before the first item behind it (``ts < owed``) or at the end of the chunk,
        whichever comes first. So an in-order chunk brings one watermark, not one per
        item, and downstream results are the same as with a watermark before every item
        that advanced it: an item behind a watermark (late, for a window) sees exactly
        that watermark before it, and an item at or above it could not be late for an
        earlier one either, nor belong to a window or session that an earlier watermark
        closes (those end at or below it). Nothing is dropped here.

        The work per item runs at C speed (timestamps by ``map``, the next event at or
        above the policy's report threshold by ``compress``); Python code runs per
        reported event (every event for a policy without a threshold) and per
        watermark. A policy whose watermark follows the highest timestamp alone
        (``watermark_after``) and a chunk with no item behind the chunk's last
        watermark take one report of the maximum. A chunk with a timestamp that is not a plain ``int`` takes the
        careful per-item path, which converts or rejects it.
        """
        outbox = self.outbox
        bucket = outbox.buckets[0]
        room = outbox.capacity - len(bucket)
        policy = self._policy
        # duck-typed policies without report_threshold report every event
        threshold_fn = getattr(policy, "report_threshold", None) or _report_everything
        threshold = threshold_fn()
        ts_fn = self._timestamp_fn
        n = len(inbox)
        if n >= room:
            n = room - 1  # a slot for the chunk's watermark
        if n <= 0:
            self._process_items(inbox)
            return
        src = iter(inbox)
        try:
            tss = list(map(ts_fn, islice(src, n)))
        except Exception as e:  # the timestamp function raised: name the item
            k = failed_position(len(inbox), src)
            if not self.context.item_errors.handle(inbox[k], e):
                raise
            del inbox[k]  # set aside; the items before it go through again
            return
        if not only_int_timestamps(tss):
            self._process_items(inbox)
            return
        blocks = None
        if self._blockwise:
            # the last chunk moved the watermark (unthrottled): its maximum comes from
            # the block maxima that the check needs anyway (one pass less)
            blocks = _block_extremes(tss)
            top = max(blocks[0])
        else:
            top = max(tss)
        if top > MAX_TIMESTAMP:
            # beyond the 64-bit range it would be a watermark no later item could pass:
            # the careful path rejects it (or passes it on unreported, as late)
            self._blockwise = False
            self._process_items(inbox)
            return
        if top < threshold:
            # no event can move the watermark (the usual case with a throttled policy):
            # move the items at C speed
            self._blockwise = False
            _take_into(inbox, n, bucket.extend)
            return
        last = self._last_emitted
        after = getattr(policy, "watermark_after", None)
        wm_at_end = after(top) if after is not None else None
        if wm_at_end is not None and (
            wm_at_end <= last or _none_behind(policy, tss, last, wm_at_end, blocks)
        ):
            # the policy follows the highest timestamp and no item is behind the chunk's
            # last watermark, so none is behind an earlier one: report the maximum once
            wm = policy.report_event(top)
            # unthrottled: the next chunk's new maxima move the watermark again
            self._blockwise = threshold_fn() <= top + 1
            only = not bucket and not outbox.specials
            _take_into(inbox, n, bucket.extend)
            if wm > last:
                bucket.append(Watermark(wm))
                # the engine need not scan the bucket for it
                outbox.specials = SPECIAL_AT_TAIL if only else True
                self._last_emitted = wm
            return
        # outbox room: the items, a watermark before each of up to `budget` of them, and
        # the chunk's last watermark
        budget = room - 1 - n
        if budget <= 0:
            n = (room - 1) // 2
            budget = room - 1 - n
            if n <= 0:
                self._process_items(inbox)
                return
        report = policy.report_event
        owed = last
        changes: list[tuple[int, int]] = []  # (index, owed watermark from there on)
        every = threshold <= NO_WATERMARK  # a policy without a threshold sees every event
        pos = 0
        while pos < n:
            if every:
                i = pos
            else:
                # the next event at or above the threshold, found at C speed
                found = next(compress(range(pos, n), map(ge, tss[pos:n], repeat(threshold))), None)
                if found is None:
                    break
                i = found
            if len(changes) == budget:
                n = i  # the rest goes in the next call
                break
            wm = report(tss[i])
            threshold = threshold_fn()
            if wm > owed:
                owed = wm
                changes.append((i, wm))
            pos = i + 1
        if not changes:
            _take_into(inbox, n, bucket.extend)
            return
        items = _take(inbox, n)
        append = bucket.append
        start = 0
        for k, (i, wm) in enumerate(changes):
            end = changes[k + 1][0] if k + 1 < len(changes) else n
            if min(tss[i:end]) < wm:  # an item behind the owed watermark: it must see it
                j = next(x for x in range(i, end) if tss[x] < wm)
                bucket.extend(items[start:j])
                append(Watermark(wm))
                last = wm
                start = j
        bucket.extend(items[start:] if start else items)
        if owed > last:
            append(Watermark(owed))
            last = owed
        outbox.specials = True
        self._last_emitted = last

    def _process_items(self, inbox: Inbox) -> None:
        offer = self.outbox.offer
        report = self._policy.report_event
        ts_fn = self._timestamp_fn
        last = self._last_emitted
        reported = self._head_reported
        errors = self.context.item_errors
        while inbox:
            item = inbox[0]
            if reported:
                reported = False
            else:
                try:
                    ts: Any = ts_fn(item)
                except Exception as e:  # the timestamp function raised: name the item
                    if not errors.handle(item, e):
                        raise
                    inbox.popleft()
                    continue
                if type(ts) is not int or not NO_WATERMARK <= ts <= MAX_TIMESTAMP:
                    try:
                        ts = self._integer_timestamp(item, ts)
                    except (TypeError, ValueError) as e:  # its message names the item
                        if not errors.handle(item, e, names_item=True):
                            raise
                        inbox.popleft()
                        continue
                wm = last if ts is None else report(ts)
                if wm > last:
                    self._last_emitted = last = wm
                    if not offer(Watermark(wm)):
                        self._pending = Watermark(wm)
                        reported = True
                        break
            if not offer(item):
                reported = True
                break
            inbox.popleft()
        self._head_reported = reported

    def _integer_timestamp(self, item: Any, ts: Any) -> int | None:
        """An integer-like timestamp in the 64-bit range as an int. Any other (NaN,
        infinite, fractional, not a number, too large or too small) fails, or with
        ``invalid_timestamps="late"`` gives ``None``: the item goes on without moving the
        watermark (the windows downstream count it)."""
        v = int_value(ts)
        if v is not None and not NO_WATERMARK <= v <= MAX_TIMESTAMP:
            if self._invalid_timestamps == "fail":
                raise timestamp_out_of_range(
                    f"insert_watermarks (vertex {self.context.vertex_name!r})",
                    item,
                    v,
                    "(invalid_timestamps='late' passes such items on to be counted as late)",
                )
            return None
        if v is None and self._invalid_timestamps == "fail":
            raise not_a_timestamp(
                f"insert_watermarks (vertex {self.context.vertex_name!r})",
                item,
                ts,
                "(filter out the items without a time before with_timestamps(), or set "
                "on_item_error='skip')"
                if self.context.pipeline_stage is not None
                else "(invalid_timestamps='late' passes such items on to be counted as late)",
            )
        return v

    def _offer_pending(self) -> bool:
        if not self.outbox.offer(self._pending):
            return False
        self._pending = None
        return True

    # -- lulls -----------------------------------------------------------------------
    def try_process(self) -> bool:
        if self._pending is not None and not self._offer_pending():
            return False
        if self._idle:
            # idle: stay silent until the next item re-activates the substream
            return True
        wm = self._policy.current_watermark()
        if wm > self._last_emitted:
            self._last_emitted = wm
            if not self.outbox.offer(Watermark(wm)):
                self._pending = Watermark(wm)
                return False
        timeout = self._idle_timeout
        if timeout is not None and self._clock() - self._last_item_at >= timeout:
            self._idle = True
            if not self.outbox.offer(IDLE_MESSAGE):
                self._pending = IDLE_MESSAGE
                return False
        return True

    def complete(self) -> bool:
        return self._pending is None or self._offer_pending()

    # -- snapshots -------------------------------------------------------------------
    def save_to_snapshot(self) -> bool:
        if self._pending is not None and not self._offer_pending():
            return False
        if self._micro_batch:
            # the end of the epoch's input: the watermark held during the epoch goes
            # out before the closing barrier (and is saved for the next epoch)
            held = self._policy.held()
            if held > self._last_emitted:
                self._last_emitted = held
                if not self.outbox.offer(Watermark(held)):
                    self._pending = Watermark(held)
                    return False
        return self.outbox.offer_to_snapshot(WM_SNAPSHOT_KEY, self._last_emitted)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if key != WM_SNAPSHOT_KEY:
            raise ValueError(
                f"insert_watermarks (vertex {self.context.vertex_name!r}): unexpected "
                f"snapshot entry {key!r}"
            )
        if self._restored_wm is None or (
            value > self._restored_wm if self._micro_batch else value < self._restored_wm
        ):
            self._restored_wm = value

    def finish_snapshot_restore(self) -> bool:
        restored = self._restored_wm
        if restored is not None:
            self._last_emitted = restored
            if self._micro_batch and restored > NO_WATERMARK:
                # the vertex's watermark after the earlier micro-batches, before any item
                # of this one (a repeat of one sent before is dropped downstream)
                self._policy.floor = restored
                self._pending = Watermark(restored)
        return True

    def __repr__(self) -> str:
        return f"InsertWatermarksP(last_emitted={self._last_emitted}, idle={self._idle})"


class _HeldPolicy:
    """The policy of an inserter in a batch job: it never advances. Its report threshold
    is above every timestamp, so chunks of items move at C speed."""

    def report_event(self, timestamp: int) -> int:
        return NO_WATERMARK

    def current_watermark(self) -> int:
        return NO_WATERMARK

    def report_threshold(self) -> int:
        return MAX_TIMESTAMP + 1


class _MicroBatchPolicy:
    """The policy of an inserter inside one Spark micro-batch epoch: ``inner`` (the
    user's policy) follows the events, but the watermark reported is held at ``floor``
    (the vertex's watermark when the epoch started) until the processor emits
    :meth:`held` at the end of the epoch's input. It keeps ``inner``'s report threshold,
    and its ``watermark_after`` when it has one, so chunks keep the fast paths."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.floor = NO_WATERMARK
        threshold = getattr(inner, "report_threshold", None)
        self.report_threshold = threshold if threshold is not None else _report_everything
        if getattr(inner, "watermark_after", None) is not None:
            self.watermark_after = self._floor_after

    def report_event(self, timestamp: int) -> int:
        self.inner.report_event(timestamp)
        return self.floor

    def current_watermark(self) -> int:
        return self.floor

    def _floor_after(self, timestamp: int) -> int:
        return self.floor

    def held(self) -> int:
        """The watermark of the epoch's events, never below ``floor``."""
        wm = self.inner.current_watermark()
        return wm if wm > self.floor else self.floor


def _take(inbox: Inbox, n: int) -> list[Any]:
    """Remove and return the first ``n`` items of ``inbox`` (C speed)."""
    if n >= len(inbox):
        items = list(inbox)
        inbox.clear()
        return items
    items = list(islice(inbox, n))
    rest = list(islice(inbox, n, None))
    inbox.clear()
    inbox.extend(rest)
    return items


def _take_into(inbox: Inbox, n: int, extend: Callable[[Any], Any]) -> None:
    if n >= len(inbox):
        extend(inbox)
        inbox.clear()
    else:
        extend(_take(inbox, n))


_BLOCK = 32


def _none_behind(
    policy: Any,
    tss: list[int],
    last: int,
    wm_at_end: int,
    blocks: tuple[list[int], list[int]] | None = None,
) -> bool:
    """Whether no timestamp of the chunk ``tss`` is behind a watermark that the events
    before it in the chunk produce (policies with ``watermark_after``): none is below
    the chunk's last watermark ``wm_at_end``, or, for a policy with a ``lag_bound``
    ``L``, every ``ts >= (running maximum before it) - L`` and the policy's watermark
    was emitted already (an item behind that one has seen it).

    At C speed and without a running maximum per item (``accumulate(tss, max)`` costs
    several times a ``max`` pass): the chunk is cut into blocks of ``_BLOCK``; each
    block's minimum must be within ``L`` of the maximum of every block before it (exact
    for items of different blocks), and within a block whose own maximum and minimum
    are more than ``L`` apart the running maximum decides (exact; rare on data whose
    disorder is bounded by the lag)."""
    bound_fn = getattr(policy, "lag_bound", None)
    lag = None if bound_fn is None else bound_fn()
    if lag is None or policy.current_watermark() > last:
        return min(tss) >= wm_at_end
    maxes, mins = blocks if blocks is not None else _block_extremes(tss)
    if min(mins) >= wm_at_end:
        return True
    if len(maxes) > 1 and min(map(sub, mins[1:], accumulate(maxes, max))) < -lag:
        return False  # an item behind a block before it by more than the lag
    spreads = list(map(sub, maxes, mins))
    if max(spreads) <= lag:
        return True
    for b, spread in enumerate(spreads):
        if spread > lag:
            block = tss[b * _BLOCK : (b + 1) * _BLOCK]
            if min(map(sub, block, accumulate(block, max))) < -lag:
                return False
    return True


def _block_extremes(tss: list[int]) -> tuple[list[int], list[int]]:
    """The maximum and the minimum of every block of ``_BLOCK`` timestamps (the last
    block may be shorter), at C speed: ``map(max, *[it] * B)`` hands ``max`` B items at
    a time."""
    n = len(tss)
    full = n - n % _BLOCK
    maxes = list(map(max, *[iter(tss)] * _BLOCK))
    mins = list(map(min, *[iter(tss)] * _BLOCK))
    if full < n:
        tail = tss[full:]
        maxes.append(max(tail))
        mins.append(min(tail))
    return maxes, mins


def _report_everything() -> int:
    return NO_WATERMARK


def insert_watermarks(
    timestamp_fn: Callable[[Any], int],
    policy_factory: Callable[[], Any],
    *,
    idle_timeout_ms: int | None = None,
    clock: Clock | None = None,
    invalid_timestamps: str = "fail",
) -> Callable[[], InsertWatermarksP]:
    """A supplier of processors that insert watermarks (``P.insert_watermarks``).

    ``timestamp_fn(item)`` gives the event timestamp (an int). ``policy_factory`` is a
    zero-argument callable returning a new watermark policy, e.g.
    ``lambda: with_fixed_lag(100)`` — each processor needs its own policy instance.
    ``idle_timeout_ms``: when set, a processor that received no item for that long (by
    ``clock``, milliseconds, default monotonic) emits :data:`IDLE` once.
    ``invalid_timestamps``: ``"fail"`` (an item whose timestamp is not an integer fails
    the job, naming it) or ``"late"`` (it goes on without moving the watermark; give the
    windowing processor the same option to drop and count it).
    """
    check_fn(timestamp_fn, "timestamp_fn", "insert_watermarks")
    if not callable(policy_factory):
        hint = ""
        if callable(getattr(policy_factory, "report_event", None)):
            hint = (
                " (got a policy instance; pass a factory such as "
                "`lambda: with_fixed_lag(lag)` so that every processor gets its own policy)"
            )
        raise TypeError(
            f"insert_watermarks: policy_factory must be a zero-argument callable returning "
            f"a watermark policy, got {policy_factory!r}{hint}"
        )
    if idle_timeout_ms is not None:
        as_int = int_value(idle_timeout_ms)
        if as_int is None:
            raise TypeError(
                f"insert_watermarks: idle_timeout_ms must be an int or None, got {idle_timeout_ms!r}"
            )
        idle_timeout_ms = as_int
        if idle_timeout_ms <= 0:
            raise ValueError(
                f"insert_watermarks: idle_timeout_ms must be > 0 (or None to disable idleness), "
                f"got {idle_timeout_ms}"
            )
    if clock is not None and not callable(clock):
        raise TypeError(f"insert_watermarks: clock must be callable or None, got {clock!r}")
    invalid = check_invalid_timestamps(invalid_timestamps, "insert_watermarks")
    return functools.partial(
        InsertWatermarksP,
        timestamp_fn,
        policy_factory,
        idle_timeout_ms,
        clock,
        invalid_timestamps=invalid,
    )
