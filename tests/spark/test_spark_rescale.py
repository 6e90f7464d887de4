"""A streaming job restarted with another parallelism reroutes its keyed state by key
through Spark (issue 23, item 1; slipstream.spark.rescale): tasks read the old chains
from the checkpoint, a shuffle moves each entry to the processor key_routing gives it,
and each new processor's share is written as a chunk its epoch task restores from. The
driver handles chunk refs only: the hook below fails any read of a chunk through the
driver's snapshot store."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream.state.store import ChunkRef, DirectorySnapshotStore

from .chunk_support import damage_chunk, error_text
from .spark_fake_rdd import FakeSession
from .test_spark_executor_state import (
    _counts,
    _embedded,
    _job,
    _run,
    _spy_broadcasts,
    _store,
    epochs,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _no_driver_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver-side reads of the old path (read the chains on the driver, route them
    there) fail the test if anything calls them."""

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the driver read the state of the snapshot")

    for name in ("read_chain", "read", "read_chunks"):
        monkeypatch.setattr(DirectorySnapshotStore, name, refuse)


def _state_counts(checkpoint: Path) -> dict[Any, int]:
    """The rolling counts per key in the newest committed snapshot (read after the run)."""
    rows = ss.state.read(str(checkpoint / "slipstream-state"), "count")
    return {r.key: r.value for r in rows}


def test_rescale_2_3_1_reroutes_through_spark_with_exact_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = epochs(7, 6)
    first = ss.spark(FakeSession(default_parallelism=2))
    job1 = _job(first, tmp_path)
    for epoch_id in range(2):
        _run(first, job1, data[epoch_id], epoch_id)
    engines = [first]
    shipped_per_run = []
    with monkeypatch.context() as m:
        _no_driver_reads(m)
        for lp, epoch_ids in ((3, (2, 3)), (1, (4, 5))):
            engine = ss.spark(FakeSession(default_parallelism=lp))
            with monkeypatch.context() as spy:  # this run's states only
                shipped = _spy_broadcasts(spy)
                job = _job(engine, tmp_path)
                for epoch_id in epoch_ids:
                    _run(engine, job, data[epoch_id], epoch_id)
            assert job.rerouted_vertices == 1  # 'count' (the sink holds no state)
            shipped_per_run.append((lp, shipped))
            engines.append(engine)
    everything = [e for batch in data for e in batch]
    assert _counts(*engines) == _embedded(everything)
    assert _state_counts(tmp_path) == dict(Counter(k for k, _n in everything))
    for lp, shipped in shipped_per_run:
        # the first epoch after the change restores from the rerouted chunks, nothing
        # routed by the driver; the next from the chains that epoch committed
        assert shipped[0]["restore"] is None
        assert "count" not in shipped[0]["chains"]
        rescaled = shipped[0]["rescaled"]["count"]
        assert sorted(rescaled) == list(range(lp))
        assert all(
            ref[0]["file"].split("-t", 1)[1].startswith("rescale.") for ref in rescaled.values()
        )
        assert shipped[1]["rescaled"] is None
        assert [i for i, _refs, _b in shipped[1]["chains"]["count"]] == list(range(lp))
    # the rerouting chunks were removed at the commit of the epoch that read them
    store = _store(tmp_path)
    chunks = {n for n in os.listdir(store.directory) if n.startswith("chunk-")}
    assert not [n for n in chunks if "-trescale." in n]
    named = set().union(*(store.read_manifest(i).files() for i in store.committed_ids()))
    assert chunks == named
    manifest = store.read_manifest(store.committed_ids()[-1])
    assert sorted(manifest.vertices["count"].chains) == [0]


def _query_run_at(
    spark_session: Any,
    lp: int,
    directory: Path,
    checkpoint: Path,
    files: list[tuple[int, list[Any]]],
) -> tuple[Any, Any]:
    """As test_spark_executor_state._query_run, at total parallelism ``lp`` (one member)."""
    from .test_spark_executor_state import _query_run

    return _query_run(
        spark_session, directory, checkpoint, files, members=1, local_parallelism=lp
    )


