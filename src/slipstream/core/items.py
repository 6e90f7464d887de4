"""Special items that travel on edges beside user data.

Processors only ever see :class:`Watermark` (through ``try_process_watermark``); the
other items (idle marks, snapshot barriers, end of stream) are consumed by the engine's
tasklet. On an edge queue a special item always travels on its own, never inside a chunk
of data, so consumers can tell data from control without a per-item type check.
"""

from __future__ import annotations

from typing import Any, Final

from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK

__all__ = [
    "Watermark",
    "IdleMessage",
    "IDLE_MESSAGE",
    "SnapshotBarrier",
    "DoneItem",
    "DONE_ITEM",
    "NO_WATERMARK",
    "MAX_TIMESTAMP",
]


class Watermark:
    """An assertion that no more items with a timestamp below ``timestamp`` will follow.

    A processor emits one by offering it to its outbox; the engine then broadcasts it on
    every outbound edge regardless of the edge's routing.
    """

    __slots__ = ("timestamp",)

    def __init__(self, timestamp: int) -> None:
        self.timestamp = timestamp

    def __eq__(self, other: object) -> bool:
        return type(other) is Watermark and other.timestamp == self.timestamp

    def __hash__(self) -> int:
        return hash(("wm", self.timestamp))

    def __lt__(self, other: Watermark) -> bool:
        return self.timestamp < other.timestamp

    def __repr__(self) -> str:
        return f"Watermark({self.timestamp})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Watermark, (self.timestamp,))


class IdleMessage:
    """Jet's IDLE message: "this input has nothing to say; leave it out of the minimum".

    A source emits :data:`IDLE_MESSAGE` (``slipstream.watermark.IDLE``) when it has no data.
    Downstream tasklets exclude idle inputs from watermark coalescing; processors never
    see the message.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "IDLE"

    def __reduce__(self) -> str:
        return "IDLE_MESSAGE"


IDLE_MESSAGE: Final = IdleMessage()


class SnapshotBarrier:
    """Marks the point in a stream where snapshot ``snapshot_id`` is taken.

    ``is_terminal`` barriers end the job after the snapshot (suspend, graceful restart);
    they are always aligned exactly-once.
    """

    __slots__ = ("snapshot_id", "is_terminal")

    def __init__(self, snapshot_id: int, is_terminal: bool = False) -> None:
        self.snapshot_id = snapshot_id
        self.is_terminal = is_terminal

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is SnapshotBarrier
            and other.snapshot_id == self.snapshot_id
            and other.is_terminal == self.is_terminal
        )

    def __hash__(self) -> int:
        return hash(("barrier", self.snapshot_id, self.is_terminal))

    def __repr__(self) -> str:
        t = ", terminal" if self.is_terminal else ""
        return f"SnapshotBarrier({self.snapshot_id}{t})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SnapshotBarrier, (self.snapshot_id, self.is_terminal))


class DoneItem:
    """End of stream: the producer that sent it will send nothing more."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"

    def __reduce__(self) -> str:
        return "DONE_ITEM"


DONE_ITEM: Final = DoneItem()
