"""Sliding and tumbling window processors (docs/semantics.md §6).

Three factories share one processor class:

* :func:`aggregate_to_sliding_window` — single stage: items in, window results out;
* :func:`accumulate_by_frame` — stage 1 of two: items in, one
  ``KeyedWindowResult(frame_start, frame_end, key, accumulator)`` per frame and key out
  (the Pipeline's ``accumulate_rows_by_frame``: one ``KeyedGroup`` per frame);
* :func:`combine_to_sliding_window` — stage 2 of two: stage-1 frames in, window results
  out.

**Frames.** The time axis is cut into frames of ``window_def.frame_size`` (the slide);
an event at ``t`` goes to the frame labelled by its exclusive end,
``window_def.higher_frame_ts(t)``, and window ``E`` (``[E - window_size, E)``) is the
``frames_per_window`` frames ending at ``E``. Accumulating per frame is what lets a
window be assembled from (or slid over) a few accumulators instead of its items.

**Emission** (docs/semantics.md §6): on watermark ``W`` every window ``E <= W`` not emitted yet is
emitted, in order of ``E``, starting at the first window that contains the lowest frame;
a window emits one ``KeyedWindowResult(E - window_size, E, key, finish(acc))`` per key
that has events in it, and nothing for an empty window. After window ``E`` the oldest
frame of ``E`` is evicted (no later window needs it), so memory is bounded by the open
windows. Then ``W`` itself is forwarded. Stretches of empty windows are skipped in one
step, so a big jump of the watermark costs nothing. ``complete()`` flushes every window
up to the last one containing the top frame (``top_frame + window_size - frame_size``)
without emitting a watermark.

**Late items** are judged at frame granularity, as Jet does: an item whose frame ends at
or below the last watermark (``frame < next_win_to_emit``) is dropped and counted in the
``late_items_dropped`` metric. That includes *partially late* items whose frame still
belongs to a window not emitted yet: they must go, because some window containing them
was emitted already and the running window of the deduct path has moved past that
frame. An item with ``ts < W`` whose frame ends after ``W`` is accepted.

**Beyond Jet: results do not depend on ``deduct``.** Jet's deduct path drops a key whose
running accumulator becomes equal to an empty one, so a window of ``+1, -1`` emits
nothing with ``summing()`` but ``0`` with an op that has no ``deduct``. Here the running
window also counts, per key, how many of its frames hold that key; a key leaves the
window when that count reaches zero, never because of its accumulator's value. So
``deduct`` is purely an O(1)-per-frame speed-up and accumulators need no equality.

**Outbox capacity** is honoured everywhere: results are produced lazily by a generator
and emitted with ``emit_from``; a refused result is kept and offered first on the next
call, and ``try_process_watermark`` returns ``False`` until every window of that
watermark and the watermark itself went out.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice, repeat
from typing import Any

from slipstream.aggregate import AggregateOperation, identity
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.errors import SnapshotError
from slipstream.core.groups import GROUP_MAX, KeyedGroup
from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import failed_position
from slipstream.core.items import NO_WATERMARK, Watermark
from slipstream.core.late_items import LATE_METRIC
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.time import MAX_TIMESTAMP
from slipstream.core.traits import KEYED, WINDOWED, declare
from slipstream.core.validation import (
    LATE_COUNTS,
    check_invalid_timestamps,
    only_int_timestamps,
    per_input_fns,
    timestamp_out_of_range,
    valid_timestamps,
)
from slipstream.state.keyed import KEYED as KEYED_MAP
from slipstream.state.keyed import StateMap, StateMapSave, fast_keyed_state, saved_entry
from slipstream.state.keys import BroadcastKey, KeyedStateBatch, KeyedStateKey, expand_entries
from slipstream.window import KeyedWindowResult, SlidingWindowDef

__all__ = [
    "NEXT_WIN_TO_EMIT_KEY",
    "SlidingWindowP",
    "accumulate_by_frame",
    "aggregate_to_sliding_window",
    "combine_to_sliding_window",
]

NEXT_WIN_TO_EMIT_KEY = BroadcastKey("window.next_win_to_emit")
"""Snapshot key of the emission cursor (broadcast: restore takes the minimum)."""
WINDOW_DEFINITION_KEY = BroadcastKey("window.definition")
"""Snapshot key of a last stage's window definition, plain data ``{"size": S, "slide":
L, "offset": O}``: what a reader of the snapshot needs to tell its frames' windows
(``ss.state.read``). A restore ignores it (the job's own definition decides; stores
written before it existed have none)."""

# the metric counting the items a window processor dropped as late: the engines warn
# about them (slipstream.core.late_items)

_MISSING: Any = object()
_KWR = KeyedWindowResult
_new = tuple.__new__
_GROUP_MAX = GROUP_MAX  # most keys in one group of stage 1's frame (core/groups.py)


def _groups(head: tuple[int, int], content: dict[Any, Any]) -> list[Any]:
    """``content`` as ``KeyedGroup(head, ...)`` items of at most ``_GROUP_MAX`` keys; the
    dict itself when it is small enough."""
    if len(content) <= _GROUP_MAX:
        return [KeyedGroup(head, content)]
    items = iter(content.items())
    return [
        KeyedGroup(head, dict(islice(items, _GROUP_MAX)))
        for _ in range(0, len(content), _GROUP_MAX)
    ]


def _close(frame: Any) -> None:
    """Release a frame's map that has a ``close()`` (a disk-backed keyed state's files)
    once the processor no longer holds it."""
    close = getattr(frame, "close", None)
    if close is not None:
        close()


def _single_index(fn: Any) -> Any:
    """The index of ``operator.itemgetter(index)`` as a 1-tuple, else ``None``: the hot
    loops subscript the item themselves (``item[i]``, one bytecode) instead of mapping
    the getter over the batch and zipping the results, ~20 % less per item."""
    if type(fn) is operator.itemgetter:
        args = fn.__reduce__()[1]
        if len(args) == 1:
            return args
    return None


def window_definition(window_def: SlidingWindowDef) -> dict[str, int]:
    """The plain-data form of ``window_def`` saved under :data:`WINDOW_DEFINITION_KEY`."""
    return {
        "size": window_def.window_size,
        "slide": window_def.frame_size,
        "offset": window_def.frame_offset,
    }


class _OutOfRange(Exception):
    """A timestamp outside the 64-bit range reached a frame: the loop that met it turns
    it into :func:`timestamp_out_of_range` naming the item."""

    def __init__(self, ts: int) -> None:
        super().__init__(ts)
        self.ts = ts


class _InvalidTimestamp(Exception):
    """A timestamp that is not an int, refused by :func:`valid_timestamps` (whose error
    names the item): its own rule (``invalid_timestamps``), not the bad-record policy."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _checked_stamp(item: Any, ts: Any, where: str, invalid: str) -> list[int]:
    """``[ts]`` converted, or ``[]`` (late) under ``invalid="late"``; else
    :class:`_InvalidTimestamp` around :func:`valid_timestamps`' error."""
    try:
        return valid_timestamps([item], [ts], where, invalid)[1]
    except (TypeError, ValueError) as e:
        raise _InvalidTimestamp(e) from None


