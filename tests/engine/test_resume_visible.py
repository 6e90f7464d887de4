"""A resumed job says so (issue 21, item 7): one WARNING naming the snapshot and the store,
and ``job.metrics["__job__"]["resumed_from_snapshot"]``. Before, a resume outside the CLI
was an INFO line only, and the metrics said ``restarts: 0``."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee
from slipstream.state.store import DirectorySnapshotStore

N = 4000


def config(store: str, **kw: Any) -> JobConfig:
    return JobConfig(
        name="svc",
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_store=store,
        snapshot_interval_ms=10,
        **kw,
    )


def resume_lines(caplog: Any) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "resuming" in r.getMessage()
    ]


def test_a_resume_is_a_warning_and_a_metric(tmp_path: Any, caplog: Any) -> None:
    store = str(tmp_path / "store")
    engine = ss.local(cooperative_threads=2)
    first = engine.new_job(stp.running_sum_dag(N, rate=2000.0), config(store))
    stp.wait_for(lambda: first.metrics["__job__"]["snapshots"] >= 2, what="snapshots")
    first.cancel()
    with pytest.raises(ss.JobCancelledError):
        first.join(30)
    assert first.metrics["__job__"]["resumed_from_snapshot"] == 0
    published = list(engine.get_list("out"))
    latest = DirectorySnapshotStore(store).committed_ids()[-1]

    with caplog.at_level("WARNING"):
        second = engine.new_job(stp.running_sum_dag(N, rate=1e9), config(store, resume=True))
    second.join(60)
    assert resume_lines(caplog) == [
        f"job 'svc': resuming from snapshot {latest} in {store} (JobConfig(resume=True))"
    ]
    assert second.metrics["__job__"]["resumed_from_snapshot"] == latest
    assert Counter(engine.get_list("out")) == stp.expected_running_sums(N)
    assert len(published) < N

    # restore_from= names where the snapshot came from, too
    caplog.clear()
    other = str(tmp_path / "other")
    with caplog.at_level("WARNING"):
        third = ss.local().new_job(
            stp.running_sum_dag(N, rate=1e9), config(other), restore_from=store
        )
    third.join(60)
    final = DirectorySnapshotStore(store).committed_ids()[-1]
    assert resume_lines(caplog) == [
        f"job 'svc': resuming from snapshot {final} in {os.path.abspath(store)} (restore_from=)"
    ]
    assert third.metrics["__job__"]["resumed_from_snapshot"] == final


def test_a_fresh_job_reports_no_resume(caplog: Any) -> None:
    engine = ss.local()
    with caplog.at_level("WARNING"):
        job = engine.new_job(stp.running_sum_dag(100, rate=1e9))
    job.join(30)
    assert resume_lines(caplog) == []
    assert job.metrics["__job__"]["resumed_from_snapshot"] == 0


def test_restore_from_another_jobs_store_names_that_job(tmp_path: Any, caplog: Any) -> None:
    """restore_from= may start a job from another job's state (a documented use: a new
    job from an exported snapshot), but never silently: the resume line names the job
    that wrote the snapshot (issue 20, item 4: 'payments' continued 'orders' with one
    INFO line)."""
    orders = str(tmp_path / "orders")
    engine = ss.local()
    engine.new_job(
        stp.running_sum_dag(200, rate=1e9),
        JobConfig(
            name="orders",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_store=orders,
        ),
    ).join(60)
    final = DirectorySnapshotStore(orders).committed_ids()[-1]
    with caplog.at_level("WARNING"):
        ss.local().new_job(
            stp.running_sum_dag(200, rate=1e9),
            JobConfig(
                name="payments",
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_store=str(tmp_path / "payments"),
            ),
            restore_from=orders,
        ).join(60)
    assert resume_lines(caplog) == [
        f"job 'payments': resuming from snapshot {final} in {os.path.abspath(orders)} "
        "(restore_from=) (written by job 'orders')"
    ]
