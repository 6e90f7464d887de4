"""Incremental snapshots on the embedded engine (issue 22): keyed state kept in a
KeyedState saves only the keys that changed, the store chains a full chunk and delta
chunks per processor, and a restore merges the chain: output stays exactly-once across
a cancel and resume, an auto-restart, and another parallelism."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import JobConfig, JobStatus, ProcessingGuarantee
from slipstream.engine.snapshot import SnapshotCoordinator
from slipstream.state.keyed import DELTA, FULL, PLAIN, StateMap, StateMapSave
from slipstream.state.store import DirectorySnapshotStore, SnapshotData, VertexState

EO = ProcessingGuarantee.EXACTLY_ONCE
N = 6000
KEYS = 1000


def config(store: Any, **kw: Any) -> JobConfig:
    kw.setdefault("name", "inc")
    kw.setdefault("snapshot_interval_ms", 20)
    kw.setdefault("restart_delay_ms", 1)
    return JobConfig(processing_guarantee=EO, snapshot_store=store, **kw)


def chains(store_dir: str) -> list[list[str]]:
    """The modes of every committed snapshot's chains of vertex 'sum'."""
    store = DirectorySnapshotStore(store_dir)
    out = []
    for i in store.committed_ids():
        m = store.read_manifest(i)
        out.extend([r.mode for r in c] for c in m.vertices["sum"].chains.values())
    return out


def test_deltas_are_chained_and_a_resume_is_exact(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(stp.keyed_sum_dag(10**7, KEYS, rate=3000.0), config(store_dir))
    # wait until some chain holds deltas (every key changes within ~0.3 s at 3000 items/s:
    # a save of every key is full, so deltas come from the snapshots in between)
    stp.wait_for(
        lambda: job.metrics["__job__"]["snapshots"] >= 3
        and any(DELTA in c for c in chains(store_dir)),
        what="a delta chunk",
    )
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    assert job.metrics["__job__"]["snapshot_store_bytes"] > 0
    first = list(engine.get_list("out"))
    data = DirectorySnapshotStore(store_dir).latest()
    assert data is not None
    # merged: one full map per processor, holding every key that processor saw
    for entries in data.vertices["sum"].entries.values():
        assert [(type(k), v.mode) for k, v in entries] == [(StateMap, FULL)]
    sums: dict[int, int] = {}
    for entries in data.vertices["sum"].entries.values():
        sums.update(entries[0][1].upserts)
    # the saved sums are those of exactly the items before the saved offsets (source
    # processor i emits i, i + 2, i + 4, ...)
    offsets = {k.name[1]: v for es in data.vertices["src"].entries.values() for k, v in es}
    seen = [x for i, off in offsets.items() for x in range(i, i + 2 * off, 2)]
    expected: dict[int, int] = {}
    for x in seen:
        expected[x % KEYS] = expected.get(x % KEYS, 0) + x
    assert sums == expected
    # resume a bounded run of the same DAG shape: exactly-once overall
    engine2 = ss.local(cooperative_threads=2)
    n = max(seen, default=0) + 2000
    job2 = engine2.new_job(stp.keyed_sum_dag(n, KEYS, rate=1e9), config(store_dir, resume=True))
    job2.join(60)
    assert job2.status is JobStatus.COMPLETED
    assert Counter(first) + Counter(engine2.get_list("out")) == stp.expected_keyed_sums(n, KEYS)


@pytest.mark.parametrize("sum_lp", [2, 3])
def test_auto_restart_from_a_chain_is_exact_also_at_another_parallelism(
    tmp_path: Any, sum_lp: int
) -> None:
    store_dir = str(tmp_path / "store")
    stp.FAIL_BUDGET[0] = 1
    engine = ss.local(cooperative_threads=2)
    dag = stp.keyed_sum_dag(N, KEYS, fail_after=N // 4, rate=6000.0)
    job = engine.new_job(dag, config(store_dir))
    job.join(60)
    assert job.restarts == 1 and stp.FAIL_BUDGET[0] == 0
    assert Counter(engine.get_list("out")) == stp.expected_keyed_sums(N, KEYS)
    # and from the store's last chains into another parallelism of 'sum'
    data = DirectorySnapshotStore(store_dir).latest()
    assert data is not None
    engine2 = ss.local(cooperative_threads=2)
    job2 = engine2.new_job(
        stp.keyed_sum_dag(N, KEYS, rate=1e9, sum_lp=sum_lp), config(str(tmp_path / "b")),
        restore_from=data,
    )
    job2.join(60)
    assert job2.status is JobStatus.COMPLETED  # every processor had completed: no output
    assert engine2.get_list("out") == []


def test_a_delta_that_does_not_continue_the_committed_chain_fails_the_snapshot(
    tmp_path: Any,
) -> None:
    store = DirectorySnapshotStore(str(tmp_path / "store"))
    store.bind("j", "e1")
    c = SnapshotCoordinator("j", store, 1000, 1, {"v": 1})
    first = SnapshotData(1, "j")
    first.vertices["v"] = VertexState(1, {0: [(StateMap(PLAIN), StateMapSave(FULL, {"a": 1}))]})
    c.write_snapshot(first)
    later = SnapshotData(2, "j")
    later.vertices["v"] = VertexState(
        1, {0: [(StateMap(PLAIN), StateMapSave(DELTA, {"a": 2}, (), 7))]}
    )
    with pytest.raises(
        ss.SnapshotError,
        match=r"snapshot 2: v#0 saved keyed state as a delta relative to snapshot 7, but the "
        r"last committed snapshot of this execution holds its state as of snapshot 1",
    ):
        c.write_snapshot(later)
    assert store.committed_ids() == [1]
    assert [n for n in os.listdir(store.directory) if n.startswith("chunk-0000000002")] == []
    later.vertices["v"].entries[0] = [(StateMap(PLAIN), StateMapSave(DELTA, {"b": 2}, ("a",), 1))]
    c.write_snapshot(later)
    assert store.read(2).vertices["v"].entries[0] == [
        (StateMap(PLAIN), StateMapSave(FULL, {"b": 2}))
    ]


def test_compacted_chains_restore_exactly(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from slipstream.state import compact

    monkeypatch.setattr(compact, "DEFAULT_MAX_DELTAS", 1)
    store_dir = str(tmp_path / "store")
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(stp.keyed_sum_dag(10**7, KEYS, rate=3000.0), config(store_dir))

    def compacted_head() -> bool:
        manifest = stp.newest_manifest(store_dir)  # a commit's pruning may race it
        if manifest is None:
            return False
        chains = manifest.vertices["sum"].chains.values()
        return any(c[0].file.endswith("-c.bin") and len(c) > 1 for c in chains)

    stp.wait_for(
        lambda: job.metrics["__job__"]["snapshot_compactions"] >= 2 and compacted_head(),
        what="a compacted chain followed by a delta",
    )
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    first = list(engine.get_list("out"))
    data = DirectorySnapshotStore(store_dir).latest()
    assert data is not None
    offsets = {k.name[1]: v for es in data.vertices["src"].entries.values() for k, v in es}
    n = max(i + 2 * off for i, off in offsets.items()) + 2000
    engine2 = ss.local(cooperative_threads=2)
    job2 = engine2.new_job(stp.keyed_sum_dag(n, KEYS, rate=1e9), config(store_dir, resume=True))
    job2.join(60)
    assert Counter(first) + Counter(engine2.get_list("out")) == stp.expected_keyed_sums(n, KEYS)
