"""A resume never continues from the wrong place silently (issue 20, items 3 and 4).

* A store rolled back (its directory restored from a backup, its newest snapshot and
  manifest removed, the directory lost) would resume from an older snapshot than one
  whose output its sinks published: ``SnapshotStoreRolledBackError`` unless
  ``allow_rollback=True``, which replays (a warning says so).
* ``resume=True`` on another job's unfinished store, or a snapshot restored into another
  DAG, fails naming both sides unless ``allow_job_change=True``.
* A store written before stores recorded their generation and DAG still resumes.

Each scenario resumed silently before (with duplicates, or with another job's offsets).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import format2_store
import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sinks
from slipstream.state import lineage as snapshot_lineage
from slipstream.state import store as snapshot_store
from slipstream.state.store import MANIFEST, DirectorySnapshotStore

EO = ProcessingGuarantee.EXACTLY_ONCE
N = 4000


def config(store: Any, **kw: Any) -> JobConfig:
    kw.setdefault("name", "svc")
    kw.setdefault("snapshot_interval_ms", 10)
    kw.setdefault("restart_delay_ms", 1)
    return JobConfig(processing_guarantee=EO, snapshot_store=store, **kw)


def interrupted(store: Any, dag: DAG | None = None, snapshots: int = 3, **kw: Any) -> list[Any]:
    """Run the running-sum job slowly until it committed ``snapshots`` more snapshots,
    then cancel it (as a crash would stop it); returns the output it published."""
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(dag or stp.running_sum_dag(N, rate=2000.0), config(store, **kw))
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= snapshots, what="snapshots")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    published = list(engine.get_list("out"))
    assert 0 < len(published) < N
    return published


def completed(store: Any, dag: DAG | None = None, **kw: Any) -> list[Any]:
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(dag or stp.running_sum_dag(N, rate=1e9), config(store, **kw))
    job.join(60)
    assert job.status is JobStatus.COMPLETED
    return list(engine.get_list("out"))


def latest_id(store_dir: str) -> int:
    return DirectorySnapshotStore(store_dir).committed_ids()[-1]


def rolled_back_message(store_dir: str, newest: int, older: int | None, job: str = "svc") -> str:
    """The exact text of the SnapshotStoreRolledBackError (``older=None``: nothing left)."""
    path = snapshot_lineage.generation_path(store_dir)
    if older is None:
        what = "it holds no unfinished snapshot to resume from"
        consequence = "starting from scratch would publish all of it again"
        action = "start from scratch"
    else:
        what = f"the job would resume from snapshot {older}"
        consequence = f"resuming from snapshot {older} would publish what came after it again"
        action = f"resume from snapshot {older}"
    return (
        f"snapshot store {store_dir} was rolled back: snapshot {newest} of job {job!r} was "
        f"committed in it (recorded outside the store in {path}), but {what}. The sinks may "
        f"have published the output of every snapshot up to {newest}: {consequence}. (The "
        f"store directory was restored from a backup or lost, or its newest snapshot files "
        f"and MANIFEST.json were removed.) Put the newest snapshots back; or pass "
        f"JobConfig(allow_rollback=True) to {action} and accept that replay (duplicates "
        f"downstream); or start from scratch with another snapshot_store."
    )


# -- a rolled-back store ---------------------------------------------------------------------
def _roll_back(how: str, store_dir: str, backup: str) -> int | None:
    """Roll the store back as ``how`` says; returns the snapshot a resume would start from."""
    if how == "backup":  # the whole directory restored from a copy taken earlier
        shutil.rmtree(store_dir)
        shutil.copytree(backup, store_dir)
    elif how == "manifest":  # only the manifest put back (the newer files are still there)
        shutil.copy(os.path.join(backup, MANIFEST), os.path.join(store_dir, MANIFEST))
    elif how == "newest-deleted":  # the newest snapshot file and the manifest removed
        store = DirectorySnapshotStore(store_dir)
        os.remove(store._path(store.committed_ids()[-1]))
        os.remove(os.path.join(store_dir, MANIFEST))
    else:  # "lost": the store directory is gone
        shutil.rmtree(store_dir)
        return None
    return latest_id(store_dir)


def _two_runs(tmp_path: Any) -> tuple[str, str, list[Any], list[Any], int, int]:
    """A run interrupted after committing snapshots, a backup of its store, and a resumed
    run interrupted after committing more. Snapshots are kept long enough (keep=100) for
    the backup's manifest to name files that are still there."""
    store_dir, backup = str(tmp_path / "store"), str(tmp_path / "backup")
    first = interrupted(DirectorySnapshotStore(store_dir, keep=100))
    shutil.copytree(store_dir, backup)
    backup_id = latest_id(store_dir)
    second = interrupted(DirectorySnapshotStore(store_dir, keep=100), resume=True)
    newest = latest_id(store_dir)
    assert newest > backup_id
    return store_dir, backup, first, second, backup_id, newest


