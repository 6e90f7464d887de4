"""The forked snapshot writer (``JobConfig(snapshot_writer="fork")``, state/forked.py): a
processor's full save is written by a child process forked at the barrier."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import types
import weakref
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.state.forked import copied_maps, fork_chunk
from slipstream.state.keyed import DELTA, FULL, KeyedState, StateMap, StateMapSave, keyed_state
from slipstream.state.store import DirectorySnapshotStore
from store_support import class_path_text

EO = ProcessingGuarantee.EXACTLY_ONCE


class KeyedCount(ss.AbstractProcessor):
    """Counts items per key in a KeyedState; a key ``"lock"`` holds a lock instead."""

    def init_processor(self, context: Any) -> None:
        self.counts = keyed_state(context)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        key = item % 50
        counts = self.counts
        counts[key] = threading.Lock() if key == 7 and self.with_lock else counts.get(key, 0) + 1
        self.counts.changed(key)
        return True

    with_lock = False

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(*self.counts.snapshot_entry())

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.counts[key] = value


class LockedCount(KeyedCount):
    with_lock = True


def keyed_dag(proc: Any, name: str = "counts") -> DAG:
    dag = DAG()
    gen = dag.new_vertex("gen", sources.generator(lambda seq: seq, 20_000.0, max_items=None))
    gen.local_parallelism(1)
    counts = dag.new_vertex(name, proc).local_parallelism(2)
    sink = dag.new_vertex("sink", sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(gen, counts).partitioned(lambda seq: seq % 50))
    dag.edge(Edge.between(counts, sink))
    return dag


def config(store: str, writer: str) -> JobConfig:
    return JobConfig(
        processing_guarantee=EO,
        snapshot_interval_ms=20,
        snapshot_store=store,
        auto_restart=False,
        snapshot_writer=writer,
    )


def wait_for_commits(job: Any, n: int) -> None:
    deadline = time.monotonic() + 120
    while job.metrics["__job__"].get("snapshots", 0) < n:
        if job.status.is_terminal:
            job.join()
        assert time.monotonic() < deadline, "no snapshot committed"
        time.sleep(0.01)


@pytest.mark.parametrize("writer", ["thread", "fork"])
def test_unpicklable_keyed_state_fails_the_job_naming_the_processor(
    tmp_path: Any, writer: str
) -> None:
    job = ss.local().new_job(keyed_dag(LockedCount, "locked"), config(str(tmp_path), writer))
    with pytest.raises(ss.JobFailedError, match=r"'locked'.*cannot be pickled") as info:
        job.join(120)
    assert info.value.vertex == "locked"
    assert "cannot pickle '_thread.lock' object" in str(info.value)


def test_the_writer_child_neither_logs_nor_needs_a_lock_another_thread_holds(
    tmp_path: Any,
) -> None:
    """A logging handler whose lock another thread holds through the job's snapshots:
    the children write their chunks all the same (a child that used the handler would
    block on the lock, or, reinitialised, log under its own pid) and log nothing."""
    emitted = str(tmp_path / "emitted")

    class PidHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            with open(emitted, "a") as fh:
                fh.write(f"{os.getpid()} {record.getMessage()}\n")

    handler = PidHandler(logging.DEBUG)
    logger = logging.getLogger("slipstream")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        handler.acquire()
        held.set()
        release.wait()
        handler.release()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait()
    store = str(tmp_path / "store")
    job = ss.local().new_job(keyed_dag(KeyedCount), config(store, "fork"))
    try:
        wait_for_commits(job, 5)
        release.set()  # the snapshots committed while the lock was held
        jm = job.metrics["__job__"]
        assert jm["snapshot_writer_peak_rss_kb"] > 0  # written by forked children
    finally:
        release.set()
        job.cancel()
        try:
            job.join(60)
        except ss.JobCancelledError:
            pass
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    pids = set()
    if os.path.exists(emitted):
        with open(emitted) as fh:
            pids = {line.split()[0] for line in fh}
    assert pids <= {str(os.getpid())}
    # the chunks the children wrote name no slipstream class (a KeyedState is a dict
    # subclass: it is written as a plain dict)
    chunks = [n for n in os.listdir(store) if n.startswith("chunk-") and "-tf" in n]
    assert chunks
    for n in chunks:
        with open(os.path.join(store, n), "rb") as fh:  # a small payload compressed too
            assert b"slipstream" not in class_path_text(fh.read()).split(b"\n", 3)[3]


def test_fork_is_refused_where_the_platform_has_no_fork(monkeypatch: Any) -> None:
    monkeypatch.delattr(os, "fork")
    with pytest.raises(ValueError, match=r"snapshot_writer='fork' needs os\.fork"):
        JobConfig(snapshot_writer="fork")


def test_an_unknown_writer_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"snapshot_writer must be one of 'thread', 'fork', got 'process'"
    ):
        JobConfig(snapshot_writer="process")


def test_a_failed_fork_falls_back_to_the_store_thread(
    tmp_path: Any, monkeypatch: Any, caplog: Any
) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    store = str(tmp_path / "store")
    job = ss.local().new_job(keyed_dag(KeyedCount), config(store, "fork"))
    try:
        wait_for_commits(job, 3)
        assert "snapshot_writer_peak_rss_kb" not in job.metrics["__job__"]
    finally:
        job.cancel()
        try:
            job.join(60)
        except ss.JobCancelledError:
            pass
    assert "counts#0: cannot fork a snapshot writer ([Errno 11] Resource temporarily " in (
        caplog.text
    )
    assert not [n for n in os.listdir(store) if "-tf" in n]  # every chunk by the store thread


def test_a_live_delta_is_what_the_thread_writer_saves() -> None:
    """Under the fork writer a delta save hands over the map and its changed keys (the
    child picks the values); materialised, it is the thread writer's delta."""
    entries = {}
    for writer in ("thread", "fork"):
        ctx = types.SimpleNamespace(
            incremental_snapshots=True,
            current_snapshot_id=1,
            committed_snapshot_id=0,
            snapshot_writer=writer,
        )
        s = KeyedState(context=ctx)
        for k in range(10):
            s[k] = k
        s.snapshot_entry()
        ctx.current_snapshot_id, ctx.committed_snapshot_id = 2, 1
        s[3] = 30
        s.changed(3)
        del s[4]
        s.changed(4)
        entries[writer] = [s.snapshot_entry()]
    live = entries["fork"][0][1]
    assert live.mode == DELTA and type(live.upserts) is KeyedState
    assert copied_maps(entries["fork"]) == entries["thread"] == [
        (StateMap("e", None), StateMapSave(DELTA, {3: 30}, (4,), 1))
    ]


