"""What the dashboard remembers: the last minutes of every job, read by one poller.

A page opened on a job that has run for an hour should show how it got here, not start
from an empty chart, and its first numbers should be rates, not ``0/s``. So the server
reads every job once a second (:class:`Poller`), whoever is watching, and keeps per job a
bounded ring (:class:`History`) of each vertex's rates, watermark lag and queue fill, and
of the snapshot commits it saw. Pages ask for the points after the last one they have
(``/api/jobs?since=T``), so a poll carries one point per job, not the whole ring.

The engine keeps only its *last* commit (``job.watch()["snapshot"]``); the commit history
is kept here, from what the poller saw: with snapshots more often than once a second
some commits are not listed (their ids show the gap).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("slipstream.dashboard")

#: How far back the charts reach, and how often the poller reads the jobs.
HISTORY_S = 300.0
INTERVAL_S = 1.0
#: Snapshot commits kept per job.
SNAPSHOTS_KEPT = 20

#: The per-vertex figures a history point holds, in this order.
SERIES = ("in_rate", "out_rate", "watermark_lag_ms", "queue_fill")
_TERMINAL = frozenset(("completed", "failed", "cancelled"))
_SNAPSHOT_FIELDS = ("id", "committed_at", "duration_ms", "bytes", "entries", "pause_ms", "epoch")


class _JobHistory:
    def __init__(self, points: int, snapshots: int) -> None:
        # (time, {vertex: (in_rate, out_rate, lag, fill)}), oldest first
        self.points: deque[tuple[float, dict[str, tuple[Any, ...]]]] = deque(maxlen=points)
        self.snapshots: deque[dict[str, Any]] = deque(maxlen=snapshots)
        self.vertices: list[str] = []
        self.ended = False


class History:
    """A bounded ring of points per job (``span_s / interval_s`` of them) and of the
    last ``snapshots_kept`` snapshot commits. Thread safe."""

    def __init__(
        self,
        span_s: float = HISTORY_S,
        interval_s: float = INTERVAL_S,
        snapshots_kept: int = SNAPSHOTS_KEPT,
    ) -> None:
        self.span_s = span_s
        self.interval_s = interval_s
        self._points = max(2, int(span_s / interval_s) + 1)
        self._snapshots = snapshots_kept
        self._jobs: dict[str, _JobHistory] = {}
        self._lock = threading.Lock()

    def record(self, t: float, docs: list[dict[str, Any]]) -> None:
        """Add one point per job from ``docs`` (:meth:`Sampler.describe` results) at time
        ``t``; jobs not in ``docs`` are forgotten. A finished job gets one last point
        (its rates drop to 0) and then no more, so its charts show its run."""
        t = round(t, 3)  # as sent: a page's ?since= is a time it was sent
        with self._lock:
            alive = {d["id"] for d in docs}
            for gone in [k for k in self._jobs if k not in alive]:
                del self._jobs[gone]
            for d in docs:
                h = self._jobs.get(d["id"])
                if h is None:
                    h = self._jobs[d["id"]] = _JobHistory(self._points, self._snapshots)
                _note_snapshot(h, d.get("snapshot"))
                if h.ended:
                    continue
                h.ended = d["status"] in _TERMINAL
                values = {v["name"]: tuple(v[k] for k in SERIES) for v in d["vertices"]}
                h.vertices += [name for name in values if name not in h.vertices]
                h.points.append((t, values))

    def attach(self, docs: list[dict[str, Any]], since: float | None = None) -> list[dict[str, Any]]:
        """``docs`` with ``history`` (points after ``since``, all kept without it) and
        ``snapshot_history`` (the commits seen, oldest first) added to each job."""
        with self._lock:
            for d in docs:
                h = self._jobs.get(d["id"])
                d["history"] = _columns(h, since) if h is not None else _columns(None, since)
                d["snapshot_history"] = [dict(s) for s in h.snapshots] if h is not None else []
                d["history"]["span_s"] = self.span_s
                d["history"]["interval_s"] = self.interval_s
        return docs


def _note_snapshot(h: _JobHistory, snap: dict[str, Any] | None) -> None:
    if not snap:
        return
    entry = {k: snap.get(k) for k in _SNAPSHOT_FIELDS if k in snap}
    last = h.snapshots[-1] if h.snapshots else None
    if last is not None and (last.get("id"), last.get("committed_at")) == (
        entry.get("id"),
        entry.get("committed_at"),
    ):
        if last.get("pause_ms") is None and entry.get("pause_ms") is not None:
            last["pause_ms"] = entry["pause_ms"]  # read when its metrics had caught up
        return
    h.snapshots.append(entry)


def _columns(h: _JobHistory | None, since: float | None) -> dict[str, Any]:
    """The points after ``since`` as columns: ``t`` and, per vertex, one list per series
    (``None`` where a figure was unknown, e.g. the lag of a vertex without watermarks)."""
    points = [p for p in h.points if since is None or p[0] > since] if h is not None else []
    names = h.vertices if h is not None else []
    none = (None,) * len(SERIES)
    return {
        "t": [t for t, _ in points],
        "vertices": {
            name: {k: [vals.get(name, none)[i] for _, vals in points] for i, k in enumerate(SERIES)}
            for name in names
        },
    }


class Poller:
    """Reads every job through ``describe_all`` every ``history.interval_s`` seconds
    into ``history``, on a daemon thread, from construction until :meth:`close`."""

    def __init__(self, describe_all: Callable[[], list[dict[str, Any]]], history: History) -> None:
        self._describe_all = describe_all
        self.history = history
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slipstream-dashboard-poller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.history.record(time.time(), self._describe_all())
            except Exception:  # noqa: BLE001 - a watcher keeps watching
                log.exception("dashboard: reading the jobs failed")
            if self._stop.wait(self.history.interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