class WindowingP(AbstractProcessor):
    """What the sliding and the session window processors have in common.

    Results are produced lazily by generators and emitted with ``emit_from``, so that a
    full outbox can stop them anywhere: a refused result is kept and offered first on
    the next call, and ``try_process_watermark`` (``_watermark_output``) and
    ``complete`` (``_final_results``) return ``False`` until their generator is done.

    State is saved as ``KeyedStateKey`` entries (restored by ``_restore_keyed`` on the
    processor owning the key) and one cursor under the broadcast ``_cursor_key``: every
    processor receives every processor's cursor and keeps the minimum, which the
    subclass takes with ``_take_restored_cursor`` in ``finish_snapshot_restore``.
    """

    _vertex_kind = ""
    """The factory's name: errors name it and the vertex."""
    _cursor_key: BroadcastKey
    _cursor_name = "emission cursor"
    #: Set when the processor is fed by a watermark inserter of its own (the Pipeline
    #: API fuses ``insert_watermarks`` into stage 1 of a window): each processor then sees
    #: its own watermarks, so exactly-once cursors legitimately differ and the minimum
    #: is taken. Stage 2, fed coalesced watermarks, still decides which windows close.
    own_watermarks = False

    metric_names = (LATE_METRIC,)
    #: an item on which the key, timestamp, value or accumulate function raises goes to
    #: the bad-record policy (``on_item_error``; :mod:`slipstream.core.item_errors`)
    handles_item_errors = True

    def __init__(self, invalid_timestamps: str = "fail") -> None:
        self._invalid_timestamps = invalid_timestamps
        self._wm_it: Iterator[Any] | None = None
        self._complete_it: Iterator[Any] | None = None
        self._snapshot_it: Iterator[tuple[Any, Any]] | None = None
        self._restored_cursor: int | None = None

    def _watermark_output(self, watermark: Watermark) -> Iterator[Any]:
        """The results that ``watermark`` releases, then ``watermark`` itself."""
        raise NotImplementedError

    def _final_results(self) -> Iterator[Any]:
        """Every result still held, for ``complete()`` (no watermark)."""
        raise NotImplementedError

    def _snapshot_entries(self) -> Iterator[tuple[Any, Any]]:
        raise NotImplementedError

    def _restore_keyed(self, key: KeyedStateKey, value: Any) -> None:
        raise NotImplementedError

    def _set_input_fns(
        self, key_fn: Any, timestamp_fn: Any, op: AggregateOperation[Any, Any, Any]
    ) -> None:
        """Key and timestamp functions, one per input ordinal (tuples, or ``None`` for a
        processor whose items carry their own); ``_key_fn``/``_timestamp_fn`` are
        ordinal 0's, which the hot loops use directly."""
        self._key_fns: tuple[Any, ...] = key_fn if isinstance(key_fn, tuple) else (key_fn,)
        self._ts_fns: tuple[Any, ...] = (
            timestamp_fn if isinstance(timestamp_fn, tuple) else (timestamp_fn,)
        )
        self._key_fn = self._key_fns[0]
        self._timestamp_fn = self._ts_fns[0]
        self._op = op

    def _input_fns(self, ordinal: int) -> tuple[Any, Any, Any]:
        """(timestamp_fn, key_fn, accumulate) of input ``ordinal``."""
        accumulate = self._op.accumulate_fn(ordinal)
        if ordinal >= len(self._ts_fns) or ordinal >= len(self._key_fns):
            raise ValueError(
                f"{self._where()}: items arrived on input ordinal {ordinal} but the "
                f"processor has key and timestamp functions for {len(self._ts_fns)} input(s)"
            )
        return self._ts_fns[ordinal], self._key_fns[ordinal], accumulate

    def _where(self) -> str:
        return f"{self._vertex_kind} (vertex {self.context.vertex_name!r})"

    def _out_of_range(self, item: Any, ts: int) -> ValueError:
        return timestamp_out_of_range(self._where(), item, ts, LATE_COUNTS)

    def _timestamped(self, inbox: Inbox, ts_fn: Callable[[Any], Any]) -> tuple[Any, list[int], int]:
        """The inbox's items, their timestamps and how many were left out: the timestamps
        at C speed and one type scan (a NaN or a float would otherwise make a frame or
        session of its own that no watermark ever frees); integer-like ones are converted,
        any other fails naming the item or, if so configured, counts as late. An item on
        which ``ts_fn`` raises goes to the bad-record policy (``on_item_error``): under
        ``"fail"`` its own exception is raised, naming the item in the job's error; else
        it is left out and the same loop goes on with the next item."""
        stamps: list[Any] = []
        it = iter(inbox)
        try:
            stamps.extend(map(ts_fn, it))
            items: Any = inbox
        except Exception as err:  # noqa: BLE001 - user code: the policy decides
            items = self._stamps_past_errors(inbox, it, stamps, ts_fn, err)
        if only_int_timestamps(stamps):
            return items, stamps, 0
        return valid_timestamps(list(items), stamps, self._where(), self._invalid_timestamps)

    def _stamps_past_errors(
        self, inbox: Inbox, it: Any, stamps: list[Any], ts_fn: Any, err: Exception
    ) -> list[Any]:
        """``_timestamped`` after ``ts_fn`` raised ``err``: the policy sets each failing
        item aside (or the error is raised) and the rest are stamped; the items kept."""
        bad: list[int] = []
        while True:
            i = len(stamps) + len(bad)  # every item before it has a stamp or failed
            if not self.context.item_errors.handle(inbox[i], err):
                raise err
            bad.append(i)
            try:
                stamps.extend(map(ts_fn, it))
            except Exception as e:  # noqa: BLE001
                err = e
                continue
            break
        skip = set(bad)
        return [x for j, x in enumerate(inbox) if j not in skip]

    # -- watermarks and completion -----------------------------------------------------
    def try_process_watermark(self, watermark: Watermark) -> bool:
        it = self._wm_it
        if it is None:
            it = self._wm_it = self._watermark_output(watermark)
        if not self.emit_from(it):
            return False
        self._wm_it = None
        return True

    def complete(self) -> bool:
        it = self._complete_it
        if it is None:
            it = self._complete_it = self._final_results()
        if not self.emit_from(it):
            return False
        self._complete_it = None
        return True

    # -- snapshots -------------------------------------------------------------------
    def save_to_snapshot(self) -> bool:
        if self._complete_it is not None:
            # completing: finish the completion instead of saving state (docs/semantics.md §7)
            if not self.emit_from(self._complete_it):
                return False
            self._complete_it = None
        sit = self._snapshot_it
        if sit is None:
            sit = self._snapshot_it = self._snapshot_entries()
        if not self.emit_to_snapshot_from(sit):
            return False
        self._snapshot_it = None
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if type(key) is KeyedStateKey:
            self._restore_keyed(key, value)
        elif type(key) is KeyedStateBatch:  # not expanded by whoever restores us
            for k, v in value.items():
                self._restore_keyed(KeyedStateKey(k, key.detail), v)
        elif type(key) is StateMap:  # a saved map, not expanded by whoever restores us
            for k, v in expand_entries([(key, value)]):
                self._restore_keyed(k, v)
        elif key == WINDOW_DEFINITION_KEY:
            pass  # for readers of the snapshot: the job's own definition decides
        elif key == self._cursor_key:
            cursor = self._restored_cursor
            ctx = self.context
            if (
                cursor is not None
                and value != cursor
                and ctx.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
                and ctx.commits_snapshots
                and not self.own_watermarks
            ):
                # Every processor of the vertex saw the same watermarks before the
                # aligned barrier, so their cursors must agree (Jet asserts it); under
                # at-least-once they may differ and the minimum is taken. So may they
                # when no snapshot coordinator aligned them: the Spark engine hands
                # state from epoch to epoch, each task ending where its input ended.
                raise SnapshotError(
                    f"{self._where()}: exactly-once snapshot is inconsistent: processors "
                    f"saved different {self._cursor_name} values ({cursor} and {value})"
                )
            if cursor is None or value < cursor:
                self._restored_cursor = value
        else:
            raise ValueError(f"{self._where()}: unexpected snapshot entry {key!r}")

    def _take_restored_cursor(self) -> int | None:
        """The minimum of the restored cursors (``None`` if none came); forgotten once
        taken."""
        cursor = self._restored_cursor
        self._restored_cursor = None
        return cursor


