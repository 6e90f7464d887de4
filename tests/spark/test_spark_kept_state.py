"""A Spark streaming task keeps its processor's state in its Python worker between
epochs (issue 23, item 5; slipstream.spark.epoch_state, "Keeping it between epochs"),
and uses it only when the committed manifest's chain ends with the chunk it wrote.

The in-process RDD stand-in (spark_fake_rdd) runs every task in this process, so the
cache is this module's to look at and to tamper with: a state kept by an epoch that did
not commit is never used (a tampered one would change the counts), one that did is. The
real SparkSession runs the same job with ``spark.python.worker.reuse=false`` in a
process of its own (every task a fresh worker, nothing kept) and with reuse on in the
shared session: exact counts both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream.spark import epoch_state
from slipstream.state.keyed import StateMap

from .chunk_support import error_text
from .spark_fake_rdd import FakeSession
from .test_spark_executor_state import _counts, _embedded, _job, _run, _store, epochs

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _outcomes(job: Any) -> list[str | None]:
    """The count tasks' kept_state outcome in the job's last epoch ('hit'/'miss')."""
    last = job.epoch_breakdown[-1]
    return [t["kept_state"] for t in last["task"] if t["vertex"] == "count"]


def _tamper_kept() -> int:
    """Add 1000 to every count of every state kept in this process; how many maps."""
    n = 0
    for _chunk, merged in epoch_state._kept.values():
        for k, v in merged:
            if type(k) is StateMap:
                for key in v.upserts:
                    v.upserts[key] = v.upserts[key] + 1000
                n += 1
    return n


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    epoch_state.clear_cache()
    yield
    epoch_state.clear_cache()


def test_the_next_epoch_uses_the_state_its_task_kept(tmp_path: Path) -> None:
    data = epochs(11, 4)
    engine = ss.spark(FakeSession())
    job = _job(engine, tmp_path)
    _run(engine, job, data[0], 0)
    assert _outcomes(job) == [None, None]  # nothing to restore in the first epoch
    for epoch_id in range(1, 4):
        _run(engine, job, data[epoch_id], epoch_id)
        assert _outcomes(job) == ["hit", "hit"]
    assert _counts(engine) == _embedded([e for batch in data for e in batch])
    # where each task waited and its worker's CPU (a source of pickled rows has no
    # input records timed: its rows are not timed one by one)
    for t in job.epoch_breakdown[-1]["task"]:
        assert t["cpu"] > 0 and t["input_wait"] >= 0 and t["output_wait"] >= 0, t
        assert (t["input_wait"] == 0) == (t["vertex"] == "source"), t
    # the hits are real: a tampered kept state shows in the next epoch's counts
    assert _tamper_kept() == 2
    more = epochs(12, 1)[0]
    _run(engine, job, more, 4)
    last = [tuple(r) for r in engine.get_list("counts")[-len(more) :]]
    assert sum(1 for _k, n in last if n > 1000) > len(more) // 2


def test_a_state_kept_by_an_epoch_that_did_not_commit_is_never_used(tmp_path: Path) -> None:
    data = epochs(13, 5)
    engine = ss.spark(FakeSession())
    job = _job(engine, tmp_path)

    def crash(epoch_id: int) -> None:
        if epoch_id == 2 and not crashed:
            crashed.append(epoch_id)
            raise RuntimeError("driver lost before the commit")

    crashed: list[int] = []
    job._before_commit = crash
    for epoch_id in range(2):
        _run(engine, job, data[epoch_id], epoch_id)
    before = list(engine.get_list("counts"))
    with pytest.raises(ss.JobFailedError, match="driver lost before the commit"):
        _run(engine, job, data[2], 2)
    # the tasks kept the state of chunks no manifest names; made wrong on purpose
    assert _tamper_kept() == 2
    assert list(engine.get_list("counts")) == before  # nothing delivered
    store = _store(tmp_path)
    assert store.committed_ids()[-1] == 2

    again = ss.spark(FakeSession())  # the restarted driver replays epoch 2
    job2 = _job(again, tmp_path)
    _run(again, job2, data[2], 2)
    assert _outcomes(job2) == ["miss", "miss"]  # read the committed chains instead
    for epoch_id in range(3, 5):
        _run(again, job2, data[epoch_id], epoch_id)
        assert _outcomes(job2) == ["hit", "hit"]
    assert _counts(engine, again) == _embedded([e for batch in data for e in batch])


def test_a_kept_state_checks_the_chain_files_and_can_be_turned_off(tmp_path: Path) -> None:
    data = epochs(14, 4)
    engine = ss.spark(FakeSession())
    job = _job(engine, tmp_path)
    for epoch_id in range(2):
        _run(engine, job, data[epoch_id], epoch_id)
    store = _store(tmp_path)
    ref = store.read_manifest(store.committed_ids()[-1]).vertices["count"].chains[0][-1]
    os.remove(os.path.join(store.directory, ref.file))
    with pytest.raises(ss.JobFailedError) as info:
        _run(engine, job, data[2], 2)  # the state is kept, but its chunk is gone
    text = error_text(info.value)
    path = os.path.join(store.directory, ref.file)
    assert f"snapshot 2: chunk {path} (vertex 'count', processor 0) is missing" in text

    epoch_state.clear_cache()  # what the failed epoch's other task kept
    off = tmp_path / "off"
    engine = ss.spark(FakeSession())
    job = _job(engine, off)
    job.executor_state_cache = False
    for epoch_id, events in enumerate(data):
        _run(engine, job, events, epoch_id)
        assert _outcomes(job) == [None, None]
    assert epoch_state.cache_size() == 0
    assert _counts(engine) == _embedded([e for batch in data for e in batch])


_SCRIPT = """
import json, os, sys
from collections import Counter
import slipstream as ss
from slipstream import DAG, Edge, sinks
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import rolling_aggregate
from slipstream.spark.io import spark_stream_source
from slipstream.spark.session import create_session

