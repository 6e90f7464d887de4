"""The snapshot store's integrity: a store belongs to one submission of a job, a damaged
store never replays silently, leftovers are cleaned up, write errors are visible and
bounded, files are signed, restarts back off. Each test reproduces a way issue 9 lost or
duplicated data."""

from __future__ import annotations

import functools
import itertools
import json
import os
import pickle
import stat
import threading
import time
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import format2_store
import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sinks
from slipstream.engine import job as job_module
from slipstream.state import signing as snapshot_signing
from slipstream.state.store import (
    MANIFEST,
    DirectorySnapshotStore,
    Manifest,
    SnapshotData,
    VertexManifest,
)

EO = ProcessingGuarantee.EXACTLY_ONCE
N = 4000


def config(store: Any = None, **kw: Any) -> JobConfig:
    kw.setdefault("name", "svc")
    kw.setdefault("snapshot_interval_ms", 10)
    kw.setdefault("restart_delay_ms", 1)
    return JobConfig(processing_guarantee=EO, snapshot_store=store, **kw)


def interrupted_run(store: Any, work_dir: str | None = None, snapshots: int = 3) -> list[Any]:
    """Run the running-sum job slowly, let it commit ``snapshots`` snapshots, then cancel
    it (as a crash would stop it). Returns the output it published."""
    engine = ss.local(cooperative_threads=2, work_dir=work_dir)
    job = engine.new_job(stp.running_sum_dag(N, rate=2000.0), config(store))
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= snapshots, what="snapshots")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    published = list(engine.get_list("out"))
    assert 0 < len(published) < N
    return published


def resumed_run(store: Any, work_dir: str | None = None, fail_after: int = -1, **kw: Any) -> list[Any]:
    engine = ss.local(cooperative_threads=2, work_dir=work_dir)
    job = engine.new_job(stp.running_sum_dag(N, fail_after, rate=1e9), config(store, **kw))
    job.join(60)
    assert job.status is JobStatus.COMPLETED
    return list(engine.get_list("out"))


# -- a store belongs to one submission --------------------------------------------------------
def test_restarted_process_with_default_store_never_takes_the_old_state(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9's scenario: job ids restart at 1 in every process, so a restarted service
    met its previous run's default store, pruned its own fresh snapshots as stale and
    restored the old run's state on its first auto-restart (20k of 40k items lost)."""
    work = str(tmp_path / "work")
    first = interrupted_run(None, work, snapshots=5)
    monkeypatch.setattr(job_module, "_ids", itertools.count(1))  # a new process
    # not asked to resume: the old submission's snapshots are neither used nor pruned
    with pytest.raises(ss.SnapshotStoreInUseError, match="resume=True"):
        ss.local(work_dir=work).new_job(stp.running_sum_dag(N), config())
    # asked to resume, with a failure and auto-restart on the way: exactly-once overall
    stp.FAIL_BUDGET[0] = 1
    second = resumed_run(None, work, fail_after=300, resume=True)
    assert stp.FAIL_BUDGET[0] == 0
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)


@pytest.mark.parametrize("interval_ms", [10, 600_000])
def test_resume_starts_fresh_on_an_empty_or_completed_store(tmp_path: Any, interval_ms: int) -> None:
    """With 600 s between snapshots no periodic snapshot commits: only the final one
    records the run. Before there was one, a run that ended before its first periodic
    snapshot (at 10 ms, by chance on a loaded machine) committed nothing, so the store
    the second run had cleared was left without a manifest."""
    store = str(tmp_path / "store")
    for _ in range(2):  # empty, then holding a completed submission's snapshots
        out = resumed_run(store, resume=True, snapshot_interval_ms=interval_ms)
        assert Counter(out) == stp.expected_running_sums(N)
    manifest = json.loads((tmp_path / "store" / MANIFEST).read_text())
    assert manifest["completed"] is True and manifest["job"] == "svc"
    # a fresh (non-resume) submission may take over a completed store too
    assert Counter(resumed_run(store)) == stp.expected_running_sums(N)