class SlidingWindowP(WindowingP):
    """Aggregates items into frames and emits sliding/tumbling windows of them.

    State: ``frames`` (frame end -> key -> accumulator), ``next_win_to_emit`` (the end of
    the next window to emit; ``NO_WATERMARK`` until the first watermark), ``top_frame``
    and, on the deduct path, a running window (key -> accumulator plus key -> number of
    its frames holding the key).

    ``last_stage=False`` is stage 1 (``accumulate_by_frame``): on ``save_to_snapshot`` it
    emits all its frames downstream instead of saving them (docs/semantics.md §6), so its state travels
    inside the barrier-aligned stream and stage 2 combines partial frames of the same
    frame and key; it then saves only its emission cursor.

    The last stage keeps each frame in a :class:`~slipstream.state.keyed.KeyedState`
    (``KEYED``, detail: the frame's end; a plain dict when nothing is tracked, for the
    loops' speed: ``fast_keyed_state``), saved as one map per frame: its entries restore
    as ``(KeyedStateKey(key, frame), acc)``. While the job takes incremental snapshots the
    loops mark each key they change in its frame (a loop of their own, so that a job
    without them pays nothing per item), a save holds only those keys, a frame evicted
    since the previous save is saved as dropped, and the cursor is saved every time.

    At-least-once behaviour (the last stage saves every ``(KeyedStateKey(key, frame),
    acc)`` and the cursor; on restore the cursor is the minimum over all processors):
    items that arrived after the barrier on an input that delivered it early were
    already accumulated when the snapshot was taken and are replayed after the restart,
    so they are counted twice in windows that were still open at the snapshot. Windows
    emitted between the snapshot and the failure are emitted again. A watermark that
    appears to go backwards after the restart is tolerated: the cursor never moves back,
    and windows are not re-emitted by it. Stage 1 has the same double counting, carried
    by the frames it flushed at the barrier.
    """

    _vertex_kind = "aggregate_to_sliding_window"
    _cursor_key = NEXT_WIN_TO_EMIT_KEY
    #: a frame leaves as ``KeyedGroup((start, end), {key: acc, ...})`` items, not a
    #: ``KeyedWindowResult`` per key (:class:`_AccumulateRowsByFrameP`, the Pipeline's
    #: stage 1)
    _grouped = False

    def __init__(
        self,
        key_fn: Any,
        timestamp_fn: Any,
        window_def: SlidingWindowDef,
        agg_op: AggregateOperation[Any, Any, Any],
        last_stage: bool = True,
        invalid_timestamps: str = "fail",
    ) -> None:
        super().__init__(invalid_timestamps)
        self._set_input_fns(key_fn, timestamp_fn, agg_op)
        self._wd = window_def
        self._op = agg_op
        self._last_stage = last_stage
        if not last_stage:
            # stage 1 runs on every member behind a local edge: on several members its
            # processors see their own member's watermarks, so their cursors differ at a
            # snapshot whenever the members' sources are at other event times. It
            # flushes its frames at every snapshot, so the minimum cursor is right.
            self.own_watermarks = True
        self._fs = window_def.frame_size
        self._offset = window_def.frame_offset
        self._ws = window_def.window_size
        # window E consists of the frames E - span, ..., E
        self._span = window_def.window_size - window_def.frame_size
        self._tumbling = window_def.is_tumbling
        self._use_deduct = last_stage and not self._tumbling and agg_op.deduct is not None

        # (timestamp, key, value) indices when ordinal 0 sums and its three functions
        # are plain itemgetters of one index: see _process_indexed
        self._indices: tuple[Any, Any, Any] | None = None
        getters = (self._timestamp_fn, self._key_fn, agg_op.additive)
        indices = [_single_index(fn) for fn in getters] if callable(agg_op.additive) else []
        if indices and all(indices):
            self._indices = (indices[0][0], indices[1][0], indices[2][0])
        self._frames: dict[int, dict[Any, Any]] = {}
        self._next_win = NO_WATERMARK
        self._top = NO_WATERMARK
        # deduct path: the running window (frames running_end - span + fs .. running_end
        # after the eviction that follows an emission)
        self._running: dict[Any, Any] = {}
        self._counts: dict[Any, int] = {}
        self._running_end: int | None = None
        self._flush_it: Iterator[Any] | None = None
        # during a restore: (frame, key) pairs that received a frame saved off the grid
        self._realigned: set[tuple[int, Any]] = set()
        # incremental snapshots (last stage): the loops mark changed keys, and the frames
        # evicted since the previous save are saved as dropped (their DROP entries)
        self._tracked = False
        self._dropped: list[tuple[StateMap, StateMapSave]] = []
        self._fresh: set[int] = set()  # frames made since the previous save

    def init_processor(self, context: Context) -> None:
        self._tracked = self._last_stage and bool(context.incremental_snapshots)

    def _new_frame(self, f: int) -> dict[Any, Any]:
        """A new frame: a keyed-state map in the last stage (it is saved), a dict in
        stage 1 (it flushes its frames instead)."""
        if self._last_stage:
            if self._tracked:
                self._fresh.add(f)
            return fast_keyed_state(self.context, KEYED_MAP, f)
        return {}

    # -- items -----------------------------------------------------------------------
    def process(self, ordinal: int, inbox: Inbox) -> None:
        ts_fn = self._timestamp_fn
        key_fn = self._key_fn
        assert ts_fn is not None and key_fn is not None
        accumulate = self._op.accumulate
        additive = self._op.additive
        if ordinal:  # co-aggregation: this input's own functions
            ts_fn, key_fn, accumulate = self._input_fns(ordinal)
            additive = None
        create = self._op.create
        enter = self._enter_frame
        if self._tracked:
            if not ordinal and self._indices is not None:
                self._process_indexed_marked(inbox, self._indices)
                return
            items, stamps, late = self._timestamped(inbox, ts_fn)
            late += self._accumulate_marked(items, stamps, key_fn, accumulate, additive)
            inbox.clear()
            if late:
                self.context.increment_metric(LATE_METRIC, late)
            return
        if not ordinal and self._indices is not None:
            self._process_indexed(inbox, self._indices)
            return
        items, stamps, late = self._timestamped(inbox, ts_fn)
        # Items mostly arrive in event-time order, so consecutive items usually share a
        # frame: the loops keep the current frame's bounds [lo, hi) and its dict, and
        # only compute the frame (and the late check) when an item falls outside.
        while True:
            lo = hi = 0
            d: dict[Any, Any] = {}
            # the position of `it` is the item a raising function or key was on
            it = iter(items)
            try:
                if additive is None:
                    for item, ts in zip(it, stamps, strict=True):
                        if not lo <= ts < hi:
                            entered = enter(ts)
                            if entered is None:
                                late += 1
                                continue
                            lo, hi, d = entered
                        k = key_fn(item)
                        acc = d.get(k, _MISSING)
                        d[k] = accumulate(create() if acc is _MISSING else acc, item)
                elif callable(additive):  # summing: add inline, no call per item
                    # the item functions run at C speed through map (itemgetters stay in C)
                    for ts, k, v in zip(stamps, map(key_fn, it), map(additive, items), strict=True):
                        if not lo <= ts < hi:
                            entered = enter(ts)
                            if entered is None:
                                late += 1
                                continue
                            lo, hi, d = entered
                        d[k] = d.get(k, 0) + v
                else:  # counting
                    for ts, k in zip(stamps, map(key_fn, it), strict=True):
                        if not lo <= ts < hi:
                            entered = enter(ts)
                            if entered is None:
                                late += 1
                                continue
                            lo, hi, d = entered
                        d[k] = d.get(k, 0) + additive
            except _OutOfRange as e:
                raise self._out_of_range(items[stamps.index(e.ts)], e.ts) from None
            except Exception as e:  # noqa: BLE001 - user code: the policy decides
                # the items before the bad one are in; under "fail" its own error
                i = failed_position(len(items), it)
                if not self.context.item_errors.handle(items[i], e):
                    raise
                items = list(items)[i + 1 :]
                stamps = stamps[i + 1 :]
                continue
            break
        inbox.clear()
        if late:
            self.context.increment_metric(LATE_METRIC, late)

    def _accumulate_marked(
        self, items: Any, stamps: list[int], key_fn: Any, accumulate: Any, additive: Any
    ) -> int:
        """``process``'s loops while the job takes incremental snapshots: the same frame
        logic and order of calls, each key also marked in its frame's ``dirty`` (before
        ``accumulate``, which may change an accumulator in place; a new key whose
        accumulate raised is unmarked again). A frame made since the previous save is
        saved whole anyway: nothing is marked in it. Returns how many items were late."""
        enter = self._enter_frame
        create = self._op.create
        fresh = self._fresh
        missing = _MISSING
        late = 0
        while True:
            lo = hi = 0
            d: Any = None
            mark: Any = None
            k: Any = missing
            it = iter(items)
            try:
                if additive is None:
                    for item, ts in zip(it, stamps, strict=True):
                        if not lo <= ts < hi:
                            entered = enter(ts)
                            if entered is None:
                                late += 1
                                continue
                            lo, hi, d = entered
                            mark = None if d.detail in fresh else d.dirty.add
                        k = key_fn(item)
                        if mark is not None:
                            mark(k)
                        acc = d.get(k, missing)
                        d[k] = accumulate(create() if acc is missing else acc, item)
                else:
                    values = (
                        map(additive, items) if callable(additive) else repeat(additive, len(items))
                    )
                    for ts, k, v in zip(stamps, map(key_fn, it), values, strict=True):
                        if not lo <= ts < hi:
                            entered = enter(ts)
                            if entered is None:
                                late += 1
                                continue
                            lo, hi, d = entered
                            mark = None if d.detail in fresh else d.dirty.add
                        d[k] = d.get(k, 0) + v
                        if mark is not None:
                            mark(k)
            except _OutOfRange as e:
                raise self._out_of_range(items[stamps.index(e.ts)], e.ts) from None
            except Exception as e:  # noqa: BLE001 - user code: the policy decides
                if mark is not None and k not in d:
                    d.dirty.discard(k)  # a new key that got no accumulator
                i = failed_position(len(items), it)
                if not self.context.item_errors.handle(items[i], e):
                    raise
                items = list(items)[i + 1 :]
                stamps = stamps[i + 1 :]
                continue
            return late

    def _enter_frame(self, ts: int) -> tuple[int, int, dict[Any, Any]] | None:
        """The bounds ``[lo, hi)`` of the frame of ``ts`` (``hi`` is the frame's end,
        ``higher_frame_ts`` inlined) and its dict, created on first use; ``None`` when
        the frame is late (it ends at or below the last watermark). The loops call it
        only when an item leaves the current frame's bounds (~3 % of the items of the
        windowing benchmark), so the range check of ``ts`` is here: the bounds are cut
        to the 64-bit range, so that every timestamp outside it comes here, and raises
        :class:`_OutOfRange` (or, under ``invalid_timestamps="late"``, is late)."""
        if not NO_WATERMARK <= ts <= MAX_TIMESTAMP:
            if self._invalid_timestamps == "late":
                return None
            raise _OutOfRange(ts)
        fs = self._fs
        f = ts - (ts - self._offset) % fs + fs
        if f < self._next_win:
            return None
        d = self._frames.get(f)
        if d is None:
            d = self._frames[f] = self._new_frame(f)
            if f > self._top:
                self._top = f
        lo = f - fs
        return (
            lo if lo >= NO_WATERMARK else NO_WATERMARK,
            f if f <= MAX_TIMESTAMP else MAX_TIMESTAMP + 1,
            d,
        )

    def _process_indexed(self, inbox: Inbox, indices: tuple[Any, Any, Any]) -> None:
        """``process`` for a sum whose timestamp, key and value are ``item[i]``: one
        pass over the items, no per-batch lists of timestamps, keys and values (~20 %
        less per item). The type check is per item (a timestamp that is not a plain int
        takes the careful conversion of :func:`valid_timestamps`); the frame logic is
        ``process``'s."""
        ti, ki, vi = indices
        enter = self._enter_frame
        late = 0
        lo = hi = 0
        d: dict[Any, Any] = {}
        item: Any = None
        it = iter(inbox)
        while True:
            try:
                for item in it:
                    ts = item[ti]
                    if type(ts) is not int or not lo <= ts < hi:
                        if type(ts) is not int:
                            # valid_timestamps' own error names the item
                            stamps = _checked_stamp(
                                item, ts, self._where(), self._invalid_timestamps
                            )
                            if not stamps:
                                late += 1
                                continue
                            ts = stamps[0]
                        entered = enter(ts)
                        if entered is None:
                            late += 1
                            continue
                        lo, hi, d = entered
                    k = item[ki]
                    d[k] = d.get(k, 0) + item[vi]
            except _OutOfRange as e:
                raise self._out_of_range(item, e.ts) from None
            except _InvalidTimestamp as e:
                raise e.error from None
            except Exception as e:  # noqa: BLE001 - a malformed item: the policy decides
                if not self.context.item_errors.handle(item, e):
                    raise
                continue  # the same iterator, past the bad item
            break
        inbox.clear()
        if late:
            self.context.increment_metric(LATE_METRIC, late)

    def _process_indexed_marked(self, inbox: Inbox, indices: tuple[Any, Any, Any]) -> None:
        """:meth:`_process_indexed` while the job takes incremental snapshots: each key
        also marked in its frame (not in a frame made since the previous save)."""
        ti, ki, vi = indices
        enter = self._enter_frame
        fresh = self._fresh
        late = 0
        lo = hi = 0
        d: Any = {}
        mark: Any = None
        item: Any = None
        it = iter(inbox)
        while True:
            try:
                for item in it:
                    ts = item[ti]
                    if type(ts) is not int or not lo <= ts < hi:
                        if type(ts) is not int:
                            stamps = _checked_stamp(
                                item, ts, self._where(), self._invalid_timestamps
                            )
                            if not stamps:
                                late += 1
                                continue
                            ts = stamps[0]
                        entered = enter(ts)
                        if entered is None:
                            late += 1
                            continue
                        lo, hi, d = entered
                        mark = None if d.detail in fresh else d.dirty.add
                    k = item[ki]
                    d[k] = d.get(k, 0) + item[vi]
                    if mark is not None:
                        mark(k)
            except _OutOfRange as e:
                raise self._out_of_range(item, e.ts) from None
            except _InvalidTimestamp as e:
                raise e.error from None
            except Exception as e:  # noqa: BLE001 - a malformed item: the policy decides
                if not self.context.item_errors.handle(item, e):
                    raise
                continue  # the same iterator, past the bad item
            break
        inbox.clear()
        if late:
            self.context.increment_metric(LATE_METRIC, late)

    # -- watermarks ------------------------------------------------------------------
    def min_relevant_watermark(self) -> int:
        # a watermark below the next window's end emits no window and leaves the cursor
        # (and so the late check) where it is: it would only be forwarded
        return self._next_win

    def _watermark_output(self, watermark: Watermark) -> Iterator[Any]:
        # the items at C speed: a generator resumes once per window, not per result
        # (through two generators 49 ns an item, through chain 11: docs/performance.md,
        # "The distributed edge's per-item costs")
        return chain.from_iterable(self._watermark_batches(watermark))

    def _watermark_batches(self, watermark: Watermark) -> Iterator[list[Any]]:
        wm = watermark.timestamp
        yield from self._window_batches(wm)
        next_win = self._wd.higher_frame_ts(wm)
        if next_win > self._next_win:
            # never moves back (a restored processor may see lower watermarks again)
            self._next_win = next_win
        yield [watermark]

    def _window_results(self, limit: int) -> Iterator[KeyedWindowResult]:
        """Emit every window from the cursor up to ``limit`` and evict its oldest frame.

        Lazily, one result per ``next()``, so that a full outbox can stop it anywhere
        (a window's frame is evicted once all its results were taken). Does not move
        ``next_win_to_emit``: a watermark does that, a flush does not.
        """
        return chain.from_iterable(self._window_batches(limit))

    def _window_batches(self, limit: int) -> Iterator[list[KeyedWindowResult]]:
        """:meth:`_window_results`, a window's results as one list."""
        frames = self._frames
        if not frames:
            return
        fs = self._fs
        ws = self._ws
        span = self._span
        finish = self._op.finish
        end = self._next_win
        if end == NO_WATERMARK:
            # the first emission starts at the first window holding the lowest frame
            # (when the cursor is set, an empty window below the frames is skipped by the
            # loop: no scan of the frames per watermark)
            end = min(frames)
        content_of = self._window_content
        evict = self._evict
        grouped = self._grouped and finish is identity and self._tumbling
        while end <= limit:
            content = content_of(end)
            if type(content) is not dict:  # a frame on disk: read it once, whole
                content = dict(content.items())
            if content:
                start = end - ws
                results: list[Any]
                if grouped:
                    # the frame's own dict (evicted below, never changed again), in
                    # groups of at most _GROUP_MAX keys: one item each
                    results = _groups((start, end), content)
                    yield results
                    evict(end - span)
                    end += fs
                    continue
                values = content.values() if finish is identity else map(finish, content.values())
                rows = zip(repeat(start), repeat(end), content, values)
                # tuple.__new__ builds the named tuple without its Python-level __new__,
                # all at C speed (map/zip: 2x faster than a list comprehension)
                results = list(map(_new, repeat(_KWR), rows))
                yield results
                evict(end - span)
                end += fs
            else:
                # an empty window: every remaining frame lies after ``end``; skip the
                # empty stretch in one step
                if not frames:
                    return
                lowest = min(frames)
                end = lowest if lowest > end else end + fs

    def _window_content(self, end: int) -> dict[Any, Any]:
        """Key -> accumulator of window ``end`` (must not be mutated by the caller)."""
        frames = self._frames
        if self._tumbling:
            return frames.get(end) or {}
        combine = self._op.combine
        create = self._op.create
        assert combine is not None
        fs = self._fs
        if self._use_deduct:
            running = self._running
            counts = self._counts
            if self._running_end == end - fs:
                # slide: the running window already holds every frame but the leading one
                first = last = end
            else:
                running.clear()
                counts.clear()
                first, last = end - self._span, end
            for f in range(first, last + 1, fs):
                d = frames.get(f)
                if d:
                    for k, a in d.items():
                        r = running.get(k, _MISSING)
                        running[k] = combine(create() if r is _MISSING else r, a)
                        counts[k] = counts.get(k, 0) + 1
            self._running_end = end
            return running
        # no deduct: recombine the window's frames into fresh accumulators
        window: dict[Any, Any] = {}
        for f in range(end - self._span, end + 1, fs):
            d = frames.get(f)
            if d:
                for k, a in d.items():
                    r = window.get(k, _MISSING)
                    window[k] = combine(create() if r is _MISSING else r, a)
        return window

    def _evict(self, frame: int) -> None:
        d = self._frames.pop(frame, None)
        if self._tracked and d is not None:
            gone = d.dropped_entry()  # type: ignore[attr-defined]
            if gone is not None:  # a snapshot holds the frame: the next save drops it
                self._dropped.append(gone)
        if d and self._use_deduct and self._running_end is not None:
            deduct = self._op.deduct
            assert deduct is not None
            running = self._running
            counts = self._counts
            for k, a in d.items():
                c = counts[k] - 1
                if c:
                    counts[k] = c
                    running[k] = deduct(running[k], a)
                else:
                    # the key has no event left in the window: it leaves the window,
                    # whatever its accumulator's value
                    del counts[k]
                    del running[k]
        if d is not None and type(d) is not dict:
            _close(d)

    # -- completion ------------------------------------------------------------------
    def _final_results(self) -> Iterator[Any]:
        # every window up to the last one containing the top frame
        return self._window_results(self._top + self._span)

    # -- snapshots -------------------------------------------------------------------
    def save_to_snapshot(self) -> bool:
        if not self._last_stage and self._complete_it is None:
            # stage 1: flush every frame downstream instead of saving it (docs/semantics.md §6) -- unless
            # completing: then the base class finishes the completion, which emits them
            it = self._flush_it
            if it is None:
                it = self._flush_it = self._final_results()
            if not self.emit_from(it):
                return False
            self._flush_it = None
        return super().save_to_snapshot()

    def _snapshot_entries(self) -> Iterator[tuple[Any, Any]]:
        # one map per frame: a C-speed dict copy (or the frame's changed keys) instead of
        # an entry per key (restore receives the KeyedStateKey(key, frame) entries it
        # stands for); taken at once, as every frame's save starts its next interval
        entries: list[tuple[Any, Any]] = []
        if self._dropped:
            # a drop relative to a save that did not commit is left out: every map is
            # then saved whole, so the save replaces the processor's state
            committed = self.context.committed_snapshot_id
            entries.extend(e for e in self._dropped if e[1].base_id <= committed)
            self._dropped.clear()
        entries.extend(saved_entry(d, KEYED_MAP, f) for f, d in self._frames.items())
        self._fresh.clear()
        entries.append((NEXT_WIN_TO_EMIT_KEY, self._next_win))
        if self._last_stage:
            entries.append((WINDOW_DEFINITION_KEY, window_definition(self._wd)))
        return iter(entries)

    def _restore_keyed(self, key: KeyedStateKey, value: Any) -> None:
        saved = key.detail
        # the frame of the current grid that the saved frame ends in: the same frame
        # unless the job was restored with another slide or offset (Jet 4.x realigns too)
        f = self._wd.higher_frame_ts(saved - 1)
        d = self._frames.get(f)
        if d is None:
            d = self._frames[f] = self._new_frame(f)
        k = key.key
        if f != saved:
            if not self._realigned:
                self.context.logger.warning(
                    "%s: restored frames do not match the window definition %s (saved "
                    "under another slide or offset); they are moved to the frames they "
                    "end in, so windows overlapping them mix old and new boundaries",
                    self._where(),
                    self._wd,
                )
            self._realigned.add((f, k))
        elif k in d and (f, k) not in self._realigned:
            raise ValueError(
                f"{self._where()}: duplicate snapshot entry for key {k!r} in frame {saved!r}"
            )
        acc = d.get(k, _MISSING)
        if acc is _MISSING:
            d[k] = value
            return
        combine = self._op.combine
        if combine is None:
            raise ValueError(
                f"{self._where()}: several restored frames fall into frame {f} of {self._wd}; "
                "merging them needs agg_op.combine, which is None"
            )
        d[k] = combine(acc, value)

    def finish_snapshot_restore(self) -> bool:
        self._realigned.clear()
        restored = self._take_restored_cursor()
        if restored is not None:
            # on the current grid (the same value unless the window definition changed)
            self._next_win = (
                restored if restored == NO_WATERMARK else self._wd.higher_frame_ts(restored - 1)
            )
        frames = self._frames
        if self._next_win != NO_WATERMARK:
            # frames whose every window was emitted already (possible when processors
            # saved different cursors) are of no use
            oldest_needed = self._next_win - self._span
            for f in [f for f in frames if f < oldest_needed]:
                d = frames.pop(f)
                if self._tracked:
                    gone = d.dropped_entry()  # type: ignore[attr-defined]
                    if gone is not None:  # restored from its chain: the next save drops it
                        self._dropped.append(gone)
                _close(d)
        if self._fresh:
            # frames restored from the processor's own chain continue it (their first save
            # is a delta, see state.keyed.continue_restored_chain): not fresh, their
            # changes are marked
            self._fresh = {f for f in self._fresh if not getattr(frames.get(f), "saved_id", 0)}
        self._top = max(frames, default=NO_WATERMARK)
        # the running window is rebuilt from the restored frames at the next emission
        self._running.clear()
        self._counts.clear()
        self._running_end = None
        return True

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._wd}, frames={len(self._frames)}, "
            f"next_win_to_emit={self._next_win})"
        )


