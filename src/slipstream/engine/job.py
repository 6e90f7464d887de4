"""A running job on the embedded engine and its lifecycle."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from slipstream.core.config import JobConfig, JobStatus
from slipstream.core.dag import DAG
from slipstream.core.errors import JobCancelledError, JobFailedError
from slipstream.engine.plan import build_vertex_plans, wire
from slipstream.engine.tasklet import ProcessorTasklet
from slipstream.engine.workers import TaskletFailure, WorkerPool

if TYPE_CHECKING:
    from slipstream.engine.local import LocalEngine

log = logging.getLogger("slipstream.job")
_ids = itertools.count(1)


class Job:
    """Handle of a submitted job: ``join``, ``cancel``, ``status``, ``metrics``."""

    def __init__(self, engine: LocalEngine, dag: DAG, config: JobConfig) -> None:
        self.id = next(_ids)
        self.engine = engine
        self.dag = dag
        self.config = config
        self.name = config.name or f"job-{self.id}"
        self._status = JobStatus.NOT_RUNNING
        self._lock = threading.Lock()
        self._terminal = threading.Event()
        self._failure: TaskletFailure | None = None
        self._error: BaseException | None = None
        self._cancel_requested = False
        self._tasklets: list[ProcessorTasklet] = []
        self._pool: WorkerPool | None = None
        self.submission_time = time.time()
        self.completion_time: float | None = None

    # -- public API --------------------------------------------------------------------
    @property
    def status(self) -> JobStatus:
        return self._status

    def get_status(self) -> JobStatus:
        return self._status

    def join(self, timeout: float | None = None) -> None:
        """Wait for the job to end. Raises ``JobFailedError`` (naming the vertex and
        processor index, with the processor's exception chained), ``JobCancelledError``,
        or ``TimeoutError`` if ``timeout`` seconds pass first."""
        if not self._terminal.wait(timeout):
            raise TimeoutError(f"job {self.name!r} still {self._status.value} after {timeout} s")
        if self._status is JobStatus.CANCELLED:
            raise JobCancelledError(f"job {self.name!r} was cancelled")
        if self._status is JobStatus.FAILED:
            raise self._failure_error()

    def cancel(self) -> None:
        """Stop the job; ``join()`` then raises ``JobCancelledError``."""
        with self._lock:
            if self._status.is_terminal:
                return
            self._cancel_requested = True
        for t in self._tasklets:
            t.cancelled = True
        if self._pool is not None:
            self._pool.stop()
        else:
            self._finish()

    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        """Per vertex: ``items_in``, ``items_out`` and the processors' own counters."""
        out: dict[str, dict[str, int]] = {}
        for t in self._tasklets:
            m = out.setdefault(t.vertex_name, {"items_in": 0, "items_out": 0})
            m["items_in"] += t.items_in
            m["items_out"] += sum(c.items_out for c in t.collectors)
            for k, v in t.context.metrics.items():
                m[k] = m.get(k, 0) + v
        return out

    def get_metrics(self) -> dict[str, dict[str, int]]:
        return self.metrics

    def __repr__(self) -> str:
        return f"Job(id={self.id}, name={self.name!r}, status={self._status.value})"

    # -- execution ---------------------------------------------------------------------
    def _start(self) -> None:
        self._status = JobStatus.STARTING
        engine = self.engine
        plans = build_vertex_plans(
            self.dag,
            self.config,
            engine.member_count,
            engine.cooperative_threads,
            engine.services,
            self.name,
        )
        specs = wire(self.dag, plans, self.config.processing_guarantee)
        self._plans = plans
        tasklets = []
        for s in specs:
            tasklets.append(
                ProcessorTasklet(
                    s.processor,
                    s.context,
                    s.inbound,
                    s.outbound,
                    guarantee=self.config.processing_guarantee,
                    outbox_capacity=engine.outbox_capacity,
                )
            )
        self._tasklets = tasklets
        try:
            for t in tasklets:
                t.init()
        except BaseException as e:
            self._failure = TaskletFailure(t, e)
            self._status = JobStatus.FAILED
            self._close_all()
            self._terminal.set()
            return
        self._pool = WorkerPool(
            tasklets,
            engine.cooperative_threads,
            self._on_failure,
            self._finish,
            name=self.name,
        )
        self._status = JobStatus.RUNNING
        self._pool.start()

    def _on_failure(self, failure: TaskletFailure) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = failure
        for t in self._tasklets:
            t.cancelled = True
        if self._pool is not None:
            self._pool.stop()

    def _finish(self) -> None:
        """Called once when every worker has exited."""
        failed = self._failure is not None
        if failed or self._cancel_requested:
            self._close_all()
        error = self._failure.error if self._failure else None
        for vp in getattr(self, "_plans", {}).values():
            for s in vp.suppliers:
                try:
                    s.close(error)
                except Exception:  # noqa: BLE001
                    log.exception("closing supplier of %s failed", vp.vertex.name)
        self.completion_time = time.time()
        if failed:
            self._status = JobStatus.FAILED
        elif self._cancel_requested:
            self._status = JobStatus.CANCELLED
        else:
            self._status = JobStatus.COMPLETED
        self._terminal.set()

    def _close_all(self) -> None:
        for t in self._tasklets:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - close errors are only logged
                log.exception("closing %s#%d failed", t.vertex_name, t.index)

    def _failure_error(self) -> JobFailedError:
        f = self._failure
        assert f is not None
        t = f.tasklet
        err = JobFailedError(
            f"job {self.name!r} failed: vertex {t.vertex_name!r}, processor {t.index}: "
            f"{type(f.error).__name__}: {f.error}",
            vertex=t.vertex_name,
            processor_index=t.index,
            cause=f.error,
            remote_traceback=f.traceback,
        )
        err.__cause__ = f.error
        return err

    def _wait_terminal(self, timeout: float | None = None) -> bool:
        return self._terminal.wait(timeout)

    def _debug_states(self) -> list[Any]:
        return [repr(t) for t in self._tasklets]
