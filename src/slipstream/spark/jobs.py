"""What every job on the Spark engine shares: the handle base, the job-id source, the
failure mapping and result bookkeeping, and the batch job itself.

Jobs talk to their engine only through :class:`JobHost` (cluster shape, the driver's
lists/maps, merging task results), so this module and
:mod:`slipstream.spark.streaming` import nothing from :mod:`slipstream.spark.engine`:
the engine imports the jobs, never the other way round.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from slipstream.core.config import JobConfig, JobStatus
from slipstream.core.dag import DAG
from slipstream.core.errors import JobFailedError
from slipstream.core.item_errors import SKIPPED_METRIC
from slipstream.core.job_handle import JobHandle
from slipstream.core.late_items import LATE_METRIC, LateItemsReport
from slipstream.core.traits import all_sources_bounded
from slipstream.execution.plan import member_addresses
from slipstream.spark.compile import CompiledDag, compile_dag
from slipstream.spark.failures import (
    environment_problem,
    find_failure,
    new_failure_key,
    summarize_spark_error,
    thread_died_error,
)
from slipstream.spark.io import write_rows
from slipstream.state.reader import StateQueries

__all__ = [
    "JobHost",
    "SparkJob",
    "SparkJobBase",
    "failure_error",
    "ordered_results",
    "quietly",
    "sum_metrics",
]

log = logging.getLogger("slipstream.spark")

#: The one job-id source of the Spark engine (batch, streaming and micro-batch jobs).
_ids = itertools.count(1)


class JobHost(Protocol):
    """The engine as its jobs see it."""

    spark_context: Any
    session: Any

    def shape(self) -> tuple[int, int]:
        """``(member count, default local parallelism)``, read once per job."""

    def services_broadcast(self) -> Any:
        """The driver's lists and maps for executors (a broadcast), or ``None``."""

    def merge_results(self, results: list[dict[str, Any]]) -> None:
        """Apply the tasks' list/map changes to the driver's lists and maps."""

    def set_dataframes(self, frames: Mapping[str, tuple[Any, Any, Any]]) -> None:
        """Record the DataFrame sinks a job completed."""

    def trim_lists(self, names: Iterable[str], limit: int) -> None:
        """Keep only the newest ``limit`` items of the named lists."""


