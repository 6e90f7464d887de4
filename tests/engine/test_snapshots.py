"""Snapshots on the embedded engine: exactly-once and at-least-once under failures,
suspend/resume/restart, restore with another parallelism, the store's integrity."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sinks
from slipstream.state.store import DirectorySnapshotStore

EO = ProcessingGuarantee.EXACTLY_ONCE
ALO = ProcessingGuarantee.AT_LEAST_ONCE


running_sum_dag = stp.running_sum_dag
expected_running_sums = stp.expected_running_sums


def run_job(dag: DAG, guarantee: ProcessingGuarantee, tmp: str, interval: int = 10, **kw: Any):
    engine = ss.local(cooperative_threads=2)
    cfg = JobConfig(
        name="snap",
        processing_guarantee=guarantee,
        snapshot_interval_ms=interval,
        snapshot_store=tmp,
        max_restarts=kw.pop("max_restarts", 20),
        restart_delay_ms=1,  # back-off is tested in test_snapshot_store.py; keep this lean
    )
    job = engine.new_job(dag, cfg, **kw)
    return engine, job


def test_no_failure_exactly_once_output_and_snapshots_taken(tmp_path: Any) -> None:
    n = 3000
    # the sources complete only after taking part in 3 snapshots, so snapshots 1 and 2
    # have ended by then however slow the machine is (no reliance on the job's duration)
    engine, job = run_job(running_sum_dag(n, min_snapshots=3), EO, str(tmp_path))
    job.join(30)
    assert Counter(engine.get_list("out")) == expected_running_sums(n)
    assert job.metrics["__job__"]["snapshots"] >= 2
    assert DirectorySnapshotStore(str(tmp_path)).latest() is not None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(fail_after=st.integers(1, 1400), failures=st.integers(1, 3), interval=st.sampled_from([3, 10, 25]))
def test_exactly_once_with_random_failures_matches_failure_free_run(
    tmp_path_factory: Any, fail_after: int, failures: int, interval: int
) -> None:
    n = 3000
    stp.FAIL_BUDGET[0] = failures
    tmp = str(tmp_path_factory.mktemp("eo"))
    engine, job = run_job(running_sum_dag(n, fail_after), EO, tmp, interval)
    job.join(60)
    assert job.status is JobStatus.COMPLETED
    assert Counter(engine.get_list("out")) == expected_running_sums(n)  # no loss, no duplicates
    # two processors can fail in the same execution, which is one restart
    assert 1 <= job.restarts <= failures - stp.FAIL_BUDGET[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(fail_after=st.integers(1, 1400), interval=st.sampled_from([3, 10]))
def test_at_least_once_with_failures_loses_nothing(
    tmp_path_factory: Any, fail_after: int, interval: int
) -> None:
    n = 3000
    stp.FAIL_BUDGET[0] = 2
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, n, 40_000.0)).local_parallelism(2)
    m = dag.new_vertex("map", functools.partial(stp.FailingMap, fail_after)).local_parallelism(2)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, m).partitioned(lambda x: x % 10).distributed())
    dag.edge(Edge.between(m, sink))
    engine, job = run_job(dag, ALO, str(tmp_path_factory.mktemp("alo")), interval)
    job.join(60)
    got = Counter(engine.get_list("out"))
    # every item is there at least once; replays may add duplicates
    assert set(got) == {2 * x for x in range(n)}


def test_failure_without_guarantee_fails_job(tmp_path: Any) -> None:
    stp.FAIL_BUDGET[0] = 1
    engine, job = run_job(running_sum_dag(500, 100), ProcessingGuarantee.NONE, str(tmp_path))
    with pytest.raises(ss.JobFailedError, match="injected failure") as ei:
        job.join(30)
    assert ei.value.vertex == "sum"


def test_restarts_are_bounded_with_clear_final_error(tmp_path: Any) -> None:
    stp.FAIL_BUDGET[0] = 100
    engine, job = run_job(running_sum_dag(3000, 50), EO, str(tmp_path), max_restarts=2)
    with pytest.raises(ss.JobFailedError, match="after 2 restart") as ei:
        job.join(60)
    assert ei.value.vertex == "sum"
    stp.FAIL_BUDGET[0] = 0


def test_suspend_resume_and_restore_with_other_parallelism(tmp_path: Any) -> None:
    """Suspended in the middle (each source held at 1,000 of its 3,000 items until the
    suspension: a sleep before it let the job complete first on a loaded machine)."""
    n = 6000
    stp.HOLD_AT[0] = 1000
    try:
        engine, job = run_job(running_sum_dag(n, rate=5000.0), EO, str(tmp_path), interval=50)
        stp.wait_for(lambda: len(engine.get_list("out")) == 2000, what="the items before the hold")
        job.suspend()
    finally:
        stp.HOLD_AT[0] = None
    assert job.status is JobStatus.SUSPENDED
    snap = job.export_snapshot()
    assert snap is not None and snap.vertices["sum"].total_parallelism == 2
    job.resume()
    job.join(60)
    assert job.status is JobStatus.COMPLETED
    assert Counter(engine.get_list("out")) == expected_running_sums(n)

    # the same snapshot restored into a new job whose keyed vertex has parallelism 3
    engine2 = ss.local()
    dag2 = running_sum_dag(n, rate=1e9, sum_lp=3)
    job2 = engine2.new_job(
        dag2,
        JobConfig(processing_guarantee=EO, snapshot_store=str(tmp_path / "second")),
        restore_from=snap,
    )
    job2.join(60)
    # results before the snapshot were published by the first job; the rest must continue
    # the sums exactly where they stood
    first_part = Counter(engine.get_list("out")) - Counter(engine2.get_list("out"))
    assert first_part + Counter(engine2.get_list("out")) == Counter(engine.get_list("out"))
    assert Counter(engine2.get_list("out")) <= expected_running_sums(n)
    assert sum(Counter(engine2.get_list("out")).values()) > 0


def test_corrupt_newest_snapshot_is_an_error_not_a_silent_fallback(tmp_path: Any) -> None:
    engine, job = run_job(running_sum_dag(3000, min_snapshots=3), EO, str(tmp_path), interval=5)
    job.join(30)
    store = DirectorySnapshotStore(str(tmp_path))
    ids = store.committed_ids()
    assert len(ids) >= 2
    path = os.path.join(str(tmp_path), f"snapshot-{ids[-1]:010d}.bin")
    with open(path, "r+b") as fh:
        fh.seek(-5, os.SEEK_END)
        fh.write(b"XXXXX")
    # an older snapshot would republish what the newest one published: refuse, and say
    # which snapshots are intact and how to restore one deliberately
    with pytest.raises(ss.SnapshotStoreDamagedError, match=f"snapshot {ids[-1]} .*signature") as ei:
        store.latest()
    assert f".read({ids[-2]})" in str(ei.value)
    assert store.read(ids[-2]).snapshot_id == ids[-2]


def test_restore_from_missing_store_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(ss.SnapshotError, match="no committed snapshot"):
        ss.local().new_job(running_sum_dag(10), restore_from=str(tmp_path / "nothing"))


def test_suspend_requires_a_guarantee() -> None:
    engine = ss.local()
    job = engine.new_job(running_sum_dag(200000, rate=1000.0))
    with pytest.raises(ss.SnapshotError, match="cannot be suspended"):
        job.suspend()
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(5)


def test_restart_takes_a_terminal_snapshot_and_continues(tmp_path: Any) -> None:
    import time

    n = 6000
    engine, job = run_job(running_sum_dag(n, rate=5000.0), EO, str(tmp_path), interval=50)
    time.sleep(0.2)
    job.restart()
    assert job.status is JobStatus.RUNNING
    job.join(60)
    assert job.status is JobStatus.COMPLETED
    assert Counter(engine.get_list("out")) == expected_running_sums(n)


def _key3(e: Any) -> int:
    return e % 3


def _ts(e: Any) -> int:
    return e


def _window_dag(n: int, rate: float, window_def: Any) -> DAG:
    from slipstream import processors as P
    from slipstream.aggregate import counting

    dag = DAG()
    src = dag.new_vertex(
        "src", functools.partial(stp.PacedSource, n, rate, wm_lag=10)
    ).local_parallelism(1)
    win = dag.new_vertex(
        "win",
        P.aggregate_to_sliding_window(
            key_fn=_key3, timestamp_fn=_ts, window_def=window_def, agg_op=counting()
        ),
    ).local_parallelism(2)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, win).partitioned(_key3).distributed())
    dag.edge(Edge.between(win, sink))
    return dag


def test_restore_into_another_window_definition_keeps_every_event(tmp_path: Any) -> None:
    """docs/fault-tolerance.md: a suspended tumbling(2) window job restored with
    ``restore_from=`` into tumbling(4): the new job's windows are all on the size-4 grid,
    and every event is counted exactly once over both jobs (frames saved under the old
    grid are moved into the new frames they end in; none is lost)."""
    import time

    from slipstream.window import tumbling_window_def

    n = 4000
    engine, job = run_job(_window_dag(n, 4000.0, tumbling_window_def(2)), EO, str(tmp_path / "a"), 50)
    deadline = time.monotonic() + 30
    while job.metrics.get("src", {}).get("items_out", 0) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    job.suspend()
    snap = job.export_snapshot()
    assert snap is not None
    first = list(engine.get_list("out"))
    assert first and all(r.end - r.start == 2 for r in first)

    engine2 = ss.local()
    job2 = engine2.new_job(
        _window_dag(n, 1e9, tumbling_window_def(4)),
        JobConfig(processing_guarantee=EO, snapshot_store=str(tmp_path / "b")),
        restore_from=snap,
    )
    job2.join(60)
    second = list(engine2.get_list("out"))
    assert second and all(r.end % 4 == 0 and r.end - r.start == 4 for r in second)
    assert sum(r.value for r in first + second) == n
    assert job2.metrics["win"].get("late_items_dropped", 0) == 0


def test_suspend_of_a_job_without_a_commit_phase_returns_and_resumes(tmp_path: Any) -> None:
    """A job whose processors have no commit phase (an endless generator into noop)
    closes every tasklet right after the terminal barrier, before the store committed the
    terminal snapshot: the execution must wait for that outcome instead of taking the
    job as completed (it waited forever for a final snapshot: suspend() timed out)."""
    from slipstream import Pipeline, sinks, sources

    p = Pipeline()
    (
        p.read_from(sources.generator(lambda i: (i % 50, 1), 20000.0))
        .group_by(lambda t: t[0])
        .rolling_aggregate(ss.aggregate.counting())
        .write_to(sinks.noop())
    )
    engine = ss.local()
    job = engine.new_job(
        p,
        JobConfig(processing_guarantee=EO, snapshot_store=str(tmp_path), snapshot_interval_ms=50),
    )
    store = DirectorySnapshotStore(str(tmp_path))
    deadline = time.monotonic() + 60
    while not store.committed_ids():  # a snapshot committed: the job runs
        assert time.monotonic() < deadline and not job.status.is_terminal
        time.sleep(0.02)
    job.suspend(timeout=30)
    assert job.status is JobStatus.SUSPENDED
    job.resume()
    assert job.status is JobStatus.RUNNING
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)


class FinalHoldingStore(DirectorySnapshotStore):
    """Holds the write of the job's final snapshot (every processor completed) until
    ``go`` is set; ``holding`` says it is being held."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.holding = threading.Event()
        self.go = threading.Event()

    def commit(self, manifest: Any, chunk_bytes: int | None = None) -> None:
        if all(len(vm.completed) == vm.total_parallelism for vm in manifest.vertices.values()):
            self.holding.set()
            self.go.wait(60)
        super().commit(manifest, chunk_bytes)


