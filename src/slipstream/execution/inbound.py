"""One inbound edge of one processor: its channels (one per upstream producer,
:class:`~slipstream.execution.channels.ChannelReader`), watermark
coalescing across them, barrier alignment, and end-of-stream detection (Jet's
``ConcurrentInboundEdgeStream``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.items import (
    IDLE_MESSAGE,
    NO_WATERMARK,
    DoneItem,
    IdleMessage,
    SnapshotBarrier,
    Watermark,
)
from slipstream.execution.channels import ChannelReader
from slipstream.execution.coalescer import NO_NEW_WM, WatermarkCoalescer


class SnapshotOrderError(Exception):
    pass


class InboundEdgeStream:
    """After ``drain_to`` the results of that drain are in ``wm_out`` (a timestamp,
    ``IDLE_MESSAGE`` or ``None``), ``barrier_out`` (a completed barrier or ``None``) and
    ``done`` (every producer finished)."""

    __slots__ = (
        "ordinal",
        "priority",
        "queues",
        "live",
        "coalescer",
        "exactly_once",
        "barrier_at",
        "barrier_count",
        "current_barrier",
        "wm_out",
        "barrier_out",
        "done",
        "items_in",
        "label",
        "skip_below",
        "held_wm",
    )

    def __init__(
        self,
        ordinal: int,
        priority: int,
        queues: Sequence[ChannelReader],
        exactly_once: bool = True,
        label: str = "",
    ) -> None:
        self.ordinal = ordinal
        self.priority = priority
        self.queues = list(queues)
        self.live = list(range(len(self.queues)))
        self.label = label or f"ordinal {ordinal}"
        self.coalescer = WatermarkCoalescer(
            len(self.queues), [f"{self.label}, upstream queue {i}" for i in range(len(self.queues))]
        )
        self.exactly_once = exactly_once
        self.barrier_at = [False] * len(self.queues)
        self.barrier_count = 0
        self.current_barrier: SnapshotBarrier | None = None
        self.wm_out: Any = None
        self.barrier_out: SnapshotBarrier | None = None
        self.done = not self.queues
        self.items_in = 0
        self.skip_below = NO_WATERMARK
        self.held_wm: Any = None

    def drain_to(self, inbox: Inbox, wm_relevant_from: int = NO_WATERMARK) -> bool:
        """Move available items into ``inbox``; stop early when a watermark, a completed
        barrier or the end of the edge must be reported. Returns whether anything was
        consumed.

        ``wm_relevant_from`` is the processor's ``min_relevant_watermark()``: a coalesced
        watermark below it, which the processor would only forward, does not stop the
        drain, and when the drain brought items it is *held* (not reported) while more
        items keep coming: a later watermark replaces it, and it is reported by the
        first drain that finds no items, or before a special item other than a
        watermark (idle mark, barrier, end of stream) is taken. So a processor fed a
        watermark per input chunk sees one per lull or per relevant step instead."""
        self.skip_below = wm_relevant_from
        self.wm_out = None
        self.barrier_out = None
        held = self.held_wm
        progress = False
        stop = False
        queues = self.queues
        barrier_at = self.barrier_at
        idle = self.coalescer.idle
        for qi in list(self.live):
            if barrier_at[qi] and (self.exactly_once or self.current_barrier.is_terminal):  # type: ignore[union-attr]
                continue
            entries = queues[qi].entries
            taken = 0
            while entries:
                entry = entries[0]
                if type(entry) is list:
                    entries.popleft()
                    inbox.extend(entry)
                    taken += len(entry)
                    if idle[qi]:  # data makes an idle queue active again
                        self.coalescer.observe_event(qi)
                    continue
                if type(entry) is not Watermark and (held is not None or self.wm_out is not None):
                    # a held or skipped watermark goes first; the special item waits
                    if self.wm_out is None:
                        self.wm_out = held
                    held = None
                    stop = progress = True
                    break
                entries.popleft()
                taken += 1
                progress = True
                stop = self._special(qi, entry)
                if self.wm_out is not None:
                    held = None  # replaced by a later watermark
                if stop or (
                    barrier_at[qi]
                    and (self.exactly_once or self.current_barrier.is_terminal)  # type: ignore[union-attr]
                ):
                    break
            if taken:
                queues[qi].take_count += taken
                progress = True
            if stop:
                break
        else:
            # the periodic check (Jet polls it after every drain): an idle mark owed
            # since every queue went idle or finished after the top watermark went out
            if self.coalescer.idle_pending and self.wm_out is None and held is None:
                self.wm_out = self.coalescer.check_pending_idle()
                progress = True
        n = len(inbox)
        if n:
            self.items_in += n
            wm = self.wm_out
            if not stop and wm is not None and wm is not IDLE_MESSAGE and wm < wm_relevant_from:
                # only to be forwarded, and items are flowing: hold it
                held = wm
                self.wm_out = None
        elif held is not None and self.wm_out is None:
            # a lull: report the held watermark
            self.wm_out = held
            held = None
            progress = True
        self.held_wm = held
        return progress

    def _special(self, qi: int, item: Any) -> bool:
        """Handle a special item from queue ``qi``; ``True`` if the drain must stop to
        report something."""
        t = type(item)
        if t is Watermark or t is IdleMessage:
            v = IDLE_MESSAGE if t is IdleMessage else item.timestamp
            out = self.coalescer.observe_wm(qi, v)
            if out is not NO_NEW_WM:
                self.wm_out = out
                # a watermark the processor would only forward does not stop the drain
                return out is IDLE_MESSAGE or out >= self.skip_below
            return False
        if t is SnapshotBarrier:
            cur = self.current_barrier
            if cur is not None and cur.snapshot_id != item.snapshot_id:
                raise SnapshotOrderError(
                    f"{self.label}: barrier {item.snapshot_id} while aligning {cur.snapshot_id}"
                )
            if self.barrier_at[qi]:
                raise SnapshotOrderError(f"{self.label}: two barriers on queue {qi}")
            self.current_barrier = item
            self.barrier_at[qi] = True
            self.barrier_count += 1
            return self._check_barrier()
        if t is DoneItem:
            self.live.remove(qi)
            if self.barrier_at[qi]:
                self.barrier_at[qi] = False
                self.barrier_count -= 1
            out = self.coalescer.queue_done(qi)
            if out is not NO_NEW_WM:
                self.wm_out = out
            if not self.live:
                self.done = True
                return True
            stop = self._check_barrier()
            return stop or out is not NO_NEW_WM
        raise TypeError(f"{self.label}: unexpected special item {item!r}")

    def _check_barrier(self) -> bool:
        if self.current_barrier is not None and self.barrier_count == len(self.live):
            self.barrier_out = self.current_barrier
            self.current_barrier = None
            self.barrier_at = [False] * len(self.queues)
            self.barrier_count = 0
            return True
        return False
