"""A snapshot store with a few committed snapshots, from a job run for it (the tests of
``ss.state`` reading and querying a store, and of the ``slipstream state`` command)."""

from __future__ import annotations

import time

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee
from slipstream.core.errors import JobCancelledError
from slipstream.state.store import DirectorySnapshotStore


def run_until_snapshots(
    pipeline: ss.Pipeline, name: str, directory: str, snapshots: int = 4
) -> None:
    """Run ``pipeline`` (its source endless) exactly once as job ``name``, a snapshot every
    20 ms into the store at ``directory`` (keeping 50), until ``snapshots`` committed; then
    cancel it."""
    engine = ss.local()
    try:
        job = engine.new_job(
            pipeline,
            JobConfig(
                name=name,
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_interval_ms=20,
                snapshot_store=DirectorySnapshotStore(directory, keep=50),
            ),
        )
        deadline = time.monotonic() + 120
        while int(job.metrics["__job__"]["snapshots"]) < snapshots:
            assert not job.status.is_terminal and time.monotonic() < deadline
            time.sleep(0.005)
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
    finally:
        engine.shutdown()
