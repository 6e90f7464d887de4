"""Worker threads running cross-process channel tasklets (engine/workers.py with
slipstream.execution.remote): an idle worker waits on its channels' sockets, so a frame
or a credit report ends its pause; a sender never asks to be woken by reports it would
leave unread (that would spin); two pools joined by a channel run a job's edge to the
end, as two member processes will."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from slipstream.core.inbox import Inbox
from slipstream.core.items import DONE_ITEM, Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.engine.workers import WorkerPool, wait_idle
from slipstream.execution.collectors import RoundRobinCollector
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.remote import ChannelReceiver, ChannelSender
from slipstream.execution.tasklet import ProcessorTasklet

LABEL = "edge 'src' -> 'sink' (ordinal 0)"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_an_idle_worker_wakes_when_a_frame_arrives(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    receiver.lane(0, 1, 8)
    assert wait_idle([receiver], 0.001) is False  # nothing came: the pause ran out
    sender.lane(0, 1, 8).offer([1, 2], 2)
    sender.call()
    # a frame waits: the pause ends at once (were it slept, this would wait a minute and
    # still return False)
    assert wait_idle([receiver], 60.0) is True


def test_a_sender_does_not_wait_on_reports_it_would_leave_unread(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1, window=16)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 64)
    r = receiver.lane(0, 1, 64)
    q.offer([1, 2, 3], 3)
    sender.call()
    receiver.call()  # decodes the frame and acknowledges it
    r.entries.clear()
    r.take_count += 3
    receiver.call()  # reports the lane taken
    # one frame in flight of 16, credit to spare: the sender reads its reports later, so
    # its readable socket must not end an idle worker's pause over and over
    assert sender.in_flight == 1
    assert sender.waits_on() == ([], [])
    assert receiver.waits_on() == ([b], [])


class Numbers(AbstractProcessor):
    def __init__(self, n: int) -> None:
        self.n = n

    def init_processor(self, context: Context) -> None:
        self._it = iter(
            [y for v in range(self.n) for y in ((v, Watermark(v)) if v % 100 == 0 else (v,))]
        )

    def complete(self) -> bool:
        return self.emit_from(self._it)


class Keep(AbstractProcessor):
    def init_processor(self, context: Context) -> None:
        self.got: list[Any] = []
        self.wms: list[int] = []

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.got.extend(inbox)
        inbox.clear()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.wms.append(watermark.timestamp)
        return True


def test_two_worker_pools_joined_by_a_channel_run_an_edge_to_its_end(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1, window=2, batch_items=64)
    receiver = ChannelReceiver(b, LABEL, 0)
    src = ProcessorTasklet(
        Numbers(20_000), Context(), [], [RoundRobinCollector([sender.lane(0, 1, 256)])]
    )
    keep = Keep()
    sink = ProcessorTasklet(
        keep, Context(), [InboundEdgeStream(0, 0, [receiver.lane(0, 1, 256)], label=LABEL)], []
    )
    failures: list[Any] = []
    done = [threading.Event(), threading.Event()]
    pools = [
        WorkerPool([src, sender], 1, failures.append, done[0].set, name="member-0"),  # type: ignore[list-item]
        WorkerPool([receiver, sink], 1, failures.append, done[1].set, name="member-1"),  # type: ignore[list-item]
    ]
    for t in (src, sink):
        t.init()
    for p in pools:
        p.start()
    for d in done:
        assert d.wait(120)
    assert not failures
    assert keep.got == list(range(20_000))
    assert keep.wms == list(range(0, 20_000, 100))
    assert sender.done and receiver.done
    assert DONE_ITEM not in keep.got
