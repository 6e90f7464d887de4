"""The CSV running sum's floor on this machine: what its DAG costs with no engine at all
(issue 24, the row ``rsf`` of bench/processes.py).

    python bench/rsf_floor.py [--rounds 3]

bench/processes.py's ``rsf`` row runs bench/wordcount.py's ``rsf_dag`` (``read_files`` ->
distributed edge partitioned by the user's ``rsf_key`` -> the user's ``CsvRunningSum``
-> ``map_sink``) over 2,000,000 lines in 8 files, against the plain loop over the same
files. This script measures, in forked processes and by CPU (``time.process_time`` /
``time.thread_time``, so a busy machine moves the figures less than the wall time):

* ``plain loop``: bench/wordcount.py's ``rsf_plain`` over the 8 files, one process.
* ``plain loop, 2 procs by hand``: each half of the files in its own process at once
  (no merge): what a second process costs code that shares nothing.
* ``a member's pieces``: the work one member of ``processes=2`` cannot do without, on
  its 4 files, composed in one loop with the engine's own functions and no tasklet,
  queue or socket: the read (blocks decoded and split into lines), the split by key
  (``PerTargetCollector._split``: the user's ``rsf_key`` on every line, the key cache),
  the crossing half's encoding both ways (``pack_text``, pickle, ``unpack_text``), the
  user's processor through ``AbstractProcessor.process`` and ``try_emit``, and the map
  sink's check and ``dict.update``; ns per line of the member's 1,000,000. Alone, then
  two such processes at once (one per half of the files).
* ``the DAG by hand, 2 procs``: the same pieces in two processes that send each other
  their crossing lines over a socketpair (the engine's frame encoding): a hand-written
  two-process program of this DAG, no engine. Its busiest process's CPU is what
  ``processes=2`` could reach if the engine's own machinery (tasklets, queues, credits,
  reports) cost nothing.
* ``the user's processor``: its logic written as a loop, then through the API with a
  ``try_emit`` that only appends, then with the real ``try_emit`` (ns per line, one file).

Internals, not the documented API: a measurement of the DAG's floor, not a user's job
(docs/performance.md, "The running sum's floor on 2 cores").
"""

from __future__ import annotations

import argparse
import gc
import glob
import multiprocessing
import os
import pickle
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wordcount  # noqa: E402
from benchlib import cache_path  # noqa: E402

from slipstream.core.inbox import Inbox  # noqa: E402
from slipstream.core.outbox import Outbox  # noqa: E402
from slipstream.core.partition import DEFAULT_PARTITION_COUNT  # noqa: E402
from slipstream.engine.gc_tuning import JOB_THRESHOLD  # noqa: E402
from slipstream.execution.collectors import PerTargetCollector  # noqa: E402
from slipstream.execution.remote import pack_text, unpack_text  # noqa: E402
from slipstream.sinks.basic import _plain_tuples  # noqa: E402

LINES = 2_000_000
FILES = 8  # bench/processes.py's RSF_FILES
CHUNK = 2048  # the source's outbox capacity (a chunk the split gets)
_HEAD = struct.Struct("!I")
_tt = time.thread_time


class _AnyQueue:
    capacity = 1 << 30

    def offer(self, item: Any, size: int) -> bool:
        return True


class _Errors:
    def bind(self, outbox: Outbox) -> None:
        pass


class _Context:
    metrics: dict[str, int] = {}
    item_errors = _Errors()


def _lines(path: str, block: int = 1 << 16) -> Iterator[list[str]]:
    """The file's lines in blocks, without their newline (as ``read_files`` gives them)."""
    carry = ""
    with open(path, encoding="utf-8") as fh:
        while True:
            text = fh.read(block)
            if not text:
                return
            lines = (carry + text).split("\n")
            carry = lines.pop()
            yield lines


