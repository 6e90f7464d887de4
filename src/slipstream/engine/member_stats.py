"""Per-member figures of a job whose members run in processes (``ss.local(processes=N)``):
what ``job.watch()["members"]`` holds, and the dashboard's Members table and ``/metrics``
``slipstream_member_*`` series show.

Each member process reports, every 0.1 s with its metrics (:mod:`slipstream.engine.member`),
its CPU time, its peak and its current resident set; the coordinator keeps the latest
report per member (``ProcessExecution.member_usage``) and, here, a few of the past CPU
readings to turn CPU time into a share of a core (:class:`CpuShare`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from slipstream.core.items import MAX_TIMESTAMP, NO_WATERMARK

#: the control message with a member's watermarks and queue fill per vertex
WATCH = "watch"

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
