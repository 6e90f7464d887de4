"""A cooperative processor that blocks: a warning names it, and ``cancel()`` still ends
the job (``join()`` returns) although Python cannot interrupt the stuck call."""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobStatus, sinks, sources
from slipstream import processors as P

EVENTS: dict[str, tuple[threading.Event, threading.Event]] = {}


def events(name: str) -> tuple[threading.Event, threading.Event]:
    """(entered, release) of the test ``name`` (suppliers must be picklable: no events)."""
    return EVENTS.setdefault(name, (threading.Event(), threading.Event()))


class Blocker(ss.AbstractProcessor):
    """Blocks in ``process()`` on its first item until the test releases it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def init_processor(self, context: ss.Context) -> None:
        self.entered, self.release = events(self.name)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.entered.set()
        self.release.wait()
        return self.try_emit(item)



def blocking_dag(name: str) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(100))).local_parallelism(1)
    stuck = dag.new_vertex("stuck", functools.partial(Blocker, name)).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, stuck)).edge(Edge.between(stuck, sink))
    return dag


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_blocking_cooperative_call_is_reported_and_cancel_still_ends_the_job(caplog: Any) -> None:
    entered, release = events("cancel")
    engine = ss.local(slow_call_ms=50, stop_grace_ms=200)
    try:
        with caplog.at_level(logging.WARNING, logger="slipstream"):
            job = engine.new_job(blocking_dag("cancel"))
            assert entered.wait(60)
            wait_for(lambda: "cooperative call to process()" in caplog.text, "the warning")
            warning = next(r.getMessage() for r in caplog.records if "cooperative call" in r.getMessage())
            assert "vertex 'stuck', processor 0 (Blocker)" in warning
            job.cancel()
            with pytest.raises(ss.JobCancelledError):
                job.join(60)
        assert job.status is JobStatus.CANCELLED
        assert "did not return" in caplog.text and "'stuck'" in caplog.text
    finally:
        release.set()  # let the stuck thread go


def boom_once_stuck(x: int) -> int:
    if events("failure")[0].is_set():
        raise ValueError("boom")
    return x


def test_a_failure_elsewhere_also_ends_a_job_with_a_stuck_processor() -> None:
    entered, release = events("failure")

    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(100))).local_parallelism(1)
    stuck = dag.new_vertex("stuck", functools.partial(Blocker, "failure")).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.noop()).local_parallelism(1)
    src2 = dag.new_vertex("src2", sources.generator(lambda i: i, 1000.0)).local_parallelism(1)
    fail = dag.new_vertex("fail", P.map(boom_once_stuck)).local_parallelism(1)
    sink2 = dag.new_vertex("sink2", sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(src, stuck)).edge(Edge.between(stuck, sink))
    dag.edge(Edge.between(src2, fail)).edge(Edge.between(fail, sink2))
    # two cooperative threads: the failing chain keeps running while one worker is stuck.
    # Tasklets go to the threads in turn, so the chain's must stay two (fail, sink2): fused
    # (JobConfig.fuse_vertices) they are one tasklet, on the stuck processor's thread
    engine = ss.local(cooperative_threads=2, slow_call_ms=50, stop_grace_ms=200)
    try:
        job = engine.new_job(dag, ss.JobConfig(fuse_vertices=False))
        with pytest.raises(ss.JobFailedError, match="boom"):
            job.join(60)
        assert job.status is JobStatus.FAILED
    finally:
        release.set()


def block_once(name: str, x: int) -> int:
    """Blocks on its first item until the test releases it (a slow remote call)."""
    entered, release = events(name)
    if not entered.is_set():
        entered.set()
        release.wait(60)
    return x


def slow_call_warning(name: str, job: Any, caplog: Any) -> str:
    entered, release = events(name)
    try:
        with caplog.at_level(logging.WARNING, logger="slipstream"):
            engine = ss.local(slow_call_ms=50)
            running = engine.new_job(job)
            assert entered.wait(60)
            wait_for(lambda: "cooperative call to process()" in caplog.text, "the warning")
    finally:
        release.set()
    running.join(60)
    return next(r.getMessage() for r in caplog.records if "cooperative call" in r.getMessage())


SLOW = "cooperative processors must return within about a millisecond. "


def test_the_advice_fits_a_pipeline_stage(caplog: Any) -> None:
    """Issue 21, item 3: on main a Pipeline user was told to override is_cooperative()."""
    p = ss.Pipeline()
    p.read_from(sources.items(range(3))).map(functools.partial(block_once, "pipeline")).write_to(
        sinks.noop()
    )
    warning = slow_call_warning("pipeline", p, caplog)
    assert warning.endswith(
        f"{SLOW}It runs the Pipeline stage map 'map': move a blocking call (I/O, a remote "
        "service, a model) into stage.map_using_service(P.service_factory(create), fn) (or "
        "filter_/flat_map_using_service), which gets a thread of its own"
    )


def test_the_advice_fits_a_library_processor_of_the_core_api(caplog: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(range(3))).local_parallelism(1)
    m = dag.new_vertex("lookup", P.map(functools.partial(block_once, "core"))).local_parallelism(1)
    dag.edge(Edge.between(src, m)).edge(Edge.between(m, dag.new_vertex("sink", sinks.noop())))
    warning = slow_call_warning("core", dag, caplog)
    assert "vertex 'lookup', processor 0 (MapP)" in warning
    assert warning.endswith(
        f"{SLOW}Move a blocking call (I/O, a remote service, a model) out of its function "
        "into P.map_using_service(P.service_factory(create), fn) (or filter_/"
        "flat_map_using_service, or an _async variant), which gets a thread of its own"
    )


def test_the_advice_fits_a_processor_of_ones_own(caplog: Any) -> None:
    dag = blocking_dag("own")
    events("own")  # Blocker blocks on every item until released
    warning = slow_call_warning("own", dag, caplog)
    assert warning.endswith(
        f"{SLOW}Make it non-cooperative (is_cooperative() -> False) to give it a thread of "
        "its own"
    )


class PoolTasklet:
    """A stand-in tasklet for a ``WorkerPool``: counts its calls; with ``block`` set it
    blocks in its next call until ``release`` is set."""

    cooperative = True
    callback_name = "process"
    processor = None

    def __init__(self, name: str) -> None:
        self.vertex_name, self.index = name, 0
        self.calls = 0
        self.block = False
        self.entered, self.release = threading.Event(), threading.Event()

    def call(self) -> int:
        from slipstream.execution.tasklet import NO_PROGRESS

        self.calls += 1
        if self.block:
            self.entered.set()
            self.release.wait()
        return NO_PROGRESS


def test_a_pool_that_gave_up_on_a_stuck_worker_calls_no_other_tasklet_of_it() -> None:
    """Once the pool gave up on a worker stuck in a call (``stop_grace_s`` after
    ``stop()``) and reported itself finished, the execution commits what the other
    tasklets prepared and closes them on its own thread (``run_committed_closures``,
    ``close_tasklets``: all but ``abandoned``). So when the stuck call returns, its
    worker must call no other tasklet: it would run a sink's commit beside the
    execution's (a batch published twice) or a processor already closed."""
    from slipstream.engine.workers import WorkerPool

    stuck, sink = PoolTasklet("stuck"), PoolTasklet("sink")
    finished = threading.Event()
    pool = WorkerPool([stuck, sink], 1, print, finished.set, stop_grace_s=0.05)
    pool.start()
    try:
        stuck.block = True
        assert stuck.entered.wait(60)
        pool.stop()
        assert finished.wait(60)
        assert pool.abandoned == [stuck]
        calls = sink.calls
    finally:
        stuck.release.set()
    pool.join(60)
    assert sink.calls == calls
