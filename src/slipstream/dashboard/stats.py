"""Turn a job's counters into what a person watches: rates, lags, ages.

One :class:`Sampler` serves the dashboard's JSON, its Prometheus endpoint and the
CLI's progress table, so every view computes rates the same way. It works with any
engine's job handle (``name``, ``status``, ``metrics`` and the optional
:meth:`~slipstream.core.job_handle.JobHandle.watch`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

#: Watermarks at or above this (1 Jan 2000 in epoch milliseconds) are taken as wall-clock
#: event time, so their lag behind the clock is shown; smaller ones are logical times.
EPOCH_MS_FLOOR = 946_684_800_000

#: Counters that get their own column rather than going to ``counters``.
_KNOWN = ("items_in", "items_out", "late_items_dropped")


class Sampler:
    """Keeps the previous reading of each job's counters to turn totals into rates.
    A reading younger than ``min_interval`` seconds is reused, so many viewers polling at
    once see steady rates. Thread safe."""

    def __init__(self, min_interval: float = 0.5, clock: Any = time.time) -> None:
        self.min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        # job key -> (time, {vertex: (items_in, items_out)}, {vertex: (in_rate, out_rate)})
        self._prev: dict[Any, tuple[float, dict[str, tuple[int, int]], dict[str, tuple[float, float]]]] = {}

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
        rates = self._rates(key, now, totals, terminal=_is_terminal(job)) if totals else {}
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
                "counters": {k: v for k, v in m.items() if k not in _KNOWN},
            }
            if name in progress:
                done, total = progress[name]
                entry["progress"] = {"done": int(done), "total": int(total)}
            vertices.append(entry)
        snap = watch.get("snapshot")
        if snap is not None:
            snap = dict(snap)
            snap["age_s"] = round(max(0.0, now - snap.get("committed_at", now)), 1)
        job_metrics = metrics.get("__job__", {})
        submitted = getattr(job, "submission_time", None)
        ended = getattr(job, "completion_time", None)
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
            "stages": watch.get("stages"),
            "vertices": vertices,
        }

    def _rates(
        self, key: Any, now: float, totals: dict[str, tuple[int, int]], terminal: bool
    ) -> dict[str, tuple[float, float]]:
        with self._lock:
            prev = self._prev.get(key)
            if prev is not None and now - prev[0] < self.min_interval:
                return prev[2]
            rates: dict[str, tuple[float, float]] = {}
            if prev is not None and not terminal:
                dt = now - prev[0]
                for v, (i, o) in totals.items():
                    pi, po = prev[1].get(v, (0, 0))
                    # a restart resets counters: never show a negative rate
                    rates[v] = (max(0, i - pi) / dt, max(0, o - po) / dt)
            self._prev[key] = (now, totals, rates)
            return rates


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
