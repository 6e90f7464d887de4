"""The child-process side of tests/execution/test_channels.py (imported as a plain module,
so a forkserver child can import these functions by name). Each takes its control
connection to the parent last."""

from __future__ import annotations

import enum
import socket
import time
from dataclasses import dataclass
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import SpscQueue
from slipstream.execution.remote import ChannelReceiver, ChannelSender
from slipstream.execution.tasklet import NO_PROGRESS

LABEL = "edge 'tokens' -> 'counts' (ordinal 0)"


@dataclass(frozen=True)
class Point:
    """A user's class: items of it cross by pickle."""

    x: int
    y: float


class Level(enum.IntEnum):
    """An int subclass: marshal would flatten it to an int, so it must cross by pickle."""

    LOW = 1


def take_all(q: SpscQueue, out: list[Any]) -> None:
    """The consumer's part: take every entry, flattened to items and special items."""
    entries = q.entries
    taken = 0
    while entries:
        e = entries.popleft()
        if type(e) is list:
            out.extend(e)
            taken += len(e)
        else:
            out.append(e)
            taken += 1
    q.take_count += taken


def receive_lanes(
    sock: socket.socket,
    member: int,
    lanes: list[tuple[int, int]],
    capacity: int,
    wait_for_go: bool,
    control: Any,
) -> None:
    """Receive every lane to its end and send back what each lane's consumer saw. With
    ``wait_for_go`` the receiver does not run until the parent sends ``"go"``."""
    r = ChannelReceiver(sock, LABEL, member)
    queues = {k: r.lane(p, c, capacity) for k in lanes for p, c in [k]}
    control.send("ready")
    if wait_for_go:
        assert control.recv() == "go"
    got: dict[tuple[int, int], list[Any]] = {k: [] for k in lanes}
    while not r.done:
        idle = r.call() == NO_PROGRESS
        for k, q in queues.items():
            take_all(q, got[k])
        if idle:
            time.sleep(0.0002)
    for k, q in queues.items():
        take_all(q, got[k])
    control.send(got)


def receive_stream(
    sock: socket.socket, member: int, lane: tuple[int, int], capacity: int, control: Any
) -> None:
    """Feed one lane into an inbound edge stream (as a processor tasklet does) and send
    back the flat log of what the stream reported: items, then ``("wm", t)``,
    ``("barrier", id, terminal)``, ``("done",)`` where the stream reported them."""
    r = ChannelReceiver(sock, LABEL, member)
    stream = InboundEdgeStream(0, 0, [r.lane(*lane, capacity)], exactly_once=True, label=LABEL)
    control.send("ready")
    inbox = Inbox()
    log: list[Any] = []
    while not stream.done:
        idle = r.call() == NO_PROGRESS
        if stream.drain_to(inbox):
            log.extend(inbox)
            inbox.clear()
            if stream.wm_out is not None:
                log.append(("wm", stream.wm_out))
            if stream.barrier_out is not None:
                b = stream.barrier_out
                log.append(("barrier", b.snapshot_id, b.is_terminal))
            if stream.done:
                log.append(("done",))
        elif idle:
            time.sleep(0.0002)
    while not r.done:  # the sender closes once it has every acknowledgement
        if r.call() == NO_PROGRESS:
            time.sleep(0.0002)
    control.send(log)


def send_then_hang(
    sock: socket.socket, member: int, lane: tuple[int, int], entries: list[Any], control: Any
) -> None:
    """Send ``entries`` (not ending the lane), tell the parent, then wait to be killed."""
    s = ChannelSender(sock, LABEL, member)
    q = s.lane(*lane, 1024)
    for e in entries:
        assert q.offer(e, len(e) if type(e) is list else 1)
    while q.entries or s._out is not None:
        s.call()
    control.send("sent")
    control.recv()  # never comes: the parent kills this process
