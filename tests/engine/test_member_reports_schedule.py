"""A member process's background work (``ss.local(processes=N)``): when it reports to the
coordinator (engine/member_stats.py's ``ReportSchedule``), what a report's resident set
reading costs (core/resident.py's ``resident_kb``), and how often a worker pool's
watchdog wakes (engine/workers.py). Their effect on a lone item's latency and on the
rows of bench/processes.py is measured there (docs/performance.md, "A member's
reports"); here the schedules themselves, on a fake clock."""

from __future__ import annotations

import os
from itertools import pairwise
from typing import Any

import pytest

from slipstream.engine import member
from slipstream.engine.member_stats import (
    EARLY_REPORT_S,
    METRICS_INTERVAL_S,
    REPORT_INTERVAL_S,
    ReportSchedule,
)
from slipstream.engine.workers import WATCHDOG_PERIOD_S, WorkerPool


def run_loop(
    schedule: ReportSchedule, seconds: float, output_at: Any, start: float = 0.0
) -> list[tuple[float, bool]]:
    """``_Member.run``'s loop on a fake clock: wait for the next tick (or, with
    ``output_at(now)`` true between ticks, an idle worker's wake-up 1 ms later), report
    when due; each report takes 0.3 ms. Returns ``(time, carries the watch)`` per report."""
    now = start
    reports: list[tuple[float, bool]] = []
    while now < start + seconds:
        wait = schedule.wait_s(now)
        if output_at(now) and wait > 0.001:
            wait = 0.001  # a worker went idle with sink output (_on_idle)
        now += wait
        output = output_at(now)
        if not schedule.due(now, output):
            continue
        reports.append((now, schedule.reporting(now)))
        now += 0.0003
        if output:
            now += EARLY_REPORT_S
    return reports


def test_a_member_with_nothing_new_reports_twice_a_second_not_ten_times() -> None:
    """On main a member reported at every tick (10 a second) and sent its watermarks
    in a second message after each: 20 messages a second, each waking the coordinator."""
    reports = run_loop(ReportSchedule(0.0), 10.0, lambda now: False)
    assert 10.0 / METRICS_INTERVAL_S - 1 <= len(reports) <= 10.0 / METRICS_INTERVAL_S + 1
    assert len(reports) <= 21
    assert reports[0][0] == pytest.approx(REPORT_INTERVAL_S)  # the first tick reports
    gaps = [b[0] - a[0] for a, b in pairwise(reports)]
    assert min(gaps) >= METRICS_INTERVAL_S - REPORT_INTERVAL_S
    assert all(watch for _, watch in reports)  # each carries the watermarks


def test_a_member_with_new_output_reports_it_at_every_tick_and_sooner_when_idle() -> None:
    busy = run_loop(ReportSchedule(0.0), 10.0, lambda now: True)
    # output that is there at a tick goes at the tick (engine.get_list fills as before),
    # and a worker gone idle with output sends it at once: at most one report per
    # EARLY_REPORT_S and its own time
    assert len(busy) >= 10.0 / REPORT_INTERVAL_S
    assert len(busy) <= 10.0 / (EARLY_REPORT_S + 0.0003) + 1
    watched = [t for t, watch in busy if watch]
    gaps = [b - a for a, b in pairwise(watched)]
    assert 10.0 / REPORT_INTERVAL_S - 1 <= len(watched) <= 2 * 10.0 / REPORT_INTERVAL_S + 1
    assert min(gaps) >= REPORT_INTERVAL_S / 2


def test_the_members_ticks_are_apart_and_stay_apart_after_a_late_wake_up() -> None:
    a, b = ReportSchedule(5.0, 0, 2), ReportSchedule(5.0, 1, 2)
    assert a.wait_s(5.0) == pytest.approx(REPORT_INTERVAL_S)
    assert b.wait_s(5.0) == pytest.approx(1.5 * REPORT_INTERVAL_S)
    # member 0 wakes 0.37 s late (its process was off the CPU): its next tick keeps its
    # phase, half an interval from member 1's
    a.due(5.0 + REPORT_INTERVAL_S + 0.37, False)
    b.due(5.0 + 1.5 * REPORT_INTERVAL_S, False)
    next_a = 5.0 + REPORT_INTERVAL_S + 0.37 + a.wait_s(5.0 + REPORT_INTERVAL_S + 0.37)
    next_b = 5.0 + 1.5 * REPORT_INTERVAL_S + b.wait_s(5.0 + 1.5 * REPORT_INTERVAL_S)
    assert (next_a - 5.0) / REPORT_INTERVAL_S == pytest.approx(round((next_a - 5.0) / REPORT_INTERVAL_S))
    assert abs(next_a - next_b) % REPORT_INTERVAL_S == pytest.approx(REPORT_INTERVAL_S / 2)
    reports_a = run_loop(ReportSchedule(0.0, 0, 2), 5.0, lambda now: False)
    reports_b = run_loop(ReportSchedule(0.0, 1, 2), 5.0, lambda now: False)
    closest = min(abs(x - y) for x, _ in reports_a for y, _ in reports_b)
    assert closest >= REPORT_INTERVAL_S / 2 - 1e-9


def test_resident_kb_opens_statm_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """On main every report opened ``/proc/self/statm`` anew (60-75 us of a member's
    report thread, against 10-12 for reading an open descriptor)."""
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc")
    first = member.resident_kb()
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kw: Any) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", counting_open)
    again = [member.resident_kb() for _ in range(5)]
    assert opened == []
    with open("/proc/self/statm", "rb") as f:
        now = int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    assert first > 0 and all(abs(kb - now) < 64 * 1024 for kb in again)
    cpu, peak, rss = member.usage()
    assert cpu > 0 and peak >= rss > 0 and opened == []
    # a forked child's inherited descriptor would read its parent's figures: a new pid
    # opens its own
    monkeypatch.setattr(os, "getpid", lambda: -12345)
    assert member.resident_kb() > 0
    assert opened == ["/proc/self/statm"]


def test_the_watchdog_looks_every_quarter_of_its_shortest_bound() -> None:
    """On main it looked every 0.05 s whatever its bounds: 20 wake-ups a second in
    every member process (and in a job's own process) for a warning due after 1 s."""

    def pool(**kw: Any) -> WorkerPool:
        return WorkerPool([], 1, lambda f: None, lambda: None, **kw)

    assert pool().watch_period_s() == pytest.approx(0.25)  # slow_call 1 s, grace 5 s
    assert pool(slow_call_s=10.0, stop_grace_s=2.0).watch_period_s() == pytest.approx(0.5)
    # the tests' short bounds still get the old period
    assert pool(slow_call_s=0.05, stop_grace_s=0.2).watch_period_s() == WATCHDOG_PERIOD_S