def test_restart_before_first_commit_restores_from_restore_from_not_from_scratch(
    tmp_path: Any,
) -> None:
    first = interrupted_run(str(tmp_path / "a"))
    snap = DirectorySnapshotStore(str(tmp_path / "a")).latest()
    engine = ss.local(cooperative_threads=2)
    stp.FAIL_BUDGET[0] = 1
    job = engine.new_job(
        stp.running_sum_dag(N, fail_after=1, rate=1e9),
        config(str(tmp_path / "b"), snapshot_interval_ms=60_000),
        restore_from=snap,
    )
    job.join(60)
    assert job.restarts == 1
    assert Counter(first) + Counter(engine.get_list("out")) == stp.expected_running_sums(N)


# -- a damaged store never replays silently ---------------------------------------------------
def test_deleted_manifest_is_rebuilt_from_the_signed_files(tmp_path: Any, caplog: Any) -> None:
    store = str(tmp_path / "store")
    first = interrupted_run(store)
    os.remove(os.path.join(store, MANIFEST))
    with caplog.at_level("WARNING"):
        second = resumed_run(store, resume=True)
    assert "rebuilt" in caplog.text
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)  # no replay


def _corrupt(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(-3, os.SEEK_END)
        fh.write(b"!!!")


@pytest.mark.parametrize("damage", ["newest", "all", "newest-missing"])
def test_damaged_store_fails_with_instructions(tmp_path: Any, damage: str) -> None:
    store_dir = str(tmp_path / "store")
    interrupted_run(store_dir)
    store = DirectorySnapshotStore(store_dir)
    ids = store.committed_ids()
    assert len(ids) >= 2
    if damage == "newest-missing":
        os.remove(store._path(ids[-1]))
    for i in ids if damage == "all" else ids[-1:]:
        if os.path.exists(store._path(i)):
            _corrupt(store._path(i))
    for kw in ({"resume": True}, {}):
        with pytest.raises(ss.SnapshotStoreDamagedError) as ei:
            ss.local().new_job(
                stp.running_sum_dag(N),
                config(store_dir, **kw),
                restore_from=None if kw else store_dir,
            )
        text = str(ei.value)
        assert f"snapshot {ids[-1]}" in text and store_dir in text
        if damage == "all":
            assert "No older snapshot is intact" in text
        else:
            assert f"read({ids[-2]})" in text  # the deliberate way to accept duplicates


FAIL_NOW = [False]


class FailOnFlag(ss.AbstractProcessor):
    """x -> x; raises once when FAIL_NOW is set."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if FAIL_NOW[0]:
            FAIL_NOW[0] = False
            raise RuntimeError("injected failure")
        return self.try_emit(item)


def test_newest_snapshot_damaged_while_running_fails_the_restart(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, 10**7, 2000.0))
    m = dag.new_vertex("map", FailOnFlag)
    dag.edge(Edge.between(src, m))
    dag.edge(Edge.between(m, dag.new_vertex("sink", sinks.list_sink("out"))))
    job = ss.local(cooperative_threads=2).new_job(dag, config(store_dir))
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 3, what="snapshots")
    coordinator = job._execution.coordinator  # type: ignore[union-attr]
    coordinator.stop()  # no further snapshots; let the one in progress end
    stp.wait_for(lambda: coordinator.requested_snapshot() is None, what="the last snapshot")
    store = DirectorySnapshotStore(store_dir)
    for i in store.file_ids():
        _corrupt(store._path(i))
    FAIL_NOW[0] = True
    with pytest.raises(ss.JobFailedError, match="damaged"):
        job.join(60)
    assert job.restarts == 1  # the restart was attempted and refused to replay


def test_leftover_temp_and_orphan_files_are_removed(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    first = interrupted_run(store_dir)
    store = DirectorySnapshotStore(store_dir)
    ids = store.committed_ids()
    with open(os.path.join(store_dir, ".tmp-crashed"), "wb") as fh:
        fh.write(b"half a snapshot")
    orphan = store._path(ids[-1] + 1)  # renamed into place, manifest never written
    with open(store._path(ids[-1]), "rb") as src, open(orphan, "wb") as dst:
        dst.write(src.read())
    pruned = store._path(0)
    with open(pruned, "wb") as fh:
        fh.write(b"left by an interrupted prune")
    second = resumed_run(store_dir, resume=True)
    names = os.listdir(store_dir)
    assert not [n for n in names if n.startswith(".tmp-")]
    assert os.path.basename(pruned) not in names
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)


# -- store write errors -------------------------------------------------------------------------
class FailingStore(DirectorySnapshotStore):
    """Fails writes while ``failing`` (as a full disk would)."""

    failing = 0  # number of writes still to fail; -1: all

    def commit(self, manifest: Any) -> None:
        if self.failing:
            self.failing -= 1 if self.failing > 0 else 0
            raise OSError(28, "No space left on device")
        super().commit(manifest)


def test_store_write_errors_pause_sources_show_in_metrics_and_fail_the_job(tmp_path: Any) -> None:
    store = FailingStore(str(tmp_path / "store"))
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(
        stp.running_sum_dag(10**7, rate=20_000.0), config(store, max_snapshot_failures=4)
    )
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 1, what="a snapshot")
    store.failing = -1
    emitted = {}
    for n in (1, 2, 3):
        stp.wait_for(
            lambda n=n: job.metrics["__job__"]["snapshot_failures"] >= n  # type: ignore[misc]
            or job.status is not JobStatus.RUNNING,
            what=f"{n} failed snapshots",
        )
        emitted[n] = job.metrics["src"]["items_out"]
        if n == 2:
            assert job.status is JobStatus.RUNNING
            assert "No space left" in (job.snapshot_error or "")
            assert job.metrics["__job__"]["snapshot_failures_total"] >= 2
    # back-pressure: after a failed snapshot the sources emit nothing until one commits
    assert emitted[3] == emitted[2]
    with pytest.raises(ss.JobFailedError, match="4 consecutive snapshots could not be written") as ei:
        job.join(60)
    assert "No space left" in str(ei.value) and ei.value.vertex is None
    assert job.restarts == 0  # a restart cannot fix the store


def test_transient_store_errors_lose_and_duplicate_nothing(tmp_path: Any) -> None:
    store = FailingStore(str(tmp_path / "store"))
    store.failing = 2
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(stp.running_sum_dag(N, min_snapshots=4), config(store))
    job.join(60)
    assert Counter(engine.get_list("out")) == stp.expected_running_sums(N)
    assert store.failing == 0


# -- signing ------------------------------------------------------------------------------------
class _Boom:
    def __reduce__(self) -> Any:
        return (os.mkdir, ("/tmp/slipstream-pwned-by-snapshot",))


def test_forged_or_unsigned_files_are_never_unpickled(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    store = DirectorySnapshotStore(store_dir)
    store.write(SnapshotData(1, "j"))
    evil = pickle.dumps(_Boom())
    # (1) the pre-signing format: a sha256 line and a pickle
    import hashlib

    with open(store._path(1), "wb") as fh:
        fh.write(hashlib.sha256(evil).hexdigest().encode() + b"\n" + evil)
    with pytest.raises(ss.SnapshotError, match="unsigned"):
        store.read(1)
    # (2) format 2 (a pickled SnapshotData) signed with another key
    other = DirectorySnapshotStore(store_dir, key=b"k" * 32)
    format2_store.write_payload(other, 2, evil)
    with pytest.raises(ss.SnapshotError, match="signature"):
        store.read(2)
    # (3) format 3: a manifest naming a chunk of that pickle, signed with another key
    other.write(SnapshotData(3, "j"))
    with pytest.raises(ss.SnapshotError, match="signature"):
        store.read(3)
    other.begin(4)
    ref = other.write_chunk(4, "v", 0, "full", evil)
    manifest = Manifest(4, "j")
    manifest.vertices["v"] = VertexManifest(1, chains={0: [ref]})
    other.commit(manifest)
    with pytest.raises(ss.SnapshotError, match="signature"):
        store.read(4)
    with pytest.raises(ss.SnapshotError, match=r"chunk .*chunk-0000000004-0-.*fails its signature"):
        store.read_chain([ref], "v", 0, 4)
    assert not os.path.exists("/tmp/slipstream-pwned-by-snapshot")


def test_default_key_is_private_and_found_again_by_a_new_store(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    DirectorySnapshotStore(store_dir).write(SnapshotData(7, "j"))
    path = snapshot_signing.store_key_path(store_dir)
    assert not path.startswith(store_dir)  # write access to the store does not give the key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert os.stat(path).st_uid == os.getuid()
    assert DirectorySnapshotStore(store_dir).read(7).snapshot_id == 7  # "a new process"
    os.chmod(path, 0o644)
    with pytest.raises(ss.SnapshotError, match="chmod 600"):
        DirectorySnapshotStore(store_dir).read(7)
    os.chmod(path, 0o600)
    os.chmod(os.path.dirname(path), 0o755)
    with pytest.raises(ss.SnapshotError, match="chmod 700"):
        DirectorySnapshotStore(store_dir).read(7)
    os.chmod(os.path.dirname(path), 0o700)
    if os.getuid() == 0:  # only root can hand the file to someone else
        os.chown(path, 54321, -1)
        with pytest.raises(ss.SnapshotError, match="owned by uid 54321"):
            DirectorySnapshotStore(store_dir).read(7)
        os.chown(path, 0, -1)


def test_key_from_config_and_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store_dir = str(tmp_path / "store")
    monkeypatch.setenv(snapshot_signing.KEY_ENV, "e" * 20)
    DirectorySnapshotStore(store_dir).write(SnapshotData(1, "j"))
    assert not os.path.exists(snapshot_signing.store_key_path(store_dir))
    assert DirectorySnapshotStore(store_dir, key="e" * 20).read(1).snapshot_id == 1
    monkeypatch.delenv(snapshot_signing.KEY_ENV)
    with pytest.raises(ss.SnapshotError, match="signature"):
        DirectorySnapshotStore(store_dir).read(1)
    with pytest.raises(ss.SnapshotError, match="at least 16 bytes"):
        DirectorySnapshotStore(store_dir, key="short").read(1)
    # a job signs with JobConfig(snapshot_key=...), and restore_from uses the same key
    engine = ss.local()
    job = engine.new_job(
        stp.running_sum_dag(500, min_snapshots=2), config(store_dir + "2", snapshot_key=b"s" * 16)
    )
    job.join(30)
    assert "s" * 16 not in repr(job.config)
    assert DirectorySnapshotStore(store_dir + "2", key=b"s" * 16).latest() is not None
    with pytest.raises(ss.SnapshotStoreDamagedError, match="signature"):
        DirectorySnapshotStore(store_dir + "2").latest()


# -- restart back-off ---------------------------------------------------------------------------
STARTS: list[float] = []


class AlwaysFails(ss.AbstractProcessor):
    def init_processor(self, context: ss.Context) -> None:
        STARTS.append(time.monotonic())

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        raise RuntimeError("always fails")


def failing_dag() -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, 10**6, 1e9))
    bad = dag.new_vertex("bad", AlwaysFails).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, bad))
    dag.edge(Edge.between(bad, sink))
    return dag


def test_auto_restart_backs_off_exponentially_up_to_a_bound(tmp_path: Any) -> None:
    STARTS.clear()
    job = ss.local().new_job(
        failing_dag(),
        config(
            str(tmp_path),
            snapshot_interval_ms=600_000,  # a committed snapshot would reset the back-off
            restart_delay_ms=40,
            restart_delay_max_ms=100,
            max_restarts=4,
        ),
    )
    with pytest.raises(ss.JobFailedError, match="after 4 restart"):
        job.join(60)
    gaps = [b - a for a, b in itertools.pairwise(STARTS)]
    assert len(gaps) == 4
    for gap, delay in zip(gaps, (0.04, 0.08, 0.1, 0.1), strict=True):
        assert gap >= delay  # lower bounds only: a loaded machine is only ever slower


def test_cancel_during_back_off_ends_the_job(tmp_path: Any) -> None:
    STARTS.clear()
    job = ss.local().new_job(
        failing_dag(), config(str(tmp_path), restart_delay_ms=600_000, restart_delay_max_ms=600_000)
    )
    stp.wait_for(lambda: job.status is JobStatus.RESTARTING, what="the restart delay")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    assert len(STARTS) == 1


def test_store_that_cannot_be_verified_is_not_taken_over(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    DirectorySnapshotStore(store_dir, key=b"a" * 16).write(SnapshotData(1, "svc"))
    with pytest.raises(ss.SnapshotStoreInUseError, match="cannot be verified"):
        ss.local().new_job(stp.running_sum_dag(10), config(store_dir, snapshot_key=b"b" * 16))
    assert os.path.exists(os.path.join(store_dir, "snapshot-0000000001.bin"))  # untouched


STOPPING = threading.Event()


class SlowToStopSink(ss.AbstractProcessor):
    """Swallows items; its close() (run while a cancelled job stops) waits for STOPPING,
    so a test sees the job between cancel() and its end."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return True

    def close(self) -> None:
        assert STOPPING.wait(60)


def test_cancelled_job_holds_its_store_until_it_has_ended(tmp_path: Any) -> None:
    """cancel() only asks a job to stop; the store is released when the job ends (before
    its status turns terminal and join() returns). The Kafka rescale test once started
    its next job right after cancel() and got SnapshotStoreInUseError on loaded machines,
    where the stop (closing consumers, the last snapshot's fsync) outlasted its produce()."""
    store_dir = str(tmp_path / "store")
    STOPPING.clear()
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, N, 2000.0))
    dag.edge(Edge.between(src, dag.new_vertex("sink", SlowToStopSink)))
    job = ss.local().new_job(dag, config(store_dir))
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 1, what="a snapshot")
    job.cancel()
    assert not job.status.is_terminal  # its sink is still closing
    with pytest.raises(ss.SnapshotStoreInUseError, match=r"join\(\) a cancelled job"):
        ss.local().new_job(stp.running_sum_dag(10), config(store_dir, resume=True))
    STOPPING.set()
    with pytest.raises(ss.JobCancelledError):
        job.join(60)
    # free once ended: the same DAG resumes, its source unpaced (what it has left at
    # 2,000 items/s was ~1.5 s of the test)
    again = DAG()
    rest = again.new_vertex("src", functools.partial(stp.PacedSource, N))
    again.edge(Edge.between(rest, again.new_vertex("sink", SlowToStopSink)))
    second = ss.local().new_job(again, config(store_dir, resume=True))
    second.join(60)
    assert second.status is JobStatus.COMPLETED
    assert second.metrics["__job__"]["resumed_from_snapshot"] > 0


