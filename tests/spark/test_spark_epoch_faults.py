"""Faults around an epoch's commit on Spark (issue 23): the driver SIGKILLed between the
executors' chunk writes and the manifest commit, and a task that fails after writing its
chunk and is retried, both end with the exact state of an uninterrupted run and a
manifest that names one chunk per processor (no orphan, no double). The driver runs in a
subprocess (tests/spark/epoch_fault_driver.py); the test waits for its events (lines on
stdout), never for time."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sources
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import rolling_aggregate
from slipstream.state.store import DirectorySnapshotStore

from .epoch_fault_driver import _as_event, _key, rolling_dag

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TESTS_DIR = Path(__file__).resolve().parent.parent
KEYS = 500
FILES = 4


def _events(seed: int) -> list[list[tuple[str, int]]]:
    rng = random.Random(seed)
    return [[(f"k{rng.randrange(KEYS)}", i * 1000 + j) for j in range(1000)] for i in range(FILES)]


def _prepare(workdir: Path, data: list[list[tuple[str, int]]]) -> None:
    (workdir / "events").mkdir(parents=True)
    for i, events in enumerate(data):
        text = "\n".join(json.dumps({"key": k, "n": n}) for k, n in events)
        (workdir / "events" / f"events-{i:04d}.json").write_text(text)


def _driver(workdir: Path, mode: str, master: str, *extra: str) -> subprocess.Popen[str]:
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "from spark.epoch_fault_driver import main; main()"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(TESTS_DIR), mode, str(workdir), master, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _uninterrupted(data: list[list[tuple[str, int]]]) -> Counter[tuple[Any, ...]]:
    """The same DAG over all events, uninterrupted, on the embedded engine."""
    engine = ss.local(cooperative_threads=2)
    dag = rolling_dag(sources.items([e for b in data for e in b]), rolling_aggregate(_key, counting()))
    engine.new_job(dag).join(60)
    return Counter(tuple(r) for r in engine.get_list("counts"))


def _check_state(store: DirectorySnapshotStore, data: list[list[tuple[str, int]]]) -> None:
    """The newest snapshot holds the exact counts; every processor's chain has one chunk
    per snapshot it spans, and the directory holds exactly what the manifests name."""
    rows = ss.state.read(store, "count")
    assert {r.key: r.value for r in rows} == dict(Counter(k for b in data for k, _n in b))
    newest = store.read_manifest(store.committed_ids()[-1])
    for i, chain in newest.vertices["count"].chains.items():
        assert [r.snapshot_id for r in chain] == sorted({r.snapshot_id for r in chain}), i
    named = set().union(*(store.read_manifest(s).files() for s in store.committed_ids()))
    chunks = {n for n in os.listdir(store.directory) if n.startswith("chunk-")}
    assert chunks == named


@pytest.mark.timeout(420)
def test_sigkill_between_chunk_writes_and_commit_restarts_exact(
    spark_session: Any, tmp_path: Path
) -> None:
    from slipstream.spark.io import spark_stream_source

    data = _events(11)
    _prepare(tmp_path, data)
    kill_epoch = 2
    child = _driver(tmp_path, "kill", "local[2]", str(kill_epoch))
    try:
        assert child.stdout is not None
        lines = []
        for line in child.stdout:  # events, not time: the driver says where it is
            lines.append(line.strip())
            if line.startswith("AT-COMMIT"):
                break
        assert lines[-1:] == ["AT-COMMIT"], (lines, child.stderr.read() if child.poll() is not None else "")
        store = DirectorySnapshotStore(tmp_path / "cp" / "slipstream-state")
        # the executors wrote the epoch's chunks; no manifest names them yet
        assert store.committed_ids()[-1] == kill_epoch
        written = {n for n in os.listdir(store.directory) if n.startswith(f"chunk-{kill_epoch + 1:010d}-")}
        assert len(written) == 2
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(60)
    before = json.loads((tmp_path / "output.json").read_text())
    assert store.committed_ids()[-1] == kill_epoch

    # a new driver from the same checkpoint: Spark replays epoch 2, then the rest
    df = spark_session.readStream.schema("key string, n long").json(str(tmp_path / "in"))
    engine = ss.spark(spark_session, members=1, local_parallelism=2)
    job = engine.new_job(
        rolling_dag(spark_stream_source(df, _as_event), rolling_aggregate(_key, counting())),
        ss.JobConfig(name="rolling"),
        checkpoint_location=str(tmp_path / "cp"),
    )
    try:
        job.process_all_available(120)
        for f in sorted((tmp_path / "events").iterdir()):
            os.rename(f, tmp_path / "in" / f.name)
            job.process_all_available(120)
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(60)
    assert job.resumed_from_snapshot == kill_epoch and job.epochs_committed == FILES - kill_epoch
    got = Counter(tuple(r) for r in before) + Counter(tuple(r) for r in engine.get_list("counts"))
    assert got == _uninterrupted(data)
    _check_state(store, data)
    # the killed epoch's chunks went at the replay's commit
    assert not written & set(os.listdir(store.directory))


@pytest.mark.timeout(420)
def test_a_task_failing_after_its_chunk_write_is_retried_exact(tmp_path: Path) -> None:
    data = _events(12)
    _prepare(tmp_path, data)
    child = _driver(tmp_path, "retry", "local[2,2]")  # a task may fail once
    out, err = child.communicate(timeout=400)
    assert child.returncode == 0, err[-4000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"epochs": FILES}
    # the failure happened, after attempt 0 of the count's task 0 wrote its chunk
    failed_attempt = json.loads((tmp_path / "fired.json").read_text())
    assert len(failed_attempt) == 1 and failed_attempt[0].startswith("chunk-0000000002-0-")
    got = Counter(tuple(r) for r in json.loads((tmp_path / "output.json").read_text()))
    assert got == _uninterrupted(data)
    store = DirectorySnapshotStore(tmp_path / "cp" / "slipstream-state")
    _check_state(store, data)
    chain = store.read_manifest(2).vertices["count"].chains[0]
    # snapshot 2 names the retried attempt's chunk; the failed attempt's is gone
    assert chain[-1].snapshot_id == 2 and chain[-1].file != failed_attempt[0]
    assert failed_attempt[0] not in os.listdir(store.directory)