class _AccumulateByFrameP(SlidingWindowP):
    """Stage 1: a tumbling-by-frame window with identity finish that flushes on
    snapshot (see :class:`SlidingWindowP`)."""

    _vertex_kind = "accumulate_by_frame"


class _AccumulateRowsByFrameP(_AccumulateByFrameP):
    """Stage 1 of the Pipeline's windows (:func:`accumulate_rows_by_frame`): its frames
    leave as :class:`~slipstream.core.groups.KeyedGroup` items, ``(start, end)`` the
    head."""

    _grouped = True


class _CombineToSlidingWindowP(SlidingWindowP):
    """Stage 2: its items are stage-1 frames, combined into the frame they end in.

    The frame of an input is ``higher_frame_ts(item.end - 1)``: the item's own end when
    both stages use the same window definition, and the enclosing frame when stage 1
    used a finer one.
    """

    _vertex_kind = "combine_to_sliding_window"
    #: it runs no key or timestamp function of the user's (its items are stage 1's
    #: frames), only ``combine``, which the bad-record policy does not cover
    handles_item_errors = False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if inbox and type(inbox[0]) is KeyedGroup:
            self._combine_groups(inbox)
        else:
            self._combine_rows(inbox)
        if self._tracked:
            self._mark_combined(inbox)
        inbox.clear()

    def _combine_rows(self, inbox: Inbox) -> None:
        frames = self._frames
        combine = self._op.combine
        assert combine is not None
        create = self._op.create
        fs = self._fs
        offset = self._offset
        next_win = self._next_win
        top = self._top
        late = 0
        item: Any = None
        # consecutive stage-1 frames mostly end at the same frame: keep its bounds
        lo = hi = 0
        d: dict[Any, Any] = {}
        # an additive op (counting, summing) combines with +: add inline
        inline_add = self._op.additive is not None and combine is operator.add
        items = iter(inbox)
        try:
            # items are KeyedWindowResult(start, end, key, acc): plain tuple unpacking
            for item in items:
                _start, end, k, v = item
                t = end - 1
                if not lo <= t < hi:
                    f = t - (t - offset) % fs + fs
                    if f < next_win:
                        late += 1
                        continue
                    d = frames.get(f)  # type: ignore[assignment]
                    if d is None:
                        d = frames[f] = self._new_frame(f)
                        if f > top:
                            top = f
                    lo = f - fs
                    hi = f
                if inline_add:
                    d[k] = d.get(k, 0) + v
                else:
                    acc = d.get(k, _MISSING)
                    d[k] = combine(create() if acc is _MISSING else acc, v)
        except (AttributeError, TypeError, ValueError) as e:
            if type(item) is not KeyedGroup:
                raise self._bad_item(item, e) from e
            # a group among the rows: it and the rest go the groups' way
            self._top = top
            self._combine_groups(chain((item,), items))
            top = self._top
        self._top = top
        if late:
            self.context.increment_metric(LATE_METRIC, late)

    def _bad_item(self, item: Any, e: Exception) -> TypeError:
        return TypeError(
            f"{self._where()}: expected KeyedWindowResult frames from "
            f"accumulate_by_frame, cannot combine item {item!r}: {e}"
        )

    def _combine_groups(self, items: Iterable[Any]) -> None:
        """Combine stage 1's :class:`~slipstream.core.groups.KeyedGroup` frames (head
        ``(start, end)``); a row among them is combined as one entry. A group of a frame
        that is new here with an additive op (``+``) becomes the frame with one
        ``dict.update``: each accumulator is one of stage 1's, which began as ``create()``
        (``0``), so ``0 + acc`` would be ``acc`` again. Late groups count their keys in
        the late items metric, as their rows would."""
        frames = self._frames
        combine = self._op.combine
        assert combine is not None
        create = self._op.create
        fs = self._fs
        offset = self._offset
        next_win = self._next_win
        top = self._top
        late = 0
        inline_add = self._op.additive is not None and combine is operator.add
        for item in items:
            if type(item) is KeyedGroup:
                entries = item.entries
                try:
                    t = item.head[1] - 1
                    f = t - (t - offset) % fs + fs
                except (IndexError, TypeError) as e:
                    raise self._bad_item(item, e) from e
            else:
                try:
                    _start, end, k, v = item
                    t = end - 1
                    f = t - (t - offset) % fs + fs
                except (AttributeError, TypeError, ValueError) as e:
                    raise self._bad_item(item, e) from e
                entries = {k: v}
            if f < next_win:
                late += len(entries)
                continue
            d = frames.get(f)
            if d is None:
                d = frames[f] = self._new_frame(f)
                if f > top:
                    top = f
                if inline_add:
                    d.update(entries)
                    continue
            if inline_add:
                get = d.get
                for k, v in entries.items():
                    d[k] = get(k, 0) + v
            else:
                for k, v in entries.items():
                    acc = d.get(k, _MISSING)
                    d[k] = combine(create() if acc is _MISSING else acc, v)
        self._top = top
        if late:
            self.context.increment_metric(LATE_METRIC, late)

    def _mark_combined(self, inbox: Inbox) -> None:
        """Mark the keys the frames of ``inbox`` changed (incremental snapshots only: a
        second pass, so that the combining loop stays as it is without them)."""
        frames = self._frames
        fresh = self._fresh
        fs = self._fs
        offset = self._offset
        next_win = self._next_win
        for item in inbox:
            if type(item) is KeyedGroup:
                t = item.head[1] - 1
                f = t - (t - offset) % fs + fs
                d = frames.get(f)
                if d is not None and f not in fresh and f >= next_win:  # not a late frame's
                    d.dirty.update(item.entries)  # type: ignore[attr-defined]
                continue
            _start, end, k, _v = item
            t = end - 1
            f = t - (t - offset) % fs + fs
            d = frames.get(f)
            if d is not None and f not in fresh and k in d:  # not a late frame's
                d.dirty.add(k)  # type: ignore[attr-defined]


