"""The progress watchdog (issue 20): a job whose snapshots stop committing makes no
durable progress, whatever its sources still read. A snapshot not committed
``stall_warning_s`` after it was requested is reported, naming the processors that hold
it back with their state; after ``stall_timeout_s`` the job fails. Before, such a job
stayed RUNNING with ``snapshot_failures=0`` and nothing said anywhere.

The stall here is a sink whose commit never returns (a commit call blocked on a server
that went away): the test waits for the events (the warning, the failure), never for
a span of time."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sources
from slipstream.core.processor import AbstractProcessor

RELEASE = threading.Event()
COMMITTING = threading.Event()


class StuckCommitSink(AbstractProcessor):
    """Takes items; its first commit blocks until ``RELEASE`` is set."""

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Any) -> None:
        inbox.clear()

    def snapshot_commit_finish(self, success: bool) -> bool:
        COMMITTING.set()
        RELEASE.wait(120)
        return True


def _job(tmp_path: Any, **cfg: Any) -> Any:
    dag = DAG()
    src = dag.new_vertex("src", sources.generator(lambda i: i, 1000.0)).local_parallelism(1)
    sink = dag.new_vertex("stuck", StuckCommitSink).local_parallelism(1)
    dag.edge(Edge.between(src, sink))
    # a failed job waits stop_grace_ms for its sink stuck in the commit before it gives
    # the sink's thread up (the default 5 s was most of the timeout test's time)
    return ss.local(stop_grace_ms=200).new_job(
        dag,
        JobConfig(
            name="stalled",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_store=str(tmp_path / "store"),
            snapshot_interval_ms=50,
            **cfg,
        ),
    )


class _Seen(logging.Handler):
    def __init__(self, word: str) -> None:
        super().__init__(logging.WARNING)
        self.word = word
        self.event = threading.Event()
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())
        if self.word in record.getMessage():
            self.event.set()


@pytest.fixture
def seen() -> Any:
    handlers: list[_Seen] = []

    def make(word: str) -> _Seen:
        h = _Seen(word)
        logging.getLogger("slipstream").addHandler(h)
        handlers.append(h)
        return h

    yield make
    for h in handlers:
        logging.getLogger("slipstream").removeHandler(h)
    RELEASE.set()


def test_a_stalled_snapshot_is_reported_naming_the_processor_and_its_state(
    tmp_path: Any, seen: Any
) -> None:
    RELEASE.clear()
    COMMITTING.clear()
    warned = seen("has not committed")
    job = _job(tmp_path, stall_warning_s=0.5, stall_timeout_s=None)
    try:
        assert COMMITTING.wait(60)
        assert warned.event.wait(60), warned.texts
        text = next(t for t in warned.texts if "has not committed" in t)
        assert "job stalled: snapshot " in text
        assert "it waits for processors that have not saved it: stuck#0 (COMMIT_FINISH)" in text
        assert "stall_timeout_s=None: the job keeps waiting" in text
        assert job.status is JobStatus.RUNNING
        assert job.metrics["__job__"]["snapshot_stalled_s"] >= 0
        assert "stuck#0 (COMMIT_FINISH)" in (job.watch().get("error") or "")
        RELEASE.set()  # the commit returns: snapshots commit again, the report clears
        n = job.metrics["__job__"]["snapshots"]
        deadline_ok = job_wait(lambda: job.metrics["__job__"]["snapshots"] >= n + 2)
        assert deadline_ok
        assert job_wait(lambda: job.watch().get("error") is None)
    finally:
        RELEASE.set()
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(60)


def test_a_snapshot_stalled_past_the_timeout_fails_the_job(tmp_path: Any, seen: Any) -> None:
    RELEASE.clear()
    COMMITTING.clear()
    job = _job(tmp_path, stall_warning_s=0.2, stall_timeout_s=0.5, auto_restart=False)
    with pytest.raises(ss.JobFailedError) as err:
        job.join(120)
    RELEASE.set()
    text = str(err.value)
    assert "SnapshotStalledError" in text, text
    assert "stuck#0 (COMMIT_FINISH)" in text and "JobConfig(stall_timeout_s=0.5)" in text, text
    assert isinstance(err.value.__cause__, ss.SnapshotStalledError)
    assert job.status is JobStatus.FAILED


def test_watchdog_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="stall_warning_s must be > 0"):
        JobConfig(stall_warning_s=0)
    with pytest.raises(ValueError, match="stall_timeout_s must be None or >= stall_warning_s"):
        JobConfig(stall_warning_s=10, stall_timeout_s=5)


def job_wait(cond: Any, timeout: float = 60.0) -> bool:
    event = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if cond():
            return True
        event.wait(0.02)
    return bool(cond())
