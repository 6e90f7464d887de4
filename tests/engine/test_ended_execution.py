"""An ended execution lets go of its processors and their state (engine/ended.py): they
are freed by reference counting at the job's end, not at a full collection of the
cyclic garbage collector, while the job's handle still reads its figures."""

from __future__ import annotations

import gc
import traceback
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobStatus, sinks, sources

EO = ss.ProcessingGuarantee.EXACTLY_ONCE


class Marker:
    """An object kept in a key's state."""


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _job(markers: list[weakref.ref[Marker]], fail_on: int | None) -> ss.Pipeline:
    def create() -> list[Any]:
        m = Marker()
        markers.append(weakref.ref(m))
        return [m, 0]

    def add(state: list[Any], key: int, item: int) -> int | None:
        state[1] += item
        if item == fail_on:
            raise ValueError(f"bad item {item}")
        return None

    p = ss.Pipeline()
    (
        p.read_from(sources.items(range(1000)))
        .group_by(lambda x: x % 50)
        .map_stateful(create, add)
        .set_name("sum")
        .write_to(sinks.list_sink("out"))
    )
    return p


@pytest.mark.parametrize(
    "guarantee, fail_on",
    [(None, None), (EO, None), (None, 990)],
    ids=["completed", "completed-exactly-once", "failed"],
)
def test_the_state_of_an_ended_job_is_freed_by_reference_counting(
    no_gc: None, tmp_path: Any, guarantee: ss.ProcessingGuarantee | None, fail_on: int | None
) -> None:
    """With the collector off, a job's keyed state is gone once it ended and its worker
    threads exited, the engine and the job handle still held, and the engine and the job
    once dropped: on main the engine kept the state (engine.jobs), and once dropped it
    stayed in reference cycles (the engine and its jobs, the processors and their
    contexts, the pool's and the coordinator's callbacks, and for a failed job the
    error's traceback with the worker's frames) until gc.collect()."""
    markers: list[weakref.ref[Marker]] = []
    engine = ss.local(work_dir=str(tmp_path))
    config = ss.JobConfig(name="ended", auto_restart=False)
    if guarantee is not None:
        config = ss.JobConfig(
            name="ended", processing_guarantee=guarantee, snapshot_store=str(tmp_path / "s")
        )
    job = engine.new_job(_job(markers, fail_on), config)
    error: ss.JobFailedError | None = None
    try:
        job.join(60)
    except ss.JobFailedError as e:
        error = e
    pool = job._execution.pool  # type: ignore[union-attr]
    assert pool is not None
    pool.join(60)  # the worker threads exited
    assert len(markers) == 50
    alive = [m for m in markers if m() is not None]
    assert alive == []
    # what the handle reads after the end is still there
    items_in = job.metrics["sum"]["items_in"]
    assert items_in == 1000 if fail_on is None else fail_on < items_in <= 1000
    assert job.watch()["parallelism"]["sum"] == 1
    if fail_on is None:
        assert job.status is JobStatus.COMPLETED
    else:
        assert job.status is JobStatus.FAILED and error is not None
        assert error.vertex == "sum" and error.processor_index == 0
        # the user's frame still shows in the traceback (its locals are gone)
        text = "".join(traceback.format_exception(error.__cause__))
        assert "in add" in text and "ValueError: bad item 990" in text
    # and once the caller drops the engine and the job, they go too (with the lists
    # the sinks filled), by reference counting
    gone = weakref.ref(engine), weakref.ref(job), weakref.ref(engine.services)
    del engine, job, error, pool
    assert [r() for r in gone] == [None, None, None]