# -- factories -------------------------------------------------------------------------


def _check_window_def(factory: str, window_def: Any) -> None:
    if not isinstance(window_def, SlidingWindowDef):
        raise TypeError(
            f"{factory}: window_def must be a SlidingWindowDef (from sliding_window_def() or "
            f"tumbling_window_def()), got {window_def!r}"
        )


def check_agg_op(factory: str, agg_op: Any, *, needs_combine: bool, why: str = "") -> None:
    """``agg_op`` must be an AggregateOperation, with ``combine`` when ``needs_combine``
    (``why`` completes the error: "which is needed <why>")."""
    if not isinstance(agg_op, AggregateOperation):
        raise TypeError(f"{factory}: agg_op must be an AggregateOperation, got {agg_op!r}")
    if needs_combine and agg_op.combine is None:
        raise ValueError(f"{factory}: agg_op has no combine primitive, which is needed {why}")


def aggregate_to_sliding_window(
    *,
    key_fn: Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
    timestamp_fn: Callable[[Any], int] | Sequence[Callable[[Any], int]],
    window_def: SlidingWindowDef,
    agg_op: AggregateOperation[Any, Any, Any],
    invalid_timestamps: str = "fail",
) -> Callable[[], SlidingWindowP]:
    """Single-stage sliding/tumbling window aggregation by key.

    Emits ``KeyedWindowResult(start, end, key, agg_op.finish(acc))`` for every window
    ``end <= W`` on watermark ``W``, then forwards ``W``. A sliding (not tumbling) window
    needs ``agg_op.combine``; ``agg_op.deduct``, when present, slides each window in
    O(1) per frame instead of recombining its frames (results are the same either way).
    Put it behind a distributed edge partitioned by the same key, so that snapshot state
    is restored to the processor that receives the key's items.

    ``timestamp_fn`` must give integers: an item whose timestamp is NaN, infinite,
    fractional or not a number fails the job with an error naming the vertex and the
    item, or, with ``invalid_timestamps="late"``, is dropped and counted in the
    ``late_items_dropped`` metric.
    """
    name = "aggregate_to_sliding_window"
    _check_window_def(name, window_def)
    check_agg_op(
        name,
        agg_op,
        needs_combine=not window_def.is_tumbling,
        why="to assemble a sliding window from its frames (or use a tumbling window)",
    )
    key_fns = per_input_fns(key_fn, "key_fn", name, agg_op.arity)
    ts_fns = per_input_fns(timestamp_fn, "timestamp_fn", name, agg_op.arity)
    invalid = check_invalid_timestamps(invalid_timestamps, name)
    return declare(
        functools.partial(
            SlidingWindowP,
            key_fns,
            ts_fns,
            window_def,
            agg_op,
            True,
            invalid_timestamps=invalid,
        ),
        KEYED,
        WINDOWED,
    )


