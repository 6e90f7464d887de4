"""Compaction (state/compact.py): a chain longer than max_deltas is merged into one full
chunk in the background, later manifests name it instead of the chunks it replaces, and
chunk files no retained manifest names are removed (disk use stays bounded)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from slipstream.engine.snapshot import SnapshotCoordinator
from slipstream.state import compact
from slipstream.state.keyed import DELTA, FULL, PLAIN, StateMap, StateMapSave
from slipstream.state.store import DirectorySnapshotStore, SnapshotData, VertexState


def wait_for(cond: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def snapshot(sid: int, save: StateMapSave) -> SnapshotData:
    data = SnapshotData(sid, "j")
    data.vertices["v"] = VertexState(1, {0: [("offset", sid), (StateMap(PLAIN), save)]})
    return data


class Unimportable:
    """A value class a child process cannot import (it claims to live in __main__)."""

    __module__ = "__main__"

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unimportable) and other.x == self.x

    def __hash__(self) -> int:
        return self.x


def test_deltas_that_outweigh_their_full_chunk_are_compacted(tmp_path: Any) -> None:
    """However few they are: a restore then reads at most about twice the state."""
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=8)
    c.write_snapshot(snapshot(1, StateMapSave(FULL, {1: 1})))
    c.write_snapshot(snapshot(2, StateMapSave(DELTA, {k: k for k in range(100)}, (1,), 1)))
    wait_for(lambda: c.compactions >= 1, "the compaction")
    c.write_snapshot(snapshot(3, StateMapSave(DELTA, {}, (), 2)))
    assert [r.snapshot_id for r in store.read_manifest(3).vertices["v"].chains[0]] == [2, 3]
    c.stop()


@pytest.mark.parametrize("in_child", [True, False])
def test_a_long_chain_is_compacted_and_old_chunks_are_removed(tmp_path: Any, in_child: bool) -> None:
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=2, compact_in_child=in_child)
    expected = {k: 0 for k in range(100)}
    c.write_snapshot(snapshot(1, StateMapSave(FULL, dict(expected))))
    for sid in range(2, 15):
        upserts = {sid: sid, sid + 50: -sid}
        expected.update(upserts)
        removed = (sid - 1,) if sid % 3 == 0 else ()
        for k in removed:
            expected.pop(k, None)
        c.write_snapshot(snapshot(sid, StateMapSave(DELTA, upserts, removed, sid - 1)))
        assert c._compactor is not None
        wait_for(c._compactor.idle, "the compaction")  # (a job does not wait for it)
        data = store.read(sid)
        assert data.vertices["v"].entries[0] == [
            ("offset", sid),
            (StateMap(PLAIN), StateMapSave(FULL, expected)),
        ]
    chain = store.read_manifest(14).vertices["v"].chains[0]
    assert chain[0].file.endswith("-c.bin") and chain[0].mode == "full"
    assert len(chain) <= 1 + 2 + 1  # compacted when more than max_deltas, next one applies it
    assert c.compactions >= 3
    c.stop()
    # every chunk file is named by a retained manifest (3 kept): disk use is bounded
    named = set()
    for i in store.committed_ids():
        named |= store.read_manifest(i).files()
    chunks = {n for n in os.listdir(store.directory) if n.startswith("chunk-")}
    assert chunks - named == set() or all(n in store.protected for n in chunks - named)
    assert len(chunks) <= 3 * 5
    assert c.store_bytes == store.disk_bytes() > 0


def test_a_child_that_cannot_load_the_values_compacts_on_the_thread(tmp_path: Any) -> None:
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=1)
    base = {k: Unimportable(k) for k in range(100, 300)}  # the deltas do not outweigh it
    c.write_snapshot(snapshot(1, StateMapSave(FULL, {1: Unimportable(1), **base})))
    c.write_snapshot(snapshot(2, StateMapSave(DELTA, {2: Unimportable(2)}, (), 1)))
    c.write_snapshot(snapshot(3, StateMapSave(DELTA, {3: Unimportable(3)}, (), 2)))
    wait_for(lambda: c.compactions >= 1, "the compaction")
    c.write_snapshot(snapshot(4, StateMapSave(DELTA, {1: Unimportable(4)}, (), 3)))
    chain = store.read_manifest(4).vertices["v"].chains[0]
    assert [r.snapshot_id for r in chain] == [3, 4] and chain[0].file.endswith("-c.bin")
    assert store.read(4).vertices["v"].entries[0][1] == (
        StateMap(PLAIN),
        StateMapSave(FULL, {1: Unimportable(4), **base, 2: Unimportable(2), 3: Unimportable(3)}),
    )
    c.stop()


def test_a_compaction_superseded_by_a_full_save_is_not_used(tmp_path: Any) -> None:
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=1)
    base = {k: 0 for k in range(100, 300)}  # the deltas do not outweigh it
    c.write_snapshot(snapshot(1, StateMapSave(FULL, {1: 1, **base})))
    c.write_snapshot(snapshot(2, StateMapSave(DELTA, {2: 2}, (), 1)))
    c.write_snapshot(snapshot(3, StateMapSave(DELTA, {3: 3}, (), 2)))
    wait_for(lambda: c.compactions >= 1, "the compaction")
    c.write_snapshot(snapshot(4, StateMapSave(FULL, {4: 4, **base})))  # every key changed
    assert [r.mode for r in store.read_manifest(4).vertices["v"].chains[0]] == ["full"]
    c.write_snapshot(snapshot(5, StateMapSave(DELTA, {5: 5}, (), 4)))
    assert store.protected == set()
    c.write_snapshot(snapshot(6, StateMapSave(DELTA, {6: 6}, (), 5)))
    c.write_snapshot(snapshot(7, StateMapSave(DELTA, {7: 7}, (), 6)))
    assert not [n for n in os.listdir(store.directory) if n.startswith("chunk-0000000003")]
    c.stop()


def test_the_child_process_entry_point(tmp_path: Any) -> None:
    """python -m slipstream.state.compact: the request on stdin, the reference on stdout."""
    store = DirectorySnapshotStore(str(tmp_path / "store"), key=b"k" * 16)
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=None)
    c.write_snapshot(snapshot(1, StateMapSave(FULL, {1: 1})))
    c.write_snapshot(snapshot(2, StateMapSave(DELTA, {2: 2}, (1,), 1)))
    chain = store.read_manifest(2).vertices["v"].chains[0]
    ref = compact.compact_in_child(store, "v", 0, chain)
    assert ref.snapshot_id == 2 and ref.file.endswith("-c.bin")
    assert store.read_chain([ref], "v", 0, 2) == [
        ("offset", 2),
        (StateMap(PLAIN), StateMapSave(FULL, {2: 2})),
    ]


def test_the_child_runs_niced_below_the_job() -> None:
    """The child takes the CPU the job's threads leave idle (COMPACTION_NICE): it is
    niced before it reads its request (main: the child ran at the job's priority)."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream.state.compact"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        expected = min(19, ours + compact.COMPACTION_NICE)
        wait_for(lambda: os.getpriority(os.PRIO_PROCESS, proc.pid) == expected, "the nice")
    finally:
        proc.communicate(b"")  # no request: the child fails and ends
    assert proc.returncode != 0


class HeldChild:
    """Stands in for a compaction child still running when the job ends (a niced child
    on a busy machine): it runs until the job's stop terminates it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.terminated = threading.Event()

    def __call__(self, store: Any, vertex: str, index: int, chain: Any, started: Any = None) -> Any:
        if started is not None:
            started(self)
        self.started.set()
        self.terminated.wait(60)
        raise RuntimeError("exit status -15")

    def poll(self) -> int | None:
        return -15 if self.terminated.is_set() else None

    def terminate(self) -> None:
        self.terminated.set()

    def kill(self) -> None:
        self.terminated.set()

    def wait(self, timeout: float | None = None) -> int:
        return -15


def test_a_compaction_running_when_the_job_ends_leaves_no_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks a running compaction reads are protected from the store's GC; once the
    job's stop ends it, the ones no retained manifest names any more are removed (main:
    the last commit's GC skipped them and nothing removed them later, so a completed
    job's store kept them for good: tests/engine/test_kill_compaction.py seed 12 once
    found 4 such chunks, the niced child still running after the job's last commit)."""
    child = HeldChild()
    monkeypatch.setattr(compact, "compact_in_child", child)
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=1)
    base = {k: 0 for k in range(100, 300)}
    c.write_snapshot(snapshot(1, StateMapSave(FULL, {1: 1, **base})))
    c.write_snapshot(snapshot(2, StateMapSave(DELTA, {2: 2}, (), 1)))
    c.write_snapshot(snapshot(3, StateMapSave(DELTA, {3: 3}, (), 2)))
    assert child.started.wait(60), "no compaction started"
    for sid in range(4, 7):  # full saves: no retained manifest names chunks 1-3 any more
        c.write_snapshot(snapshot(sid, StateMapSave(FULL, {sid: sid, **base})))
    assert {n[:16] for n in os.listdir(store.directory) if n.startswith("chunk-")} >= {
        "chunk-0000000001"
    }  # (the compaction's inputs, protected while it runs)
    c.stop()
    named = set().union(*(store.read_manifest(i).files() for i in store.committed_ids()))
    assert sorted(n for n in os.listdir(store.directory) if n.startswith("chunk-")) == sorted(named)
    assert store.protected == set()