@pytest.mark.timeout(400)
def test_a_query_rescaled_2_3_1_across_restarts_keeps_exact_state(
    spark_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import slipstream.state.store as store_module

    data = list(enumerate(epochs(8, 5)))
    (tmp_path / "in").mkdir()
    cp = tmp_path / "cp"
    first, _job1 = _query_run_at(spark_session, 2, tmp_path / "in", cp, data[:2])
    engines = [first]
    with monkeypatch.context() as m:
        # no chunk is read in the driver's process (the executors' Python workers are
        # processes of their own): every verified chunk read goes through this function
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the driver read a chunk of the snapshot")

        m.setattr(store_module, "verified_chunk_file", refuse)
        _no_driver_reads(m)
        for lp, files in ((3, data[2:4]), (1, data[4:])):
            engine, job = _query_run_at(spark_session, lp, tmp_path / "in", cp, files)
            assert job.rerouted_vertices == 1 and job.epochs_committed == len(files)
            engines.append(engine)
            store = _store(cp)
            chains = store.read_manifest(store.committed_ids()[-1]).vertices["count"].chains
            assert sorted(chains) == list(range(lp))
    everything = [e for _i, batch in data for e in batch]
    assert _counts(*engines) == _embedded(everything)
    assert _state_counts(cp) == dict(Counter(k for k, _n in everything))
    store = _store(cp)
    chunks = {n for n in os.listdir(store.directory) if n.startswith("chunk-")}
    named = set().union(*(store.read_manifest(i).files() for i in store.committed_ids()))
    assert chunks == named


def _ts(e: tuple[int, str]) -> int:
    return e[0]


def _wkey(e: tuple[int, str]) -> str:
    return e[1]


def _by_digits(key: str, count: int) -> int:
    """A custom partitioner: restore routing must use it, as live items do."""
    return int(key[1:]) % count


def _row(row: Any) -> tuple[int, str]:
    return tuple(row)  # type: ignore[return-value]


def _window_dag() -> Any:
    """events -> watermarks -> tumbling count per key (frames plus the window's
    BroadcastKey bookkeeping), partitioned by a custom partitioner -> list sink."""
    from slipstream import DAG, Edge, sinks
    from slipstream import processors as P
    from slipstream.aggregate import counting
    from slipstream.spark.io import spark_stream_source
    from slipstream.watermark import with_fixed_lag
    from slipstream.window import tumbling_window_def

    from .test_spark_executor_state import _FakeStreamingDF

    dag = DAG()
    src = dag.new_vertex("events", spark_stream_source(_FakeStreamingDF(), _row))
    wm = dag.new_vertex("watermarks", P.insert_watermarks(_ts, lambda: with_fixed_lag(20)))
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=_wkey, timestamp_fn=_ts, window_def=tumbling_window_def(50), agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink("w")).local_parallelism(1)
    dag.edge(Edge.between(src, wm))
    dag.edge(Edge.between(wm, win).distributed().partitioned(_wkey, _by_digits))
    dag.edge(Edge.between(win, out).distributed().all_to_one())
    return dag


