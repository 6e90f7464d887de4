"""Turn a job's counters into what a person watches: rates, lags, ages.

One :class:`Sampler` serves the dashboard's JSON, its Prometheus endpoint and the
CLI's progress table, so every view computes rates the same way. It works with any
engine's job handle (``name``, ``status``, ``metrics`` and the optional
:meth:`~slipstream.core.job_handle.JobHandle.watch`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

#: Watermarks at or above this (1 Jan 2000 in epoch milliseconds) are taken as wall-clock
#: event time, so their lag behind the clock is shown; smaller ones are logical times.
EPOCH_MS_FLOOR = 946_684_800_000

#: Counters that get their own column rather than going to ``counters``.
_KNOWN = ("items_in", "items_out", "late_items_dropped", "items_skipped")


#: Readings of a job's counters kept to compute rates from (the newest few seconds').
_READINGS_KEPT = 16

Totals = dict[str, tuple[int, int]]  # vertex -> (items_in, items_out)


class Sampler:
    """Keeps recent readings of each job's counters to turn totals into rates: a rate
    is the growth since the newest kept reading at least ``min_interval`` seconds old,
    and a reading is kept only ``min_interval`` after the previous one, so many viewers
    polling at once see steady rates. A job's first reading has no earlier one: its
    rates are then its totals over the time since submission, never a blank 0/s. The
    dashboard's poller reads every job once a second, so a page's first request already
    has rates from the server's own readings. Thread safe."""

    def __init__(self, min_interval: float = 0.5, clock: Any = time.time) -> None:
        self.min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        # job key -> readings (time, totals), oldest first
        self._readings: dict[Any, deque[tuple[float, Totals]]] = {}

    def describe(self, job: Any, job_key: Any = None) -> dict[str, Any]:
        """A JSON-ready description of ``job`` (see docs/watching.md for the fields)."""
        now = self._clock()
        metrics = _read_metrics(job)
        watch = _safe(job.watch, {}) if hasattr(job, "watch") else {}
        status = job.status.value if hasattr(job.status, "value") else str(job.status)
        key = job_key if job_key is not None else id(job)
        totals = {
            v: (int(m.get("items_in", 0)), int(m.get("items_out", 0)))
            for v, m in metrics.items()
            if not v.startswith("__")
        }
        # an unreadable moment (no totals) must not turn the next reading into a spike
        submitted = getattr(job, "submission_time", None)
        rates = self._rates(key, now, totals, _is_terminal(job), submitted) if totals else {}
        wms = watch.get("watermarks", {})
        fills = watch.get("queue_fill", {})
        par = watch.get("parallelism", {})
        progress = watch.get("progress", {})
        names = _vertex_names(job, metrics)
        out_edges = _out_edges(job)
        vertices = []
        for name in names:
            m = metrics.get(name, {})
            wm = wms.get(name)
            lag = now * 1000.0 - wm if wm is not None and wm >= EPOCH_MS_FLOOR else None
            in_rate, out_rate = rates.get(name, (0.0, 0.0))
            entry: dict[str, Any] = {
                "name": name,
                "parallelism": par.get(name),
                "items_in": int(m.get("items_in", 0)),
                "items_out": int(m.get("items_out", 0)),
                # items_out counts an item once per outbound edge: views say how many
                "out_edges": out_edges.get(name, 0),
                "in_rate": round(in_rate, 1),
                "out_rate": round(out_rate, 1),
                "queue_fill": round(float(fills[name]), 3) if name in fills else None,
                "watermark": wm,
                "watermark_lag_ms": round(lag, 1) if lag is not None else None,
                "late_items_dropped": int(m.get("late_items_dropped", 0)),
                # items set aside by JobConfig.on_item_error (skipped or dead-lettered)
                "items_skipped": int(m.get("items_skipped", 0)),
                "counters": {k: v for k, v in m.items() if k not in _KNOWN},
            }
            if name in progress:
                done, total = progress[name]
                entry["progress"] = {"done": int(done), "total": int(total)}
            vertices.append(entry)
        job_metrics = metrics.get("__job__", {})
        snap = watch.get("snapshot")
        if snap is not None:
            snap = dict(snap)
            snap["age_s"] = round(max(0.0, now - snap.get("committed_at", now)), 1)
            snap.setdefault("pause_ms", _pause_ms(snap, job_metrics))
        ended = getattr(job, "completion_time", None)
        members = watch.get("members")
        return {
            "id": str(getattr(job, "id", key)),
            "name": job.name,
            "status": status,
            "engine": _engine_kind(job),
            "submitted": submitted,
            "elapsed_s": round((ended or now) - submitted, 1) if submitted else None,
            "restarts": int(job_metrics.get("restarts", getattr(job, "restarts", 0)) or 0),
            "snapshots": int(job_metrics.get("snapshots", 0)),
            "snapshot": snap,
            "error": watch.get("error"),
            # what keeps the job from making progress (a sink retrying its server, a
            # stalled snapshot): "vertex#index: text" / "job: text", see job.watch()
            "warnings": [f"{k}: {v}" for k, v in sorted((watch.get("warnings") or {}).items())],
            "commit_retries": int(job_metrics.get("commit_retries", 0)),
            "sink_unavailable_s": int(job_metrics.get("sink_unavailable_s", 0)),
            "stages": watch.get("stages"),
            "vertices": vertices,
            # a job whose members run in processes: per member and all together
            "members": members,
            "members_total": members_total(members) if members else None,
        }

    def _rates(
        self, key: Any, now: float, totals: Totals, terminal: bool, submitted: float | None
    ) -> dict[str, tuple[float, float]]:
        if terminal:
            return {}
        with self._lock:
            readings = self._readings.setdefault(key, deque(maxlen=_READINGS_KEPT))
            ref = next(
                (r for r in reversed(readings) if now - r[0] >= self.min_interval and now > r[0]), None
            )
            if ref is None and readings and now > readings[0][0]:
                ref = readings[0]  # only younger readings: the oldest of them
            if not readings or now - readings[-1][0] >= self.min_interval:
                readings.append((now, totals))
        if ref is None:
            if submitted is None or now <= submitted:
                return {}
            ref = (submitted, {})  # counters start at 0 when the job is submitted
        t0, prev = ref
        dt = now - t0
        rates: dict[str, tuple[float, float]] = {}
        for v, (i, o) in totals.items():
            pi, po = prev.get(v, (0, 0))
            # a restart resets counters: never show a negative rate
            rates[v] = (max(0, i - pi) / dt, max(0, o - po) / dt)
        return rates

    def retain(self, keys: set[Any]) -> None:
        """Forget the readings of jobs not in ``keys`` (the engine dropped them)."""
        with self._lock:
            for k in [k for k in self._readings if k not in keys]:
                del self._readings[k]