def _broken_processor() -> ss.AbstractProcessor:
    raise ValueError("no processor today")


def test_job_that_cannot_start_releases_its_store(tmp_path: Any) -> None:
    """A job whose execution could not be built (here a processor supplier raises) kept
    its store locked for the rest of the process: every later job on it was refused
    with SnapshotStoreInUseError."""
    store_dir = str(tmp_path / "store")
    engine = ss.local()
    dag = stp.running_sum_dag(N)
    dag.new_vertex("broken", _broken_processor)
    with pytest.raises(ValueError, match="no processor today"):
        engine.new_job(dag, config(store_dir))
    assert Counter(resumed_run(store_dir)) == stp.expected_running_sums(N)
    failed = engine.jobs[-1]
    assert failed.status is JobStatus.FAILED
    with pytest.raises(ss.JobFailedError, match="no processor today"):
        failed.join(1)


BUILDS = [0]


def _builds_once() -> ss.AbstractProcessor:
    BUILDS[0] += 1
    if BUILDS[0] > 1:
        raise ValueError("no second execution")
    return ss.AbstractProcessor()


@pytest.mark.parametrize("how", ["resume", "auto-restart"])
def test_execution_that_cannot_be_rebuilt_fails_the_job_and_releases_its_store(
    tmp_path: Any, how: str
) -> None:
    """resume() whose execution could not be built left the job RESTARTING forever,
    holding its store; an auto-restart's failure ends the job too, naming the processor
    that failed first. Either way the next submission resumes exactly-once."""
    store_dir = str(tmp_path / "store")
    BUILDS[0] = 0
    stp.FAIL_BUDGET[0] = 1 if how == "auto-restart" else 0
    dag = stp.running_sum_dag(N, fail_after=300 if how == "auto-restart" else -1, rate=2000.0)
    dag.new_vertex("once", _builds_once).local_parallelism(1)
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(dag, config(store_dir))
    if how == "resume":
        stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 1, what="a snapshot")
        job.suspend(60)
        with pytest.raises(ValueError, match="no second execution"):
            job.resume()
        where = ""
    else:
        where = "vertex 'sum'"
    with pytest.raises(ss.JobFailedError, match=f"{where}.*no second execution"):
        job.join(60)
    assert job.status is JobStatus.FAILED
    # the resumed DAG lacks the stateless vertex 'once': a changed DAG, accepted explicitly
    second = resumed_run(store_dir, resume=True, allow_job_change=True)
    assert Counter(engine.get_list("out")) + Counter(second) == stp.expected_running_sums(N)


