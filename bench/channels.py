"""Per-item cost of an edge: the in-process queue vs the cross-process channel (issue 24).

    python bench/channels.py [--items 1000000] [--batches 1,64,1024] [--repeat 3]
                             [--payloads int,tuple,object] [--variants queue,channel,...]
                             [--skip-throughput] [--skip-latency] [--latency-items 2000]
                             [--latency-interval-ms 1] [--skip-serialisation]
                             [--ser-payloads int,tuple,row,line,object,bytes,bytearray]
                             [--ser-frames 200] [--ser-rounds 5]
                             [--skip-start] [--start-rounds 7]

For each batch size B (items per chunk the producer offers; the sender's ``batch_items``
is B too, so a frame carries about B items) and payload (``int``: small ints; ``tuple``:
``(word, count)`` as a word count's partitioned edge carries; ``object``: a user's
dataclass, which must be pickled; ``bytes``: 64 KiB items from a pool of 1,024, which the
channel sends out of band, to be run with fewer ``--items``), one producer sends
``--items`` items and end-of-stream to one consumer:

* ``queue``: an in-process ``SpscQueue``, producer and consumer alternating in one
  thread (what a local edge costs).
* ``channel-1proc``: ``ChannelSender`` -> socketpair -> ``ChannelReceiver``, all in this
  process (the channel's CPU cost per item, serialisation included, without a second core).
* ``channel``: the same with the receiver and consumer in a forkserver child (the real
  thing: two cores).
* ``channel-1024``: as ``channel`` with the sender's default ``batch_items`` (1024)
  whatever the producer's chunk size: the sender merges what accumulated, as in the
  engine.
* ``mp-connection``: the batches pickled and sent with ``multiprocessing.Pipe``'s
  blocking ``send_bytes``/``recv_bytes`` to a child (no credits, no tasklets): the
  transport the channel was measured against.
* ``os-pipe``: pickled batches with a length prefix on a plain pipe, blocking (same).

``wall ns/item`` is the producer's wall time from the first offer until the consumer has
taken the last item (reported by the child); ``cpu ns/item`` the CPU time of both
processes. Idle loops pause as the engine's workers do (``idle_pause``). Best of
``--repeat`` rounds.

The latency part sends ``--latency-items`` items one at a time, one per
``--latency-interval-ms``, each carrying its send time (``perf_counter_ns``, one clock
for all processes of the machine), and prints p50 / p99 / max of the time until the
consumer took it: an in-process queue between two threads whose consumer pauses as the
engine's workers do today (blind sleeps), the channel with both sides pausing through
``wait_idle`` (select on the socket), and the channel with blind sleeps.

The serialisation part (``--ser-payloads``, ``--ser-frames``, ``--ser-rounds``) sends
frames of one payload through a socketpair from one thread and prints the thread CPU
per item (best of ``--ser-rounds`` x ``--ser-frames`` frames) of encoding, sending,
receiving and decoding into the items the consumer takes, checked equal (and of the same
types) to what was sent. Payloads (items per frame): ``int``, ``tuple`` and ``object`` as
above, ``row`` (keyed window results, which the channel sends as columns), ``line`` (CSV
lines, which it joins), 1024 each; ``bytes`` and ``bytearray`` (64 KiB items, the second
standing for a numpy-like writable buffer), 16 each. Variants:

* ``pickle 5``: what the channel does with every chunk not led by a big binary item
  (its packing, protocol 5 in band, the head joined to the body for one ``send``, the
  receiver reading into one reused buffer); with those too before 2026-11-27.
* ``p5 sendmsg``: the same, head and body sent by one ``sendmsg`` (no joining copy).
* ``p5 oob``: protocol 5 with out-of-band buffers: big binary items (>= 4 KiB) leave as
  ``PickleBuffer`` objects sent by ``sendmsg`` as they are; the receiver reads each into a
  fresh ``bytearray`` (a ``bytearray`` item arrives as that very buffer, a ``bytes``
  item is copied out of it).
* ``p5 oob 1 buf``: the same, the receiver reading the buffers into its one reused
  buffer and every item copied out of it.
* ``p5 oob joined``: as ``p5 oob 1 buf``, the frame joined into one ``bytes`` for one
  ``send``: what the channel does with a chunk led by a big binary item.
* ``arrow``: an Arrow record batch of the chunk's columns (IPC stream), read back and
  turned into the items (``to_pylist``, tuples zipped, rows rebuilt as the channel
  does, the dataclass through its ``__init__``, which is not generic).
* ``marshal+scan``: ``marshal`` of the packed chunk after the exact-type scan that makes
  it safe (marshal carries a ``bytearray`` as ``bytes``); ``-`` where it cannot.

The start-up part times ``Process.start()`` until the child (which imports
``slipstream.execution.remote``) answers, for each start method: ``fork``, ``forkserver``
(first start includes the server's, then each further child), ``forkserver`` with
``set_forkserver_preload``, and ``spawn``.

Figures: docs/performance.md, "Channels" and "The channel's serialisation, measured".
"""

