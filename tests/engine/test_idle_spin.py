"""``JobConfig(idle_spin_ms=...)``: for that long after its last progress an idle worker
polls its tasklets again at once instead of sleeping, then backs off as without it
(engine/workers.py). Its latency and CPU figures are bench/processes.py's latency rows
(docs/performance.md); here: the setting is checked, reaches the workers of the job's
process and of every member process, leaves the output alone, and a worker idle past the
window is back on its normal back-off. Tests wait for events (counters), never for time;
``GUARD_S`` only bounds a test that hangs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_idle_pause import Bursts

import slipstream as ss
from process_support import functions_by_value
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream.engine import workers
from slipstream.engine.workers import WorkerPool

GUARD_S = 120


@pytest.fixture(scope="module", autouse=True)
def by_value() -> Iterator[None]:
    """This module's functions travel to member processes by value."""
    with functions_by_value(sys.modules[__name__]):
        yield


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, "guard: the condition never held"
        time.sleep(0.001)


@pytest.mark.parametrize("bad", [-1, -0.5, "5", True, None, float("nan"), float("inf")])
def test_idle_spin_ms_must_be_a_finite_number_of_milliseconds(bad: Any) -> None:
    with pytest.raises(ValueError) as e:
        JobConfig(idle_spin_ms=bad)
    assert str(e.value) == (
        "JobConfig: idle_spin_ms must be a finite number of milliseconds >= 0 (how long an "
        f"idle worker keeps polling before it sleeps; 0 = never), got {bad!r}"
    )


def test_idle_spin_ms_is_off_by_default() -> None:
    assert JobConfig().idle_spin_ms == 0
    assert JobConfig(idle_spin_ms=2).idle_spin_ms == 2
    assert JobConfig(idle_spin_ms=0.25).idle_spin_ms == 0.25


def test_a_default_job_shows_no_spin_figures() -> None:
    """Without the setting ``__job__`` keeps the keys the Spark engine's jobs give (the
    differential tests compare the two engines' metrics whole)."""
    dag = DAG()
    src = dag.new_vertex("source", sources.generator(seq, None, max_items=10))
    out = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, out))
    job = ss.local().new_job(dag)
    job.join(timeout=GUARD_S)
    assert not {"idle_spin_passes", "idle_pauses"} & set(job.metrics["__job__"])


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_an_idle_worker_spins_for_the_window_then_backs_off_from_the_first_pause(
    spin_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run of idle passes starts with the spin window (no sleep), then the pauses
    follow the normal schedule from its first, shortest one (``idle_pause(1, ...)``);
    a worker idle past the window never spins again until it makes progress."""
    firsts: list[int] = []  # the pass count each run of pauses started with
    real = workers.idle_pause

    def noted(idle_passes: int, idle_s: float) -> float:
        if not firsts or idle_passes <= last[0]:
            firsts.append(idle_passes)
        last[0] = idle_passes
        return real(idle_passes, idle_s)

    last = [0]
    monkeypatch.setattr(workers, "idle_pause", noted)
    t = Bursts()
    t.work = 3
    pool = WorkerPool([t], 1, print, print, idle_spin_s=spin_s)
    pool.start()
    try:
        wait_for(lambda: pool.idle_counts()[1] >= 3)
        spins, pauses = pool.idle_counts()
        assert (spins > 0) == (spin_s > 0)
        wait_for(lambda: pool.idle_counts()[1] >= pauses + 3)  # still idle: pauses only
        assert pool.idle_counts()[0] == spins
        t.work = 2  # progress: a new run of idle passes, a new window
        wait_for(lambda: pool.idle_counts()[1] >= pauses + 6 and len(firsts) == 2)
        assert (pool.idle_counts()[0] > spins) == (spin_s > 0)
        assert firsts == [1, 1]
    finally:
        pool.stop()
        pool.join(GUARD_S)


def seq(n: int) -> int:
    return n


def trickle(n: int) -> DAG:
    """``n`` items at 2,000 a second through a distributed edge into a list."""
    dag = DAG()
    src = dag.new_vertex("source", sources.generator(seq, 2000, max_items=n))
    out = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, out).distributed().partitioned(seq))
    return dag


@pytest.mark.timeout(GUARD_S)
def test_the_setting_reaches_every_members_workers_and_leaves_the_output_alone() -> None:
    two = ss.local(processes=2)
    job = two.new_job(trickle(100), JobConfig(name="spin", idle_spin_ms=2))
    job.join(timeout=GUARD_S)
    assert sorted(two.get_list("out")) == list(range(100))
    # each member process's workers polled (its row comes with its last report): a
    # member is idle between its generator's items and while it waits on the other one
    rows = job.watch()["members"]
    assert [r["idle_spin_passes"] > 0 for r in rows] == [True, True]
    figures = job.metrics["__job__"]
    assert figures["idle_spin_passes"] == sum(r["idle_spin_passes"] for r in rows)


@pytest.mark.timeout(GUARD_S)
def test_an_idle_job_in_this_process_spins_then_backs_off() -> None:
    """The job's own workers (processes=1) take the setting; a job with nothing to do
    goes back to its normal back-off (every run of pauses follows a spin window)."""
    dag = DAG()
    src = dag.new_vertex("source", sources.generator(seq, 10))
    out = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, out))
    job = ss.local().new_job(dag, JobConfig(name="idle-spin", idle_spin_ms=1))
    try:
        wait_for(lambda: job.metrics["__job__"]["idle_pauses"] > 0)
        assert job.metrics["__job__"]["idle_spin_passes"] > 0
    finally:
        job.cancel()