class _Member:
    """One member's pieces: the split, the processor with its outbox, the sink's map."""

    def __init__(self) -> None:
        table = [p % 2 for p in range(DEFAULT_PARTITION_COUNT)]
        self.split = PerTargetCollector(
            [_AnyQueue(), _AnyQueue()], wordcount.rsf_key, partition_to_target=table
        )._split
        self.processor = wordcount.CsvRunningSum()
        outbox = Outbox(1, CHUNK)
        self.processor.init(outbox, _Context())  # type: ignore[arg-type]
        self.bucket = outbox.buckets[0]
        self.inbox = Inbox()
        self.sink: dict[str, int] = {}
        self.acc = dict.fromkeys(("read", "split", "channel", "process", "sink"), 0.0)

    def run(self, part: list[str]) -> None:
        acc = self.acc
        t0 = _tt()
        self.inbox.extend(part)
        self.processor.process(0, self.inbox)
        t1 = _tt()
        if _plain_tuples(self.bucket):
            self.sink.update(self.bucket)
        self.bucket.clear()
        acc["process"] += t1 - t0
        acc["sink"] += _tt() - t1


def _plain(share: list[str]) -> tuple[float, dict[str, float]]:
    t0 = time.process_time()
    sums: dict[str, int] = {}
    get = sums.get
    for path in share:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                k, v = line.split(",", 1)
                sums[k] = get(k, 0) + int(v)
    return time.process_time() - t0, {}


def _pieces(share: list[str]) -> tuple[float, dict[str, float]]:
    """A member's pieces in one loop; the crossing half encoded and decoded here."""
    m = _Member()
    acc = m.acc
    for path in share:
        blocks = _lines(path)
        while True:
            t0 = _tt()
            block = next(blocks, None)
            acc["read"] += _tt() - t0
            if block is None:
                break
            for i in range(0, len(block), CHUNK):
                t0 = _tt()
                mine, theirs = m.split(block[i : i + CHUNK], 2)
                t1 = _tt()
                body = pickle.dumps(pack_text(theirs), pickle.HIGHEST_PROTOCOL)
                crossed = unpack_text(pickle.loads(body))
                acc["split"] += t1 - t0
                acc["channel"] += _tt() - t1
                m.run(mine)
                m.run(crossed)
    return sum(acc.values()), acc


def _by_hand(me: int, share: list[str], sock: socket.socket) -> tuple[float, dict[str, float]]:
    """A member's pieces, its crossing lines sent to the other process over ``sock``."""
    t0 = time.process_time()
    sock.setblocking(False)
    m = _Member()
    out = bytearray()
    into = bytearray()
    peer_done = False

    def pump() -> None:
        nonlocal peer_done
        if out:
            try:
                del out[: sock.send(out)]
            except BlockingIOError:
                pass
        while True:
            try:
                data = sock.recv(1 << 18)
            except BlockingIOError:
                break
            if not data:
                break
            into.extend(data)
        pos = 0
        while len(into) - pos >= _HEAD.size:
            (length,) = _HEAD.unpack_from(into, pos)
            end = pos + _HEAD.size + length
            if len(into) < end:
                break
            text = pickle.loads(memoryview(into)[pos + _HEAD.size : end])
            pos = end
            if text is None:
                peer_done = True
            else:
                m.run(unpack_text(text))
        del into[:pos]

    def send(text: Any) -> None:
        body = pickle.dumps(text, pickle.HIGHEST_PROTOCOL)
        out.extend(_HEAD.pack(len(body)) + body)

    for path in share:
        for block in _lines(path):
            for i in range(0, len(block), CHUNK):
                parts = m.split(block[i : i + CHUNK], 2)
                if parts[1 - me]:
                    send(pack_text(parts[1 - me]))
                m.run(parts[me])
                pump()
    send(None)
    while out or not peer_done:
        pump()
        if out or not peer_done:
            time.sleep(0.0002)
    return time.process_time() - t0, {"keys": len(m.sink)}


def _child(fn: Callable[..., Any], args: tuple[Any, ...], conn: Any) -> None:
    gc.set_threshold(*JOB_THRESHOLD)  # as a job runs (engine/gc_tuning.py)
    conn.send(fn(*args))
    conn.close()