class SparkJobBase(JobHandle, StateQueries):
    """The job API every Spark job kind shares: ``id`` (one sequence for all kinds),
    ``name``, ``status``, ``join``, ``cancel`` (cancels the job's Spark job group, then
    :meth:`_stop`). ``suspend``/``resume``/``restart`` are not supported on Spark."""

    _kind = "job"
    _no_suspend = "is not supported for batch jobs on the Spark engine"

    def __init__(self, engine: JobHost, dag: DAG, config: JobConfig) -> None:
        self.id = next(_ids)
        self.engine = engine
        self.dag = dag
        self.config = config
        self.name = config.name or f"{self._kind}-{self.id}"
        self.job_group = f"slipstream-{self._kind}-{self.id}-{uuid.uuid4().hex[:12]}"
        self._status = JobStatus.NOT_RUNNING
        self._lock = threading.Lock()
        self._terminal = threading.Event()
        self._cancel_requested = False
        self._error: JobFailedError | None = None
        self._metrics: dict[str, dict[str, int]] = {}
        #: signs the failure markers of this job's tasks (:mod:`slipstream.spark.failures`)
        self.failure_key = new_failure_key()
        self.submission_time = time.time()
        self.completion_time: float | None = None
        #: warns about items the windows drop as late (from the counts the tasks return)
        self.late_items = LateItemsReport(self.name, log, batch=self._is_batch())
        #: items set aside under on_item_error, per vertex (from the tasks' counts)
        self._skipped: dict[str, int] = {}

    def _is_batch(self) -> bool:
        """A batch job that let its watermarks flow (``batch_watermarks=True``): the
        late-item warning then says that the default keeps every item."""
        return False

    def _report_late(self, results: list[dict[str, Any]], warn: bool = True) -> None:
        """Feed the late items the tasks of ``results`` dropped to :attr:`late_items`,
        and count the items they set aside under ``on_item_error``."""
        for r in results:
            count = r["metrics"].get(LATE_METRIC, 0)
            if count:
                self.late_items.add(r["vertex"], count, warn=warn)
            skipped = r["metrics"].get(SKIPPED_METRIC, 0)
            if skipped:
                self._skipped[r["vertex"]] = self._skipped.get(r["vertex"], 0) + skipped

    def _finish_reports(self) -> None:
        """At the job's end: the late-item total, and one WARNING with the items set aside
        under ``on_item_error`` (the tasks return counts only: the items themselves are
        in the dead-letter sink, if the policy is one)."""
        self.late_items.finish()
        if self._skipped:
            total = sum(self._skipped.values())
            per_vertex = ", ".join(f"vertex {v!r}: {n}" for v, n in sorted(self._skipped.items()))
            log.warning(
                "job %r skipped %d %s on which user code raised (%s). See "
                "docs/troubleshooting.md",
                self.name,
                total,
                "item" if total == 1 else "items",
                per_vertex,
            )

    def _join_error(self) -> JobFailedError:
        assert self._error is not None
        return self._error

    def spark_stages(self, limit: int = 8) -> list[dict[str, Any]]:
        """The newest ``limit`` Spark stages of this job (its job group), with their task
        counts, from Spark's status tracker: what a watcher can know while tasks run."""
        try:
            tracker = self.engine.spark_context.statusTracker()
            stages: list[dict[str, Any]] = []
            for jid in tracker.getJobIdsForGroup(self.job_group):
                info = tracker.getJobInfo(jid)
                for sid in info.stageIds if info is not None else ():
                    st = tracker.getStageInfo(sid)
                    if st is not None:
                        stages.append(
                            {
                                "id": int(sid),
                                "name": str(st.name),
                                "tasks_done": int(st.numCompletedTasks),
                                "tasks_active": int(st.numActiveTasks),
                                "tasks_failed": int(st.numFailedTasks),
                                "tasks_total": int(st.numTasks),
                            }
                        )
        except Exception:  # noqa: BLE001 - a watcher never fails the job (context gone)
            return []
        stages.sort(key=lambda x: x["id"])
        return stages[-limit:]

    def _failure(self, error: BaseException) -> JobFailedError:
        return failure_error(self.name, error, self.failure_key)

    def _finish(self, error: BaseException | None) -> None:
        """End the job after its driver thread's work (``error`` is ``None`` on success)."""
        raise NotImplementedError

    def _finish_or_die(self, error: BaseException | None) -> None:
        """``_finish``, from the job's driver thread; a failure while finishing still
        fails the job, so ``join()`` returns."""
        try:
            self._finish(error)
        except BaseException as exc:  # noqa: BLE001 - join() must return, whatever failed
            self._thread_died(exc)

    def _thread_died(self, exc: BaseException) -> None:
        """A driver-side thread of the job failed unexpectedly: fail the job, so
        ``join()`` returns."""
        log.error("job %s: the driver thread died", self.name, exc_info=exc)
        self._error = thread_died_error(self.name, threading.current_thread().name, exc)
        self._status = JobStatus.FAILED
        self._terminal.set()

    def cancel(self) -> None:
        """Cancel the job's Spark job group; ``join()`` then raises ``JobCancelledError``."""
        with self._lock:
            if self._status.is_terminal or self._cancel_requested:
                return
            self._cancel_requested = True
        try:
            self.engine.spark_context.cancelJobGroup(self.job_group)
        except Exception:  # noqa: BLE001 - the context may already be stopped
            log.debug("cancelJobGroup failed", exc_info=True)
        self._stop()

    def _stop(self) -> None:
        """Whatever else stops the job after ``cancel()``."""

    def _start(self) -> None:
        raise NotImplementedError

    def suspend(self) -> None:
        raise NotImplementedError(f"suspend() {self._no_suspend}")

    def resume(self) -> None:
        raise NotImplementedError(f"resume() {self._no_suspend}")

    def restart(self) -> None:
        raise NotImplementedError(f"restart() {self._no_suspend}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id}, name={self.name!r}, status={self._status.value})"
        )


