"""The heartbeat of member processes (``ss.local(processes=N)``): a member that stops
answering without dying (SIGSTOP; a call that holds the GIL) is killed and fails the job
naming it, and the call it was last seen in when its last answer named one; with a
processing guarantee the job restarts from its last snapshot instead.

The tests wait for events (output arriving, the coordinator having heard of a long
call, the job ending), never for time; ``heartbeat_timeout_ms`` is generous for a loaded
machine and ``GUARD_S`` only bounds a test that hangs.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import slipstream as ss
from kill_support import kill_point
from process_support import functions_by_value
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import summing
from slipstream.core.errors import JobFailedError
from slipstream.engine.heartbeat import HeartbeatMonitor, silence_text

GUARD_S = 120


@pytest.fixture(autouse=True, scope="module")
def _by_value() -> Iterator[None]:
    """This module's functions travel to the members by value, so a member does not
    import it (and pytest with it) at every job."""
    with functions_by_value(sys.modules[__name__]):
        yield
TIMEOUT_MS = 3000


def identity(x: Any) -> Any:
    return x


def wait_for(cond: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + GUARD_S / 2
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


class StallOnMember1(ss.AbstractProcessor):
    """Passes items on; on member 1 it stalls in its first call (sleeping: the
    interpreter runs the member's other threads meanwhile)."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if self.context.member_index == 1:
            time.sleep(3600)
        return self.try_emit(item)


def stop_and_join(job: Any, pid: int) -> None:
    """Stop member process ``pid`` (SIGSTOP) and wait for ``job`` to end; the member is
    let go on (SIGCONT) afterwards in case the job ended without killing it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        job.join(timeout=GUARD_S)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def stop_and_fail(job: Any, pid: int) -> JobFailedError:
    with pytest.raises(JobFailedError) as e:
        stop_and_join(job, pid)
    assert job.status is ss.JobStatus.FAILED
    assert all(p.exitcode is not None for p in job._execution._procs)
    return e.value


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_a_silent_member_is_named_with_the_call_it_was_last_seen_in() -> None:
    """Member 1's processor stalls; its member answers heartbeats on (naming the long
    call) until it is stopped: then the job fails naming the vertex and processor."""
    engine = ss.local(processes=2, heartbeat_timeout_ms=TIMEOUT_MS, slow_call_ms=100)
    dag = DAG()
    src = dag.new_vertex("source", sources.items(list(range(100)))).local_parallelism(1)
    stall = dag.new_vertex("stall", StallOnMember1).local_parallelism(1)
    out = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, stall).distributed())
    dag.edge(Edge.between(stall, out))
    job = engine.new_job(dag, JobConfig(name="stalled"))
    ex = job._execution
    wait_for(lambda: ex.heartbeat.calls.get(1), "a heartbeat naming the stalled call")
    pid = ex._procs[1].pid
    error = stop_and_fail(job, pid)
    assert re.fullmatch(
        rf"job 'stalled' failed: vertex 'stall', processor 1, member 1: "
        rf"MemberUnresponsiveError: member 1 \(pid {pid}\) stopped answering: no heartbeat "
        r"within heartbeat_timeout_ms=3000, so it was killed; when it last answered, "
        r"vertex 'stall', processor 1 had been in a call to process\(\) for \d+\.\d s "
        r"\(a call that holds the GIL stops the whole process\)",
        str(error).split("\n")[0],
    ), str(error)
    assert error.vertex == "stall" and error.processor_index == 1



def tens(x: int) -> int:
    return x % 10


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_a_stopped_member_under_exactly_once_restarts_from_the_last_snapshot(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A member stopped with SIGSTOP is found by the heartbeat and killed; with a
    processing guarantee that is handled as a member's death: the job restarts from its
    last committed snapshot with fresh members (docs/guide.md, "Member processes"), and a
    keyed sum behind a distributed edge and an items sink (two-phase) hold every item
    exactly once. (Without a guarantee the same text fails the job:
    test_a_member_stuck_in_a_call_that_holds_the_gil_is_detected.)"""
    n = 4000
    engine = ss.local(processes=2, heartbeat_timeout_ms=TIMEOUT_MS)
    dag = DAG()
    src = dag.new_vertex("gen", sources.generator(identity, 4000.0, max_items=n))
    src.local_parallelism(1)
    agg = dag.new_vertex("sum", P.aggregate_by_key(tens, summing()))
    sums = dag.new_vertex("sums", sinks.list_sink("sums"))
    items = dag.new_vertex("items", sinks.list_sink("items"))
    dag.edge(Edge.from_(src, 0).to(agg).partitioned(tens).distributed())
    dag.edge(Edge.from_(src, 1).to(items).distributed())
    dag.edge(Edge.between(agg, sums))
    config = JobConfig(
        name="stopped-eo",
        processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=20,
        snapshot_store=str(tmp_path / "store"),
        restart_delay_ms=10,
    )
    job = engine.new_job(dag, config)
    wait_for(kill_point(job, 2, "gen", n), "two committed snapshots")
    assert job.status is ss.JobStatus.RUNNING, "the job ended before the stop"
    pid = job._execution._procs[1].pid
    stop_and_join(job, pid)
    assert job.restarts == 1
    restarts = [r.getMessage() for r in caplog.records if "restart 1 of" in r.getMessage()]
    assert len(restarts) == 1 and (
        f"(MemberUnresponsiveError: member 1 (pid {pid}) stopped answering: no heartbeat "
        "within heartbeat_timeout_ms=3000, so it was killed; none of its processors was in a "
        "long call when it last answered (a stopped process, e.g. SIGSTOP or a debugger, or "
        "a call that began since and holds the GIL)); restart 1 of" in restarts[0]
    ), restarts
    assert sorted(engine.get_list("items")) == list(range(n))
    assert dict(engine.get_list("sums")) == {k: sum(range(k, n, 10)) for k in range(10)}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_monitor_reports_a_silent_member_once_and_pings_the_others() -> None:
    """The monitor's rule without processes or sleeps: ``_run``'s body is driven by a
    fake clock and a stop event that ends the loop after the steps asked for."""
    clock = FakeClock()
    sent: list[tuple[int, Any]] = []
    silent: list[tuple[int, Any]] = []
    mon = HeartbeatMonitor(3, 10.0, lambda m, msg: sent.append((m, msg)),
                           lambda m, calls: silent.append((m, calls)), clock=clock)
    steps = iter([2.0, 4.0, 6.0, 8.0, 11.0, 12.0])

    class Steps:
        def wait(self, _timeout: float) -> bool:
            try:
                clock.now = next(steps)
            except StopIteration:
                return True
            mon.heard(0)  # member 0 answers every time
            if clock.now < 5:
                mon.heard(1, [("v", 2, "process", 1.5)])  # member 1 until 4 s
            return False

    mon._stopped = Steps()  # type: ignore[assignment]
    mon.ended(2)  # member 2 ended: never judged
    mon._run()
    # member 1 last heard at 4 s: silent past 14 s? no; at 11 and 12 s it is 7-8 s
    assert silent == []
    assert {m for m, _ in sent} == {0, 1}
    steps = iter([15.0, 16.0])
    mon._run()
    assert silent == [(1, [("v", 2, "process", 1.5)])]  # once
    assert sent[-1] == (0, ("ping",))


