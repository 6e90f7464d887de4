"""A processor's exception is shown once: the job's error chains it with its own
traceback (which starts at the processor's code, without the engine's worker loop and
tasklet), and adds a traceback of its own only when the cause carries none (one that
came from a Spark executor as text)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.core.errors import JobFailedError, trim_driver_frames

THIS = Path(__file__).name


def invert(x: int) -> float:
    return 1 / x


def failing_job() -> JobFailedError:
    dag = DAG()
    src = dag.new_vertex("numbers", sources.items([1, 2, 0, 4])).local_parallelism(1)
    m = dag.new_vertex("invert", P.map(invert)).local_parallelism(1)
    out = dag.new_vertex("out", sinks.noop())
    dag.edge(Edge.between(src, m)).edge(Edge.between(m, out))
    with pytest.raises(JobFailedError) as info:
        ss.local().new_job(dag, ss.JobConfig(name="boom")).join(60)
    return info.value


def frames(tb: str) -> list[str]:
    return [
        line.split('"')[1].rsplit("/", 1)[-1] + ":" + line.rsplit(" ", 1)[-1]
        for line in tb.splitlines()
        if line.startswith('  File "')
    ]


def test_the_processor_traceback_is_shown_once_from_the_processor_on() -> None:
    err = failing_job()
    assert "--- processor traceback ---" not in str(err)
    shown = "".join(traceback.format_exception(err))
    # the chained cause with its traceback, then join()'s own: nothing twice
    assert shown.count("Traceback (most recent call last)") == 2
    assert shown.count("in _run") == 0 and shown.count("in _process_inbox") == 0
    tb = err.processor_traceback()
    assert tb is not None and tb.startswith("Traceback (most recent call last):")
    # the map runs fused into "out" (execution/fusion.py): over the whole inbox at once
    assert frames(tb) == ["basic.py:process_all", f"{THIS}:invert"]
    assert tb.endswith("ZeroDivisionError: division by zero\n")


def test_a_traceback_from_elsewhere_is_added_when_the_cause_has_none() -> None:
    cause = ValueError("bad")  # as decoded from a Spark executor's text: no traceback
    err = JobFailedError("job 'j' failed", cause=cause, remote_traceback="Traceback ...\n")
    assert str(err) == "job 'j' failed\n--- processor traceback ---\nTraceback ...\n"
    assert err.processor_traceback() == "Traceback ...\n"
    assert JobFailedError("job 'j' failed").processor_traceback() is None


def test_driver_frames_alone_are_kept() -> None:
    try:
        raise RuntimeError("the engine's own error")
    except RuntimeError as e:
        before = frames("".join(traceback.format_exception(e)))
        assert frames("".join(traceback.format_exception(trim_driver_frames(e)))) == before