@pytest.mark.parametrize(("members", "lp"), [(1, 3), (2, 2), (1, 1)])
def test_rerouted_chunks_hold_what_restore_plan_gives(
    tmp_path: Path, members: int, lp: int
) -> None:
    """Each new processor's rerouting chunk holds exactly the entries, in the same order,
    that the embedded engine's restore routing gives it (keyed entries by the vertex's
    custom partitioner and the new member count, BroadcastKey entries to all)."""
    import pickle
    import random
    from types import SimpleNamespace

    from slipstream.spark.rescale import RerouteTarget, reroute
    from slipstream.spark.streaming import SparkStreamingJob
    from slipstream.state.keys import expand_entries
    from slipstream.state.restore import custom_partitioners, restore_plan
    from slipstream.state.store import read_chain_files

    from .test_spark_executor_state import _Batch

    rng = random.Random(9)
    data = [[(i * 200 + j, f"k{rng.randrange(30)}") for j in range(200)] for i in range(2)]
    engine = ss.spark(FakeSession(default_parallelism=2))
    job = SparkStreamingJob(engine, _window_dag(), ss.JobConfig(name="w"), str(tmp_path), None)
    job._prepare()
    for epoch_id, events in enumerate(data):
        job._epoch(_Batch(engine.spark_context.parallelize(events, 2)), epoch_id)
    store = _store(tmp_path)
    sid = store.committed_ids()[-1]
    manifest = store.read_manifest(sid)
    partitioners = custom_partitioners(_window_dag())
    with_state = sorted(n for n, vm in manifest.vertices.items() if vm.chains)
    assert "windows" in with_state and "windows" in partitioners
    targets = [
        RerouteTarget(
            name,
            {i: [r.as_json() for r in c] for i, c in manifest.vertices[name].chains.items()},
            members,
            lp,
            partitioners.get(name),
        )
        for name in with_state
    ]
    where = {"directory": store.directory, "key": store.key}
    chunks = reroute(engine.spark_context, where, sid, sid + 1, targets)
    shape = SimpleNamespace(
        local_parallelism=lp, member_count=members, total_parallelism=members * lp
    )
    expected, _completed = restore_plan(
        store.read(sid), {n: shape for n in with_state}, partitioners
    )
    broadcast_seen = False
    for name in with_state:
        for g in range(members * lp):
            refs = chunks[name].get(g)
            got = (
                expand_entries(
                    read_chain_files(
                        store.directory,
                        store.key,
                        [ChunkRef.from_json(r) for r in refs],
                        name,
                        g,
                        sid + 1,
                    )
                )
                if refs
                else []
            )
            assert pickle.dumps(got) == pickle.dumps(expected[(name, g)]), (name, g)
            broadcast_seen |= any(type(k).__name__ == "BroadcastKey" for k, _v in got)
    assert broadcast_seen


def test_a_damaged_chunk_fails_the_rescale_naming_the_file(tmp_path: Path) -> None:
    data = epochs(10, 3)
    first = ss.spark(FakeSession(default_parallelism=2))
    job1 = _job(first, tmp_path)
    for epoch_id in range(2):
        _run(first, job1, data[epoch_id], epoch_id)
    store = _store(tmp_path)
    ref = store.read_manifest(2).vertices["count"].chains[1][-1]
    path = damage_chunk(store, ref)
    second = ss.spark(FakeSession(default_parallelism=3))
    job2 = _job(second, tmp_path)
    with pytest.raises(ss.JobFailedError) as info:
        _run(second, job2, data[2], 2)
    text = error_text(info.value)
    assert (
        f"snapshot 2: chunk {path} (vertex 'count', processor 1) fails its signature check" in text
    )
    assert "failed: vertex 'count', processor 1: SnapshotError" in text  # the chain's processor
    assert store.committed_ids()[-1] == 2  # nothing committed
    assert job2.rerouted_vertices == 0


@pytest.mark.timeout(300)
def test_a_damaged_chunk_fails_a_query_rescaled_naming_the_file(
    spark_session: Any, tmp_path: Path
) -> None:
    data = list(enumerate(epochs(13, 2)))
    (tmp_path / "in").mkdir()
    cp = tmp_path / "cp"
    _query_run_at(spark_session, 2, tmp_path / "in", cp, data[:1])
    store = _store(cp)
    ref = store.read_manifest(1).vertices["count"].chains[0][-1]
    path = damage_chunk(store, ref)
    with pytest.raises(ss.JobFailedError) as info:
        _query_run_at(spark_session, 3, tmp_path / "in", cp, data[1:])
    assert (
        f"snapshot 1: chunk {path} (vertex 'count', processor 0) fails its signature check"
        in str(info.value)
    )
    assert store.committed_ids() == [1]