from __future__ import annotations

import argparse
import marshal
import multiprocessing
import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import partial
from itertools import chain, cycle, repeat
from operator import attrgetter
from typing import Any

import pyarrow as pa

from slipstream.core.items import DONE_ITEM
from slipstream.engine.workers import idle_pause, wait_idle
from slipstream.execution.queues import SpscQueue
from slipstream.execution.remote import (
    _CHUNK,
    _PICKLE,
    _ROWS,
    _TEXT,
    DEFAULT_BATCH_ITEMS,
    ChannelReceiver,
    ChannelSender,
    _pack_chunks,
    unpack_rows,
    unpack_text,
)
from slipstream.execution.tasklet import DONE, NO_PROGRESS
from slipstream.window import KeyedWindowResult

LABEL = "edge 'a' -> 'b' (ordinal 0)"
CAPACITY = 1024  # the default Edge.queue_size


@dataclass(slots=True)
class Point:
    x: int
    y: float


def payload(kind: str, n: int) -> list[Any]:
    if kind == "int":
        return list(range(n))
    if kind == "tuple":
        return [(f"word{i % 5000}", i) for i in range(n)]
    if kind == "bytes":
        return [bytes([i % 251]) * BIG for i in range(n)]
    return [Point(i, i / 2) for i in range(n)]


POOL = 1 << 16
BIG = 64 * 1024


def chunks(kind: str, batch: int) -> Any:
    """An endless iterator of chunks of ``batch`` items, cycling over a pool of 65,536
    distinct items (so no frame pickles the same object twice, which pickle's memo
    would make cheap; of 64 KiB ``bytes``, 1,024)."""
    size = max(batch, 1024) if kind == "bytes" else POOL
    pool = payload(kind, size)
    return cycle([pool[i : i + batch] for i in range(0, size - batch + 1, batch)])


class Idle:
    """The engine's idle strategy: pause after passes without progress; with ``waiter``
    (a sender or receiver) the pause is the engine's ``wait_idle`` on its sockets (a
    frame or a credit report ends it at once), as a member's worker does."""

    def __init__(self, waiter: Any = None) -> None:
        self.passes = 0
        self.since = 0.0
        self.waiters = [waiter] if waiter is not None else []

    def __call__(self, progress: bool) -> None:
        if progress:
            self.passes = 0
            return
        now = time.perf_counter()
        if not self.passes:
            self.since = now
        self.passes += 1
        pause = idle_pause(self.passes, now - self.since)
        if self.waiters:
            wait_idle(self.waiters, pause)
        else:
            time.sleep(pause)


def drain(q: SpscQueue) -> tuple[int, bool]:
    """Take everything; returns (items taken, end of stream seen)."""
    entries = q.entries
    n = 0
    done = False
    while entries:
        e = entries.popleft()
        if type(e) is list:
            n += len(e)
        else:
            n += 1
            done = e is DONE_ITEM
    q.take_count += n
    return n, done


# -- the variants ------------------------------------------------------------------------