def test_two_running_jobs_never_share_a_store(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    engine = ss.local(cooperative_threads=2)
    first = engine.new_job(stp.running_sum_dag(N, rate=2000.0), config(store_dir))
    # also before the first one committed anything (then no manifest names an owner)
    with pytest.raises(ss.SnapshotStoreInUseError, match="in use by another running job"):
        ss.local().new_job(stp.running_sum_dag(10), config(store_dir, name="other"))
    first.cancel()
    with pytest.raises(ss.JobCancelledError):
        first.join(30)
    # released at the end: the next submission may resume it
    second = resumed_run(store_dir, resume=True)
    assert Counter(engine.get_list("out")) + Counter(second) == stp.expected_running_sums(N)


class _SlowFinalStore(DirectorySnapshotStore):
    """Holds the write of the job's final snapshot (every processor completed) until the
    job has ended or 2 s passed, then records whether the job still held the store."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.writing = threading.Event()
        self.job: Any = None
        self.held_while_writing: list[bool] = []

    def commit(self, data: Any) -> None:  # the manifest of snapshot data.snapshot_id
        final = all(len(vs.completed) == vs.total_parallelism for vs in data.vertices.values())
        if final and not self.writing.is_set():
            self.writing.set()
            deadline = time.monotonic() + 2.0
            # (the job may be this fast: new_job() has not returned it yet)
            while time.monotonic() < deadline and not (
                self.job is not None and self.job.status.is_terminal
            ):
                time.sleep(0.01)
            self.held_while_writing.append(self._lock_fd is not None)
        super().commit(data)


def test_cancel_during_the_final_snapshot_waits_for_its_write_before_releasing_the_store(
    tmp_path: Any,
) -> None:
    """A job cancelled while its final snapshot is written ends only once that write is
    done, as when any other snapshot is under way: it releases its store when it ends,
    and the write must not land in a store another job may hold by then. On main the job
    ended at once (the store thread's final write was not waited for) and the write went
    on into the released store: the snapshot file, the manifest and the generation of a
    job that had ended (seen as a vanished temp file when the next job, restored from
    the store, cleaned it up: 'its final snapshot 24 could not be written ... No such
    file or directory: .../.tmp-...')."""
    store = _SlowFinalStore(str(tmp_path / "store"))
    p = ss.Pipeline()
    p.read_from(ss.sources.items(range(100))).write_to(sinks.list_sink("o"))
    engine = ss.local()
    job = store.job = engine.new_job(p, config(store, name="final"))
    assert store.writing.wait(60), "the final snapshot was not written"
    job.cancel()
    try:
        job.join(60)
    except ss.JobCancelledError:
        pass
    stp.wait_for(lambda: bool(store.held_while_writing), what="the final write")
    assert store.held_while_writing == [True], "the job released its store while writing to it"
    assert DirectorySnapshotStore(str(tmp_path / "store")).latest() is not None