@pytest.mark.parametrize("how", ["backup", "manifest", "newest-deleted", "lost"])
def test_rolled_back_store_fails_loudly_instead_of_replaying(tmp_path: Any, how: str) -> None:
    """Before: each resumed silently from the older snapshot (or from scratch) and
    published the output after it a second time."""
    store_dir, backup, first, second, _backup_id, newest = _two_runs(tmp_path)
    older = _roll_back(how, store_dir, backup)
    for kw in ({"resume": True}, {"resume": True, "auto_restart": False}):
        engine = ss.local()
        with pytest.raises(ss.SnapshotStoreRolledBackError) as ei:
            engine.new_job(stp.running_sum_dag(N), config(store_dir, **kw))
        assert str(ei.value) == rolled_back_message(store_dir, newest, older)
        assert engine.get_list("out") == []
    assert isinstance(ei.value, ss.SnapshotError)
    if how != "lost":  # restore_from= the store directory is checked the same way
        with pytest.raises(ss.SnapshotStoreRolledBackError) as ei:
            ss.local().new_job(
                stp.running_sum_dag(N), config(str(tmp_path / "other")), restore_from=store_dir
            )
        assert str(ei.value) == rolled_back_message(store_dir, newest, older)
    # a start without resume=True is a fresh start by request (the store is refused
    # as in use when it holds unfinished snapshots, as before)
    if how == "lost":
        assert Counter(completed(store_dir)) == stp.expected_running_sums(N)


def test_allow_rollback_resumes_from_the_older_snapshot_and_replays(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The replay is exactly the output published after the restored snapshot: what the
    second run published, since it had started from the same snapshot."""
    store_dir, backup, first, second, backup_id, newest = _two_runs(tmp_path)
    _roll_back("backup", store_dir, backup)
    with caplog.at_level("WARNING", logger="slipstream.snapshot"):
        third = completed(store_dir, resume=True, allow_rollback=True)
    assert (
        f"job svc: snapshot store {store_dir} was rolled back: snapshot {newest} of job 'svc' "
        f"was committed in it, but the job would resume from snapshot {backup_id}; "
        f"allow_rollback=True: the output its sinks published after snapshot {backup_id} is "
        f"published again"
    ) in caplog.text
    assert Counter(first) + Counter(second) + Counter(third) == (
        stp.expected_running_sums(N) + Counter(second)
    )
    # snapshot ids never go back in a store: the replay continued after the newest one
    manifest = json.loads((tmp_path / "store" / MANIFEST).read_text())
    assert manifest["completed"] is True and manifest["latest"] > newest


def test_a_resume_after_the_run_completed_starts_fresh_without_an_error(tmp_path: Any) -> None:
    """The generation file does not get in the way of the ordinary cycle: a completed
    store starts fresh under resume=True, also after its directory was removed."""
    store_dir = str(tmp_path / "store")
    interrupted(store_dir)
    assert Counter(completed(store_dir, resume=True)) != Counter()
    assert Counter(completed(store_dir, resume=True)) == stp.expected_running_sums(N)
    shutil.rmtree(store_dir)
    assert Counter(completed(store_dir, resume=True)) == stp.expected_running_sums(N)


def test_store_removed_while_the_job_runs_is_taken_again(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the next snapshot re-created the directory without a word, and the job's
    lock stayed on the removed lock file, so a second job given the store with
    resume=True took it while the first one was still writing there."""
    store_dir = str(tmp_path / "store")
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(stp.running_sum_dag(N, rate=2000.0), config(store_dir))
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 3, what="snapshots")
    with caplog.at_level("WARNING", logger="slipstream.snapshot"):
        n = job.metrics["__job__"]["snapshots"]
        os.rename(store_dir, str(tmp_path / "gone"))  # the directory vanishes at once
        shutil.rmtree(str(tmp_path / "gone"))
        stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= n + 2, what="snapshots")
    assert (
        f"snapshot store {store_dir} was removed or replaced while job svc held it (its lock "
        f"file {os.path.join(store_dir, '.lock')} is gone): the snapshots it held are lost; "
        f"taking the store again and writing the next snapshots there"
    ) in caplog.text
    with pytest.raises(ss.SnapshotStoreInUseError, match="in use by another running job"):
        ss.local().new_job(stp.running_sum_dag(N), config(store_dir, resume=True))
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    second = completed(store_dir, resume=True)  # from the snapshots written after
    assert Counter(engine.get_list("out")) + Counter(second) == stp.expected_running_sums(N)