def run_queue(items: int, batch: int, kind: str) -> tuple[float, float]:
    source = chunks(kind, batch)
    q = SpscQueue(CAPACITY)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(items // batch):
        q.offer(next(source), batch)
        drain(q)
    q.offer(DONE_ITEM, 1)
    drain(q)
    return time.perf_counter() - t0, time.process_time() - c0


def produce(sender: ChannelSender, items: int, batch: int, kind: str, pump: Any = None) -> None:
    """Offer ``items`` items in chunks of ``batch`` and end-of-stream, driving the sender
    (and ``pump``, the in-process receiver side) until the sender is done."""
    source = chunks(kind, batch)
    q = sender.queues[0]
    idle = Idle(None if pump is not None else sender)
    left = items // batch
    chunk = next(source)
    while left:
        progress = False
        while left and q.offer(chunk, batch):
            left -= 1
            chunk = next(source)
            progress = True
        if sender.call() != NO_PROGRESS:
            progress = True
        if pump is not None and pump():
            progress = True
        idle(progress)
    while not q.offer(DONE_ITEM, 1):
        sender.call()
        if pump is not None:
            pump()
    while sender.call() != DONE:
        if pump is not None:
            pump()


def consume(receiver: ChannelReceiver, q: SpscQueue) -> int:
    idle = Idle(receiver)
    got = 0
    while not receiver.done:
        r = receiver.call()
        n, _ = drain(q)
        got += n
        idle(r != NO_PROGRESS or n > 0)
    return got + drain(q)[0]


def run_channel_1proc(items: int, batch: int, kind: str) -> tuple[float, float]:
    a, b = socket.socketpair()
    sender = ChannelSender(a, LABEL, 1, batch_items=batch)
    sender.lane(0, 1, CAPACITY)
    receiver = ChannelReceiver(b, LABEL, 0)
    rq = receiver.lane(0, 1, CAPACITY)
    got = [0]

    def pump() -> bool:
        r = receiver.call()
        n, _ = drain(rq)
        got[0] += n
        return r != NO_PROGRESS or n > 0

    t0, c0 = time.perf_counter(), time.process_time()
    produce(sender, items, batch, kind, pump)
    while not receiver.done:
        pump()
    pump()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert got[0] == items // batch * batch + 1, got
    b.close()
    return wall, cpu


def child_channel(sock: socket.socket, control: Any) -> None:
    receiver = ChannelReceiver(sock, LABEL, 0)
    q = receiver.lane(0, 1, CAPACITY)
    control.send("ready")
    c0 = time.process_time()
    got = consume(receiver, q)
    control.send((got, time.process_time() - c0))


def child_connection(conn: Any, control: Any) -> None:
    control.send("ready")
    c0 = time.process_time()
    got = 0
    while True:
        batch = pickle.loads(conn.recv_bytes())
        if batch is None:
            break
        got += len(batch)
    control.send((got + 1, time.process_time() - c0))


_LEN = struct.Struct("!I")


def _read_exactly(fd: int, n: int) -> bytes:
    parts = []
    while n:
        b = os.read(fd, n)
        if not b:
            raise EOFError
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def child_pipe(fd: int, control: Any) -> None:
    control.send("ready")
    c0 = time.process_time()
    got = 0
    while True:
        (n,) = _LEN.unpack(_read_exactly(fd, 4))
        batch = pickle.loads(_read_exactly(fd, n))
        if batch is None:
            break
        got += len(batch)
    control.send((got + 1, time.process_time() - c0))


def _child(ctx: Any, target: Any, arg: Any) -> tuple[Any, Any]:
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(arg, child), daemon=True)
    p.start()
    child.close()
    assert parent.recv() == "ready"
    return p, parent


def run_channel(items: int, batch: int, kind: str, frame: int = 0) -> tuple[float, float]:
    ctx = multiprocessing.get_context("forkserver")
    a, b = socket.socketpair()
    p, control = _child(ctx, child_channel, b)
    b.close()
    sender = ChannelSender(a, LABEL, 1, batch_items=frame or batch)
    sender.lane(0, 1, CAPACITY)
    t0, c0 = time.perf_counter(), time.process_time()
    produce(sender, items, batch, kind)
    got, child_cpu = control.recv()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0 + child_cpu
    p.join()
    assert got == items // batch * batch + 1, got
    return wall, cpu