def _at_once(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
    """Each call in its own forked process, all at once; their results in order."""
    ctx = multiprocessing.get_context("fork")
    running = []
    for fn, args in calls:
        here, there = ctx.Pipe()
        p = ctx.Process(target=_child, args=(fn, args, there))
        p.start()
        running.append((p, here))
    results = [here.recv() for _, here in running]
    for p, _ in running:
        p.join()
    return results


def _processor_costs(path: str, rounds: int) -> dict[str, float]:
    """ns per line of the user's processor: its logic as a loop, through the API with a
    check-free ``try_emit``, through the API as it is."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")[:-1]

    def inline(chunks: list[list[str]]) -> float:
        sums: dict[str, int] = {}
        get = sums.get
        out: list[Any] = []
        emit = out.append
        t0 = _tt()
        for chunk in chunks:
            for line in chunk:
                k, v = line.split(",", 1)
                s = get(k, 0) + int(v)
                emit((k, s))
                sums[k] = s
            out.clear()
        return _tt() - t0

    class AppendOnly(wordcount.CsvRunningSum):
        def try_emit(self, item: Any, ordinal: int | None = None) -> bool:
            self._emit_bucket.append(item)
            return True

    def through(cls: type[wordcount.CsvRunningSum]) -> Callable[[list[list[str]]], float]:
        def run(chunks: list[list[str]]) -> float:
            p = cls()
            outbox = Outbox(1, CHUNK)
            p.init(outbox, _Context())  # type: ignore[arg-type]
            p._emit_bucket = bucket = outbox.buckets[0]
            inbox = Inbox()
            t0 = _tt()
            for chunk in chunks:
                inbox.extend(chunk)
                p.process(0, inbox)
                bucket.clear()
            return _tt() - t0

        return run

    variants = {
        "the logic as a loop": inline,
        "through the API, try_emit only appends": through(AppendOnly),
        "through the API": through(wordcount.CsvRunningSum),
    }
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in variants.items():
            chunks = [lines[i : i + 1024] for i in range(0, len(lines), 1024)]
            best[name] = min(best.get(name, 1e9), fn(chunks) * 1e9 / len(lines))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    d = cache_path(f"rsf-{LINES}-{FILES}")
    wordcount.write_rsf_file(d, LINES, FILES)
    files = sorted(glob.glob(os.path.join(d, "events-*.csv")))
    halves = [files[: FILES // 2], files[FILES // 2 :]]
    print(
        f"{os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"{LINES:,} lines in {FILES} files; CPU seconds (ns a line)"
    )

    def ns(seconds: float, lines: float) -> str:
        return f"{seconds * 1e9 / lines:.0f}"

    for r in range(a.rounds):
        ((plain, _),) = _at_once([(_plain, (files,))])
        split = _at_once([(_plain, (h,)) for h in halves])
        ((alone, acc),) = _at_once([(_pieces, (halves[0],))])
        two = _at_once([(_pieces, (h,)) for h in halves])
        s0, s1 = socket.socketpair()
        hand = _at_once([(_by_hand, (0, halves[0], s0)), (_by_hand, (1, halves[1], s1))])
        s0.close()
        s1.close()
        busiest_split = max(c for c, _ in split)
        busiest_two = max(c for c, _ in two)
        busiest_hand = max(c for c, _ in hand)
        half = LINES / 2
        print(f"round {r}:")
        print(f"  plain loop                     {plain:.3f} ({ns(plain, LINES)})")
        print(
            f"  plain loop, 2 procs by hand    {busiest_split:.3f} busiest ({ns(busiest_split, half)}): "
            f"{plain / busiest_split:.2f}x"
        )
        print(
            f"  a member's pieces, alone       {alone:.3f} ({ns(alone, half)}: "
            + ", ".join(f"{k} {ns(v, half)}" for k, v in acc.items())
            + ")"
        )
        print(
            f"  a member's pieces, two at once {busiest_two:.3f} busiest ({ns(busiest_two, half)}): "
            f"{plain / busiest_two:.2f}x of the plain loop"
        )
        print(
            f"  the DAG by hand, 2 procs       {busiest_hand:.3f} busiest ({ns(busiest_hand, half)}): "
            f"{plain / busiest_hand:.2f}x of the plain loop",
            flush=True,
        )
    costs = _processor_costs(files[0], max(3, 2 * a.rounds))
    print(
        "the user's processor, ns a line (best of rounds): "
        + "; ".join(f"{k} {v:.0f}" for k, v in costs.items())
    )


if __name__ == "__main__":
    main()
