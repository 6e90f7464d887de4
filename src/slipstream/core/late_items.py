"""Dropped late items are never silent: :class:`LateItemsReport` turns a job's
``late_items_dropped`` counts into warnings.

A window processor drops an item that arrives behind the watermark and counts it in the
``late_items_dropped`` metric. A count alone is easy to miss (a job that lost 6 % of its
rows exited 0 and said nothing), so each engine gives its jobs one report, fed with every
increment of that metric: the first drop logs a WARNING at once, later ones at most once
per ``interval_s`` (a minute) with the running count, and the job's end logs the total.
The text names the setting to change (the allowed lag) and docs/troubleshooting.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["LATE_METRIC", "LateItemsReport", "late_items_message"]

LATE_METRIC = "late_items_dropped"
"""The metric counting the items a window processor dropped as late."""

REPEAT_INTERVAL_S = 60.0
"""While items keep arriving late, the warning repeats at most this often."""


def late_items_message(job_name: str, counts: dict[str, int], final: bool, batch: bool) -> str:
    """The warning's text: the running (or, at the job's end, ``final``) counts per vertex
    and what to change. ``batch``: the job reads bounded input only, so
    ``JobConfig(batch_watermarks=False)`` would keep every item."""
    total = sum(counts.values())
    per_vertex = ", ".join(f"vertex {v!r}: {n}" for v, n in sorted(counts.items()) if n)
    items = "item" if total == 1 else "items"
    when = "in all" if final else "so far"
    batch_fix = ", or leave JobConfig(batch_watermarks=False) in this batch job" if batch else ""
    repeat = "" if final else " (repeated at most once a minute while items come late)"
    return (
        f"job {job_name!r} dropped {total} late {items} {when} ({per_vertex}): they arrived "
        f"behind the watermark. To keep them, allow more lag: allowed_lag_ms in "
        f"with_timestamps() (Core API: the lag of the watermark policy given to "
        f"P.insert_watermarks){batch_fix}. See docs/troubleshooting.md{repeat}"
    )


class LateItemsReport:
    """One job's late-item warnings (see the module docstring). Thread-safe: processors
    of several worker threads feed :meth:`on_metric`."""

    def __init__(
        self,
        job_name: str,
        logger: logging.Logger,
        *,
        batch: bool = False,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_name = job_name
        self.batch = batch
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._warned_at: float | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Late items dropped per vertex since the job started (over every execution)."""
        with self._lock:
            return dict(self._counts)

    def on_metric(self, vertex: str, metric: str, delta: int) -> None:
        """A ``Context.metric_listener``: counts ``late_items_dropped`` increments and
        warns at the first one, then at most once per interval."""
        if metric != LATE_METRIC or delta <= 0:
            return
        self.add(vertex, delta)

    def add(self, vertex: str, count: int, warn: bool = True) -> None:
        """``count`` more items dropped by ``vertex``; ``warn=False`` only counts (for
        counts that arrive at the job's end, which :meth:`finish` reports)."""
        if count <= 0:
            return
        with self._lock:
            self._counts[vertex] = self._counts.get(vertex, 0) + count
            now = self._clock()
            due = warn and (self._warned_at is None or now - self._warned_at >= self._interval)
            if due:
                self._warned_at = now
                message = late_items_message(self.job_name, self._counts, False, self.batch)
        if due:
            self._log.warning(message)

    def finish(self) -> None:
        """At the job's end: the total, if any item was dropped."""
        counts = self.counts
        if any(counts.values()):
            self._log.warning(late_items_message(self.job_name, counts, True, self.batch))
