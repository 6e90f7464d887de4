"""The integrity rules of state as data (issue 25, "Done when"): a tampered file of a
store is refused by every way in (``ss.state.read``, ``ss.state.changes``,
``ss.state.transform``, ``sources.snapshot``, ``slipstream state``, ``restore_from=``),
each naming the file, while the older snapshot still reads as before and nothing is
written; a store of another DAG is refused naming the vertex: a job's own session store
restored into a DAG whose session vertex has another name or whose edges differ, and a
transformed snapshot written into a store that holds another DAG's snapshots."""

from __future__ import annotations

import operator
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import JobCancelledError, SnapshotError, SnapshotStoreDamagedError
from slipstream.state.store import DirectorySnapshotStore
from slipstream.window import session_window_def

ROOT = Path(__file__).resolve().parents[2]


def rolling(items: list[str], name: str = "rolling_aggregate") -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items(items)).group_by(lambda x: x).rolling_aggregate(counting()).set_name(
        name
    ).write_to(sinks.list_sink("out"))
    return p


def config(store: Any, name: str = "integrity", interval_ms: int = 10_000) -> JobConfig:
    return JobConfig(
        name=name,
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=interval_ms,
        snapshot_store=store,
    )


def two_snapshots(store: Path) -> tuple[int, int]:
    """A seeded store and a transformed snapshot after it: (older id, newer id)."""
    ss.state.bootstrap(rolling([]), "rolling_aggregate", [("a", 3), ("b", 1)], store)
    ss.state.transform(store, "rolling_aggregate", lambda r: r._replace(value=r.value * 10))
    older, newer = DirectorySnapshotStore(store).committed_ids()
    return older, newer


