"""Per-member figures of a job whose members run in processes (``ss.local(processes=N)``):
what ``job.watch()["members"]`` holds, and the dashboard's Members table and ``/metrics``
``slipstream_member_*`` series show.

Each member process reports with its metrics (:mod:`slipstream.engine.member`, when:
:class:`ReportSchedule`) its CPU time, its peak and its current resident set; the
coordinator keeps the latest report per member (``ProcessExecution.member_usage``) and,
here, a few of the past CPU readings to turn CPU time into a share of a core
(:class:`CpuShare`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from slipstream.core.items import MAX_TIMESTAMP, NO_WATERMARK

#: seconds between a member's report ticks: at each its list and map sinks' new output
#: (if any) goes to the coordinator, so ``engine.get_list`` fills as the job runs
REPORT_INTERVAL_S = 0.1
#: a member whose worker went idle with new list or map sink output reports it at once,
#: but no sooner than this after its last report (items trickling in do not each cost a
#: report)
EARLY_REPORT_S = 0.002
#: seconds between a member's reports when its sinks have nothing new (its metrics, CPU
#: time, resident set, watermarks and queue fill only): the dashboard and its history
#: sample every second (``dashboard/history.py``), :class:`CpuShare` over one
METRICS_INTERVAL_S = 0.5


class ReportSchedule:
    """When member ``member`` of ``members`` reports (``_Member.run``'s loop).

    Ticks every :data:`REPORT_INTERVAL_S` on a fixed schedule from ``start``, member
    ``m``'s shifted by ``m / members`` of an interval, so the members' reports (and the
    coordinator's listeners that take them) do not all run at one moment on a machine
    whose cores the members' workers use. At a tick, or when a worker went idle with
    sink output, the member reports if its sinks have new output, or if
    :data:`METRICS_INTERVAL_S` passed since its last report (the first tick always
    reports: the member shows as running). Each report is ~0.2-0.3 ms of its report
    thread holding the GIL and a wake-up of the coordinator; a lone item that meets one
    waits for it (docs/performance.md, "A member's reports"), so a member with nothing
    new reports 2 times a second, not 10."""

    def __init__(self, start: float, member: int = 0, members: int = 1) -> None:
        self._next_tick = start + REPORT_INTERVAL_S * (1.0 + member / max(1, members))
        self._last_report = -float("inf")
        self._last_watch = -float("inf")

    def wait_s(self, now: float) -> float:
        """How long to wait for the next tick from ``now`` (0 if it is due)."""
        return max(0.0, self._next_tick - now)

    def due(self, now: float, output: bool) -> bool:
        """Whether to report at ``now`` (a tick, or a worker gone idle), ``output``: the
        sinks hold output not yet reported. Moves the next tick past ``now``."""
        if now >= self._next_tick:
            late = int((now - self._next_tick) / REPORT_INTERVAL_S) + 1
            self._next_tick += late * REPORT_INTERVAL_S  # the phase stays the member's
        # a tick's wait may end a little early: a due metrics report is not put off a tick
        return output or now - self._last_report >= METRICS_INTERVAL_S - REPORT_INTERVAL_S / 2

    def reporting(self, now: float) -> bool:
        """A report goes at ``now``; whether it carries the watermarks and queue fill
        (``watermarks_and_fill``: at most every :data:`REPORT_INTERVAL_S`)."""
        self._last_report = now
        if now - self._last_watch >= REPORT_INTERVAL_S - REPORT_INTERVAL_S / 2:
            self._last_watch = now
            return True
        return False

#: the CPU share is the growth of CPU time over at least this long (the newest reading
#: that old, or the oldest kept)
CPU_WINDOW_S = 1.0
_KEPT = 32


class CpuShare:
    """Per member, recent ``(time, CPU seconds)`` readings, for its CPU use as a share of
    one core over about the last :data:`CPU_WINDOW_S`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._readings: dict[int, deque[tuple[float, float]]] = {}

    def record(self, member: int, cpu_s: float) -> None:
        with self._lock:
            self._readings.setdefault(member, deque(maxlen=_KEPT)).append((self._clock(), cpu_s))

    def share(self, member: int) -> float | None:
        """CPU seconds per second (1.0 is one core busy) between the newest reading and
        the newest one at least :data:`CPU_WINDOW_S` older (or the oldest kept);
        ``None`` before two readings."""
        with self._lock:
            readings = list(self._readings.get(member, ()))
        if len(readings) < 2:
            return None
        t1, c1 = readings[-1]
        ref = readings[0]
        for r in reversed(readings[:-1]):
            if t1 - r[0] >= CPU_WINDOW_S:
                ref = r
                break
        dt = t1 - ref[0]
        return max(0.0, (c1 - ref[1]) / dt) if dt > 0 else None


def member_rows(ex: Any) -> list[dict[str, Any]]:
    """Per member (``ex`` is a ``ProcessExecution``): ``member``, ``pid``, ``state``
    (``starting`` before its first report, ``running``, then ``done``, ``cancelled``,
    ``failed``, ``died`` or ``unresponsive``), ``items_in`` and ``items_out`` (summed
    over the member's processors, every vertex), ``cpu_ms``, ``cpu_share`` (CPU seconds
    per second lately; ``None`` before two reports), ``rss_kb`` (its resident set at its
    last report), ``peak_rss_kb`` and its workers' ``idle_spin_passes`` (polled in
    ``JobConfig.idle_spin_ms``'s window after their last progress)."""
    rows = []
    procs = list(ex._procs)
    for m in range(ex.count):
        metrics = ex.member_metrics.get(m, {})
        usage = ex.member_usage.get(m)
        state = ex.member_state.get(m) or ("running" if usage is not None else "starting")
        rows.append(
            {
                "member": m,
                "pid": procs[m].pid if m < len(procs) else None,
                "state": state,
                "items_in": sum(int(f.get("items_in", 0)) for f in metrics.values()),
                "items_out": sum(int(f.get("items_out", 0)) for f in metrics.values()),
                "cpu_ms": int(usage[0] * 1000) if usage else 0,
                "cpu_share": _round(ex.cpu_share.share(m)),
                "rss_kb": int(usage[2]) if usage and len(usage) > 2 else 0,
                "peak_rss_kb": int(usage[1]) if usage else 0,
                "idle_spin_passes": int(usage[3]) if usage and len(usage) > 4 else 0,
            }
        )
    return rows


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def watermarks_and_fill(tasklets: Any) -> tuple[dict[str, int | None], dict[str, float]]:
    """Per vertex of ``tasklets``: its watermark (the slowest processor's of those that
    passed one on, ``None`` if none did: a processor without one yet holds the vertex
    back only once it passes one on, as in Jet's coalescing) and the fill of its fullest
    inbound queue (0..1). What ``job.watch()`` shows for one process, and what a member
    process reports for its own processors."""
    wms: dict[str, list[int]] = {}
    fill: dict[str, float] = {}
    for t in tasklets:
        wm = t.last_wm_out if t.collectors else t.coalescer.last_emitted
        # the vertices fused into t (execution/fusion.py): the inbound queues are the
        # first one's, and each passes on the watermarks t receives
        stages = getattr(t, "fused_stages", None) or ()
        for stage in stages:
            lst = wms.setdefault(stage.vertex_name, [])
            if NO_WATERMARK < t.coalescer.last_emitted < MAX_TIMESTAMP:
                lst.append(t.coalescer.last_emitted)
            fill.setdefault(stage.vertex_name, 0.0)
        lst = wms.setdefault(t.vertex_name, [])
        if NO_WATERMARK < wm < MAX_TIMESTAMP:
            lst.append(wm)
        fill.setdefault(t.vertex_name, 0.0)
        queued = stages[0].vertex_name if stages else t.vertex_name
        f = fill[queued]
        for s in t.streams:
            for q in s.queues:
                f = max(f, min(1.0, q.size() / q.capacity))
        fill[queued] = f
    return {n: (min(v) if v else None) for n, v in wms.items()}, fill


def merge_members_watch(
    reports: dict[int, tuple[dict[str, int | None], dict[str, float]]],
) -> tuple[dict[str, int | None], dict[str, float]]:
    """The members' latest :func:`watermarks_and_fill` as one job's: per vertex the
    lowest watermark of the members that have one, and the fullest queue."""
    wms: dict[str, int | None] = {}
    fill: dict[str, float] = {}
    for member_wms, member_fill in list(reports.values()):
        for v, wm in member_wms.items():
            have = wms.get(v)
            wms[v] = wm if have is None else (have if wm is None else min(have, wm))
        for v, f in member_fill.items():
            fill[v] = max(fill.get(v, 0.0), f)
    return wms, fill