def members_total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The members' figures summed (``cpu_share`` of all of them: 2.0 is two cores
    busy; the peak resident sets summed are an upper bound of what they held at once)."""
    shares = [r["cpu_share"] for r in rows if r["cpu_share"] is not None]
    return {
        "members": len(rows),
        "items_in": sum(r["items_in"] for r in rows),
        "items_out": sum(r["items_out"] for r in rows),
        "cpu_ms": sum(r["cpu_ms"] for r in rows),
        "cpu_share": round(sum(shares), 3) if shares else None,
        "rss_kb": sum(r["rss_kb"] for r in rows),
        "peak_rss_kb": sum(r["peak_rss_kb"] for r in rows),
    }


def _pause_ms(snap: dict[str, Any], job_metrics: dict[str, Any]) -> float | None:
    """The longest processor pause of the commit ``snap`` describes, from the job's
    metrics (``snapshot_pause_us`` is the last commit's), or ``None`` while those
    describe another commit (one that committed between the two reads): the figures
    must match the commit's duration, size and entries."""
    pause = job_metrics.get("snapshot_pause_us")
    dur_us = job_metrics.get("snapshot_duration_us")
    if pause is None or dur_us is None or snap.get("duration_ms") is None:
        return None
    same = (
        abs(dur_us / 1000.0 - float(snap["duration_ms"])) <= 0.1
        and job_metrics.get("snapshot_bytes") == (snap.get("bytes") or 0)
        and job_metrics.get("snapshot_entries") == snap.get("entries")
    )
    return round(pause / 1000.0, 3) if same else None


def _vertex_names(job: Any, metrics: dict[str, Any]) -> list[str]:
    """Vertices in the DAG's topological order (metrics may not list one that has not
    started yet)."""
    dag = getattr(job, "dag", None)
    names: list[str] = []
    if dag is not None:
        try:
            names = [v.name for v in dag.topological_order()]
        except Exception:  # noqa: BLE001
            names = []
    for v in metrics:
        if not v.startswith("__") and v not in names:
            names.append(v)
    return names


def _out_edges(job: Any) -> dict[str, int]:
    """Vertex name -> number of its outbound edges in the job's DAG (empty if unknown)."""
    dag = getattr(job, "dag", None)
    counts: dict[str, int] = {}
    try:
        for e in dag.edges if dag is not None else []:
            counts[e.source.name] = counts.get(e.source.name, 0) + 1
    except Exception:  # noqa: BLE001 - a watcher must never fail
        return {}
    return counts


def _is_terminal(job: Any) -> bool:
    return bool(getattr(job.status, "is_terminal", False))


def _engine_kind(job: Any) -> str:
    mod = type(job).__module__
    return "spark" if ".spark" in mod else "local"


def _read_metrics(job: Any) -> dict[str, Any]:
    """``job.metrics``, retried: it sums counters the job's threads are updating, and a
    processor adding its first counter of a kind mid-read makes the read fail."""
    for _ in range(5):
        try:
            return dict(job.metrics)
        except RuntimeError:
            continue
        except Exception:  # noqa: BLE001
            break
    return {}


def _safe(fn: Any, default: Any) -> Any:
    """A watcher must never fail because the job changed under it."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return default