class SparkJob(SparkJobBase):
    """A batch job on the Spark engine: ``join``, ``cancel``, ``status``, ``metrics``,
    ``id``.

    ``metrics`` (per vertex: ``items_in``, ``items_out`` and the processors' own
    counters) is filled when the job completes; Spark reports nothing per processor
    while tasks run.
    """

    def __init__(self, engine: JobHost, dag: DAG, config: JobConfig) -> None:
        super().__init__(engine, dag, config)
        self._compiled: CompiledDag | None = None

    def _is_batch(self) -> bool:
        return self.config.batch_watermarks and all_sources_bounded(self.dag)
        self._broadcast: Any = None
        self._thread: threading.Thread | None = None

    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        return {k: dict(v) for k, v in self._metrics.items()}

    def watch(self) -> dict[str, Any]:
        """See :meth:`JobHandle.watch`: a batch job on Spark reports its parallelism, its
        Spark stages' task progress and its error; its counters arrive when it completes."""
        out: dict[str, Any] = {"stages": self.spark_stages()}
        compiled = self._compiled
        if compiled is not None:
            out["parallelism"] = dict(compiled.total_parallelism)
        if self._error is not None:
            out["error"] = str(self._error)
        return out

    def _start(self) -> None:
        from pyspark import InheritableThread

        engine = self.engine
        self._status = JobStatus.STARTING
        members, lp = engine.shape()
        self._broadcast = engine.services_broadcast()
        try:
            self._compiled = compile_dag(
                engine.spark_context,
                self.dag,
                self.config,
                job_name=self.name,
                member_count=members,
                default_parallelism=lp,
                addresses=member_addresses(members),
                services=self._broadcast,
                failure_key=self.failure_key,
            )
        except BaseException:
            self._status = JobStatus.FAILED
            self._release()
            self._terminal.set()
            raise
        self._thread = InheritableThread(target=self._run, name=f"slipstream-spark-{self.name}")
        self._thread.daemon = True
        self._thread.start()

    def _run(self) -> None:
        compiled = self._compiled
        assert compiled is not None
        sc = self.engine.spark_context
        error: BaseException | None = None
        try:
            sc.setJobGroup(self.job_group, f"slipstream job {self.name!r}", interruptOnCancel=True)
            with self._lock:
                if self._cancel_requested:
                    raise _CancelledBeforeStart()
                self._status = JobStatus.RUNNING
            records = compiled.result_rdd.collect()
            self._status = JobStatus.COMPLETING
            results = ordered_results(compiled, [payload for _t, (_tag, payload) in records])
            write_all(self.engine.session, compiled, None)
            self.engine.merge_results(results)
            self._metrics = sum_metrics(results, compiled.order)
            # the counts arrive with the results: one warning, with the total
            self._report_late(results, warn=False)
            self._finish_reports()
            self.engine.set_dataframes(compiled.dataframes)
        except BaseException as exc:  # noqa: BLE001 - reported through join()
            error = exc
        finally:
            self._finish_or_die(error)

    def _finish(self, error: BaseException | None) -> None:
        compiled = self._compiled
        if compiled is not None:
            for name, meta in compiled.meta_suppliers:
                try:
                    meta.close(error)
                except Exception:  # noqa: BLE001 - close errors are only logged
                    log.exception("closing the meta-supplier of %s failed", name)
        keep = set()
        if error is None and compiled is not None:
            keep = {id(entry[2]) for entry in compiled.dataframes.values()}
        self._release(keep)
        self.completion_time = time.time()
        if error is None:
            self._status = JobStatus.COMPLETED
        elif self._cancel_requested:
            self._status = JobStatus.CANCELLED
        else:
            self._error = self._failure(error)
            self._status = JobStatus.FAILED
        self._terminal.set()

    def _release(self, keep: set[int] | None = None) -> None:
        compiled = self._compiled
        if compiled is not None:
            for rdd in compiled.persisted:
                if keep is None or id(rdd) not in keep:
                    unpersist(rdd)
        if self._broadcast is not None:
            quietly(self._broadcast.unpersist)
            self._broadcast = None


