"""Per-item cost of an edge: the in-process queue vs the cross-process channel (issue 24).

    python bench/channels.py [--items 1000000] [--batches 1,64,1024] [--repeat 3]
                             [--payloads int,tuple,object] [--variants queue,channel,...]
                             [--skip-throughput] [--skip-latency] [--latency-items 2000]
                             [--latency-interval-ms 1] [--skip-serialisation]
                             [--skip-start] [--start-rounds 7]

For each batch size B (items per chunk the producer offers; the sender's ``batch_items``
is B too, so a frame carries about B items) and payload (``int``: small ints; ``tuple``:
``(word, count)`` as a word count's partitioned edge carries; ``object``: a user's
dataclass, which must be pickled), one producer sends ``--items`` items and end-of-stream
to one consumer:

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

The serialisation part times, per item of a 1024-item chunk, pickle protocol 5 (dumps +
loads) against ``marshal`` (dumps + loads) plus the exact-type scan that makes marshal
safe (it would carry a ``bytearray`` as ``bytes``): the channel pickles because of it.

The start-up part times ``Process.start()`` until the child (which imports
``slipstream.execution.remote``) answers, for each start method: ``fork``, ``forkserver``
(first start includes the server's, then each further child), ``forkserver`` with
``set_forkserver_preload``, and ``spawn``.

Figures: docs/performance.md, "Channels".
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
from dataclasses import dataclass
from itertools import chain, cycle
from typing import Any

from slipstream.core.items import DONE_ITEM
from slipstream.engine.workers import idle_pause, wait_idle
from slipstream.execution.queues import SpscQueue
from slipstream.execution.remote import DEFAULT_BATCH_ITEMS, ChannelReceiver, ChannelSender
from slipstream.execution.tasklet import DONE, NO_PROGRESS

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
    return [Point(i, i / 2) for i in range(n)]


POOL = 1 << 16


def chunks(kind: str, batch: int) -> Any:
    """An endless iterator of chunks of ``batch`` items, cycling over a pool of 65,536
    distinct items (so no frame pickles the same object twice, which pickle's memo
    would make cheap)."""
    pool = payload(kind, POOL)
    return cycle([pool[i : i + batch] for i in range(0, POOL - batch + 1, batch)])


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


def _per_item(fn: Any, n: int = 300, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n / 1024 * 1e9)
    return best


def serialisation(kinds: list[str]) -> None:
    print("\nserialisation, ns per item of a 1024-item chunk (best of 5)")
    print(f"{'payload':<10}{'pickle 5':>10}{'marshal':>10}{'type scan':>11}{'marshal+scan':>14}")
    for kind in kinds:
        chunk = payload(kind, 1024)
        p = pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL)
        pk = _per_item(lambda c=chunk: pickle.dumps(c, pickle.HIGHEST_PROTOCOL))
        pk += _per_item(lambda b=p: pickle.loads(b))
        scan = _per_item(lambda c=chunk: marshal_safe(c))
        try:
            m = marshal.dumps(chunk, 4)
        except ValueError:
            print(f"{kind:<10}{pk:>10.0f}{'-':>10}{scan:>11.0f}{'-':>14}")
            continue
        ms = _per_item(lambda c=chunk: marshal.dumps(c, 4)) + _per_item(
            lambda b=m: marshal.loads(b)
        )
        print(f"{kind:<10}{pk:>10.0f}{ms:>10.0f}{scan:>11.0f}{ms + scan:>14.0f}")


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
        serialisation(a.payloads.split(","))
    if not a.skip_start:
        start_methods(a.start_rounds)


if __name__ == "__main__":
    main()
