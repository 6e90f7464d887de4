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