def test_suspend_of_a_job_whose_sources_ended_first_says_it_completed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sources' end won the race with the terminal snapshot: every processor had
    completed and the final snapshot was being written (the job still RUNNING) when
    suspend() asked for the terminal one. On 11205dd suspend() returned as if the job
    were suspended, its status COMPLETED, and resume() then raised."""
    n = 300
    store = FinalHoldingStore(str(tmp_path / "store"))
    engine = ss.local()
    cfg = JobConfig(name="ends-first", processing_guarantee=EO, snapshot_store=store)
    job = engine.new_job(running_sum_dag(n, rate=1e9), cfg)
    try:
        assert store.holding.wait(60), "the final snapshot was never written"
        assert job.status is JobStatus.RUNNING
        coordinator = job._execution.coordinator  # type: ignore[union-attr]
        request = coordinator.request

        def request_then_release(terminal: bool = False) -> int | None:
            try:
                return request(terminal)  # the terminal snapshot is asked for too late
            finally:
                store.go.set()  # the final snapshot commits: the job completes

        monkeypatch.setattr(coordinator, "request", request_then_release)
        with pytest.raises(RuntimeError) as ei:
            job.suspend(60)
    finally:
        store.go.set()
    message = (
        "job 'ends-first' completed before it could be suspended (its sources ended "
        "first): there is nothing to resume"
    )
    assert type(ei.value) is ss.JobCompletedError and str(ei.value) == message
    assert job.status is JobStatus.COMPLETED
    job.join(60)
    assert Counter(engine.get_list("out")) == expected_running_sums(n)
    # the same error once the job is known to have completed, for restart() too
    with pytest.raises(ss.JobCompletedError, match="completed before it could be suspended"):
        job.suspend()
    with pytest.raises(ss.JobCompletedError, match="completed before it could be suspended"):
        job.restart()
