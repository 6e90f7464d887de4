"""Session windows: ``aggregate_to_session_window`` (docs/semantics.md §7).

A session of a key is a maximal run of its events in which each event is less than
``session_timeout`` after the previous one. Every event at ``t`` stands for the
**half-open** interval ``[t, t + timeout)`` (Jet 3.0+); a session is the union of
overlapping event intervals, ``[min ts, max ts + timeout)``. Two events exactly
``timeout`` apart therefore start two sessions ("touching sessions stay separate"): with
half-open intervals the result cannot depend on whether a watermark equal to the
boundary happened to arrive between them.

Per key the processor keeps a list of non-overlapping sessions sorted by start. An event
whose interval overlaps one session extends it; one that overlaps two (it *bridges* a
gap) merges them with ``agg_op.combine`` — an interval of length ``timeout`` cannot
overlap three sessions, each of which is at least ``timeout`` long; otherwise it opens a
new session.

**When a session is emitted.** We follow docs/semantics.md §7: on watermark ``W`` every
session with ``end < W`` is emitted and forgotten, then ``W`` is forwarded. The rule is
consistent: an event at ``t`` can still change session ``[s, e)`` only if ``t < e``, and
after ``W`` only events with ``t >= W`` are accepted, so a session with ``e < W`` is
final. (``e <= W`` would be final as well — the event at ``t = e = W`` does not overlap
``[s, e)`` — so the strict rule sometimes keeps a final session until the next
watermark. We keep Jet 4.x's strict comparison, inherited from its closed-interval era,
so that results relative to watermarks are the same as Jet's; the contents of the
sessions are identical under both rules.)

**Late events** (``ts < W``, the last watermark received) are dropped and counted in the
``late_items_dropped`` metric; equality is not late. ``complete()`` emits every session
that is left, without a watermark. Results are ``KeyedWindowResult(start, end, key,
agg_op.finish(acc))``.

Emission is driven by a heap of ``(deadline, seq, key)`` entries, one live entry per key
holding a lower bound of the key's earliest session end: extending a session only raises
the true deadline, so no new entry is needed then; only a new *earliest* session pushes a
new entry (the old one becomes stale and is skipped by its sequence number). A watermark
thus touches only keys with something to emit.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from slipstream.aggregate import AggregateOperation
from slipstream.core.inbox import Inbox
from slipstream.core.items import NO_WATERMARK, Watermark
from slipstream.core.processor import Context
from slipstream.core.time import MAX_TIMESTAMP
from slipstream.core.traits import KEYED, WINDOWED, declare
from slipstream.core.validation import (
    check_invalid_timestamps,
    int_value,
    per_input_fns,
)
from slipstream.processors.windows import LATE_METRIC, WindowingP, _OutOfRange, check_agg_op
from slipstream.state.keyed import KEYED as KEYED_MAP
from slipstream.state.keyed import fast_keyed_state, saved_entry
from slipstream.state.keys import BroadcastKey, KeyedStateKey
from slipstream.window import KeyedWindowResult

__all__ = ["CURRENT_WATERMARK_KEY", "SessionWindowP", "aggregate_to_session_window"]

_KWR = KeyedWindowResult
_new = tuple.__new__
#: most results of one list of :meth:`SessionWindowP._expired_batches`
_BATCH = 512

CURRENT_WATERMARK_KEY = BroadcastKey("session_window.current_watermark")
"""Snapshot key of the last watermark received (broadcast: restore takes the minimum)."""


class SessionWindowP(WindowingP):
    """Aggregates each key's events into sessions; see the module docstring.

    State: ``sessions`` (key -> list of ``[start, end, acc]`` sorted by start, pairwise
    non-overlapping), the deadline heap, and the current watermark.

    ``sessions`` is a :class:`~slipstream.state.keyed.KeyedState` (``KEYED``: its entries
    restore as ``(KeyedStateKey(key), sessions)``; a plain dict when nothing is tracked:
    ``fast_keyed_state``). The lists change in place, so while the job takes incremental
    snapshots every item marks its key (before it changes the list), as does emitting a
    key's sessions; a save then holds only those keys (the engine copies the lists it is
    handed). The watermark is saved every time.

    At-least-once behaviour: the snapshot holds every key's session list (under the key,
    so it is restored to the processor owning the key's partition) and the current
    watermark; on restore the watermark is the minimum over all processors. Events that
    arrived after the barrier on an input that delivered it early were already in the
    saved sessions and are replayed after the restart: they are accumulated twice (the
    session bounds are the same, the same timestamps are seen again, but counts and sums
    are too high). Sessions emitted between the snapshot and the failure are emitted
    again. After the restore the watermark may appear to go back; events are judged late
    against the restored (minimum) watermark.
    """

    _vertex_kind = "aggregate_to_session_window"
    _cursor_key = CURRENT_WATERMARK_KEY
    _cursor_name = "current watermark"

    def __init__(
        self,
        session_timeout: int,
        key_fn: Any,
        timestamp_fn: Any,
        agg_op: AggregateOperation[Any, Any, Any],
        invalid_timestamps: str = "fail",
    ) -> None:
        super().__init__(invalid_timestamps)
        self._timeout = session_timeout
        self._set_input_fns(key_fn, timestamp_fn, agg_op)
        self._sessions: dict[Any, list[list[Any]]] = {}  # replaced in init_processor
        self._heap: list[tuple[int, int, Any]] = []
        # key -> sequence number of its live heap entry
        self._scheduled: dict[Any, int] = {}
        self._seq = itertools.count()
        self._wm = NO_WATERMARK

    def init_processor(self, context: Context) -> None:
        self._sessions = fast_keyed_state(context, KEYED_MAP)

    # -- items -----------------------------------------------------------------------
    def process(self, ordinal: int, inbox: Inbox) -> None:
        sessions = self._sessions
        dirty = getattr(sessions, "dirty", None)
        ts_fn = self._timestamp_fn
        key_fn = self._key_fn
        accumulate = self._op.accumulate
        if ordinal:  # co-aggregation: this input's own functions
            ts_fn, key_fn, accumulate = self._input_fns(ordinal)
        create = self._op.create
        combine = self._op.combine
        assert combine is not None
        timeout = self._timeout
        wm = self._wm
        items, stamps, late = self._timestamped(inbox, ts_fn)
        item: Any = None
        pairs = zip(items, stamps, strict=True)
        while True:
            try:
                for item, t in pairs:
                    if not wm <= t <= MAX_TIMESTAMP:  # late, or outside the 64-bit range
                        if t > MAX_TIMESTAMP or t < NO_WATERMARK:
                            if self._invalid_timestamps != "late":
                                raise _OutOfRange(t)
                        late += 1
                        continue
                    e = t + timeout
                    k = key_fn(item)
                    lst = sessions.get(k)
                    if lst is None:
                        sessions[k] = [[t, e, accumulate(create(), item)]]
                        if dirty is not None:
                            dirty.add(k)
                        self._schedule(k, e)
                        continue
                    if dirty is not None:  # before the list changes
                        dirty.add(k)
                    # i = index of the first session ending after t (ends are sorted
                    # too); events mostly arrive in order, so scan from the right
                    i = len(lst)
                    while i and lst[i - 1][1] > t:
                        i -= 1
                    if i < len(lst) and lst[i][0] < e:
                        w = lst[i]
                        if i + 1 < len(lst) and lst[i + 1][0] < e:
                            # the event bridges sessions i and i + 1: merge them (if
                            # accumulate then raises on the item, they stay merged)
                            nxt = lst.pop(i + 1)
                            w[1] = nxt[1]
                            w[2] = combine(w[2], nxt[2])
                            w[2] = accumulate(w[2], item)
                        else:
                            # first: an item it raises on leaves the session's bounds
                            w[2] = accumulate(w[2], item)
                            if e > w[1]:
                                w[1] = e  # deadline rises: the heap's lower bound holds
                        if t < w[0]:
                            w[0] = t
                    else:
                        lst.insert(i, [t, e, accumulate(create(), item)])
                        if i == 0:
                            # a new earliest session: its end is the key's new deadline
                            self._schedule(k, e)
            except _OutOfRange as exc:
                raise self._out_of_range(item, exc.ts) from None
            except Exception as exc:  # noqa: BLE001 - user code: the policy decides
                if not self.context.item_errors.handle(item, exc):
                    raise
                continue  # the same iterator, past the bad item
            break
        inbox.clear()
        if late:
            self.context.increment_metric(LATE_METRIC, late)

    def _schedule(self, key: Any, deadline: int) -> None:
        seq = next(self._seq)
        self._scheduled[key] = seq
        heapq.heappush(self._heap, (deadline, seq, key))

    # -- watermarks ------------------------------------------------------------------
    def _watermark_output(self, watermark: Watermark) -> Iterator[Any]:
        wm = watermark.timestamp
        if wm > self._wm:
            self._wm = wm  # now, not when the generator starts: process() judges by it
        return itertools.chain(self._expired(wm), (watermark,))

    def _expired(self, wm: float) -> Iterator[KeyedWindowResult]:
        """Emit and forget every session with ``end < wm``, lazily: as the sliding
        windows do (``SlidingWindowP._watermark_output``), the results are made a list
        at a time (up to :data:`_BATCH` of them) and ``itertools.chain`` hands them on
        at C speed, so a full outbox stops it anywhere; a list's keys leave the state
        when the list is made (no snapshot is taken before the watermark's output is
        out)."""
        return itertools.chain.from_iterable(self._expired_batches(wm))

    def _expired_batches(self, wm: float) -> Iterator[list[KeyedWindowResult]]:
        heap = self._heap
        scheduled = self._scheduled
        sessions = self._sessions
        dirty = getattr(sessions, "dirty", None)
        finish = self._op.finish
        out: list[Any] = []
        add = out.append
        while heap and heap[0][0] < wm:
            _, seq, key = heapq.heappop(heap)
            if scheduled.get(key) != seq:
                continue  # stale entry
            del scheduled[key]
            lst = sessions[key]
            n = 0
            while n < len(lst) and lst[n][1] < wm:
                n += 1
            done = lst[:n]
            del lst[:n]
            if dirty is not None:
                dirty.add(key)
            if lst:
                self._schedule(key, lst[0][1])
            else:
                del sessions[key]
            for start, end, acc in done:
                # tuple.__new__: the named tuple without its Python-level __new__
                add(_new(_KWR, (start, end, key, finish(acc))))
            if len(out) >= _BATCH:
                yield out
                out = []
                add = out.append
        if out:
            yield out

    # -- completion ------------------------------------------------------------------
    def _final_results(self) -> Iterator[KeyedWindowResult]:
        return self._expired(math.inf)

    # -- snapshots -------------------------------------------------------------------
    def _snapshot_entries(self) -> Iterator[tuple[Any, Any]]:
        # one KEYED map: its entries restore as KeyedStateKey(key), routed by the key and
        # never mistaken for our own broadcast entry whatever the user's key is
        return iter([saved_entry(self._sessions, KEYED_MAP), (CURRENT_WATERMARK_KEY, self._wm)])

    def _restore_keyed(self, key: KeyedStateKey, value: Any) -> None:
        if key.key in self._sessions:
            raise ValueError(f"{self._where()}: duplicate snapshot entry for key {key.key!r}")
        self._sessions[key.key] = [list(w) for w in value]

    def finish_snapshot_restore(self) -> bool:
        restored = self._take_restored_cursor()
        if restored is not None:
            self._wm = restored
        self._heap.clear()
        self._scheduled.clear()
        for key, lst in self._sessions.items():
            self._schedule(key, lst[0][1])
        return True

    def __repr__(self) -> str:
        return f"SessionWindowP(keys={len(self._sessions)}, wm={self._wm})"


def aggregate_to_session_window(
    *,
    session_timeout: int,
    key_fn: Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
    timestamp_fn: Callable[[Any], int] | Sequence[Callable[[Any], int]],
    agg_op: AggregateOperation[Any, Any, Any],
    invalid_timestamps: str = "fail",
) -> Callable[[], SessionWindowP]:
    """Session window aggregation by key (``P.aggregate_to_session_window``).

    ``session_timeout`` (a positive int, in timestamp units) is the gap that closes a
    session. ``agg_op`` needs ``combine``, to merge two sessions that an out-of-order
    event bridges. Put it behind a distributed edge partitioned by the same key.
    ``invalid_timestamps`` as in ``aggregate_to_sliding_window``: an item whose timestamp
    is not an integer fails the job naming it, or with ``"late"`` is dropped and counted.
    """
    name = "aggregate_to_session_window"
    timeout = int_value(session_timeout)
    if timeout is None:
        raise TypeError(f"{name}: session_timeout must be a positive int, got {session_timeout!r}")
    if timeout <= 0:
        raise ValueError(f"{name}: session_timeout must be > 0, got {timeout}")
    check_agg_op(
        name,
        agg_op,
        needs_combine=True,
        why="to merge two sessions that an out-of-order event bridges",
    )
    key_fns = per_input_fns(key_fn, "key_fn", name, agg_op.arity)
    ts_fns = per_input_fns(timestamp_fn, "timestamp_fn", name, agg_op.arity)
    invalid = check_invalid_timestamps(invalid_timestamps, name)
    return declare(
        functools.partial(
            SessionWindowP, timeout, key_fns, ts_fns, agg_op, invalid_timestamps=invalid
        ),
        KEYED,
        WINDOWED,
    )