def run_connection(items: int, batch: int, kind: str) -> tuple[float, float]:
    ctx = multiprocessing.get_context("forkserver")
    mine, theirs = ctx.Pipe()
    p, control = _child(ctx, child_connection, theirs)
    theirs.close()
    source = chunks(kind, batch)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(items // batch):
        mine.send_bytes(pickle.dumps(next(source), pickle.HIGHEST_PROTOCOL))
    mine.send_bytes(pickle.dumps(None))
    got, child_cpu = control.recv()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0 + child_cpu
    p.join()
    assert got == items // batch * batch + 1, got
    return wall, cpu


def run_pipe(items: int, batch: int, kind: str) -> tuple[float, float]:
    ctx = multiprocessing.get_context("fork")  # the fd is inherited (no threads here)
    r, w = os.pipe()
    p, control = _child(ctx, child_pipe, r)
    os.close(r)
    source = chunks(kind, batch)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(items // batch):
        body = pickle.dumps(next(source), pickle.HIGHEST_PROTOCOL)
        os.write(w, _LEN.pack(len(body)) + body)
    body = pickle.dumps(None)
    os.write(w, _LEN.pack(len(body)) + body)
    got, child_cpu = control.recv()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0 + child_cpu
    p.join()
    os.close(w)
    assert got == items // batch * batch + 1, got
    return wall, cpu


VARIANTS = {
    "queue": run_queue,
    "channel-1proc": run_channel_1proc,
    "channel": run_channel,
    "channel-1024": lambda i, b, k: run_channel(i, b, k, frame=DEFAULT_BATCH_ITEMS),
    "mp-connection": run_connection,
    "os-pipe": run_pipe,
}


# -- latency -----------------------------------------------------------------------------


def _percentiles(lat_ns: list[int]) -> tuple[float, float, float]:
    lat = sorted(lat_ns)
    return (
        lat[len(lat) // 2] / 1e3,
        lat[min(len(lat) - 1, len(lat) * 99 // 100)] / 1e3,
        lat[-1] / 1e3,
    )


def _paced(n: int, interval: float, offer: Any, step: Any, idle: Idle) -> None:
    """Offer ``n`` one-item chunks holding their ``perf_counter_ns`` send time, one per
    ``interval``, calling ``step`` (the sender) and pausing as a worker does between."""
    start = time.perf_counter()
    sent = 0
    while sent < n:
        progress = False
        if time.perf_counter() >= start + sent * interval and offer([time.perf_counter_ns()]):
            sent += 1
            progress = True
        if step() != NO_PROGRESS:
            progress = True
        idle(progress)


def child_latency(sock: socket.socket, control: Any) -> None:
    n, select_idle = control.recv()
    receiver = ChannelReceiver(sock, LABEL, 0)
    q = receiver.lane(0, 1, CAPACITY)
    control.send("ready")
    idle = Idle(receiver if select_idle else None)
    lat: list[int] = []
    while not receiver.done:
        r = receiver.call()
        entries = q.entries
        taken = 0
        while entries:
            e = entries.popleft()
            taken += 1 if e is DONE_ITEM else len(e)
            if e is not DONE_ITEM:
                now = time.perf_counter_ns()
                lat.extend(now - ts for ts in e)
        q.take_count += taken
        idle(r != NO_PROGRESS or taken > 0)
    control.send(lat[:n])


def latency_channel(n: int, interval: float, select_idle: bool) -> list[int]:
    ctx = multiprocessing.get_context("forkserver")
    a, b = socket.socketpair()
    parent, child = ctx.Pipe()
    p = ctx.Process(target=child_latency, args=(b, child), daemon=True)
    p.start()
    child.close()
    b.close()
    parent.send((n, select_idle))
    assert parent.recv() == "ready"
    sender = ChannelSender(a, LABEL, 1)
    q = sender.lane(0, 1, CAPACITY)
    _paced(n, interval, lambda c: q.offer(c, 1), sender.call, Idle(sender if select_idle else None))
    while not q.offer(DONE_ITEM, 1):
        sender.call()
    while sender.call() != DONE:
        pass
    lat: list[int] = parent.recv()
    p.join()
    return lat


def latency_queue(n: int, interval: float) -> list[int]:
    q = SpscQueue(CAPACITY)
    lat: list[int] = []

    def consumer() -> None:
        idle = Idle()
        while True:
            entries = q.entries
            taken = 0
            done = False
            while entries:
                e = entries.popleft()
                taken += 1 if e is DONE_ITEM else len(e)
                if e is DONE_ITEM:
                    done = True
                else:
                    now = time.perf_counter_ns()
                    lat.extend(now - ts for ts in e)
            q.take_count += taken
            if done:
                return
            idle(taken > 0)

    t = threading.Thread(target=consumer)
    t.start()
    _paced(n, interval, lambda c: q.offer(c, 1), lambda: NO_PROGRESS, Idle())
    while not q.offer(DONE_ITEM, 1):
        time.sleep(0.0001)
    t.join()
    return lat


def latency(n: int, interval_ms: float) -> None:
    interval = interval_ms / 1000
    print(f"\nlatency: {n:,} items one at a time, one per {interval_ms:g} ms (µs)")
    print(f"{'variant':<40}{'p50':>10}{'p99':>10}{'max':>10}")
    rows = [
        ("queue, 2 threads, sleeping idle", lambda: latency_queue(n, interval)),
        ("channel, waiting on the socket", lambda: latency_channel(n, interval, True)),
        ("channel, sleeping idle", lambda: latency_channel(n, interval, False)),
    ]
    for name, fn in rows:
        p50, p99, mx = _percentiles(fn())
        print(f"{name:<40}{p50:>10.0f}{p99:>10.0f}{mx:>10.0f}")


# -- serialisation -----------------------------------------------------------------------

_PLAIN = frozenset({int, float, str, bytes, bool, type(None), complex})


def marshal_safe(chunk: list[Any]) -> bool:
    """Whether marshal carries ``chunk`` unchanged: exact plain types, or tuples of them."""
    types = set(map(type, chunk))
    if types <= _PLAIN:
        return True
    if types == {tuple}:
        return set(map(type, chain.from_iterable(chunk))) <= _PLAIN
    return False


#: the serialisation part's payloads and the items per frame each is timed at (a 64 KiB
#: item's frame of 16 is 1 MiB)
SER_PAYLOADS = {
    "int": 1024,
    "tuple": 1024,
    "row": 1024,
    "line": 1024,
    "object": 1024,
    "bytes": 16,
    "bytearray": 16,
}


def ser_payload(kind: str, n: int) -> list[Any]:
    """``n`` items of one of :data:`SER_PAYLOADS`: ``row`` a keyed window's results (the
    columns the channel packs, a window's bounds shared by 512 results in a row), ``line``
    the running sum's CSV lines (the channel joins them), ``bytes`` / ``bytearray`` 64 KiB
    binary items (a numpy array's buffer is the ``bytearray`` case: a writable buffer
    that can arrive in the very memory it was received into)."""
    if kind == "row":
        return [
            KeyedWindowResult(i // 512 * 1000, i // 512 * 1000 + 1000, f"key{i % 5000}", i)
            for i in range(n)
        ]
    if kind == "line":
        return [f"key{i % 5000},{i},{i * 7 % 1000}" for i in range(n)]
    if kind == "bytearray":
        return [bytearray([i % 251]) * BIG for i in range(n)]
    return payload(kind, n)


# The frame every variant sends: ``!IBH`` (body length, codec, out-of-band buffer count),
# the buffers' lengths (``!Q`` each), the body, the buffers.
_HEAD = struct.Struct("!IBH")
_BUF_LEN = struct.Struct("!Q")
_OOB_MIN = 4096  # a binary item at least this big goes out of band


class _Copied:
    """A binary item out of band that arrives as a copy of the buffer it was received
    into, of its own type: pickled as ``bytes(<buffer>)`` or ``bytearray(<buffer>)``
    (an out-of-band ``PickleBuffer`` of a ``bytes`` unpickles as a read-only memoryview,
    of a ``bytearray`` as the receiver's buffer object itself; ``reducer_override`` is
    never called for exact ``bytes``)."""

    __slots__ = ("b",)

    def __init__(self, b: bytes | bytearray) -> None:
        self.b = b

    def __reduce_ex__(self, protocol: Any) -> Any:
        return type(self.b), (pickle.PickleBuffer(self.b),)


def _out_of_band(chunk: list[Any], in_place: bool = True) -> list[Any]:
    """``chunk`` with its big binary items made out-of-band buffers: a ``bytes`` as
    :class:`_Copied`, a ``bytearray`` as its ``PickleBuffer`` when ``in_place`` (it
    unpickles as the fresh buffer it was received into: no copy), else as
    :class:`_Copied`. Only a chunk whose first item is binary is scanned."""
    if type(chunk[0]) not in (bytes, bytearray):
        return chunk
    out = []
    for x in chunk:
        t = type(x)
        if (t is bytes or t is bytearray) and len(x) >= _OOB_MIN:
            x = pickle.PickleBuffer(x) if in_place and t is bytearray else _Copied(x)
        out.append(x)
    return out


def _packed(chunk: list[Any]) -> list[Any]:
    """The channel's record of a chunk, packed as it packs it (columns, joined lines),
    its binary items kept in band (the channel's ``_CHUNK`` record as it was)."""
    records = [0, _CHUNK, chunk]
    _pack_chunks(records)
    if records[1] == _CHUNK:
        records[2] = chunk  # the channel would send big binary items out of band
    return records


def _unpacked(records: list[Any]) -> list[Any]:
    """The chunk the channel's receiver delivers from ``records`` (``_deliver``)."""
    kind, p = records[1], records[2]
    if kind == _TEXT:
        return unpack_text(p)
    if kind == _ROWS:
        return unpack_rows(p)
    return p  # type: ignore[no-any-return]


def _frame(codec: int, body: Any, buffers: Sequence[Any] = ()) -> list[Any]:
    head = _HEAD.pack(len(body), codec, len(buffers))
    if buffers:
        head += b"".join(_BUF_LEN.pack(memoryview(b).nbytes) for b in buffers)
    return [head, body, *buffers]


def enc_pickle(chunk: list[Any]) -> list[Any]:
    """As the channel does (a chunk not led by a big binary item): packed, pickled in band, the head joined to the body
    (one buffer for one ``send``: a copy of the body)."""
    head, body = _frame(_PICKLE, pickle.dumps(_packed(chunk), pickle.HIGHEST_PROTOCOL))
    return [head + body]


def enc_pickle_sendmsg(chunk: list[Any]) -> list[Any]:
    """As today, but head and body sent by one ``sendmsg`` (no joining copy)."""
    return _frame(_PICKLE, pickle.dumps(_packed(chunk), pickle.HIGHEST_PROTOCOL))


def enc_pickle_oob(chunk: list[Any], in_place: bool = True) -> list[Any]:
    """Protocol 5 with out-of-band buffers: big binary items' memory goes to ``sendmsg``
    as it is, the pickle only refers to it."""
    bufs: list[pickle.PickleBuffer] = []
    body = pickle.dumps(
        _packed(_out_of_band(chunk, in_place)),
        pickle.HIGHEST_PROTOCOL,
        buffer_callback=bufs.append,
    )
    return _frame(_PICKLE if in_place else _OOB, body, [b.raw() for b in bufs])


def enc_pickle_oob_joined(chunk: list[Any]) -> list[Any]:
    """As ``enc_pickle_oob`` (every item a copy on arrival), the frame joined into one
    ``bytes`` for one ``send``: what the channel does with a chunk led by a big binary
    item (``remote._encode_out_of_band``)."""
    return [b"".join(enc_pickle_oob(chunk, in_place=False))]


def dec_pickle(body: memoryview, buffers: list[bytearray]) -> list[Any]:
    return _unpacked(pickle.loads(body, buffers=buffers))


#: a pickle whose buffers the receiver reads into its one reused buffer (``_PICKLE``: each
#: into a fresh ``bytearray``)
_OOB = 79  # "O"
_ARROW = 65  # "A"
_MARSHAL = 77  # "M"


def enc_arrow(chunk: list[Any]) -> list[Any] | None:
    """An Arrow record batch (IPC stream) of the chunk's columns: tuples and named tuples
    by position, a dataclass by its fields, anything else as one column."""
    first = chunk[0]
    if isinstance(first, tuple):
        arrays = [pa.array(c) for c in zip(*chunk, strict=True)]
    elif is_dataclass(first):
        arrays = [pa.array(list(map(attrgetter(f.name), chunk))) for f in fields(first)]
    else:
        arrays = [pa.array(chunk)]
    batch = pa.RecordBatch.from_arrays(arrays, names=[f"c{i}" for i in range(len(arrays))])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return _frame(_ARROW, sink.getvalue())


def dec_arrow(kind: str) -> Any:
    """The receiver of ``kind``'s Arrow batches: back to the Python items the consumer
    takes. It is told the shape (the class of rows and objects): a real channel would
    have to send it beside the batch."""
    rows_cls = type(ser_payload("row", 1)[0])

    def dec(body: memoryview, buffers: list[bytearray]) -> list[Any]:
        batch = pa.ipc.open_stream(pa.py_buffer(body)).read_next_batch()
        if kind == "bytearray":
            return [bytearray(x.as_buffer()) for x in batch.column(0)]
        cols = [c.to_pylist() for c in batch.columns]
        if kind == "tuple":
            return list(zip(*cols, strict=True))
        if kind == "row":
            return list(map(tuple.__new__, repeat(rows_cls), zip(*cols, strict=True)))
        if kind == "object":
            return list(map(Point, *cols))  # through __init__: not generic
        return cols[0]

    return dec


def enc_marshal(chunk: list[Any]) -> list[Any] | None:
    """``marshal`` of the packed record, after the exact-type scan that makes it safe
    (``None``: not safe, or not marshallable)."""
    if not marshal_safe(chunk):
        return None
    try:
        body = marshal.dumps(_packed(chunk), 4)
    except ValueError:
        return None  # a packed row's class
    head, body = _frame(_MARSHAL, body)
    return [head + body]


def dec_marshal(body: memoryview, buffers: list[bytearray]) -> list[Any]:
    return _unpacked(marshal.loads(body))


class Wire:
    """A socketpair driven from one thread: the sender's parts go out by non-blocking
    ``sendmsg`` while the receiver reads, as the channel's receiver does, into one
    reused buffer (``recv_into``, growing for a bigger frame), and each out-of-band
    buffer into a fresh ``bytearray`` of its length (the part of it the buffer's read
    took is copied over)."""

    def __init__(self) -> None:
        self.a, self.b = socket.socketpair()
        self.a.setblocking(False)
        self.b.setblocking(False)
        self.buf = bytearray(1 << 18)
        self.pending: list[memoryview] = []

    def close(self) -> None:
        self.a.close()
        self.b.close()

    def _pump(self) -> None:
        pending = self.pending
        if not pending:
            return
        try:
            n = self.a.sendmsg(pending)
        except BlockingIOError:
            return
        while n:
            first = pending[0]
            if n >= len(first):
                n -= len(first)
                del pending[0]
            else:
                pending[0] = first[n:]
                n = 0

    def _read(self, view: memoryview) -> int:
        while True:
            self._pump()
            try:
                return self.b.recv_into(view)
            except BlockingIOError:
                if not self.pending:
                    raise RuntimeError("nothing to receive") from None

    def round_trip(self, parts: list[Any], decode: Any) -> list[Any]:
        """Send ``parts`` (one frame) and decode it on the other side."""
        self.pending = [memoryview(p).cast("B") for p in parts]
        fill = 0
        need = _HEAD.size
        while True:
            if need > len(self.buf):
                self.buf += bytearray(need - len(self.buf))
            fill += self._read(memoryview(self.buf)[fill:])
            if fill < need:
                continue
            length, codec, nbufs = _HEAD.unpack_from(self.buf, 0)
            start = _HEAD.size + nbufs * _BUF_LEN.size
            need = start + length
            if fill >= need:
                break
        view = memoryview(self.buf)
        sizes = [
            _BUF_LEN.unpack_from(self.buf, _HEAD.size + k * _BUF_LEN.size)[0] for k in range(nbufs)
        ]
        if codec == _OOB:
            # the buffers into the reused buffer too, the items copied out of it
            total = need + sum(sizes)
            if total > len(self.buf):
                view.release()
                self.buf += bytearray(total - len(self.buf))
                view = memoryview(self.buf)
            while fill < total:
                fill += self._read(view[fill:total])
            slices = []
            at = need
            for size in sizes:
                slices.append(view[at : at + size])
                at += size
            assert not self.pending and fill == total, "one frame at a time"
            return decode(view[start:need], slices)  # type: ignore[no-any-return]
        buffers = []
        at = need
        for size in sizes:
            b = bytearray(size)
            bv = memoryview(b)
            have = min(size, max(0, fill - at))
            bv[:have] = view[at : at + have]
            at += have
            got = have
            while got < size:
                got += self._read(bv[got:])
            buffers.append(b)
        assert not self.pending and fill <= at, "one frame at a time"
        return decode(view[start:need], buffers)  # type: ignore[no-any-return]


SER_VARIANTS = (
    "pickle 5",
    "p5 sendmsg",
    "p5 oob",
    "p5 oob 1 buf",
    "p5 oob joined",
    "arrow",
    "marshal+scan",
)


def ser_codecs(kind: str) -> dict[str, tuple[Any, Any]]:
    return {
        "pickle 5": (enc_pickle, dec_pickle),
        "p5 sendmsg": (enc_pickle_sendmsg, dec_pickle),
        "p5 oob": (enc_pickle_oob, dec_pickle),
        "p5 oob 1 buf": (partial(enc_pickle_oob, in_place=False), dec_pickle),
        "p5 oob joined": (enc_pickle_oob_joined, dec_pickle),
        "arrow": (enc_arrow, dec_arrow(kind)),
        "marshal+scan": (enc_marshal, dec_marshal),
    }


def ser_round_trips(kind: str, n: int) -> dict[str, list[Any] | None]:
    """What each variant delivers of an ``n``-item chunk of ``kind`` (``None``: the
    variant cannot carry it), for the check that they all deliver the same items."""
    chunk = ser_payload(kind, n)
    wire = Wire()
    try:
        out: dict[str, list[Any] | None] = {}
        for name, (enc, dec) in ser_codecs(kind).items():
            parts = enc(chunk)
            out[name] = None if parts is None else wire.round_trip(parts, dec)
        return out
    finally:
        wire.close()


def _same(a: list[Any], b: list[Any]) -> bool:
    return a == b and list(map(type, a)) == list(map(type, b))


def serialisation(kinds: list[str], frames: int, rounds: int) -> None:
    print(
        f"\nserialisation through a socketpair, one thread: thread CPU ns per item of a "
        f"frame (encode, send, receive, decode into the items the consumer takes), "
        f"best of {rounds} x {frames} frames"
    )
    print(f"{'payload':<10}{'items':>6}" + "".join(f"{v:>15}" for v in SER_VARIANTS))
    wire = Wire()
    for kind in kinds:
        n = SER_PAYLOADS[kind]
        chunk = ser_payload(kind, n)
        cells = []
        for name, (enc, dec) in ser_codecs(kind).items():
            parts = enc(chunk)
            if parts is None:
                cells.append("-")
                continue
            assert _same(wire.round_trip(parts, dec), chunk), (kind, name)
            best = float("inf")
            for _ in range(rounds):
                t0 = time.thread_time_ns()
                for _ in range(frames):
                    wire.round_trip(enc(chunk), dec)
                best = min(best, (time.thread_time_ns() - t0) / frames / n)
            cells.append(f"{best:,.0f}")
        print(f"{kind:<10}{n:>6}" + "".join(f"{c:>15}" for c in cells))
    wire.close()


# -- start-up ---------------------------------------------------------------------------


def child_ready(arg: Any, control: Any) -> None:
    import slipstream.execution.remote  # noqa: F401 - what a member imports first

    control.send("ready")


def start_once(ctx: Any) -> float:
    t0 = time.perf_counter()
    p, control = _child(ctx, child_ready, None)
    t = time.perf_counter() - t0
    p.join()
    return t


def start_methods(rounds: int) -> None:
    print("\nstart-up: Process.start() until the child imported slipstream.execution.remote")
    print(f"{'method':<32}{'first ms':>10}{'then best ms':>14}{'then median ms':>16}")
    for name in ("fork", "forkserver", "spawn"):
        ctx = multiprocessing.get_context(name)
        first = start_once(ctx)
        rest = sorted(start_once(ctx) for _ in range(rounds))
        _row(name, first, rest)
    # a forkserver whose server imported slipstream first: a fresh server is needed, so
    # this runs in a child of its own (the forkserver of this process is already up)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_preloaded_forkserver, args=(rounds, child))
    p.start()
    first, rest = parent.recv()
    p.join()
    _row("forkserver + preload", first, rest)


def _preloaded_forkserver(rounds: int, control: Any) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["slipstream.execution.remote"])
    first = start_once(ctx)
    control.send((first, sorted(start_once(ctx) for _ in range(rounds))))


def _row(name: str, first: float, rest: list[float]) -> None:
    print(
        f"{name:<32}{first * 1e3:>10.1f}{rest[0] * 1e3:>14.1f}{rest[len(rest) // 2] * 1e3:>16.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--batches", default="1,64,1024")
    ap.add_argument("--payloads", default="int,tuple,object")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-start", action="store_true")
    ap.add_argument("--skip-serialisation", action="store_true")
    ap.add_argument("--ser-payloads", default=",".join(SER_PAYLOADS))
    ap.add_argument("--ser-frames", type=int, default=200)
    ap.add_argument("--ser-rounds", type=int, default=5)
    ap.add_argument("--start-rounds", type=int, default=7)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--latency-items", type=int, default=2000)
    ap.add_argument("--latency-interval-ms", type=float, default=1.0)
    ap.add_argument("--skip-throughput", action="store_true")
    a = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    variants = a.variants.split(",")
    for kind in [] if a.skip_throughput else a.payloads.split(","):
        print(
            f"\npayload {kind}, {a.items:,} items (batch 1: {a.items // 10:,}), best of {a.repeat}"
        )
        print(f"{'variant':<18}{'batch':>6}{'wall ns/item':>14}{'items/s':>14}{'cpu ns/item':>13}")
        for batch in (int(x) for x in a.batches.split(",")):
            items = a.items // 10 if batch == 1 else a.items
            for name in variants:
                best: tuple[float, float] | None = None
                for _ in range(a.repeat):
                    wall, cpu = VARIANTS[name](items, batch, kind)
                    if best is None or wall < best[0]:
                        best = (wall, cpu)
                assert best is not None
                wall, cpu = best
                print(
                    f"{name:<18}{batch:>6}{wall / items * 1e9:>14,.0f}{items / wall:>14,.0f}"
                    f"{cpu / items * 1e9:>13,.0f}"
                )
    if not a.skip_latency:
        latency(a.latency_items, a.latency_interval_ms)
    if not a.skip_serialisation:
        serialisation(a.ser_payloads.split(","), a.ser_frames, a.ser_rounds)
    if not a.skip_start:
        start_methods(a.start_rounds)


if __name__ == "__main__":
    main()
