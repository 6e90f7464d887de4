"""Compaction of a snapshot chain (state/compact.py): in a child process or on a thread
of the job's process, and what each costs the job's own Python threads.

A chain of one full chunk of ``--keys`` keys (int -> int, a rolling count's state) and
``--deltas`` delta chunks of ``--changed`` keys each is written to a fresh store; then
it is compacted ``--runs`` times each way while a "job" thread runs a pure-Python loop
(a cooperative thread's work, it needs the GIL). Printed per way: the compaction's wall
time, the job thread's loop rate during it against its rate with nothing else running,
and its longest stall (the longest time between two of its loops: what a processor's
pause would be). The child process takes no GIL from the job; the thread does.

    PYTHONPATH=src python bench/compaction.py --keys 1000000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from slipstream.state import compact  # noqa: E402
from slipstream.state.keyed import DELTA, FULL, PLAIN, StateMap, StateMapSave  # noqa: E402
from slipstream.state.store import (  # noqa: E402
    DirectorySnapshotStore,
    Manifest,
    VertexManifest,
    encode_chunk,
)


def write_chain(store: DirectorySnapshotStore, keys: int, deltas: int, changed: int) -> list:
    chain = []
    full = {k: k for k in range(keys)}
    store.begin(1)
    chain.append(store.write_chunk(1, "sum", 0, "full", encode_chunk([(StateMap(PLAIN), StateMapSave(FULL, full))], 1, "sum", 0)))
    for sid in range(2, deltas + 2):
        store.begin(sid)
        ups = {(sid * 7919 + i * 104729) % keys: sid for i in range(changed)}
        payload = encode_chunk([(StateMap(PLAIN), StateMapSave(DELTA, ups, (), sid - 1))], sid, "sum", 0)
        chain.append(store.write_chunk(sid, "sum", 0, "delta", payload))
    m = Manifest(deltas + 1, "bench")
    m.vertices["sum"] = VertexManifest(1, chains={0: chain})
    store.commit(m)
    return chain


class Loop:
    """A pure-Python loop on its own thread: iterations per second while it runs."""

    def __init__(self) -> None:
        self.n = 0
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        x = 0
        clock = time.perf_counter
        last = clock()
        while not self.stop:
            for i in range(1000):
                x += i
            self.n += 1
            now = clock()
            if now - last > self.gap:
                self.gap = now - last
            last = now

    gap = 0.0  # the longest time between two loops (a stall of the job thread)

    def rate(self, fn) -> tuple[float, float, float]:
        self.n = 0
        self.gap = 0.0
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        return dt, self.n / dt, self.gap


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--deltas", type=int, default=4)
    ap.add_argument("--changed", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = DirectorySnapshotStore(os.path.join(d, "store"), key=b"b" * 16)
        store.bind("bench", "e")
        chain = write_chain(store, a.keys, a.deltas, a.changed)
        size = sum(r.size for r in chain)
        loop = Loop()
        loop.t.start()
        _, idle, idle_gap = loop.rate(lambda: time.sleep(1.0))
        print(f"chain: {a.keys:,} keys + {a.deltas} deltas of {a.changed:,} keys, {size / 1e6:.1f} MB; load {os.getloadavg()[0]:.1f}")
        print(f"job thread alone: {idle:,.0f} loops/s, longest stall {idle_gap * 1000:.0f} ms")
        for way, fn in (
            ("child process", lambda: compact.compact_in_child(store, "sum", 0, chain)),
            ("thread", lambda: compact.compact_chain(store, "sum", 0, chain)),
        ):
            for _ in range(a.runs):
                dt, r, gap = loop.rate(fn)
                print(
                    f"{way:14s} compaction {dt * 1000:6.0f} ms   job thread {r:,.0f} loops/s "
                    f"({r / idle:.2f}x), longest stall {gap * 1000:.0f} ms"
                )
        loop.stop = True


if __name__ == "__main__":
    main()