def accumulate_by_frame(
    *,
    key_fn: Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
    timestamp_fn: Callable[[Any], int] | Sequence[Callable[[Any], int]],
    window_def: SlidingWindowDef,
    agg_op: AggregateOperation[Any, Any, Any],
    invalid_timestamps: str = "fail",
) -> Callable[[], SlidingWindowP]:
    """Stage 1 of a two-stage sliding window: accumulate by (frame, key).

    Emits ``KeyedWindowResult(frame_end - frame_size, frame_end, key, accumulator)`` for
    every frame ``frame_end <= W`` on watermark ``W`` (the accumulator is not finished),
    then forwards ``W``. Feed :func:`combine_to_sliding_window` through a distributed
    edge partitioned by ``lambda r: r.key``; this stage usually sits behind a local edge
    partitioned by the key. On a snapshot it emits its frames instead of saving them.
    ``invalid_timestamps`` as in :func:`aggregate_to_sliding_window`.
    """
    return _frame_stage(
        _AccumulateByFrameP, key_fn, timestamp_fn, window_def, agg_op, invalid_timestamps
    )


def _frame_stage(
    cls: type[_AccumulateByFrameP],
    key_fn: Any,
    timestamp_fn: Any,
    window_def: SlidingWindowDef,
    agg_op: AggregateOperation[Any, Any, Any],
    invalid_timestamps: str,
) -> Callable[[], SlidingWindowP]:
    """The supplier of stage 1 processors of class ``cls``, the arguments checked."""
    name = "accumulate_by_frame"
    _check_window_def(name, window_def)
    check_agg_op(name, agg_op, needs_combine=False)
    key_fns = per_input_fns(key_fn, "key_fn", name, agg_op.arity)
    ts_fns = per_input_fns(timestamp_fn, "timestamp_fn", name, agg_op.arity)
    invalid = check_invalid_timestamps(invalid_timestamps, name)
    return declare(
        functools.partial(
            cls,
            key_fns,
            ts_fns,
            window_def.to_tumbling_by_frame(),
            agg_op.with_identity_finish(),
            False,
            invalid_timestamps=invalid,
        ),
        WINDOWED,
    )


