"""What every engine's job handle offers: ``status``, ``metrics``, ``join``
(``state``, the point query, comes from :class:`slipstream.state.reader.StateQueries`:
``core`` does not import the state layer).

The embedded engine's :class:`~slipstream.engine.job.Job` and the Spark engine's jobs
share this base, so ``join`` raises the same errors in the same way on every engine.
"""

from __future__ import annotations

import threading
from typing import Any

from slipstream.core.config import JobStatus
from slipstream.core.errors import JobCancelledError, JobFailedError


class JobHandle:
    """Base of job handles. Subclasses set ``name``, ``_status`` and ``_terminal`` (set
    once the job reached a terminal state) and implement ``metrics`` and
    ``_join_error``."""

    name: str
    _status: JobStatus
    _terminal: threading.Event

    @property
    def status(self) -> JobStatus:
        return self._status

    def get_status(self) -> JobStatus:
        return self._status

    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        raise NotImplementedError

    def get_metrics(self) -> dict[str, dict[str, int]]:
        return self.metrics

    def watch(self) -> dict[str, Any]:
        """What a watcher (the dashboard, ``slipstream run``'s progress table) shows
        beyond ``metrics``, read without stopping the job. Keys (all optional):
        ``parallelism`` (vertex -> processors), ``watermarks`` (vertex -> the lowest
        watermark its processors passed on, or ``None``), ``queue_fill`` (vertex -> the
        fullest inbound queue's fill, 0..1: back-pressure), ``snapshot`` (the last
        committed snapshot's ``id``, ``duration_ms``, ``bytes``, ``committed_at``),
        ``error`` (text of the failure), ``progress`` (vertex -> (done, total) for
        bounded sources that know their size). Engines fill in what they can."""
        return {}

    def join(self, timeout: float | None = None) -> None:
        """Wait for the job to end. Raises ``JobFailedError`` (naming the vertex and
        processor index, with the processor's exception chained), ``JobCancelledError``,
        or ``TimeoutError`` if ``timeout`` seconds pass first."""
        if not self._terminal.wait(timeout):
            raise TimeoutError(f"job {self.name!r} still {self._status.value} after {timeout} s")
        if self._status is JobStatus.CANCELLED:
            raise JobCancelledError(f"job {self.name!r} was cancelled")
        if self._status is JobStatus.FAILED:
            raise self._join_error()

    def _join_error(self) -> JobFailedError:
        """The error ``join`` raises for a failed job."""
        raise NotImplementedError