def key(e):
    return e[0]

def event(row):
    return (row.key, row.n)

directory, checkpoint, reuse = sys.argv[1], sys.argv[2], sys.argv[3]
session = create_session("local[2]", "kept-state", {"spark.python.worker.reuse": reuse})
df = session.readStream.schema("key string, n long").option("maxFilesPerTrigger", 1).json(directory)
dag = DAG()
src = dag.new_vertex("source", spark_stream_source(df, event))
count = dag.new_vertex("count", rolling_aggregate(key, counting()))
out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
dag.edge(Edge.between(src, count).distributed().partitioned(key))
dag.edge(Edge.between(count, out).distributed().all_to_one())
engine = ss.spark(session)
job = engine.new_job(dag, ss.JobConfig(name="kept"), checkpoint_location=checkpoint,
                     trigger={"availableNow": True})
job.join(240)
tasks = [t for e in job.epoch_breakdown for t in e["task"] if t["vertex"] == "count"]
print(json.dumps({
    "counts": [list(r) for r in engine.get_list("counts")],
    "epochs": job.epochs_committed,
    "fresh": [t["fresh_worker"] for t in tasks],
    "kept": [t["kept_state"] for t in tasks],
}))
session.stop()
"""


def _write_files(directory: Path, data: list[list[tuple[str, int]]]) -> None:
    directory.mkdir()
    for i, events in enumerate(data):
        tmp = directory.parent / f".tmp-{i}"
        tmp.write_text("\n".join(json.dumps({"key": k, "n": n}) for k, n in events))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # read oldest first
        os.rename(tmp, directory / f"part-{i:04d}.json")


@pytest.mark.timeout(400)
def test_without_worker_reuse_every_task_reads_its_chain_and_counts_are_exact(
    tmp_path: Path,
) -> None:
    # three epochs of 500 events: the first has nothing to restore, the next two read
    # their chains (a fresh worker every task); four of 2,000 took 104 s at load 20
    data = epochs(15, 3, 500)
    _write_files(tmp_path / "in", data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_SCRIPT),
            str(tmp_path / "in"),
            str(tmp_path / "cp"),
            "false",
        ],
        capture_output=True,
        text=True,
        timeout=360,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["epochs"] == 3
    assert all(report["fresh"]) and len(report["fresh"]) == 6
    assert set(report["kept"]) == {None, "miss"}
    got = Counter(tuple(c) for c in report["counts"])
    assert got == _embedded([e for batch in data for e in batch])


@pytest.mark.timeout(300)
def test_with_worker_reuse_counts_are_exact(spark_session: Any, tmp_path: Path) -> None:
    from slipstream.spark.io import spark_stream_source

    from .test_spark_executor_state import _as_event, rolling_dag

    data = epochs(16, 3, 500)  # the first epoch restores nothing, the next two may hit
    _write_files(tmp_path / "in", data)
    df = (
        spark_session.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
    )
    engine = ss.spark(spark_session)
    job = engine.new_job(
        rolling_dag(spark_stream_source(df, _as_event)),
        ss.JobConfig(name="kept-reuse"),
        checkpoint_location=str(tmp_path / "cp"),
        trigger={"availableNow": True},
    )
    job.join(240)
    assert job.epochs_committed == 3
    assert _counts(engine) == _embedded([e for batch in data for e in batch])
    kept = [
        t["kept_state"] for e in job.epoch_breakdown[1:] for t in e["task"] if t["vertex"] == "count"
    ]
    assert len(kept) == 4 and set(kept) <= {"hit", "miss"}
    # a reused worker froze its heap at its second Spark task, so PySpark's gc.collect()
    # after each task skips the modules (docs/performance.md, "count-10k's per-item path")
    assert any(t["heap_frozen"] for e in job.epoch_breakdown[1:] for t in e["task"])
