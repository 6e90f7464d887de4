"""Processors for the snapshot tests: a paced source with offsets, and a keyed running
sum and a mapper that can be told to fail."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, sinks
from slipstream.core.errors import SnapshotError
from slipstream.state.keys import BroadcastKey
from slipstream.state.store import DirectorySnapshotStore, Manifest

FAIL_BUDGET: list[int] = [0]
#: when set, every PacedSource holds at this many items of its share (emits no more and
#: does not complete) until the test sets it back to ``None``: a test that must act in
#: the middle of a job waits for that point instead of sleeping and hoping
HOLD_AT: list[int | None] = [None]
FAIL_LOCK = threading.Lock()


def take_failure() -> bool:
    with FAIL_LOCK:
        if FAIL_BUDGET[0] > 0:
            FAIL_BUDGET[0] -= 1
            return True
        return False


class PacedSource(ss.AbstractProcessor):
    """Emits ``range(n)``'s share of this processor at ``rate`` items/s (per processor),
    saving its offset so a restored job continues where the snapshot was taken."""

    def __init__(
        self,
        n: int,
        rate: float = 50_000.0,
        batch: int = 16,
        min_snapshots: int = 0,
        wm_lag: int | None = None,
    ) -> None:
        self.n = n
        self.rate = rate
        self.batch = batch
        self.offset = 0
        # do not complete before taking part in this many snapshots: a test that needs
        # snapshots waits for them instead of hoping the job runs long enough
        self.min_snapshots = min_snapshots
        self.saved = 0
        # with wm_lag: Watermark(item - wm_lag) after every item (items are timestamps)
        self.wm_lag = wm_lag
        self.wm_pending = False

    def init_processor(self, context: ss.Context) -> None:
        self.mine = list(range(context.global_processor_index, self.n, context.total_parallelism))
        self.start = time.monotonic()
        self.start_offset = 0

    def complete(self) -> bool:
        due = self.start_offset + int((time.monotonic() - self.start) * self.rate) + 1
        hold = HOLD_AT[0]
        stop = min(len(self.mine), due, self.offset + self.batch)
        if hold is not None and stop > hold:
            stop = hold if hold > self.offset else self.offset
        while self.offset < stop or self.wm_pending:
            if self.wm_pending:
                wm = ss.Watermark(self.mine[self.offset - 1] - self.wm_lag)  # type: ignore[operator]
                if not self.try_emit(wm):
                    return False
                self.wm_pending = False
                continue
            if not self.try_emit(self.mine[self.offset]):
                return False
            self.offset += 1
            self.wm_pending = self.wm_lag is not None
        return (
            self.offset >= len(self.mine)
            and self.saved >= self.min_snapshots
            and HOLD_AT[0] is None
        )

    def save_to_snapshot(self) -> bool:
        if not self.try_emit_to_snapshot(
            BroadcastKey(("offset", self.context.global_processor_index)), self.offset
        ):
            return False
        self.saved += 1
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if key.name == ("offset", self.context.global_processor_index):
            self.offset = self.start_offset = value


class RunningSum(ss.AbstractProcessor):
    """(key, running sum) per item, key = item % keys. May fail once per FAIL_BUDGET unit
    after ``fail_after`` items."""

    def __init__(self, keys: int = 10, fail_after: int = -1) -> None:
        self.keys = keys
        self.fail_after = fail_after
        self.sums: dict[int, int] = {}
        self.seen = 0

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        k = item % self.keys
        s = self.sums.get(k, 0) + item
        if not self.try_emit((k, s)):
            return False
        self.sums[k] = s
        self.seen += 1
        if self.seen == self.fail_after and take_failure():
            raise RuntimeError(f"injected failure after {self.seen} items")
        return True

    def save_to_snapshot(self) -> bool:
        return self.save_state(self.sums.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


class FailingMap(ss.AbstractProcessor):
    """x -> x * 2; may fail once per FAIL_BUDGET unit after ``fail_after`` items."""

    def __init__(self, fail_after: int = -1) -> None:
        self.fail_after = fail_after
        self.seen = 0

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if not self.try_emit(item * 2):
            return False
        self.seen += 1
        if self.seen == self.fail_after and take_failure():
            raise RuntimeError(f"injected failure after {self.seen} items")
        return True


def running_sum_dag(
    n: int, fail_after: int = -1, rate: float = 40_000.0, sum_lp: int = 2, min_snapshots: int = 0
) -> DAG:
    """PacedSource(range(n)) -> RunningSum (keyed by x % 10) -> list_sink("out")."""
    dag = DAG()
    src = dag.new_vertex(
        "src", functools.partial(PacedSource, n, rate, min_snapshots=min_snapshots)
    ).local_parallelism(2)
    rs = dag.new_vertex("sum", functools.partial(RunningSum, 10, fail_after)).local_parallelism(
        sum_lp
    )
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, rs).partitioned(lambda x: x % 10).distributed())
    dag.edge(Edge.between(rs, sink))
    return dag


def expected_running_sums(n: int, shift: int = 0) -> Counter:
    """The ``(x % 10, running sum)`` pairs of ``x + shift`` for ``x`` in ``0 .. n-1``."""
    sums: dict[int, int] = {}
    out: Counter = Counter()
    for x in range(n):
        k = x % 10
        sums[k] = sums.get(k, 0) + x + shift
        out[(k, sums[k])] += 1
    return out


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``condition`` until it holds (generous deadline: machines are loaded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def newest_manifest(store_dir: str, key: bytes | None = None) -> Manifest | None:
    """The manifest of the newest committed snapshot in ``store_dir`` while a job may be
    committing there (``None`` before its first commit). The store keeps its newest
    ``keep`` (3) snapshots and removes older ones as it commits: with a snapshot every
    20 ms, a reader held up for a few commits between listing the ids and opening the
    newest finds that file gone. Then it reads the new newest, as the state readers do
    (``slipstream.state.reader``); a snapshot still listed that cannot be read is an
    error."""
    store = DirectorySnapshotStore(store_dir, key=key)
    while True:
        ids = store.committed_ids_read_only()  # what MANIFEST.json names, never rebuilt
        if not ids:
            return None
        try:
            return store.read_manifest(ids[-1])
        except SnapshotError:
            if store.committed_ids_read_only() == ids:
                raise


class KeyedRunningSum(ss.AbstractProcessor):
    """(key, running sum) per item, key = item % keys, kept in a KeyedState: with
    incremental snapshots it saves only the keys that changed. May fail once per
    FAIL_BUDGET unit after ``fail_after`` items."""

    def __init__(self, keys: int = 1000, fail_after: int = -1) -> None:
        self.keys = keys
        self.fail_after = fail_after
        self.seen = 0

    def init_processor(self, context: ss.Context) -> None:
        from slipstream.state.keyed import keyed_state

        self.sums = keyed_state(context)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        k = item % self.keys
        s = self.sums.get(k, 0) + item
        if not self.try_emit((k, s)):
            return False
        self.sums[k] = s
        if self.sums.dirty is not None:
            self.sums.dirty.add(k)
        self.seen += 1
        if self.seen == self.fail_after and take_failure():
            raise RuntimeError(f"injected failure after {self.seen} items")
        return True

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(*self.sums.snapshot_entry())

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


def keyed_sum_dag(
    n: int, keys: int = 1000, fail_after: int = -1, rate: float = 40_000.0, sum_lp: int = 2
) -> DAG:
    """PacedSource(range(n)) -> KeyedRunningSum (keyed by x % keys) -> list_sink("out")."""
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(PacedSource, n, rate)).local_parallelism(2)
    rs = dag.new_vertex("sum", functools.partial(KeyedRunningSum, keys, fail_after))
    rs.local_parallelism(sum_lp)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, rs).partitioned(lambda x, k=keys: x % k).distributed())
    dag.edge(Edge.between(rs, sink))
    return dag


def expected_keyed_sums(n: int, keys: int = 1000) -> Counter:
    sums: dict[int, int] = {}
    out: Counter = Counter()
    for x in range(n):
        k = x % keys
        sums[k] = sums.get(k, 0) + x
        out[(k, sums[k])] += 1
    return out
