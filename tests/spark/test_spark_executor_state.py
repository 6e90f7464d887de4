"""Keyed state stays on the executors in Spark streaming jobs (issue 23, item 1;
slipstream.spark.epoch_state): each task writes its processor's chunk into the
checkpoint and hands the driver only its ref; at the same parallelism each task reads
its own chain back. Driven through the in-process RDD stand-in (spark_fake_rdd), one
foreachBatch call per epoch, as tests/spark/test_spark_streaming.py does; the real
SparkSession runs the restart test at the end."""

from __future__ import annotations

import importlib
import os
import pickle
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import rolling_aggregate
from slipstream.state.store import DirectorySnapshotStore
from store_support import class_path_text

from .chunk_support import damage_chunk, error_text
from .query_support import feed_and_cancel
from .spark_fake_rdd import FakeSession

#: the module, not ``slipstream.spark.streaming`` by attribute (``slipstream.spark`` is
#: also the factory's name on the package, see slipstream/spark/__init__.py)
streaming_module = importlib.import_module("slipstream.spark.streaming")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = 3000


def _key(e: tuple[str, int]) -> str:
    return e[0]


def _as_event(row: Any) -> tuple[str, int]:
    return (row.key, row.n) if hasattr(row, "key") else tuple(row)  # type: ignore[return-value]


def rolling_dag(source: Any) -> DAG:
    """source -> (distributed, by key) rolling count per key -> list sink 'counts'."""
    dag = DAG()
    src = dag.new_vertex("source", source)
    count = dag.new_vertex("count", rolling_aggregate(_key, counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, count).distributed().partitioned(_key))
    dag.edge(Edge.between(count, out).distributed().all_to_one())
    return dag


def epochs(seed: int, n: int, size: int = 2000) -> list[list[tuple[str, int]]]:
    rng = random.Random(seed)
    return [[(f"k{rng.randrange(KEYS)}", i * size + j) for j in range(size)] for i in range(n)]


def _embedded(events: list[tuple[str, int]]) -> Counter[tuple[Any, ...]]:
    """The same DAG on the embedded engine over all epochs' events."""
    engine = ss.local(cooperative_threads=2)
    engine.new_job(rolling_dag(sources.items(events))).join(60)
    return Counter(tuple(r) for r in engine.get_list("counts"))


class _FakeStreamingDF:
    isStreaming = True


class _Batch:
    def __init__(self, rdd: Any) -> None:
        self.rdd = rdd


def _job(engine: Any, checkpoint: Path) -> Any:
    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.streaming import SparkStreamingJob

    dag = rolling_dag(spark_stream_source(_FakeStreamingDF(), _as_event))
    job = SparkStreamingJob(engine, dag, ss.JobConfig(name="rolling"), str(checkpoint), None)
    job._prepare()
    return job


def _run(engine: Any, job: Any, events: list[Any], epoch_id: int) -> None:
    job._epoch(_Batch(engine.spark_context.parallelize(events, 2)), epoch_id)


def _counts(*engines: Any) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for e in engines:
        out.update(tuple(r) for r in e.get_list("counts"))
    return out


def _store(checkpoint: Path) -> DirectorySnapshotStore:
    return DirectorySnapshotStore(checkpoint / "slipstream-state")


