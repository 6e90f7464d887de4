"""The idle back-off of the cooperative workers (engine/workers.py): the schedule itself;
its CPU and latency figures are bench/latency.py's (docs/performance.md)."""

from __future__ import annotations

import pytest

from slipstream.engine.workers import MAX_IDLE_S, MAX_LONG_IDLE_S, idle_pause


def test_short_gaps_back_off_as_before_up_to_one_millisecond() -> None:
    assert [idle_pause(n, 0.0) for n in range(1, 9)] == [
        0.00004, 0.00008, 0.00016, 0.00032, 0.00064, 0.001, 0.001, 0.001
    ]
    assert idle_pause(40, 0.019) == MAX_IDLE_S == 0.001


def test_a_long_lull_sleeps_a_twentieth_of_it_up_to_ten_milliseconds() -> None:
    """On main every idle pass slept at most 1 ms, however long the job had been idle."""
    assert idle_pause(60, 0.1) == pytest.approx(0.005)
    assert idle_pause(80, 0.15) == pytest.approx(0.0075)
    assert idle_pause(200, 0.2) == idle_pause(10**6, 3600.0) == MAX_LONG_IDLE_S == 0.01


def test_the_pause_never_shrinks_while_the_worker_stays_idle() -> None:
    pauses = [idle_pause(n, n * 0.002) for n in range(1, 400)]
    assert pauses == sorted(pauses)


class Bursts:
    """A cooperative tasklet that makes progress while ``work`` holds items and counts
    its idle calls; ``idle`` is set once it has been called idle ``after`` times."""

    cooperative = True

    def __init__(self) -> None:
        import threading

        self.work = 0
        self.idle_calls = 0
        self.after = 0
        self.idle = threading.Event()

    def call(self) -> int:
        from slipstream.execution.tasklet import MADE_PROGRESS, NO_PROGRESS

        if self.work:
            self.work -= 1
            return MADE_PROGRESS
        self.idle_calls += 1
        if self.idle_calls >= self.after:
            self.idle.set()
        return NO_PROGRESS


def test_a_worker_calls_on_idle_once_per_lull() -> None:
    """``WorkerPool(on_idle=...)`` runs at the first pass without progress after passes
    with progress, not at every idle pass (a member process reports its sinks' output
    then: engine/member.py)."""
    from slipstream.engine.workers import WorkerPool

    t = Bursts()
    t.work, t.after = 3, 5
    calls: list[int] = []
    pool = WorkerPool([t], 1, print, print, on_idle=lambda: calls.append(t.idle_calls))
    pool.start()
    try:
        assert t.idle.wait(60)
        assert calls == [1]
        t.idle.clear()
        t.work = 2  # before the new count: the worker takes it at its next call
        t.after = t.idle_calls + 5
        assert t.idle.wait(60)
        assert len(calls) == 2
    finally:
        pool.stop()
        pool.join(60)