@pytest.mark.parametrize("victim", ["chunk", "snapshot"])
def test_a_tampered_file_is_refused_by_every_reader_naming_it(victim: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    older, newer = two_snapshots(store)
    before = ss.state.read(store, snapshot_id=older)
    assert sorted((r.key, r.value) for r in ss.state.read(store)) == [("a", 30), ("b", 10)]
    prefix = f"chunk-{newer:010d}-" if victim == "chunk" else f"snapshot-{newer:010d}"
    (name,) = [n for n in os.listdir(store) if n.startswith(prefix)]
    path = store / name
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    files = sorted(os.listdir(store))
    if victim == "chunk":
        named = f"snapshot {newer}: chunk {path} (vertex 'rolling_aggregate', processor 0) fails its signature check"
    else:
        named = f"snapshot {newer} in {path} fails its signature check"
    damaged = (
        f"snapshot store {store} is damaged: its newest committed snapshot cannot be used: {named}"
    )

    with pytest.raises(SnapshotStoreDamagedError, match=re.escape(damaged)):
        ss.state.read(store)
    with pytest.raises(SnapshotError, match=re.escape(named)):
        ss.state.read(store, snapshot_id=newer)
    with pytest.raises(SnapshotError, match=re.escape(named)):
        ss.state.changes(store, older, newer)
    with pytest.raises(SnapshotStoreDamagedError, match=re.escape(damaged)):
        ss.state.transform(store, "rolling_aggregate", lambda r: r)
    with pytest.raises(SnapshotError, match=re.escape(named)):  # the newest, by its id
        sources.snapshot(store, "rolling_aggregate")
    with pytest.raises(SnapshotStoreDamagedError, match=re.escape(damaged)):
        ss.local().new_job(rolling(["a"]), config(tmp_path / "live"), restore_from=store).join(60)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cli = subprocess.run(
        [sys.executable, "-m", "slipstream", "state", str(store)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.startswith(f"error: {damaged}"), cli.stderr
    # nothing was written; the older snapshot reads as it did
    assert sorted(os.listdir(store)) == files
    assert DirectorySnapshotStore(store).committed_ids() == [older, newer]
    assert ss.state.read(store, snapshot_id=older) == before


def sessions(name: str = "window", extra: bool = False, rate: float | None = None) -> ss.Pipeline:
    """A count per 50 ms session over a generator (vertices ``events``,
    ``with_timestamps``, ``name``, ``sink``; ``extra``: a filter before the timestamps,
    fused with them into ``clean+with_timestamps``)."""
    p = ss.Pipeline()
    s = p.read_from(
        sources.generator(
            lambda seq: ("ab"[seq % 2], seq * 10), rate, max_items=None if rate else 0
        )
    ).set_name("events")
    if extra:
        s = s.filter(lambda e: True).set_name("clean")
    s.with_timestamps(operator.itemgetter(1), 0).group_by(operator.itemgetter(0)).window(
        session_window_def(50)
    ).aggregate(counting()).set_name(name).write_to(sinks.noop())
    return p


def test_a_store_of_another_dag_is_refused_naming_the_vertex(tmp_path: Path) -> None:
    own = tmp_path / "own"
    engine = ss.local()
    job = engine.new_job(sessions(rate=2000.0), config(own, "sessions", interval_ms=20))
    deadline = time.monotonic() + 120
    while job.metrics["__job__"]["snapshots"] < 1:
        assert not job.status.is_terminal and time.monotonic() < deadline
        time.sleep(0.005)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(60)
    (sid,) = DirectorySnapshotStore(own).committed_ids()[-1:]
    assert any(r.kind == "session" for r in ss.state.read(own, "window"))

    with pytest.raises(SnapshotError) as renamed:
        ss.local().new_job(sessions("sessions"), config(tmp_path / "a"), restore_from=own).join(60)
    assert str(renamed.value).startswith(
        f"snapshot {sid} of job 'sessions' holds state of vertices ['window'] that this DAG "
        f"does not have (its vertices: ['events', 'sessions', 'sink', 'with_timestamps']); "
        f"the DAG changed since the snapshot."
    ), renamed.value
    with pytest.raises(SnapshotError) as rewired:
        ss.local().new_job(sessions(extra=True), config(tmp_path / "b"), restore_from=own).join(60)
    assert str(rewired.value).startswith(
        f"snapshot {sid} of job 'sessions' holds state of vertices ['with_timestamps'] that "
        f"this DAG does not have (its vertices: ['clean+with_timestamps', 'events', 'sink', "
        f"'window']); the DAG changed since the snapshot."
    ), rewired.value


def test_transform_into_a_store_of_another_dag_is_refused(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    ss.state.bootstrap(rolling([]), "rolling_aggregate", [("a", 1)], src, job_name="one")
    ss.state.bootstrap(rolling([], "counts"), "counts", [("a", 5)], dest, job_name="two")
    (src_id,) = DirectorySnapshotStore(src).committed_ids()
    (dest_id,) = DirectorySnapshotStore(dest).committed_ids()
    files = sorted(os.listdir(dest))
    with pytest.raises(SnapshotError) as e:
        ss.state.transform(src, "rolling_aggregate", lambda r: r, to_store=dest)
    assert str(e.value) == (
        f"snapshot store {dest} holds snapshots of another DAG (snapshot {dest_id} of job "
        f"'two'): vertices ['counts'] are in its DAG only, vertices ['rolling_aggregate'] in "
        f"that of snapshot {src_id} of {src} only, the edges of vertices ['sink', 'source'] "
        f"differ; write the transformed snapshot into an empty store or one of the same DAG"
    )
    assert sorted(os.listdir(dest)) == files
    assert [(r.vertex, r.key, r.value) for r in ss.state.read(dest)] == [("counts", "a", 5)]
    # a store of the same DAG (another job's) takes it
    same = tmp_path / "same"
    ss.state.bootstrap(rolling([]), "rolling_aggregate", [("z", 9)], same, job_name="three")
    sid = ss.state.transform(src, "rolling_aggregate", lambda r: r, to_store=same)
    assert [
        (r.key, r.value) for r in ss.state.read(same, "rolling_aggregate", snapshot_id=sid)
    ] == [("a", 1)]


def test_chains_read_on_threads_are_each_verified_and_the_first_failure_names_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """State as data reads a large snapshot's chains on threads: a tampered chunk of any
    chain is still refused naming its file, the first failing chain's in order."""
    from slipstream.state import store as store_module

    threaded: list[int] = []
    real = store_module._in_threads

    def spy(fn: Any, items: Any) -> Any:
        threaded.append(len(items))
        return real(fn, items)

    monkeypatch.setattr(store_module, "PARALLEL_READ_BYTES", 0)
    monkeypatch.setattr(store_module, "_in_threads", spy)
    store = tmp_path / "store"
    rows = [(k, i) for i, k in enumerate("abcdefgh")]
    sid = ss.state.bootstrap(rolling([]), "rolling_aggregate", rows, store, parallelism=2)
    assert sorted((r.key, r.value) for r in ss.state.read(store, "rolling_aggregate")) == rows
    assert threaded == [2]
    manifest = DirectorySnapshotStore(store).read_manifest(sid)
    paths = {i: store / c[0].file for i, c in manifest.vertices["rolling_aggregate"].chains.items()}
    assert sorted(paths) == [0, 1]

    def tamper(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x01
        path.write_bytes(bytes(raw))

    def named(i: int) -> str:
        return (
            f"snapshot {sid}: chunk {paths[i]} (vertex 'rolling_aggregate', processor {i}) "
            f"fails its signature check"
        )

    tamper(paths[1])
    for read in (ss.state.read, ss.state.read_arrow):
        with pytest.raises(SnapshotError, match=re.escape(named(1))):
            read(store, "rolling_aggregate")
    tamper(paths[0])
    with pytest.raises(SnapshotError, match=re.escape(named(0))):
        ss.state.read(store, "rolling_aggregate")
    assert threaded and set(threaded) == {2}


def test_a_write_that_fails_midway_commits_nothing(tmp_path: Path) -> None:
    """A chunk that cannot be written after another one was (a value that does not
    pickle, on the second processor): ``bootstrap`` and ``transform`` remove what they
    wrote and commit nothing."""
    import threading

    lock = threading.Lock()
    store = tmp_path / "store"
    rows = [("a", 1), ("b", lock), ("c", 2)]  # a on processor 0, b and c on 1
    with pytest.raises(
        SnapshotError, match=r"rolling_aggregate#1: snapshot state cannot be pickled"
    ):
        ss.state.bootstrap(rolling([]), "rolling_aggregate", rows, store, parallelism=2)
    assert sorted(os.listdir(store)) == [".lock"]
    assert DirectorySnapshotStore(store).committed_ids() == []
    ss.state.bootstrap(rolling([]), "rolling_aggregate", rows[::2], store, parallelism=2)
    files = sorted(os.listdir(store))
    with pytest.raises(
        SnapshotError, match=r"rolling_aggregate#1: snapshot state cannot be pickled"
    ):
        ss.state.transform(
            store, "rolling_aggregate", lambda r: r._replace(value=lock) if r.key == "c" else r
        )
    assert sorted(os.listdir(store)) == files
    assert DirectorySnapshotStore(store).committed_ids() == [1]
    assert sorted((r.key, r.value) for r in ss.state.read(store, "rolling_aggregate")) == [
        ("a", 1),
        ("c", 2),
    ]
