"""The child-process side of tests/execution/test_channels.py (imported as a plain module,
so a forkserver child can import these functions by name). Each takes its control
connection to the parent last."""

from __future__ import annotations

import enum
import functools
import operator
import socket
import time
from dataclasses import dataclass
from typing import Any

from slipstream.core.config import JobConfig, ProcessingGuarantee
from slipstream.core.dag import DAG, Edge
from slipstream.core.inbox import Inbox
from slipstream.core.items import SnapshotBarrier, Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.services import InMemoryServices
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.plan import build_vertex_plans, wire
from slipstream.execution.queues import SpscQueue
from slipstream.execution.remote import ChannelReceiver, ChannelSender, MemberChannels
from slipstream.execution.tasklet import DONE, NO_PROGRESS, ProcessorTasklet

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


# -- a DAG split over member processes ---------------------------------------------------


class Numbers(AbstractProcessor):
    """Emits its share (by global index) of ``range(n)`` as ``(key, value)`` with a
    watermark after every 50th value, at most 7 entries per call (so a snapshot can fall
    in the middle); ``saved_at``: the items it had emitted when it saved its snapshot."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.emitted = 0
        self.saved_at = -1

    def init_processor(self, context: Context) -> None:
        mine = range(context.global_processor_index, self.n, context.total_parallelism)
        self._it = iter(
            [
                y
                for v in mine
                for y in ([(v % 13, v), Watermark(v)] if v % 50 == 0 else [(v % 13, v)])
            ]
        )
        self._next: Any = None

    def complete(self) -> bool:
        for _ in range(7):
            if self._next is None:
                self._next = next(self._it, None)
                if self._next is None:
                    return True
            if not self.try_emit(self._next):
                return False
            if type(self._next) is not Watermark:
                self.emitted += 1
            self._next = None
        return False

    def save_to_snapshot(self) -> bool:
        self.saved_at = self.emitted
        return True


class Tag(AbstractProcessor):
    """Passes ``(key, value)`` on as ``(key, value, its own global index)``."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit((*item, self.context.global_processor_index))


class Gather(AbstractProcessor):
    """Keeps what reaches it: items in ``got``, watermark timestamps in ``wms``."""

    def init_processor(self, context: Context) -> None:
        self.got: list[Any] = []
        self.wms: list[int] = []
        self.saved_at = -1

    def save_to_snapshot(self) -> bool:
        self.saved_at = len(self.got)
        return True

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.got.append(item)
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.wms.append(watermark.timestamp)
        return True


def tagged_dag(n: int) -> DAG:
    """numbers (2 per member) -partitioned, distributed-> tag (2 per member)
    -distributed, all-to-one-> gather (1 per member)."""
    dag = DAG()
    src = dag.new_vertex("numbers", functools.partial(Numbers, n)).local_parallelism(2)
    tag = dag.new_vertex("tag", Tag).local_parallelism(2)
    out = dag.new_vertex("gather", Gather).local_parallelism(1)
    dag.edge(Edge.between(src, tag).partitioned(operator.itemgetter(0)).distributed())
    dag.edge(Edge.between(tag, out).distributed().all_to_one())
    return dag


def plans_of(dag: DAG, members: int) -> Any:
    return build_vertex_plans(dag, JobConfig(), members, 2, InMemoryServices(), "channels")


def run_tasklets(tasklets: list[Any]) -> None:
    """Call every tasklet until all are done (a worker's loop, without its threads)."""
    live = list(tasklets)
    while live:
        progress = False
        for t in list(live):
            r = t.call()
            if r == DONE:
                live.remove(t)
            if r != NO_PROGRESS:
                progress = True
        if not progress:
            time.sleep(0.0002)


def gathered(specs: list[Any]) -> dict[int, tuple[list[Any], list[int]]]:
    """What each gather processor of ``specs`` kept, by global index."""
    return {
        s.global_index: (s.processor.got, s.processor.wms)
        for s in specs
        if s.vertex.vertex.name == "gather"
    }


class OneSnapshot:
    """A snapshot sink (the tasklet's ``SnapshotSink``) that asks sources for snapshot 1
    once they have called it ``after`` times, and records which processors saved it."""

    hold_sources = False

    def __init__(self, after: int) -> None:
        self.after = after
        self.calls = 0
        self.saved: list[tuple[str, int]] = []

    def requested_snapshot(self) -> SnapshotBarrier | None:
        self.calls += 1
        return SnapshotBarrier(1) if self.calls > self.after else None

    def add_entries(self, tasklet: Any, snapshot_id: int, entries: list[Any]) -> None:
        pass

    def processor_done(self, tasklet: Any, barrier: SnapshotBarrier) -> None:
        self.saved.append((tasklet.vertex_name, tasklet.index))

    def add_completion_entries(self, tasklet: Any, entries: list[Any]) -> None:
        pass

    def tasklet_completed(self, tasklet: Any) -> None:
        pass


def run_member(
    dag: DAG,
    member: int,
    members: int,
    sockets: dict[Any, socket.socket],
    snapshot_after: int | None,
    control: Any,
) -> None:
    """Run one member's share of ``dag``: its processors, wired with ``MemberChannels``,
    beside its senders and receivers; send back what its gather processors kept. With
    ``snapshot_after``, exactly-once with one snapshot (:class:`OneSnapshot`); then also
    what each processor had done when it saved, and which processors saved."""
    plans = plans_of(dag, members)
    channels = MemberChannels(member, dag, plans, sockets)
    sink = OneSnapshot(snapshot_after) if snapshot_after is not None else None
    guarantee = ProcessingGuarantee.EXACTLY_ONCE if sink else ProcessingGuarantee.NONE
    specs = wire(dag, plans, guarantee, channels, member=member)
    tasklets = [
        ProcessorTasklet(
            s.processor, s.context, s.inbound, s.outbound, guarantee=guarantee, snapshot_sink=sink
        )
        for s in specs
    ]
    for t in tasklets:
        t.init()
    control.send("ready")
    run_tasklets([*tasklets, *channels.tasklets])
    saved = {
        (s.vertex.vertex.name, s.global_index): getattr(s.processor, "saved_at", None)
        for s in specs
    }
    control.send((gathered(specs), saved, sink.saved if sink else []))