# -- another job's store, another DAG ----------------------------------------------------------
def test_resume_refuses_another_jobs_store(tmp_path: Any) -> None:
    """Issue 20: job 'payments' pointed at the unfinished store of job 'orders' with
    resume=True continued from 'orders' offsets (9,009 of 20,000 items skipped)."""
    store_dir = str(tmp_path / "orders-store")
    first = interrupted(store_dir, name="orders")
    with pytest.raises(ss.SnapshotStoreInUseError) as ei:
        ss.local().new_job(stp.running_sum_dag(N), config(store_dir, name="payments", resume=True))
    assert str(ei.value) == (
        f"snapshot store {store_dir} holds the unfinished snapshots of job 'orders', not of "
        f"job 'payments': resume=True continues a job from its own store only. Give job "
        f"'payments' its own snapshot_store; or, to continue job 'orders''s work under the "
        f"name 'payments', pass JobConfig(allow_job_change=True)."
    )
    # taken over on purpose: it continues where 'orders' stood
    second = completed(store_dir, name="payments", resume=True, allow_job_change=True)
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)


def _audited_dag() -> DAG:
    """The running-sum DAG with one more vertex fed by 'sum'."""
    dag = stp.running_sum_dag(N, rate=1e9)
    audit = dag.new_vertex("audit", sinks.noop())
    dag.edge(Edge.from_(dag.vertex("sum"), 1).to(audit))
    return dag


def test_restore_into_another_dag_names_the_vertices_that_differ(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    first = interrupted(store_dir)
    sid = latest_id(store_dir)
    with pytest.raises(ss.SnapshotError) as ei:
        ss.local().new_job(_audited_dag(), config(store_dir, resume=True)).join(60)
    assert str(ei.value) == (
        f"snapshot {sid} of job 'svc' was taken of another DAG: vertices ['audit'] are new, "
        f"the edges of vertices ['sum'] differ (edges only in the snapshot: []; only in this "
        f"DAG: ['sum[1]->audit[0]']). A snapshot is restored into the same DAG (the same "
        f"vertex names and edges; parallelism may change). Pass "
        f"JobConfig(allow_job_change=True) to restore it into this DAG anyway (vertices "
        f"match by name)."
    )
    # another parallelism is the same DAG
    second = completed(store_dir, stp.running_sum_dag(N, rate=1e9, sum_lp=3), resume=True)
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)


def test_allow_job_change_restores_into_another_dag(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    first = interrupted(store_dir)
    second = completed(store_dir, _audited_dag(), resume=True, allow_job_change=True)
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)


# -- stores written before generations and DAG shapes were recorded -----------------------------
def test_store_of_the_previous_version_still_resumes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The migration path: a store without a generation file, whose manifest and headers
    carry no DAG fingerprint and whose snapshots carry no DAG shape (as the previous
    version wrote them) resumes exactly-once, and is recorded from then on."""
    store_dir = str(tmp_path / "store")
    with monkeypatch.context() as m:
        m.setattr(snapshot_store, "record_generation", lambda *a, **k: None)
        first = interrupted(store_dir)
    # the files as that version wrote them: format 2, pickled SnapshotData objects
    format2_store.convert_to_format2(store_dir, old_version=True)
    store = DirectorySnapshotStore(store_dir)
    manifest = json.loads((tmp_path / "store" / MANIFEST).read_text())
    assert "dag" not in manifest and "dag" not in store.read_header(manifest["latest"])
    assert "dag_shape" not in vars(store.read(manifest["latest"]))
    assert not os.path.exists(snapshot_lineage.generation_path(store_dir))
    second = completed(store_dir, resume=True)
    assert Counter(first) + Counter(second) == stp.expected_running_sums(N)
    gen = snapshot_lineage.read_generation(store_dir)
    assert gen is not None and gen.completed
    assert gen.generation == latest_id(store_dir) > manifest["latest"]
    assert not format2_store.is_format2(store_dir, latest_id(store_dir))  # new ones: format 3


def test_generation_file_is_private(tmp_path: Any) -> None:
    store_dir = str(tmp_path / "store")
    interrupted(store_dir)
    path = snapshot_lineage.generation_path(store_dir)
    assert os.stat(path).st_mode & 0o077 == 0
    assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0
    os.chmod(path, 0o666)
    with pytest.raises(ss.SnapshotError, match="is not private to this user"):
        ss.local().new_job(stp.running_sum_dag(N), config(store_dir, resume=True))

