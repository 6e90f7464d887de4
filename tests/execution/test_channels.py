"""Cross-process channels (issue 24, slipstream.execution.remote): what a producer offers
into a lane arrives in order and unchanged at the consumer in another OS process (items of
plain and user types, watermarks, idle marks, snapshot barriers, end of stream), credits
bound what is in flight (a receiver that does not run stops its sender after ``window``
frames, a consumer that does not read one lane stops only that lane), and a peer that
died is a clear error naming the edge and the member.

Child processes start with the ``forkserver`` method, the one docs/internals.md
("Channels") recommends: the test process has threads, and a plain fork with threads
alive can copy a lock another thread holds. Every wait below waits for an event (a
message from the child, a counter of the channel), never for a time."""

from __future__ import annotations

import collections
import copyreg
import marshal
import multiprocessing
import pickle
import socket
import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from channel_peer import (
    LABEL,
    Level,
    Point,
    gathered,
    plans_of,
    receive_lanes,
    receive_stream,
    run_member,
    run_tasklets,
    send_then_hang,
    tagged_dag,
    take_all,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import (
    DONE_ITEM,
    IDLE_MESSAGE,
    DoneItem,
    IdleMessage,
    SnapshotBarrier,
    Watermark,
)
from slipstream.execution.channels import Channel, ChannelReader, ChannelWriter
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.plan import wire
from slipstream.execution.queues import SpscQueue
from slipstream.execution.remote import (
    LANE_CREDIT,
    ChannelPeerError,
    ChannelReceiver,
    ChannelSender,
    _plain_namedtuple,
    channel_pairs,
    channel_sockets,
    pack_rows,
    unpack_rows,
)
from slipstream.execution.tasklet import DONE, ProcessorTasklet
from slipstream.window import KeyedWindowResult

CTX = multiprocessing.get_context("forkserver")
#: only a guard against a hung test: every wait ends on an event long before
GUARD_S = 120.0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def size_of(entry: Any) -> int:
    return len(entry) if type(entry) is list else 1


def flat(entries: list[Any]) -> list[Any]:
    out: list[Any] = []
    for e in entries:
        if type(e) is list:
            out.extend(e)
        else:
            out.append(e)
    return out


def lane_entries(lane: int) -> list[Any]:
    """Chunks of every kind of item (plain, tuples, nested, a user's class, an int
    subclass that marshal must not flatten) between every kind of special item. Lane 2
    ends with a terminal barrier (suspend: nothing follows it, it ends the lane), the
    others with a barrier and end of stream."""
    out: list[Any] = []
    for i in range(40):
        base = lane * 100_000 + i * 100
        out.append(list(range(base, base + 1 + i % 7)))
        out.append([(f"w{base + j}", j, j / 3) for j in range(i % 5 + 1)])
        if i % 4 == 0:
            out.append([{"k": [base, (1, 2)]}, Point(base, 0.5), True, None, b"\x00"])
            out.append([bytearray(b"ab"), Level.LOW, 2**70])
        out.append(Watermark(base))
        if i % 10 == 3:
            out.append(IDLE_MESSAGE)
        if i % 10 == 7:
            out.append(SnapshotBarrier(i // 10 + 1))
    out.append(SnapshotBarrier(9, is_terminal=lane == 2))
    if lane != 2:
        out.append(DONE_ITEM)
    return out


def offer_all(sender: ChannelSender, queues: list[SpscQueue], pending: list[list[Any]]) -> bool:
    """Offer what the lanes take, call the sender once; ``True`` once all is offered."""
    for q, entries in zip(queues, pending, strict=True):
        while entries and q.offer(entries[0], size_of(entries[0])):
            entries.pop(0)
    sender.call()
    return not any(pending)


def pump(
    sender: ChannelSender, q: SpscQueue, receiver: ChannelReceiver, r: Any, entries: list[Any]
) -> list[Any]:
    """Offer ``entries`` to lane ``q`` as it takes them and call the pair until both are
    done; what lane ``r`` received."""
    pending = [list(entries)]
    got: list[Any] = []
    while not (sender.done and receiver.done):
        offer_all(sender, [q], pending)
        receiver.call()
        take_all(r, got)
    take_all(r, got)
    return got


def start(target: Any, sock: socket.socket, *args: Any) -> tuple[Any, Any]:
    """Start ``target(sock, *args, control)`` in a forkserver child; close this
    process's copy of ``sock`` (the child's is then the only one: its death closes it)."""
    parent, child = CTX.Pipe()
    p = CTX.Process(target=target, args=(sock, *args, child), daemon=True)
    p.start()
    child.close()
    sock.close()
    assert parent.poll(GUARD_S), "the child did not start"
    return p, parent


# -- the seam -------------------------------------------------------------------------


def test_the_in_process_queue_is_a_channel() -> None:
    q: Channel = SpscQueue(4, "a#0->b#0")
    w: ChannelWriter = q
    r: ChannelReader = q
    assert w.offer([1, 2, 3], 3) and w.offer(Watermark(5), 1)
    assert not w.offer([4], 1)  # full: 4 items in a channel of capacity 4
    assert r.entries.popleft() == [1, 2, 3]
    r.take_count += 3
    assert r.size() == 1 and w.offer([4], 1)


# -- across a process boundary ----------------------------------------------------------


@pytest.mark.timeout(GUARD_S)
def test_every_kind_of_entry_arrives_in_order_and_unchanged(pair: Any) -> None:
    a, b = pair
    lanes = [(0, 2), (1, 2), (0, 3)]
    p, control = start(receive_lanes, b, 0, lanes, 32, False)
    assert control.recv() == "ready"
    sender = ChannelSender(a, LABEL, 1, pid=p.pid, window=2, batch_items=16)
    queues = [sender.lane(pr, c, 32) for pr, c in lanes]
    expected = [lane_entries(i) for i in range(len(lanes))]
    pending = [list(e) for e in expected]
    while not offer_all(sender, queues, pending):
        pass
    while sender.call() != DONE:
        pass
    assert control.poll(GUARD_S)
    got = control.recv()
    p.join(GUARD_S)
    assert p.exitcode == 0
    for k, lane in enumerate(lanes):
        want = flat(expected[k])
        assert got[lane] == want
        assert [type(x) for x in got[lane]] == [type(x) for x in want]
    assert got[lanes[0]][-1] is DONE_ITEM  # the singletons stay singletons
    assert got[lanes[2]][-1] == SnapshotBarrier(9, is_terminal=True)
    assert IDLE_MESSAGE in got[lanes[0]]
    assert sender.frames_sent > 20  # many frames, so credits went round many times


@pytest.mark.timeout(GUARD_S)
def test_an_inbound_stream_in_the_child_sees_what_it_sees_in_process(pair: Any) -> None:
    a, b = pair
    p, control = start(receive_stream, b, 0, (0, 1), 8)
    assert control.recv() == "ready"
    entries: list[Any] = [
        [1, 2],
        [3],
        Watermark(10),
        [("a", 1)],
        IDLE_MESSAGE,
        [4],
        Watermark(20),
        SnapshotBarrier(1),
        [5, 6, 7],
        DONE_ITEM,
    ]
    sender = ChannelSender(a, LABEL, 1, pid=p.pid, window=1, batch_items=2)
    q = sender.lane(0, 1, 8)
    pending = [list(entries)]
    while not offer_all(sender, [q], pending):
        pass
    while sender.call() != DONE:
        pass
    assert control.poll(GUARD_S)
    log = control.recv()
    p.join(GUARD_S)
    # the same stream fed in process
    local = SpscQueue(100)
    for e in entries:
        local.offer(e, size_of(e))
    stream = InboundEdgeStream(0, 0, [local], exactly_once=True, label=LABEL)
    inbox = Inbox()
    want: list[Any] = []
    while not stream.done:
        stream.drain_to(inbox)
        want.extend(inbox)
        inbox.clear()
        if stream.wm_out is not None:
            want.append(("wm", stream.wm_out))
        if stream.barrier_out is not None:
            want.append(("barrier", stream.barrier_out.snapshot_id, False))
        if stream.done:
            want.append(("done",))
    assert log == want == [
        1, 2, 3, ("wm", 10), ("a", 1), ("wm", IDLE_MESSAGE), 4, ("wm", 20),
        ("barrier", 1, False), 5, 6, 7, ("done",),
    ]  # fmt: skip


@pytest.mark.timeout(GUARD_S)
def test_a_receiver_that_does_not_run_stops_its_sender_after_the_window(pair: Any) -> None:
    a, b = pair
    lane = (0, 1)
    p, control = start(receive_lanes, b, 0, [lane], 64, True)
    assert control.recv() == "ready"
    sender = ChannelSender(a, LABEL, 1, pid=p.pid, window=3, batch_items=8)
    q = sender.lane(*lane, 64)
    entries: list[Any] = [[i] for i in range(1000)] + [DONE_ITEM]
    pending = list(entries)
    # offer and send until the sender is out of credits and the lane's queue is full
    while not (sender.in_flight == sender.window and q.size() >= 64):
        while pending and q.offer(pending[0], size_of(pending[0])):
            pending.pop(0)
        sender.call()
    assert sender.frames_sent == 3 and sender.items_sent == 24
    for _ in range(100):  # it stays stopped
        sender.call()
    assert sender.frames_sent == 3
    assert not q.offer([0], 1)
    assert q.size() >= 64
    # the receiver runs: credits come back and everything goes through
    control.send("go")
    while not offer_all(sender, [q], [pending]):
        pass
    while sender.call() != DONE:
        pass
    assert control.poll(GUARD_S)
    got = control.recv()
    p.join(GUARD_S)
    assert got[lane] == flat(entries)


@pytest.mark.timeout(GUARD_S)
def test_a_sender_whose_receiver_died_names_the_edge_and_the_member(pair: Any) -> None:
    a, b = pair
    p, control = start(receive_lanes, b, 0, [(0, 1)], 64, True)
    assert control.recv() == "ready"
    sender = ChannelSender(a, LABEL, 1, pid=p.pid)
    q = sender.lane(0, 1, 64)
    p.kill()
    p.join(GUARD_S)
    assert q.offer([1, 2, 3], 3)
    with pytest.raises(ChannelPeerError) as e:
        while True:
            sender.call()
    assert str(e.value) == (
        f"{LABEL}: the channel to member 1 (pid {p.pid}) closed before the edge ended: "
        "member 1 died or closed its end (seen by the sender)"
    )


@pytest.mark.timeout(GUARD_S)
def test_a_receiver_whose_sender_died_names_the_edge_and_the_member(pair: Any) -> None:
    a, b = pair
    p, control = start(send_then_hang, a, 0, (0, 1), [[1, 2], Watermark(3)])
    assert control.recv() == "sent"
    receiver = ChannelReceiver(b, LABEL, 0, pid=p.pid)
    q = receiver.lane(0, 1, 64)
    got: list[Any] = []
    while len(got) < 3:  # what was sent before the death still arrives
        receiver.call()
        take_all(q, got)
    assert got == [1, 2, Watermark(3)]
    p.kill()
    p.join(GUARD_S)
    with pytest.raises(ChannelPeerError) as e:
        while True:
            receiver.call()
    assert str(e.value) == (
        f"{LABEL}: the channel from member 0 (pid {p.pid}) closed before the edge ended: "
        "member 0 died or closed its end (seen by the receiver)"
    )


def run_split(dag: Any, plans: Any, snapshot_after: int | None) -> tuple[Any, Any, Any]:
    """Run ``dag`` with one member per forkserver process; returns what the gather
    processors kept, what each processor had done at its save, and who saved."""
    sockets = channel_sockets(dag, plans)
    children = []
    for m in (0, 1):
        mine = {k: ends[0] if k[1] == m else ends[1] for k, ends in sockets.items() if m in k[1:]}
        parent, child = CTX.Pipe()
        p = CTX.Process(
            target=run_member, args=(dag, m, 2, mine, snapshot_after, child), daemon=True
        )
        p.start()
        child.close()
        children.append((p, parent))
    for ends in sockets.values():
        for sock in ends:
            sock.close()
    for _p, control in children:
        assert control.poll(GUARD_S) and control.recv() == "ready"
    got: dict[int, Any] = {}
    saved: dict[Any, Any] = {}
    savers: list[Any] = []
    for p, control in children:
        assert control.poll(GUARD_S)
        kept, at, who = control.recv()
        got.update(kept)
        saved.update(at)
        savers += who
        p.join(GUARD_S)
        assert p.exitcode == 0
    return got, saved, savers


@pytest.mark.timeout(GUARD_S)
def test_a_snapshot_across_two_processes_is_consistent() -> None:
    """Exactly-once, one snapshot taken while items flow: the barriers travel in band
    across the processes and align at every processor (from a local and a remote
    producer), so what the sources had emitted when they saved is exactly what reached
    the gather processor before it saved; every processor of both members saved."""
    n = 20_000
    dag = tagged_dag(n)
    plans = plans_of(dag, 2)
    got, saved, savers = run_split(dag, plans, 40)
    sources = sum(saved[("numbers", g)] for g in range(4))
    gathers = sum(saved[("gather", g)] for g in range(2) if saved[("gather", g)] >= 0)
    assert 0 < sources < n  # the snapshot fell in the middle of the stream
    assert gathers == sources
    # the gather processor the all-to-one edge does not feed completed at once, before
    # the snapshot: it takes part in none
    (fed,) = [g for g in (0, 1) if got[g][0]]
    assert saved[("gather", 1 - fed)] == -1
    assert sorted(savers) == sorted(
        [("numbers", g) for g in range(4)] + [("tag", g) for g in range(4)] + [("gather", fed)]
    )
    everything = sorted(item[:2] for items, _ in got.values() for item in items)
    assert everything == sorted((v % 13, v) for v in range(n))


@pytest.mark.timeout(GUARD_S)
def test_a_dag_split_over_two_processes_runs_as_with_two_simulated_members() -> None:
    """plan.wire(member=m) with MemberChannels in each of two processes: every
    processor gets the items (and routing) it gets with members=2 in one process, and
    the watermarks after them."""
    n = 5_000
    dag = tagged_dag(n)
    # members=2 in one process: the reference
    plans = plans_of(dag, 2)
    specs = wire(dag, plans, ProcessingGuarantee.NONE)
    tasklets = [ProcessorTasklet(s.processor, s.context, s.inbound, s.outbound) for s in specs]
    for t in tasklets:
        t.init()
    run_tasklets(tasklets)
    want = gathered(specs)
    # the same DAG, one member per process
    pairs = channel_pairs(dag, plans)
    assert pairs == [(0, 0, 1), (0, 1, 0), (1, 0, 1)] or pairs == [(0, 0, 1), (0, 1, 0), (1, 1, 0)]
    got = run_split(dag, plans, None)[0]
    assert set(got) == set(want) == {0, 1}
    for g in want:
        items, wms = got[g]
        want_items, want_wms = want[g]
        assert sorted(items) == sorted(want_items)
        assert wms == sorted(wms) and wms[-1:] == want_wms[-1:]
    everything = sorted(item[:2] for items, _ in got.values() for item in items)
    assert everything == sorted((v % 13, v) for v in range(n))
    assert len(got[0][0]) + len(got[1][0]) == n and min(len(got[0][0]), len(got[1][0])) == 0


def test_wiring_one_member_needs_a_queue_factory() -> None:
    dag = tagged_dag(10)
    with pytest.raises(ValueError) as e:
        wire(dag, plans_of(dag, 2), ProcessingGuarantee.NONE, member=0)
    assert str(e.value) == "wire(member=...) needs a queue_factory for the cross-member pairs"


# -- in one process over a socket pair -------------------------------------------------


def test_a_lane_whose_consumer_does_not_read_stops_only_that_lane(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1, window=2, batch_items=16)
    receiver = ChannelReceiver(b, LABEL, 0)
    sq = [sender.lane(0, 2, 32), sender.lane(0, 3, 32)]
    rq = [receiver.lane(0, 2, 32), receiver.lane(0, 3, 32)]
    blocked: list[Any] = [[i] for i in range(200)] + [DONE_ITEM]
    flowing: list[Any] = [[i, i] for i in range(300)] + [DONE_ITEM]
    pending = [list(blocked), list(flowing)]
    got: list[Any] = []
    # lane 2's consumer never reads: lane 3 still runs to its end
    while not got or got[-1] is not DONE_ITEM:
        offer_all(sender, sq, pending)
        receiver.call()
        take_all(rq[1], got)
    assert got == flat(flowing)
    # the unread lane holds its credit (2 x its capacity) on the far side, and is out of it
    assert rq[0].size() == sender.sent[0] >= LANE_CREDIT * 32
    assert sender.taken[0] == 0
    assert not sq[0].offer([0], 1)  # so its producer is refused, as by a full queue
    assert len(pending[0]) > 100
    rest: list[Any] = []
    while sender.call() != DONE or not receiver.done:
        offer_all(sender, sq, pending)
        receiver.call()
        take_all(rq[0], rest)
    take_all(rq[0], rest)
    assert rest == flat(blocked)


def test_an_item_that_does_not_pickle_names_the_edge_and_its_type(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 8)
    q.offer([1, lambda x: x], 2)
    with pytest.raises(pickle.PicklingError) as e:
        sender.call()
    assert str(e.value) == (
        f"{LABEL}: sender to member 1: an item of type function cannot be pickled "
        "(AttributeError: Can't pickle local object 'test_an_item_that_does_not_pickle_"
        "names_the_edge_and_its_type.<locals>.<lambda>'); items that cross processes "
        "(distributed edges) must pickle"
    )


def test_the_two_ends_must_agree_on_the_lanes(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    sender.lane(0, 1, 8).offer(DONE_ITEM, 1)
    receiver.lane(0, 2, 8)
    sender.call()
    with pytest.raises(RuntimeError) as e:
        while True:
            receiver.call()
    assert str(e.value) == (
        f"{LABEL}: receiver from member 0: the two ends disagree on the lanes (producer, "
        "consumer): the sender has [(0, 1)] that this side lacks, this side has [(0, 2)] "
        "that the sender lacks"
    )


def test_frames_bigger_than_the_read_buffer_arrive_whole(pair: Any) -> None:
    """Frames of ~1 MiB (the receiver reads into a 256 KiB buffer that then grows), and
    small frames after them, arrive unchanged."""
    a, b = pair
    sender = ChannelSender(a, LABEL, 1, batch_items=100)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 1000)
    r = receiver.lane(0, 1, 1000)
    big = [bytes([i]) * 10_000 for i in range(100)]
    entries: list[Any] = [big, [1, 2], big[::-1], Watermark(7), [b"x" * 300_000], DONE_ITEM]
    got = pump(sender, q, receiver, r, entries)
    assert got == flat(entries)


def reports_on(sock: socket.socket) -> list[list[int]]:
    """The credit reports waiting on the sender's socket (read here, not by the sender):
    each ``[acknowledged frames, lane, taken, ...]``."""
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            break
        data += chunk
    out = []
    while data:
        (length,) = struct.unpack_from("!I", data)
        out.append(marshal.loads(data[4 : 4 + length]))
        data = data[4 + length :]
    return out


def test_a_lone_item_is_acknowledged_with_its_taken_count_in_one_report(pair: Any) -> None:
    """A receiver reports at its next call what it delivered, after the pass let the
    consumer take it: no report is sent between the item's arrival and its consumer
    (the send would delay the item), and one report per lone item carries both the
    frame's acknowledgement and the consumer's taken count (two before: the
    acknowledgement at once, the taken count at the next call)."""
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 8)
    r = receiver.lane(0, 1, 8)
    got: list[Any] = []
    for item in range(3):
        assert q.offer([item], 1)
        sender.call()  # one frame (the first one carries the lane table too)
        receiver.call()
        assert list(r.entries) == [[item]]
        assert reports_on(a) == []
        take_all(r, got)
        receiver.call()
        assert reports_on(a) == [[1, 0, item + 1]]
    assert got == [0, 1, 2]


def test_a_big_frame_is_acknowledged_at_once(pair: Any) -> None:
    """A frame of many items is acknowledged in the call that delivers it (its sender
    may be waiting on its window); what the consumer took goes with the next report."""
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 1000)
    r = receiver.lane(0, 1, 1000)
    assert q.offer(list(range(100)), 100)
    sender.call()
    receiver.call()
    assert reports_on(a) == [[1]]
    got: list[Any] = []
    take_all(r, got)
    receiver.call()
    assert reports_on(a) == [[0, 0, 100]]
    assert got == list(range(100))


def test_a_sender_yields_its_core_after_a_lone_frame_only(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After sending a frame of at most 16 items (a lone item, a watermark, a barrier)
    the sender yields its core: the receiving worker its send woke is queued there and
    runs now, not after the sender's next pass. A bigger frame (a busy stream) does not
    pay the system call. What the frames carry arrives in order, special items in-band,
    and the window still stops a sender whose receiver does not run."""
    import slipstream.execution.remote as remote

    yields: list[int] = []
    monkeypatch.setattr(remote, "yield_cpu", lambda: yields.append(sender.frames_sent))
    a, b = pair
    sender = ChannelSender(a, LABEL, 1, window=5)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 1000)
    r = receiver.lane(0, 1, 1000)
    lone: list[Any] = [[0], Watermark(5), [1], SnapshotBarrier(1), [2, 3]]
    for entry in lone:  # one frame each, each followed by a yield
        assert q.offer(entry, size_of(entry))
        sender.call()
    assert yields == [1, 2, 3, 4, 5]
    assert sender.call() != DONE and sender.frames_sent == 5  # nothing to send: no yield
    assert yields == [1, 2, 3, 4, 5]
    # the receiver has not run: a sixth frame waits for credit (5 in flight, window 5)
    assert q.offer([4], 1)
    sender.call()
    assert sender.frames_sent == 5 and len(yields) == 5
    got: list[Any] = []
    while len(flat(got)) < 6:
        receiver.call()
        while r.entries:
            got.append(r.entries.popleft())
    assert got == [[0], Watermark(5), [1], SnapshotBarrier(1), [2, 3]]
    r.take_count = r.put_count
    receiver.call()  # the acknowledgements
    sender.call()  # credit back: the waiting item goes, a lone frame again
    assert sender.frames_sent == 6 and yields[-1] == 6
    assert q.offer(list(range(100, 200)), 100)
    sender.call()  # 100 items: no yield
    assert sender.frames_sent == 7 and yields[-1] == 6
    while r.size() < 101:
        receiver.call()
    assert flat(list(r.entries)) == [4, *range(100, 200)]


def test_a_pair_without_lanes_ends_at_once(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    while not (sender.done and receiver.done):
        sender.call()
        receiver.call()
    assert sender.frames_sent == receiver.frames_received == 1  # the (empty) lane table


def test_special_items_keep_their_types_and_singletons(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 8)
    r = receiver.lane(0, 1, 8)
    for e in (Watermark(-5), IDLE_MESSAGE, SnapshotBarrier(3), DONE_ITEM):
        q.offer(e, 1)
    got: list[Any] = []
    while sender.call() != DONE:
        receiver.call()
        take_all(r, got)
    assert [type(x) for x in got] == [Watermark, IdleMessage, SnapshotBarrier, DoneItem]
    assert got[0] == Watermark(-5) and got[2] == SnapshotBarrier(3)
    assert got[1] is IDLE_MESSAGE and got[3] is DONE_ITEM


@pytest.mark.timeout(GUARD_S)
def test_a_terminal_barrier_ends_its_lane_and_the_pair(pair: Any) -> None:
    """Nothing follows a terminal barrier (suspend): both ends finish after it, without
    end of stream and without an error."""
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 8)
    r = receiver.lane(0, 1, 8)
    q.offer([1, 2], 2)
    q.offer(SnapshotBarrier(3, True), 1)
    got: list[Any] = []
    while not (sender.done and receiver.done):
        sender.call()
        receiver.call()
        take_all(r, got)
    take_all(r, got)
    assert got == [1, 2, SnapshotBarrier(3, True)]


# -- chunks of NamedTuples travel as rows -----------------------------------------------

Pair = collections.namedtuple("Pair", "key value")


class Tagged(Pair):
    """A namedtuple subclass with an instance ``__dict__``: its state must cross too."""


class Slotted(Pair):
    __slots__ = ()

    def total(self) -> int:
        return self.key + self.value


class Doubled(NamedTuple):
    a: int

    def __reduce__(self) -> Any:  # its own pickle: rebuilt doubled
        return (Doubled, (self.a * 2,))


class Registered(NamedTuple):
    a: int


copyreg.pickle(Registered, lambda r: (Registered, (r.a + 1,)))


def test_which_tuple_classes_travel_as_rows() -> None:
    assert _plain_namedtuple(KeyedWindowResult) and _plain_namedtuple(Pair)
    assert _plain_namedtuple(Slotted)
    for cls in (tuple, Tagged, Doubled, Registered, int, str):
        assert not _plain_namedtuple(cls), cls


def test_chunks_of_namedtuples_arrive_with_their_classes_and_state(pair: Any) -> None:
    a, b = pair
    sender = ChannelSender(a, LABEL, 1)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 64)
    r = receiver.lane(0, 1, 64)
    tagged = Tagged(1, 2)
    tagged.note = "kept"  # type: ignore[attr-defined]
    entries: list[Any] = [
        [KeyedWindowResult(0, 10, f"k{i}", i) for i in range(5)],
        [Slotted(1, 2), Slotted(3, 4)],
        [Pair(1, 2), (1, 2), Slotted(5, 6)],  # mixed: pickled item by item
        [tagged, Pair(7, 8)],
        [Doubled(3), Registered(4)],
        Watermark(3),
        [Pair(9, 10)],
        DONE_ITEM,
    ]
    for e in entries:
        assert q.offer(e, size_of(e))
    got: list[Any] = []
    while not (sender.done and receiver.done):
        sender.call()
        receiver.call()
        take_all(r, got)
    want = flat(entries)
    want[want.index(Doubled(3))] = Doubled(6)
    want[want.index(Registered(4))] = Registered(5)
    assert got == want
    assert [type(x) for x in got] == [type(x) for x in want]
    assert got[10].note == "kept" and got[5].total() == 3


# -- how chunks are packed (docs/performance.md, "The distributed edge's per-item costs") --


def frame_records(sender: ChannelSender) -> list[Any]:
    """The records of the next frame ``sender`` builds (unpickled body, lane table
    left out)."""
    frame = sender._build()
    assert frame is not None
    records = pickle.loads(frame[struct.calcsize("!IB") :])
    return [r for j in range(0, len(records), 3) if records[j + 1] != 5 for r in records[j : j + 3]]


def test_a_chunk_of_lines_travels_as_one_string(pair: Any) -> None:
    a, _ = pair
    sender = ChannelSender(a, LABEL, 1)
    q = sender.lane(0, 1, 64)
    assert q.offer(["k1,5", "", "k2,7"], 3)
    assert frame_records(sender) == [0, 7, "k1,5\n\nk2,7"]
    # a line holding the separator, or an item that is not exactly a str: a list
    for chunk in (["a\nb", "c"], ["a", Level.LOW], ["a", 1]):
        assert q.offer(list(chunk), len(chunk))
        assert frame_records(sender) == [0, 0, chunk]


def test_window_results_travel_as_columns_with_their_bounds_once() -> None:
    rows = [KeyedWindowResult(0, 10, f"k{i}", i) for i in range(3)]
    assert pack_rows(rows) == (KeyedWindowResult, 3, [[0], [10], ("k0", "k1", "k2"), (0, 1, 2)])
    # equal but not the same value: not collapsed
    mixed = [Pair(1, 0.0), Pair(True, -0.0), Pair(1.0, 0.0)]
    assert pack_rows(mixed) == (Pair, 3, [(1, True, 1.0), (0.0, -0.0, 0.0)])
    # equal first and last values, another between: not collapsed
    assert pack_rows([Pair("a", 5), Pair("b", 6), Pair("a", 5)]) == (
        Pair,
        3,
        [("a", "b", "a"), (5, 6, 5)],
    )
    # long runs of one value (a report's windows): each run's value and length once
    rows = [KeyedWindowResult(w, w + 10, f"k{i}", i) for w in (0, 10) for i in range(16)]
    packed = pack_rows(rows)
    assert packed == (
        KeyedWindowResult,
        32,
        [
            [(0, 10), (16, 16)],
            [(10, 20), (16, 16)],
            tuple(r.key for r in rows),
            tuple(range(16)) * 2,
        ],
    )
    assert unpack_rows(packed) == rows
    # runs of equal values of other types, or of mixed int and bool, or too many runs: as is
    for column in ([1.0] * 16 + [2.0] * 16, [1] * 16 + [True] * 15 + [1], [0, 0, 1, 1] * 8):
        pairs = [Pair(0, v) for v in column]
        assert pack_rows(pairs)[2][1] == tuple(column)
        back = unpack_rows(pack_rows(pairs))
        assert back == pairs and [type(p.value) for p in back] == list(map(type, column))
    # items of unequal lengths (tuple.__new__ makes them) travel as plain tuples
    uneven = [Pair(1, 2), tuple.__new__(Pair, (3, 4, 5)), Pair(6, 7)]
    assert pack_rows(uneven) == (Pair, [(1, 2), (3, 4, 5), (6, 7)])
    back = unpack_rows(pack_rows(uneven))
    assert back == uneven and [type(x) for x in back] == [Pair] * 3


values = st.one_of(
    st.integers(-3, 3), st.booleans(), st.sampled_from([0.0, -0.0, 1.0]), st.text(max_size=3)
)
texts = st.text(st.characters(blacklist_categories=()), max_size=4)


@settings(max_examples=25, deadline=None)
@given(
    chunks=st.lists(
        st.one_of(
            st.lists(texts, min_size=1, max_size=6),
            st.lists(st.builds(Pair, values, values), min_size=1, max_size=6),
            st.lists(
                st.builds(KeyedWindowResult, values, values, values, values), min_size=1, max_size=6
            ),
        ),
        max_size=6,
    )
)
def test_packed_chunks_arrive_equal_and_of_the_same_types(chunks: list[list[Any]]) -> None:
    """Lines (any characters, the separator and lone surrogates included) and rows of
    equal-but-not-identical values (1, True, 1.0; 0.0, -0.0) arrive as they were sent."""
    a, b = socket.socketpair()
    try:
        sender = ChannelSender(a, LABEL, 1, batch_items=4)
        receiver = ChannelReceiver(b, LABEL, 0)
        q = sender.lane(0, 1, 1 << 20)
        r = receiver.lane(0, 1, 1 << 20)
        for c in chunks:
            assert q.offer(list(c), len(c))
        assert q.offer(DONE_ITEM, 1)
        got: list[Any] = []
        while not (sender.done and receiver.done):
            sender.call()
            receiver.call()
            take_all(r, got)
    finally:
        a.close()
        b.close()
    want = [*flat(chunks), DONE_ITEM]
    assert repr(got) == repr(want)
    assert [type(x) for x in got] == [type(x) for x in want]
    assert [[type(v) for v in x] for x in got[:-1] if type(x) is not str] == [
        [type(v) for v in x] for x in want[:-1] if type(x) is not str
    ]


# -- big binary items out of band (docs/performance.md, "The channel's serialisation,
# measured") --


class Blob(bytes):
    """A bytes subclass: pickled in band as it always was (only exact types go out of band)."""

    def __reduce__(self) -> Any:
        return (Blob, (bytes(self),))


def test_a_chunk_led_by_a_big_binary_item_sends_its_big_binary_items_out_of_band(
    pair: Any,
) -> None:
    """A chunk whose first item is a ``bytes`` or ``bytearray`` of >= 4 KiB travels as a
    frame of codec ``O``: a table of the buffers' lengths, a pickle that holds none of
    the big exact ``bytes``/``bytearray`` items' bytes (a ``bytes`` subclass stays in
    it), the buffers; a chunk whose first item is small goes in band (codec ``P``)."""
    a, _ = pair
    sender = ChannelSender(a, LABEL, 1)
    q = sender.lane(0, 1, 64)
    big = [bytes([i]) * 65536 for i in range(3)]
    chunk = [big[0], bytearray(big[1]), b"small", Blob(big[2]), "text", b"y" * 4096]
    assert q.offer(chunk, len(chunk))
    frame = sender._build()
    assert frame is not None and frame[4] == ord("O")
    n, *sizes = struct.unpack_from("!4I", frame, 5)
    assert (n, sizes) == (3, [65536, 65536, 4096])
    body = frame[5 + 16 : len(frame) - sum(sizes)]
    assert big[0] not in body and big[1] not in body and big[2] in body
    assert frame.endswith(big[0] + big[1] + b"y" * 4096)
    assert q.offer([b"small", big[0]], 2)
    frame = sender._build()
    assert frame is not None and frame[4] == ord("P")


def test_big_binary_items_arrive_intact_and_of_their_types(pair: Any) -> None:
    """Every item of chunks of 64 KiB ``bytes`` and ``bytearray`` items (sent out of
    band) arrives equal and of its type, small items, a ``bytes`` subclass and a ``str``
    among them; frames later than it do not change it (it is not a view of the
    receiver's reused read buffer); a received ``bytearray`` is a writable copy of its
    own; and the producer's chunks are not changed (a broadcast shares them)."""
    a, b = pair
    sender = ChannelSender(a, LABEL, 1, batch_items=4)
    receiver = ChannelReceiver(b, LABEL, 0)
    q = sender.lane(0, 1, 64)
    r = receiver.lane(0, 1, 64)
    big = [bytes([i]) * 65536 for i in range(12)]
    entries: list[Any] = [
        [big[0], bytearray(big[1]), b"small", Blob(big[2]), "text", big[3]],
        [bytearray(x) for x in big[4:8]],
        [1, 2],
        Watermark(7),
        big[8:12],
        [big[0][:5000], b"x" * 4095],
        DONE_ITEM,
    ]
    sent = [list(e) if type(e) is list else e for e in entries]
    got = pump(sender, q, receiver, r, entries)
    want = flat(entries)
    assert got == want
    assert [type(x) for x in got] == [type(x) for x in want]
    assert entries == sent and all(x is y for x, y in zip(entries[0], sent[0], strict=True))
    got[1][0] = 255  # a writable copy of its own
    assert got[1] != entries[0][1] and got[1][1:] == entries[0][1][1:]
    assert receiver.frames_received >= 4