def test_a_stop_while_the_first_compaction_starts_its_thread_joins_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ends (stop() on a worker thread) while the store thread submits the first
    compaction: main made the thread, published it and then started it, so a stop in
    between raised "cannot join thread before it is started" on the worker thread, and
    the job never ended (join() waited for ever: docs/state.md:236, 1 of 8 runs side by
    side). Here the stop comes exactly then; the thread is started under the lock
    stop() takes, so it waits for the start and joins the thread."""
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = compact.Compactor(store, in_child=False, name="t")
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            c.stop()
        except BaseException as e:  # noqa: BLE001 - what the worker thread would die of
            errors.append(e)

    stopper = threading.Thread(target=stop)

    class StopFirst(threading.Thread):
        def start(self) -> None:
            if self.name.endswith("-compaction"):
                stopper.start()
                stopper.join(0.2)  # main: stop() ran (and failed) meanwhile
            super().start()

    monkeypatch.setattr(compact.threading, "Thread", StopFirst)
    ref = compact.ChunkRef("chunk-1", "", 1, DELTA, 0)
    c.submit(("v", 0), [ref])
    stopper.join(60)
    assert not stopper.is_alive() and errors == []
    assert c._thread is not None
    c._thread.join(60)
    assert not c._thread.is_alive()  # it took the stop's None and ended


FAILED = "compacting the chain of v#0"


def chain_store(tmp_path: Any) -> tuple[DirectorySnapshotStore, SnapshotCoordinator]:
    """A store whose snapshot 3 names the chain full 1, delta 2, delta 3 (no compactor)."""
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1}, max_deltas=None)
    base = {k: 0 for k in range(100, 300)}
    c.write_snapshot(snapshot(1, StateMapSave(FULL, {1: 1, **base})))
    c.write_snapshot(snapshot(2, StateMapSave(DELTA, {2: 2}, (), 1)))
    c.write_snapshot(snapshot(3, StateMapSave(DELTA, {3: 3}, (), 2)))
    return store, c


@pytest.mark.parametrize("in_child", [False, True])
def test_a_compaction_whose_chain_was_superseded_and_collected_fails_quietly(
    tmp_path: Any, caplog: Any, in_child: bool
) -> None:
    """The chain restarted with a full save and GC removed the compaction's inputs before
    it ran (few keys, a high snapshot rate): normal operation, no warning (and no second
    attempt on the thread after the child's)."""
    store, c = chain_store(tmp_path)
    chain = store.read_manifest(3).vertices["v"].chains[0]
    base = {k: 0 for k in range(100, 300)}
    c.write_snapshot(snapshot(4, StateMapSave(FULL, {4: 4, **base})))
    for sid in (5, 6):
        c.write_snapshot(snapshot(sid, StateMapSave(DELTA, {sid: sid}, (), sid - 1)))
    assert not os.path.exists(os.path.join(store.directory, chain[0].file))  # collected
    compactor = compact.Compactor(store, in_child=in_child, name="j")
    with caplog.at_level("DEBUG", logger="slipstream.snapshot"):
        compactor.submit(("v", 0), chain)
        wait_for(lambda: compactor.superseded == 1 and compactor.idle(), "the compaction")
    compactor.stop()
    c.stop()
    assert compactor.failed == 0
    assert [r for r in caplog.records if FAILED in r.getMessage() and r.levelname == "WARNING"] == []
    assert [r.levelname for r in caplog.records if "superseded" in r.getMessage()] == ["DEBUG"]
    assert [r for r in caplog.records if "compacting on the job's compaction thread" in r.getMessage()] == []
    assert compactor.take_done() == {} and store.protected == set()


def test_a_chunk_missing_from_a_current_chain_is_still_a_warning(tmp_path: Any, caplog: Any) -> None:
    store, c = chain_store(tmp_path)
    chain = store.read_manifest(3).vertices["v"].chains[0]
    os.unlink(os.path.join(store.directory, chain[1].file))  # named by snapshot 3: damage
    compactor = compact.Compactor(store, in_child=False, name="j")
    with caplog.at_level("DEBUG", logger="slipstream.snapshot"):
        compactor.submit(("v", 0), chain)
        wait_for(lambda: compactor.failed == 1 and compactor.idle(), "the compaction")
    compactor.stop()
    c.stop()
    assert compactor.superseded == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and FAILED in warnings[0], warnings
    assert f"{chain[1].file} (vertex 'v', processor 0) is missing" in warnings[0]
    assert "the chain stays as it is" in warnings[0]
