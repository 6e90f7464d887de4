"""Two processors run back to back in one tasklet, with a hand-over between them.

Both kinds of fusion need it: engine fusion's :class:`~slipstream.execution.fusion.FusedPairP`
(a ``P.map``/``P.filter``/``P.flat_map`` vertex inside its consumer's tasklet) and the
Pipeline compiler's :class:`~slipstream.pipeline.fused.PipeP` (a watermark inserter in
front of stage 1 of a window). :class:`PairP` holds what they share: ``first`` writes
into a private one-bucket outbox; whatever it emitted is handed to ``second`` (items
through ``process`` on ``ordinal``, watermarks through ``try_process_watermark``, idle
marks straight to the outbox, in order) before ``first`` gets more input and before any
other callback goes on. Each callback returns ``False`` (call again) while something is
still in between, so the engine never takes a snapshot, completes or forwards an idle
mark (:meth:`PairP.drain_between`) with items between the two.

The subclasses keep what differs through four hooks: :meth:`PairP._first` (how a call
into ``first`` is made: engine fusion names the producer on an error),
:meth:`PairP._hand_over` (a chunk of items on its way: engine fusion checks the removed
edge's keys and counts them), :meth:`PairP._save_first` and :meth:`PairP._flush_snapshot`
(``PipeP`` saves ``first``'s state under wrapped keys); the commit phase and the restore
are each subclass's own.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.items import IdleMessage, Watermark
from slipstream.core.outbox import SPECIAL_AT_TAIL, Outbox
from slipstream.core.processor import Processor, drain_between

__all__ = ["PairP"]


def _next_special(types: list[type], start: int) -> int:
    """Index of the first watermark or idle mark at or after ``start``, else -1."""
    found = -1
    for special in (Watermark, IdleMessage):
        try:
            i = types.index(special, start)
        except ValueError:
            continue
        if found < 0 or i < found:
            found = i
    return found


class PairP(Processor):
    """``first``'s output is ``second``'s input on ``ordinal``, in one processor (see the
    module docstring). A subclass sets ``outbox``/``context`` and calls
    :meth:`_init_pair` from its ``init``."""

    handles_item_errors = True

    def __init__(self, first: Processor, second: Processor, ordinal: int) -> None:
        self.first = first
        self.second = second
        self.ordinal = ordinal
        self._mid: Outbox | None = None
        self._queue: deque[Any] = deque()  # first's output segments: item lists, specials
        self._inbox = Inbox()  # second's input
        self._first_done = False
        self._edge_done = False
        self._wm_to_first = False
        self._first_saved = False

    def _init_pair(self, outbox: Outbox, first_context: Any, context: Any) -> None:
        """Give ``first`` the private outbox and ``second`` the tasklet's."""
        self._mid = Outbox(1, outbox.capacity)
        self._first(self.first.init, self._mid, first_context)
        self.second.init(outbox, context)

    def is_cooperative(self) -> bool:
        return True

    # -- hooks ---------------------------------------------------------------------------
    def _first(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, one of ``first``'s callbacks."""
        return call(*args)

    def _hand_over(self, items: list[Any]) -> None:
        """``items`` (``first``'s output, a chunk) go into ``second``'s inbox."""
        self._inbox.extend(items)

    def _save_first(self) -> bool:
        """``first``'s ``save_to_snapshot``."""
        return bool(self._first(self.first.save_to_snapshot))

    def _flush_snapshot(self) -> bool:
        """Offer what :meth:`_save_first` holds for the snapshot; ``True`` when done."""
        return True

    # -- handing first's output to second -----------------------------------------------
    def _drain(self) -> bool:
        """Hand everything ``first`` emitted to ``second``; ``True`` when nothing is left
        in between."""
        mid = self._mid
        assert mid is not None
        bucket = mid.buckets[0]
        queue = self._queue
        inbox = self._inbox
        second = self.second
        ordinal = self.ordinal
        hand_over = self._hand_over
        while True:
            if inbox:
                second.process(ordinal, inbox)
                if inbox:
                    return False
            if queue:
                head = queue[0]
                if type(head) is list:
                    hand_over(head)
                elif type(head) is Watermark:
                    if not second.try_process_watermark(head):
                        return False
                elif not self.outbox.offer(head):  # an idle mark goes straight on
                    return False
                queue.popleft()
                continue
            if not bucket:
                return True
            if mid.specials is SPECIAL_AT_TAIL:
                # insert_watermarks' usual chunk: items, then one watermark, found
                # without a scan (the queue and the inbox are empty here, so the items
                # go straight to the inbox, handed over before the watermark)
                mid.specials = False
                queue.append(bucket.pop())
                hand_over(bucket)
            elif mid.specials:
                mid.specials = False
                # split around the watermarks (idle marks), found by C-speed index scans
                types = list(map(type, bucket))
                start = 0
                while True:
                    i = _next_special(types, start)
                    if i < 0:
                        break
                    if i > start:
                        queue.append(bucket[start:i])
                    queue.append(bucket[i])
                    start = i + 1
                if start < len(bucket):
                    queue.append(bucket[start:])
            else:
                hand_over(bucket)
            bucket.clear()

    def drain_between(self) -> bool:
        """Hand on what is between the two (a chain's inner pairs too, and what either
        holds between two of its own); ``True`` once nothing is
        (:func:`~slipstream.core.processor.drain_between`, which the tasklet calls before
        it forwards an idle mark: ``second`` has not seen the items in between, nor
        emitted what they make)."""
        if not self._drain():
            return False
        done = self._first(drain_between, self.first)
        if not self._drain() or not done:
            return False
        return drain_between(self.second)

    # -- callbacks -----------------------------------------------------------------------
    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._drain():
            return
        self._first(self.first.process, ordinal, inbox)
        self._drain()

    def try_process(self) -> bool:
        if not self._drain():
            return False
        done = self._first(self.first.try_process)
        if not self._drain():
            return False
        return bool(self.second.try_process()) and bool(done)

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if not self._drain():
            return False
        if not self._wm_to_first:
            if not self._first(self.first.try_process_watermark, watermark):
                self._drain()
                return False
            self._wm_to_first = True
        if not self._drain():
            return False
        self._wm_to_first = False
        return True

    def complete_edge(self, ordinal: int) -> bool:
        if not self._drain():
            return False
        done = self._first(self.first.complete_edge, ordinal)
        return self._drain() and bool(done)

    def complete(self) -> bool:
        if not self._drain():
            return False
        if not self._first_done:
            done = self._first(self.first.complete)
            if not self._drain() or not done:
                return False
            self._first_done = True
        if not self._edge_done:
            if not self.second.complete_edge(self.ordinal):
                return False
            self._edge_done = True
        return bool(self.second.complete())

    def save_to_snapshot(self) -> bool:
        # ``first`` saves first: a chain's inner pair drains what it holds between its
        # two there (and a producer that keeps no state saves nothing)
        if not self._drain() or not self._flush_snapshot():
            return False
        if not self._first_saved:
            done = self._save_first()
            if not self._flush_snapshot() or not self._drain() or not done:
                return False
            self._first_saved = True
        if not self.second.save_to_snapshot():
            return False
        self._first_saved = False
        return True

    def close(self) -> None:
        try:
            self._first(self.first.close)
        finally:
            self.second.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.first!r} -> {self.second!r})"