class _CancelledBeforeStart(Exception):
    pass


def write_all(session: Any, compiled: CompiledDag, epoch_id: int | None) -> None:
    """Write the rows of every writing DataFrame sink of a finished run."""
    for name, sink in compiled.writers.items():
        write_rows(session, compiled.dataframes[name][0], sink, epoch_id)


def quietly(fn: Any) -> None:
    """Call ``fn`` for cleanup; errors (e.g. a stopped context) are only logged."""
    try:
        fn()
    except Exception:  # noqa: BLE001 - cleanup only
        log.debug("cleanup failed", exc_info=True)


def unpersist(rdd: Any) -> None:
    quietly(lambda: rdd.unpersist(blocking=False))


def ordered_results(compiled: CompiledDag, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per processor, in topological then index order (a missing one is an
    engine bug: every task yields exactly one)."""
    by_key = {(p["vertex"], p["index"]): p for p in payloads}
    ordered: list[dict[str, Any]] = []
    for name in compiled.order:
        n = compiled.total_parallelism[name]
        missing = [i for i in range(n) if (name, i) not in by_key]
        if missing:
            raise RuntimeError(
                f"vertex {name!r}: no result from processors {missing[:10]}; this is a "
                "bug in the Spark engine"
            )
        ordered.extend(by_key[(name, i)] for i in range(n))
    return ordered


def failure_error(job_name: str, error: BaseException, failure_key: bytes) -> JobFailedError:
    """Map an exception from a Spark action to :class:`JobFailedError`.

    A processor's failure (a marker in the Spark error text signed with the job's
    ``failure_key``) names its vertex and index and chains the processor's exception,
    decoded as plain data. Executors that cannot run the job at all (wrong Python, a
    module they lack) give one line naming the cause and the fix, without the Java
    trace; any other Spark failure gives its real exception line."""
    if isinstance(error, JobFailedError):
        return error
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - py4j may fail to render a Java exception
        text = repr(error)
    info = find_failure(text, failure_key)
    if info is not None:
        err = JobFailedError(
            f"job {job_name!r} failed: {info.describe()}",
            vertex=info.vertex,
            processor_index=info.processor_index,
            cause=info.error,
            remote_traceback=info.traceback,
        )
        err.__cause__ = info.error
        return err
    problem = environment_problem(text)
    if problem is not None:
        err = JobFailedError(f"job {job_name!r} cannot run on Spark: {problem}", cause=error)
        err.__suppress_context__ = True  # the Java trace says no more than the message
        return err
    err = JobFailedError(
        f"job {job_name!r} failed in Spark: {summarize_spark_error(text)}",
        cause=error,
    )
    err.__cause__ = error
    return err


def sum_metrics(results: list[dict[str, Any]], order: list[str]) -> dict[str, dict[str, int]]:
    """Per-vertex sums of the tasks' metrics, plus the job's ``__job__`` counters."""
    out: dict[str, dict[str, int]] = {name: {"items_in": 0, "items_out": 0} for name in order}
    for r in results:
        m = out[r["vertex"]]
        for k, v in r["metrics"].items():
            m[k] = m.get(k, 0) + v
    # as on the embedded engine; a batch job on Spark never restarts or snapshots
    # (Spark retries failed tasks itself)
    out["__job__"] = {"restarts": 0, "snapshots": 0, "resumed_from_snapshot": 0}
    return out