class _Cycle:
    """Garbage only the cyclic collector frees (it refers to itself)."""


class _Allocating:
    """A state value whose pickling allocates ``n`` lists, all alive at once: enough for
    an automatic collection wherever the collector is on."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> Any:
        lists = [[] for _ in range(self.n)]
        return int, (len(lists),)


def test_the_writer_child_runs_no_finalizer_of_the_parents_garbage(tmp_path: Any) -> None:
    """The child inherits the garbage the parent has not collected yet; a collection in
    the child would run the parent's finalizers there (a disk-backed state's closes its
    SQLite connection, whose mutexes another thread may hold at the fork, and removes its
    directory). The child's save allocates far past the collector's threshold: the
    finalizer of a cycle left before the fork runs in the parent only."""
    ran = tmp_path / "finalized"

    def finalized() -> None:
        with open(ran, "a") as fh:
            fh.write(f"{os.getpid()}\n")

    os.mkdir(tmp_path / "store", 0o700)
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    state = KeyedState()
    state["k"] = _Allocating(50_000)
    entries = [(StateMap("e", None), StateMapSave(FULL, state))]
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(20_000)  # nothing collects in this process until the fork
    try:
        cycle = _Cycle()
        cycle.me = cycle  # type: ignore[attr-defined]
        weakref.finalize(cycle, finalized)
        del cycle
        child = fork_chunk(store.directory, store.key, 1, "v", 0, entries)
        assert child.wait().snapshot_id == 1
    finally:
        gc.set_threshold(*threshold)
    assert not ran.exists()  # not in the child, and not yet here
    gc.collect()
    assert ran.read_text().split() == [str(os.getpid())]
    assert gc.isenabled()