def accumulate_rows_by_frame(
    *,
    key_fn: Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
    timestamp_fn: Callable[[Any], int] | Sequence[Callable[[Any], int]],
    window_def: SlidingWindowDef,
    agg_op: AggregateOperation[Any, Any, Any],
    invalid_timestamps: str = "fail",
) -> Callable[[], SlidingWindowP]:
    """:func:`accumulate_by_frame` whose frames leave as one
    :class:`~slipstream.core.groups.KeyedGroup` each, ``KeyedGroup((frame_start,
    frame_end), {key: accumulator, ...})`` (a frame of more than 4,096 keys as several):
    what the Pipeline compiles a window's stage 1 to, its output being seen only by its
    stage 2 (:func:`combine_to_sliding_window` takes groups and rows), through a
    distributed edge partitioned by ``operator.itemgetter(2)`` (a collector splits a
    group by its keys, routed as rows with those keys would be). With ``processes=2``
    each member's stage 1 emits a partial result for nearly every key of every frame:
    as a group the frame's own dict is handed on, split by key in one loop, pickled at
    C speed when it crosses processes (~115 against ~210 ns a key, sender and receiver)
    and becomes stage 2's frame with one ``dict.update`` when that frame is new
    (docs/performance.md, "Windows: the partial results as one group per frame")."""
    return _frame_stage(
        _AccumulateRowsByFrameP, key_fn, timestamp_fn, window_def, agg_op, invalid_timestamps
    )


def combine_to_sliding_window(
    *,
    window_def: SlidingWindowDef,
    agg_op: AggregateOperation[Any, Any, Any],
) -> Callable[[], SlidingWindowP]:
    """Stage 2 of a two-stage sliding window: combine stage-1 frames into windows.

    Input items are the ``KeyedWindowResult`` frames of :func:`accumulate_by_frame`
    (or the ``KeyedGroup`` frames of ``accumulate_rows_by_frame``, or plain ``(start,
    end, key, acc)`` tuples; with the same ``window_def`` and ``agg_op``); output is the
    same as
    :func:`aggregate_to_sliding_window` would give on the original items.
    """
    name = "combine_to_sliding_window"
    _check_window_def(name, window_def)
    check_agg_op(name, agg_op, needs_combine=True, why="to combine stage-1 frames")
    return declare(
        functools.partial(_CombineToSlidingWindowP, None, None, window_def, agg_op, True),
        KEYED,
        WINDOWED,
    )
