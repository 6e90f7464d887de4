"""Job lifecycle on the embedded engine: completion, failure, cancellation, metrics."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import time

import pytest
from engine_test_procs import BlockingMap, Boom, CloseRecorder, Collect, Infinite, ListSource, Sink

import slipstream as ss
from slipstream import DAG, Edge, JobStatus


def test_job_completes_and_reports_metrics() -> None:
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, list(range(1000))))
    c = dag.new_vertex("sink", functools.partial(Sink, "out"))
    dag.edge(Edge.between(s, c))
    engine = ss.local()
    job = engine.new_job(dag, ss.JobConfig(name="m"))
    job.join(10)
    assert job.status is JobStatus.COMPLETED
    assert sorted(engine.get_list("out")) == list(range(1000))
    assert job.metrics["src"]["items_out"] == 1000
    assert job.metrics["sink"]["items_in"] == 1000
    assert job.name == "m" and isinstance(job.id, int)


def test_processor_exception_fails_job_with_vertex_and_index() -> None:
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, list(range(100)))).local_parallelism(1)
    b = dag.new_vertex("mapper", functools.partial(Boom, 10)).local_parallelism(1)
    c = dag.new_vertex("sink", functools.partial(Sink, "out"))
    dag.edge(Edge.between(s, b)).edge(Edge.between(b, c))
    job = ss.local().new_job(dag)
    with pytest.raises(ss.JobFailedError) as ei:
        job.join(10)
    err = ei.value
    assert err.vertex == "mapper" and err.processor_index == 0
    assert isinstance(err.__cause__, ValueError)
    assert "mapper" in str(err) and "boom on 10" in str(err)
    assert job.status is JobStatus.FAILED


def test_failure_stops_other_tasklets_and_closes_processors() -> None:
    CloseRecorder.closed.clear()
    dag = DAG()
    s = dag.new_vertex("src", Infinite).local_parallelism(2)
    p = dag.new_vertex("pass", functools.partial(CloseRecorder, "pass")).local_parallelism(2)
    b = dag.new_vertex("boom", functools.partial(Boom, 5000)).local_parallelism(1)
    dag.edge(Edge.between(s, p)).edge(Edge.between(p, b))
    job = ss.local().new_job(dag)
    with pytest.raises(ss.JobFailedError):
        job.join(10)
    assert CloseRecorder.closed.count("pass") == 2


def test_failure_in_init_fails_job() -> None:
    class BadInit(ss.AbstractProcessor):
        def init_processor(self, context: ss.Context) -> None:
            raise RuntimeError("cannot init")

    dag = DAG()
    dag.new_vertex("bad", BadInit)
    job = ss.local().new_job(dag)
    with pytest.raises(ss.JobFailedError, match="cannot init") as ei:
        job.join(10)
    assert ei.value.vertex == "bad"


def test_cancel_stops_infinite_job_quickly() -> None:
    dag = DAG()
    s = dag.new_vertex("src", Infinite)
    c = dag.new_vertex("sink", functools.partial(Sink, "inf"))
    dag.edge(Edge.between(s, c))
    engine = ss.local()
    job = engine.new_job(dag)
    time.sleep(0.2)
    assert job.status is JobStatus.RUNNING
    t0 = time.monotonic()
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(5)
    assert time.monotonic() - t0 < 1.0
    assert job.status is JobStatus.CANCELLED


def test_join_timeout_raises_timeout_error() -> None:
    dag = DAG()
    s = dag.new_vertex("src", Infinite)
    c = dag.new_vertex("sink", functools.partial(Sink, "inf2"))
    dag.edge(Edge.between(s, c))
    job = ss.local().new_job(dag)
    with pytest.raises(TimeoutError):
        job.join(0.1)
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(5)


def test_non_cooperative_processor_gets_blocking_outbox() -> None:
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, list(range(20000))))
    m = dag.new_vertex("blocking", BlockingMap).local_parallelism(2)
    c = dag.new_vertex("sink", functools.partial(Sink, "out")).local_parallelism(1)
    dag.edge(Edge.between(s, m)).edge(Edge.between(m, c).queue_size(16))
    engine = ss.local()
    engine.new_job(dag).join(20)
    assert sorted(engine.get_list("out")) == [x * 10 for x in range(20000)]


def test_non_cooperative_processor_cancel_unblocks() -> None:
    class SlowSink(ss.AbstractProcessor):
        def try_process_item(self, ordinal, item):
            time.sleep(0.01)
            return True

    dag = DAG()
    s = dag.new_vertex("src", Infinite).local_parallelism(1)
    m = dag.new_vertex("blocking", BlockingMap).local_parallelism(1)
    c = dag.new_vertex("sink", SlowSink).local_parallelism(1)
    dag.edge(Edge.between(s, m)).edge(Edge.between(m, c).queue_size(4))
    job = ss.local().new_job(dag)
    time.sleep(0.2)
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(3)


def test_engine_threads_do_not_keep_process_alive() -> None:
    script = textwrap.dedent(
        """
        import slipstream as ss
        from slipstream import DAG, Edge
        class Inf(ss.AbstractProcessor):
            def complete(self):
                while self.try_emit(1):
                    pass
                return False
        class Drop(ss.AbstractProcessor):
            def process(self, o, inbox):
                inbox.clear()
        dag = DAG()
        dag.edge(Edge.between(dag.new_vertex("s", Inf), dag.new_vertex("d", Drop)))
        ss.local().new_job(dag)  # never joined, never cancelled
        print("main done")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "main done" in r.stdout


def test_sink_collecting_watermarks_sees_coalesced_minimum() -> None:
    # two source processors with different watermark progress: the sink sees the minimum
    data = list(range(0, 100))
    dag = DAG()
    s = dag.new_vertex(
        "src", functools.partial(ListSource, data, lambda x: x * 10 + 1)
    ).local_parallelism(2)
    c = dag.new_vertex("sink", functools.partial(Collect, "wm", True)).local_parallelism(1)
    dag.edge(Edge.between(s, c))
    engine = ss.local()
    engine.new_job(dag).join(10)
    wms = [v for (_g, kind, v) in engine.get_list("wm") if kind == "wm"]
    assert wms == sorted(wms) and len(set(wms)) == len(wms)
    # processor 0 emits wm 1, 21, 41, ...; processor 1 emits 11, 31, ...: min is always the lower
    assert set(wms) <= {x * 10 + 1 for x in data}
    assert wms[-1] == 991  # when both finished... the top observed is emitted once all are done


def test_gc_settings_are_restored_when_jobs_end() -> None:
    import gc

    before = gc.get_threshold()
    dag = DAG()
    s = dag.new_vertex("src", Infinite)
    c = dag.new_vertex("sink", functools.partial(Sink, "gc"))
    dag.edge(Edge.between(s, c))
    job = ss.local().new_job(dag)
    time.sleep(0.05)
    assert gc.get_threshold() != before and gc.get_freeze_count() > 0  # tuned while running
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(5)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    ss.local(tune_gc=False).new_job(dag).cancel()
    assert gc.get_threshold() == before