def test_a_coordinator_that_did_not_run_judges_no_one() -> None:
    clock = FakeClock()
    silent: list[int] = []
    mon = HeartbeatMonitor(2, 10.0, lambda m, msg: None, lambda m, c: silent.append(m),
                           clock=clock)
    steps = iter([60.0, 61.0])

    class Steps:
        def wait(self, _timeout: float) -> bool:
            try:
                clock.now = next(steps)
            except StopIteration:
                return True
            return False

    mon._stopped = Steps()  # type: ignore[assignment]
    mon._run()  # 60 s without running, then 1 s: everyone's clock started again at 60
    assert silent == []


def test_silence_text_prefers_a_processors_call_to_a_channels() -> None:
    calls = [("edge a->b to member 0", None, "send", 9.0), ("b", 3, "process", 2.0)]
    assert silence_text(1, 42, 5000, calls).endswith(
        "when it last answered, vertex 'b', processor 3 had been in a call to process() "
        "for 2.0 s (a call that holds the GIL stops the whole process)"
    )


class HoldTheGilOnMember1(ss.AbstractProcessor):
    """On member 1, its first item starts a regular expression that backtracks for
    ever inside one C call: the interpreter never switches threads, so nothing of the
    member runs (its control thread included) until it is killed."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if self.context.member_index == 1:
            re.match(r"(a*)*b", "a" * 64)
        return self.try_emit(item)


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_a_member_stuck_in_a_call_that_holds_the_gil_is_detected() -> None:
    engine = ss.local(processes=2, heartbeat_timeout_ms=TIMEOUT_MS)
    dag = DAG()
    src = dag.new_vertex("source", sources.items(list(range(100)))).local_parallelism(1)
    hold = dag.new_vertex("hold", HoldTheGilOnMember1).local_parallelism(1)
    out = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, hold).distributed())
    dag.edge(Edge.between(hold, out))
    job = engine.new_job(dag, JobConfig(name="gil"))
    with pytest.raises(JobFailedError) as e:
        job.join(timeout=GUARD_S)
    pid = job._execution._procs[1].pid
    assert str(e.value).split("\n")[0] == (
        f"job 'gil' failed: MemberUnresponsiveError: member 1 (pid {pid}) stopped "
        "answering: no heartbeat within heartbeat_timeout_ms=3000, so it was killed; none of "
        "its processors was in a long call when it last answered (a stopped process, e.g. "
        "SIGSTOP or a debugger, or a call that began since and holds the GIL)"
    )
    assert e.value.vertex is None
    assert job.status is ss.JobStatus.FAILED
    assert all(p.exitcode is not None for p in job._execution._procs)


def test_the_default_timeout_is_jets_sixty_seconds() -> None:
    """A member starved on a loaded machine (a test under ``nice 19``) must not be
    killed by default: 60 s, as Jet's failure detector; a job sets it lower to find a
    hung member sooner."""
    assert ss.local().heartbeat_timeout_ms == 60_000.0
    assert ss.local(heartbeat_timeout_ms=500).heartbeat_timeout_ms == 500