def _spy_broadcasts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every state the driver ships to the epochs' tasks (in their closures when small,
    else as a broadcast: slipstream.spark.streaming.ship_state)."""
    seen: list[Any] = []
    original = streaming_module.ship_state

    def ship_state(sc: Any, state: Any) -> Any:
        seen.append(state)
        return original(sc, state)

    monkeypatch.setattr(streaming_module, "ship_state", ship_state)
    return seen


def test_rolling_count_restarts_from_the_executors_chunks_as_the_embedded_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = epochs(1, 6)
    first = ss.spark(FakeSession())
    job1 = _job(first, tmp_path)
    for epoch_id in range(3):
        _run(first, job1, data[epoch_id], epoch_id)
    # a new driver from the same checkpoint: its tasks read their own chains
    second = ss.spark(FakeSession())
    shipped = _spy_broadcasts(monkeypatch)
    broadcasts: list[Any] = []
    monkeypatch.setattr(second.spark_context, "broadcast", broadcasts.append)
    job2 = _job(second, tmp_path)
    for epoch_id in range(3, 6):
        _run(second, job2, data[epoch_id], epoch_id)
    assert _counts(first, second) == _embedded([e for batch in data for e in batch])
    assert broadcasts == []  # the small state went in the tasks' closures
    assert job2.resumed_from_snapshot == 3 and job2.epochs_committed == 3
    # what the driver shipped: refs of the committed manifest, never entries
    assert [s["restore"] for s in shipped] == [None, None, None]
    assert [s["restore_id"] for s in shipped] == [3, 4, 5]
    chains = shipped[0]["chains"]["count"]
    # each task continued its chain after epoch 0: a full chunk and two deltas
    assert [(i, [r["mode"] for r in refs], b) for i, refs, b in chains] == [
        (i, ["full", "delta", "delta"], False) for i in (0, 1)
    ]
    store = _store(tmp_path)
    manifest = store.read_manifest(store.committed_ids()[-1])
    assert manifest.extra["executor_state"] == {"spill": [], "broadcast": []}
    per_task = [len(es) for es in store.read(manifest.snapshot_id).vertices["count"].entries.values()]
    assert len(per_task) == 2


def test_the_driver_receives_chunk_refs_not_state(tmp_path: Path) -> None:
    data = epochs(2, 2, size=5000)
    engine = ss.spark(FakeSession())
    job = _job(engine, tmp_path)
    got: list[list[dict[str, Any]]] = []
    run_one = job._run_one_epoch

    def spy(*args: Any, **kwargs: Any) -> Any:
        results = run_one(*args, **kwargs)
        got.append(results)
        return results

    job._run_one_epoch = spy
    for epoch_id, events in enumerate(data):
        _run(engine, job, events, epoch_id)
    store = _store(tmp_path)
    for sid, results in zip(store.committed_ids(), got, strict=True):
        manifest = store.read_manifest(sid)
        for r in results:
            saved = r["snapshot"]
            assert set(saved) == {"chunk", "spill", "broadcast", "base"}
            chain = manifest.vertices[r["vertex"]].chains.get(r["index"])
            if saved["chunk"] is None:
                assert chain is None
            else:
                # a new chain, or (a delta: the task continued its own) the committed one
                # it continues followed by the task's chunk
                assert chain[-1].as_json() == saved["chunk"]
                assert len(chain) == 1 if saved["base"] is None else chain[-2].snapshot_id == saved["base"]
        # each task's whole result is far smaller than the state it saved
        state_bytes = sum(len(pickle.dumps(es)) for es in store.read(sid).vertices["count"].entries.values())
        result_bytes = sum(len(pickle.dumps(r["snapshot"])) for r in results)
        assert state_bytes > 20 * result_bytes
    # the files the tasks and the driver wrote name no slipstream class (the format the
    # two engines share is plain data; tests/test_layers.py checks the embedded engine's)
    names = os.listdir(store.directory)
    assert any(n.startswith("chunk-") for n in names)
    for n in names:
        with open(os.path.join(store.directory, n), "rb") as fh:
            assert b"slipstream" not in class_path_text(fh.read()), n


def test_a_damaged_chunk_fails_the_epoch_naming_the_file(tmp_path: Path) -> None:
    data = epochs(3, 3)
    engine = ss.spark(FakeSession())
    job = _job(engine, tmp_path)
    for epoch_id in range(2):
        _run(engine, job, data[epoch_id], epoch_id)
    store = _store(tmp_path)
    ref = store.read_manifest(store.committed_ids()[-1]).vertices["count"].chains[1][0]
    path = damage_chunk(store, ref)
    with pytest.raises(ss.JobFailedError) as info:
        _run(engine, job, data[2], 2)
    text = error_text(info.value)
    assert (
        f"snapshot 2: chunk {path} (vertex 'count', processor 1) fails its signature check" in text
    )
    assert store.committed_ids()[-1] == 2  # nothing committed


def test_a_replayed_epoch_stays_idempotent_and_leaves_no_stray_chunks(tmp_path: Path) -> None:
    data = epochs(4, 5)
    plain = ss.spark(FakeSession())
    job = _job(plain, tmp_path / "a")
    for epoch_id, events in enumerate(data):
        _run(plain, job, events, epoch_id)
    uninterrupted = _counts(plain)

    first = ss.spark(FakeSession())
    job1 = _job(first, tmp_path / "b")

    def crash(epoch_id: int) -> None:
        if epoch_id == 3:
            raise RuntimeError("driver lost")

    job1._before_commit = crash
    for epoch_id in range(3):
        _run(first, job1, data[epoch_id], epoch_id)
    before = list(first.get_list("counts"))
    _run(first, job1, data[2], 2)  # Spark replays a committed epoch: skipped
    assert job1.epochs_skipped == 1 and first.get_list("counts") == before
    with pytest.raises(ss.JobFailedError, match="driver lost"):
        _run(first, job1, data[3], 3)  # its tasks wrote chunks; no manifest names them
    store = _store(tmp_path / "b")
    stray = {n for n in os.listdir(store.directory) if n.startswith("chunk-0000000004-")}
    assert len(stray) == 2
    second = ss.spark(FakeSession())
    job2 = _job(second, tmp_path / "b")
    for epoch_id in range(3, 5):
        _run(second, job2, data[epoch_id], epoch_id)  # epoch 3 replayed from snapshot 3
    assert _counts(first, second) == uninterrupted
    named = set().union(*(store.read_manifest(i).files() for i in store.committed_ids()))
    chunks = {n for n in os.listdir(store.directory) if n.startswith("chunk-")}
    assert chunks == named and not (stray & chunks)


def test_another_parallelism_is_rerouted_through_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = epochs(5, 4)
    first = ss.spark(FakeSession())
    job1 = _job(first, tmp_path)
    for epoch_id in range(2):
        _run(first, job1, data[epoch_id], epoch_id)
    second = ss.spark(FakeSession(default_parallelism=3))
    shipped = _spy_broadcasts(monkeypatch)
    job2 = _job(second, tmp_path)
    for epoch_id in range(2, 4):
        _run(second, job2, data[epoch_id], epoch_id)
    assert _counts(first, second) == _embedded([e for batch in data for e in batch])
    # the first epoch after the change: rerouted by key through a shuffle into a chunk per
    # new processor (slipstream.spark.rescale), none by the driver; the next from the chunks
    assert shipped[0]["restore"] is None
    assert sorted(shipped[0]["rescaled"]["count"]) == [0, 1, 2]
    assert "count" not in shipped[0]["chains"]
    assert shipped[1]["restore"] is None and shipped[1]["rescaled"] is None
    assert len(shipped[1]["chains"]["count"]) == 3


def _query_run(
    spark_session: Any,
    directory: Path,
    checkpoint: Path,
    files: list[tuple[int, list[Any]]],
    **engine_options: Any,
) -> tuple[Any, Any]:
    """Run the rolling count on ``directory`` with ``checkpoint`` (``engine_options`` go
    to ``ss.spark``) over ``files`` (``feed_and_cancel``); returns the engine and the job."""
    from slipstream.spark.io import spark_stream_source

    df = (
        spark_session.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(directory))
    )
    engine = ss.spark(spark_session, **engine_options)
    job = engine.new_job(
        rolling_dag(spark_stream_source(df, _as_event)),
        ss.JobConfig(name="rolling"),
        checkpoint_location=str(checkpoint),
    )
    feed_and_cancel(job, directory, files, ("key", "n"))
    return engine, job


@pytest.mark.timeout(300)
def test_a_query_restarted_from_its_checkpoint_counts_as_the_embedded_engine(
    spark_session: Any, tmp_path: Path
) -> None:
    data = list(enumerate(epochs(6, 4)))
    (tmp_path / "in").mkdir()
    first, job1 = _query_run(spark_session, tmp_path / "in", tmp_path / "cp", data[:2])
    second, job2 = _query_run(spark_session, tmp_path / "in", tmp_path / "cp", data[2:])
    assert (job1.epochs_committed, job2.epochs_committed) == (2, 2)
    assert job2.resumed_from_snapshot == 2
    assert _counts(first, second) == _embedded([e for _i, batch in data for e in batch])
    store = _store(tmp_path / "cp")
    manifest = store.read_manifest(store.committed_ids()[-1])
    assert manifest.extra["executor_state"] == {"spill": [], "broadcast": []}
    assert sorted(manifest.vertices["count"].chains) == [0, 1]
