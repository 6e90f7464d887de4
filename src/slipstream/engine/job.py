"""A job on the embedded engine: its executions and lifecycle.

A job runs as a sequence of *executions* (one plan, its tasklets and threads). With a
processing guarantee, an execution that fails is followed by a new one restored from
the last committed snapshot (``auto_restart``, up to ``max_restarts``, with exponential
back-off); ``suspend()`` takes a terminal snapshot and ends the execution, ``resume()``
starts a new one from it, ``restart()`` does both.

The snapshot store belongs to one submission of the job (``Job.execution_id``, a
random id written into every snapshot file and the manifest): a new submission never
restores or prunes another one's snapshots unless it asked to resume
(``JobConfig(resume=True)`` or ``restore_from=``). A resume checks that the store was not
rolled back, that ``resume=True`` continues the store of a job of the same name and that
the snapshot fits the DAG (:mod:`~slipstream.state.lineage`).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from slipstream.core.config import JobConfig, JobStatus, ProcessingGuarantee
from slipstream.core.dag import DAG
from slipstream.core.errors import (
    JobCancelledError,
    JobCompletedError,
    JobFailedError,
    SinkUnavailableError,
    SnapshotError,
    SnapshotStoreInUseError,
    SnapshotStoreRolledBackError,
)
from slipstream.core.item_errors import ItemErrorReport, on_item
from slipstream.core.job_handle import JobHandle
from slipstream.core.late_items import LateItemsReport
from slipstream.core.traits import all_sources_bounded
from slipstream.engine import gc_tuning
from slipstream.engine.ended import (
    EndedFigures,
    detach_contexts,
    freeze,
    progress_figures,
    vertex_figures,
    warning_figures,
)
from slipstream.engine.member_stats import merge_members_watch, watermarks_and_fill
from slipstream.engine.workers import (
    TaskletFailure,
    WorkerPool,
    close_tasklets,
    execution_state_dir,
    prepare_context,
    remove_state_dir,
    run_committed_closures,
)
from slipstream.execution.plan import build_vertex_plans, close_suppliers, wire
from slipstream.execution.tasklet import ProcessorTasklet
from slipstream.state.reader import StateQueries

if TYPE_CHECKING:
    from slipstream.engine.local import LocalEngine
    from slipstream.engine.snapshot import SnapshotCoordinator
    from slipstream.state.store import ChunkRef, DirectorySnapshotStore, SnapshotData

# The snapshot modules (the store, its signing, the coordinator) are imported where a job
# has a processing guarantee or restores: a job without one never needs them, and a short
# script does not pay for their imports.

log = logging.getLogger("slipstream.job")
_ids = itertools.count(1)

STORE_DRAIN_TIMEOUT_S = 60.0
"""How long the end of an execution waits for the snapshot being written to commit."""


class _Execution:
    """One run of the job's plan."""

    def __init__(self, job: Job, restore: SnapshotData | None) -> None:
        self.job = job
        self.failure: TaskletFailure | None = None
        self.cancelled = False
        self.finished = threading.Event()
        engine = job.engine
        config = job.config
        self.plans = build_vertex_plans(
            job.dag,
            config,
            engine.member_count,
            engine.default_parallelism,
            engine.services,
            job.name,
            job.item_errors,
            snapshots=job.store is not None or restore is not None,
        )
        specs = wire(job.dag, self.plans, config.processing_guarantee)
        self.coordinator: SnapshotCoordinator | None = None
        if job.store is not None:
            from slipstream.engine.snapshot import SnapshotCoordinator

            first = job.next_snapshot_id
            self.coordinator = SnapshotCoordinator(
                job.name,
                job.store,
                config.snapshot_interval_ms,
                first,
                {n: vp.total_parallelism for n, vp in self.plans.items()},
                on_commit=job._on_commit,
                on_error=self._on_snapshot_error,
                on_state_error=self._on_state_error,
                max_final_failures=(
                    config.max_snapshot_failures
                    if config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
                    else None
                ),
                on_fatal=self._on_fatal,
                stall_warning_s=config.stall_warning_s,
                stall_timeout_s=config.stall_timeout_s,
                on_stall=self._on_stall,
                snapshot_writer=config.snapshot_writer,
            )
        routed: dict[tuple[str, int], list[Any]] = {}
        completed: set[tuple[str, int]] = set()
        recovering: set[tuple[str, int]] = set()
        # processors restored from exactly their own chain in this job's store: their
        # keyed state continues it (a delta, not a full save, after the restore)
        continued: dict[tuple[str, int], list[ChunkRef]] = {}
        if restore is not None:
            from slipstream.state.lineage import check_same_dag, dag_shape
            from slipstream.state.restore import (
                custom_partitioners,
                recovering_completed,
                restore_plan,
            )

            own: set[tuple[str, int]] = set()
            routed, completed = restore_plan(
                restore, self.plans, custom_partitioners(job.dag), own
            )
            check_same_dag(restore, dag_shape(job.dag), config.allow_job_change)
            recovering = recovering_completed(restore, self.plans, completed)
            continued = _continued_chains(restore, job.store, own)
        self.tasklets: list[ProcessorTasklet] = []
        # disk-backed keyed state (state_backend="sqlite") of this execution: created by
        # the first such state, removed when the execution ends (_remove_state_dir)
        self.state_dir = state_dir = execution_state_dir(engine.work_dir, job.name)
        incremental = callable(getattr(job.store, "write_chunk", None))
        for s in specs:
            key = (s.vertex.vertex.name, s.global_index)
            prepare_context(s.context, s.vertex.vertex, config, state_dir, job.late_items.on_metric)
            if self.coordinator is not None:
                s.context.snapshot_interval_ms = config.snapshot_interval_ms
                # keyed state saves only what changed where the store keeps chains of
                # full and delta chunks (state/format.py); set before the processors' init
                s.context.incremental_snapshots = incremental
                s.context.snapshot_writer = config.snapshot_writer if incremental else "thread"
                # keyed state whose values are replaced, never changed in place, saves
                # copy-on-write, produced in steps by the tasklet (state/live.py)
                if incremental and s.context.snapshot_writer == "thread":
                    s.context.live_saves = []
                chain = continued.get(key) if incremental else None
                if chain is not None and restore is not None:
                    s.context.restored_snapshot_id = chain[-1].snapshot_id
                    s.context._restored_maps = _chain_maps(restore, key)
                    s.context._restored_states = []
            restore_entries = None
            if restore is not None and (key not in completed or key in recovering):
                restore_entries = routed.get(key, [])
            self.tasklets.append(
                ProcessorTasklet(
                    s.processor,
                    s.context,
                    s.inbound,
                    s.outbound,
                    guarantee=config.processing_guarantee,
                    snapshot_sink=self.coordinator,
                    restore_entries=restore_entries,
                    restore_completed=key in completed,
                    outbox_capacity=engine.outbox_capacity,
                )
            )
        if self.coordinator is not None:
            self.coordinator.attach(self.tasklets)
            if incremental:
                self.coordinator.continue_chains(continued)
        self.pool: WorkerPool | None = None

    def start(self) -> None:
        for t in self.tasklets:
            try:
                t.init()
            except BaseException as e:  # noqa: BLE001
                self.failure = TaskletFailure(t, e)
                self._close_all()
                self._remove_state_dir()
                self.finished.set()
                self.job._execution_ended(self)
                return
        if self.job.engine.tune_gc:
            gc_tuning.job_started()
            self._gc_tuned = True
        self.pool = WorkerPool(
            self.tasklets,
            self.job.engine.cooperative_threads,
            self._on_failure,
            self._on_workers_done,
            name=self.job.name,
            slow_call_s=self.job.engine.slow_call_ms / 1000.0,
            stop_grace_s=self.job.engine.stop_grace_ms / 1000.0,
            idle_spin_s=self.job.config.idle_spin_ms / 1000.0,
        )
        if self.coordinator is not None:
            self.coordinator.start_timer()
        self.pool.start()

    def stop(self) -> None:
        self.cancelled = True
        if self.coordinator is not None:
            self.coordinator.abort()  # a final snapshot being retried gives up
        for t in self.tasklets:
            t.cancelled = True
        if self.pool is not None:
            self.pool.stop()

    def _on_snapshot_error(self, error: BaseException) -> None:
        coordinator = self.coordinator
        assert coordinator is not None and self.job.store is not None
        n, limit = coordinator.consecutive_failures, self.job.config.max_snapshot_failures
        log.error(
            "job %s: snapshot failed (%d in a row, the job fails at %d; sources pause until "
            "a snapshot commits): %s",
            self.job.name,
            n,
            limit,
            error,
        )
        if n >= limit:
            from slipstream.engine.snapshot import store_failures_error

            e = store_failures_error(n, self.job.store.directory, error)
            self._on_failure(TaskletFailure(None, e, restartable=False))

    def _on_fatal(self, error: BaseException) -> None:
        """The job's final snapshot (or a terminal one) could not be written: the
        execution fails; a restart cannot fix the store."""
        self._on_failure(TaskletFailure(None, error, restartable=False))

    def _on_stall(self, error: BaseException) -> None:
        """No snapshot committed for ``stall_timeout_s``: the execution fails (a restart
        from the last committed snapshot may get it going again)."""
        log.error("job %s: %s", self.job.name, error)
        self._on_failure(TaskletFailure(None, error))

    def _on_state_error(self, tasklet: ProcessorTasklet, error: BaseException) -> None:
        """A processor saved state that cannot be encoded: it fails like the processor."""
        self._on_failure(TaskletFailure(tasklet, error))

    def _on_failure(self, failure: TaskletFailure) -> None:
        if self.failure is None:
            self.failure = failure
        self.stop()
        self.cancelled = False

    _gc_tuned = False

    def _on_workers_done(self) -> None:
        if self._gc_tuned:
            self._gc_tuned = False
            gc_tuning.job_ended()
        if self.coordinator is not None:
            if self.failure is None and not self.cancelled and not self.coordinator.terminal_committed:
                self._complete(self.coordinator)
            # a snapshot every processor saved still commits (its write is under way);
            # cancel() waits for it no longer than for a stuck processor
            self.coordinator.stop(
                timeout=self.job.engine.stop_grace_ms / 1000.0
                if self.cancelled
                else STORE_DRAIN_TIMEOUT_S
            )
            if self.failure is not None or self.cancelled:
                self._run_committed_closures(self.coordinator)
        if self.failure is not None or self.cancelled:
            self._close_all()
        error = self.failure.error if self.failure else None
        close_suppliers(self.plans, error)
        self._remove_state_dir()
        self.finished.set()
        self.job._execution_ended(self)

    def _remove_state_dir(self) -> None:
        remove_state_dir(self.state_dir)

    def _complete(self, coordinator: SnapshotCoordinator) -> None:
        """Wait for the job's completion to be recorded in the store (the final
        snapshot; the sinks commit their last output on their tasklets once it is
        published, so those with something to commit are still running until then).
        Under exactly-once nothing is committed unless that record is durable: when it
        cannot be written (retried like any snapshot, up to ``max_snapshot_failures``)
        the job fails, its last output uncommitted; a ``resume`` replays it once. Under
        at-least-once the output is committed in any case (a replay is allowed)."""
        try:
            coordinator.wait_final()
        except SnapshotError as e:
            if self.failure is None:  # a restart cannot fix the store
                self.failure = TaskletFailure(None, e, restartable=False)

    def _run_committed_closures(self, coordinator: SnapshotCoordinator) -> None:
        """The execution stopped (cancelled or failed): commit what the processors
        prepared for snapshots that committed (:func:`~slipstream.engine.workers.
        run_committed_closures`)."""
        run_committed_closures(
            self.tasklets,
            coordinator.commit_board,
            self.pool,
            self.failure.tasklet if self.failure is not None else None,
            self.job.engine.stop_grace_ms / 1000.0,
            self.job.name,
        )

    def _close_all(self) -> None:
        close_tasklets(self.tasklets, self.pool)

    #: the figures taken when the execution ended for good (:meth:`release`)
    ended: EndedFigures | None = None

    def release(self) -> None:
        """The execution ended for good (the job ended or was suspended, or a restart
        replaces it): keep the figures ``metrics``, ``watch()`` and the at-exit report
        read, and let go of the processors, their state, queues and contexts, so that
        they are freed now by reference counting, not at a full collection of the cyclic
        garbage collector (engine/ended.py). Called on the thread that ended it, after
        the workers stopped calling processors (a processor stuck in a call the pool gave
        up on is still held by its thread)."""
        if self.ended is not None:
            return
        self.ended = freeze(self.tasklets)
        detach_contexts(self.tasklets, self.pool.abandoned if self.pool is not None else [])
        self.tasklets = []
        for vp in self.plans.values():
            vp.processors = []
            vp.contexts = []
        if self.coordinator is not None:
            self.coordinator.release()
        if self.pool is not None:
            self.pool.release()
        if self.failure is not None:
            self.failure.release()
        # the job refers to its execution (job.metrics reads it): not back
        self.job = weakref.proxy(self.job)


class Job(JobHandle, StateQueries):
    """Handle of a submitted job: ``join``, ``cancel``, ``suspend``, ``resume``,
    ``restart``, ``status``, ``metrics``."""

    def __init__(
        self,
        engine: LocalEngine,
        dag: DAG,
        config: JobConfig,
        restore_from: Any = None,
    ) -> None:
        self.id = next(_ids)
        # held until the job ends, then only weakly (see ``engine``)
        self._engine: LocalEngine | None = engine
        self._engine_ref = weakref.ref(engine)
        self.dag = dag
        self.config = config
        self.name = config.name or f"job-{self.id}"
        self._status = JobStatus.NOT_RUNNING
        self._lock = threading.RLock()
        self._terminal = threading.Event()
        self._suspended = threading.Event()
        self._failure: TaskletFailure | None = None
        self._cancel_requested = False
        self._suspend_requested = False
        self._resume_after_suspend = False
        self._execution: _Execution | None = None
        self.restarts = 0
        self._restart_streak = 0  # restarts since the last committed snapshot
        self.next_snapshot_id = 1
        self._committed_here = False
        self.submission_time = time.time()
        self.completion_time: float | None = None
        #: unique id of this submission: the snapshot store belongs to it
        self.execution_id = os.urandom(16).hex()
        self.store: DirectorySnapshotStore | None = None
        self._restore_from = _load_snapshot(restore_from, config, self.name)
        #: every source is bounded (items, lists, files, SQL): a batch job
        self.bounded = all_sources_bounded(dag)
        #: warns about items the windows drop as late (never silently)
        self.late_items = LateItemsReport(
            self.name, log, batch=self.bounded and config.batch_watermarks
        )
        #: warns about items set aside by JobConfig.on_item_error
        self.item_errors = ItemErrorReport(self.name, log)
        if config.processing_guarantee is not ProcessingGuarantee.NONE:
            self.store = _make_store(
                config, engine.work_dir, self.name, f"{self.name}-{self.execution_id[:12]}"
            )
            self.store.lock()  # released when the job ends
            try:
                self._restore_from = self._claim_store(self.store, self._restore_from)
            except BaseException:
                self.store.unlock()
                raise
        #: the id of the snapshot this submission started from (0: it started fresh)
        self.resumed_from_snapshot = 0
        if self._restore_from is not None:
            self._report_resume(restore_from)

    @property
    def engine(self) -> LocalEngine:
        """The engine that runs the job. Once the job ended it refers to its engine only
        weakly (the engine lists the job in ``engine.jobs``): an engine the caller
        dropped goes by reference counting, with the lists and maps its sinks filled,
        instead of staying in a reference cycle with its jobs until a full collection
        (engine/ended.py)."""
        engine = self._engine if self._engine is not None else self._engine_ref()
        if engine is None:
            raise RuntimeError(f"job {self.name!r} has ended and its engine is gone")
        return engine

    # -- public API --------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the job; ``join()`` then raises ``JobCancelledError``."""
        with self._lock:
            if self._status.is_terminal:
                return
            self._cancel_requested = True
            ex = self._execution
            if ex is None or ex.finished.is_set():
                self._end(JobStatus.CANCELLED)
                return
        ex.stop()

    def suspend(self, timeout: float | None = 30.0) -> None:
        """Take a final snapshot and stop; ``resume()`` continues from it. Raises
        ``JobFailedError`` when that snapshot cannot be written (the job fails: a
        ``resume=True`` continues from the last snapshot that committed), and
        ``JobCompletedError`` when the job completed instead: its sources ended before
        the terminal snapshot could be taken (a batch job racing its end), so there is
        nothing to resume; the job's output is complete, ``join()`` returns."""
        with self._lock:
            if self.store is None:
                raise SnapshotError(
                    f"job {self.name!r} has no processing guarantee, so it cannot be suspended"
                )
            if self._status is JobStatus.COMPLETED:
                raise self._completed_first()
            if self._status is not JobStatus.RUNNING:
                raise RuntimeError(f"job {self.name!r} is {self._status.value}, not running")
            self._suspend_requested = True
            self._suspended.clear()
            ex = self._execution
        assert ex is not None and ex.coordinator is not None
        ex.coordinator.request(terminal=True)
        if not self._suspended.wait(timeout):
            raise TimeoutError(f"job {self.name!r} did not suspend within {timeout} s")
        # the terminal snapshot could not be written (the job failed), or it was cancelled
        if self._status is JobStatus.FAILED:
            raise self._join_error()
        if self._status is JobStatus.CANCELLED:
            raise JobCancelledError(f"job {self.name!r} was cancelled")
        # every processor had completed when the terminal snapshot was asked for (the
        # coordinator starts none then), or completed while a snapshot before it was in
        # flight: the execution ended as the job's end, not as a suspension
        if self._status is JobStatus.COMPLETED:
            raise self._completed_first()

    def _completed_first(self) -> JobCompletedError:
        return JobCompletedError(
            f"job {self.name!r} completed before it could be suspended (its sources ended "
            f"first): there is nothing to resume"
        )

    def resume(self) -> None:
        """Continue a suspended job from its terminal snapshot."""
        with self._lock:
            if self._status is not JobStatus.SUSPENDED:
                raise RuntimeError(f"job {self.name!r} is {self._status.value}, not suspended")
            self._start_execution(self._latest_snapshot(entries=self.engine.process_count == 1))

    def restart(self, timeout: float | None = 30.0) -> None:
        """Restart from a fresh terminal snapshot (or from scratch without a guarantee).
        ``JobCompletedError`` as for ``suspend()`` when the job completed first."""
        if self.store is None:
            with self._lock:
                ex = self._execution
                self._resume_after_suspend = True
            if ex is not None:
                ex.stop()
            return
        self.suspend(timeout)
        self.resume()

    @property
    def snapshot_error(self) -> str | None:
        """Why the last snapshot could not be written, while snapshots keep failing
        (``None`` when the last one committed). Sources are paused meanwhile."""
        ex = self._execution
        c = ex.coordinator if ex else None
        if c is not None and c.stall is not None and not c.consecutive_failures:
            return c.stall
        if c is None or not c.consecutive_failures or c.last_error is None:
            return None
        return (
            f"{c.consecutive_failures} snapshot(s) in a row could not be written "
            f"(the job fails at {self.config.max_snapshot_failures}): "
            f"{type(c.last_error).__name__}: {c.last_error}"
        )

    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        """Per vertex: ``items_in``, ``items_out`` and the processors' own counters (of
        the current execution), plus job-level ``__job__``: ``restarts``, ``snapshots``,
        ``resumed_from_snapshot`` (the id of the snapshot the job started from, 0 if none);
        with a processing guarantee ``snapshot_failures`` (consecutive; sources pause
        while it is not 0) and ``snapshot_failures_total``; once a snapshot committed,
        the figures of the last one, ``snapshot_duration_us`` (request to commit), ``snapshot_bytes``,
        ``snapshot_entries``, ``snapshot_pause_us`` (the longest time a processor spent
        saving it), with ``snapshot_duration_us_max``/``_mean``,
        ``snapshot_bytes_mean`` and ``snapshot_pause_us_max``; once a keyed state was
        saved copy-on-write (produced in steps after the barrier, state/live.py),
        ``snapshot_save_step_us_max`` (the longest such step). Sinks riding out a
        server outage: ``commit_retries`` (failed attempts of the current execution, also
        per vertex) and ``sink_unavailable_s`` (how long the longest outage under way has
        lasted, 0 when every sink reaches its server). With ``processes`` > 1 the vertices'
        figures are summed over the member processes, and ``__job__`` adds ``processes``,
        ``member_cpu_ms_max`` (the busiest member's CPU time), ``member_cpu_ms_total`` and
        ``member_peak_rss_kb_total`` (the members' peak resident sets, summed). With
        ``JobConfig.idle_spin_ms`` set, the worker threads' idle passes (of every member
        process with ``processes`` > 1): ``idle_spin_passes``, spent polling in its
        window, and ``idle_pauses``, followed by a sleep (the back-off); without it the
        keys are absent, so a default job's ``__job__`` has the Spark engine's keys."""
        ex = self._execution
        # the tasklets before the end's figures: release() sets those before it drops these
        tasklets = ex.tasklets if ex else []
        ended = getattr(ex, "ended", None)
        if ended is not None:  # the figures taken at the execution's end
            out = {v: dict(m) for v, m in ended.vertices.items()}
            retries, since = ended.commit_retries, ended.unavailable_since
        else:
            out, retries, since = vertex_figures(tasklets)
        for member in list(getattr(ex, "member_metrics", {}).values()):  # processes > 1
            for vertex, figures in member.items():
                m = out.setdefault(vertex, {"items_in": 0, "items_out": 0})
                for k, v in figures.items():
                    m[k] = m.get(k, 0) + v
        c = ex.coordinator if ex else None
        job = {
            "restarts": self.restarts,
            "snapshots": 0,
            "resumed_from_snapshot": self.resumed_from_snapshot,
        }
        pool = getattr(ex, "pool", None)
        spin = self.config.idle_spin_ms > 0
        if pool is not None and spin:  # the workers' idle passes (JobConfig.idle_spin_ms)
            job["idle_spin_passes"], job["idle_pauses"] = pool.idle_counts()
        if hasattr(ex, "member_usage"):  # processes > 1
            from slipstream.engine.processes import member_figures

            job.update(member_figures(ex, idle=spin))  # type: ignore[arg-type]
        if self.store is not None:  # the same keys as the Spark engine's without snapshots
            # a sink riding out its server's outage (two-phase commits need snapshots)
            job["commit_retries"] = retries
            job["sink_unavailable_s"] = int(time.monotonic() - since) if since is not None else 0
            job["snapshot_failures"] = c.consecutive_failures if c else 0
            job["snapshot_failures_total"] = c.failed_snapshots if c else 0
            # the progress watchdog: seconds the snapshot in flight has been stalled
            job["snapshot_stalled_s"] = int(c.stalled_s) if c is not None and c.stall else 0
            # the bytes of the store's files (manifests and chunks) after the last commit
            job["snapshot_store_bytes"] = c.store_bytes if c is not None else 0
            # chains of delta chunks merged into a full chunk in the background
            job["snapshot_compactions"] = c.compactions if c is not None else 0
        if c is not None:
            job.update(c.stats.as_metrics())
        out["__job__"] = job
        return out

    def watch(self) -> dict[str, Any]:
        """See :meth:`JobHandle.watch`. Reads counters the worker threads own without
        locks: each value is a recent one (never torn), which is what a watcher needs."""
        ex = self._execution
        out: dict[str, Any] = {"parallelism": {}, "watermarks": {}, "queue_fill": {}}
        if ex is None:
            return out
        out["parallelism"] = {n: vp.total_parallelism for n, vp in ex.plans.items()}
        # the tasklets before the end's figures: release() sets those before it drops these
        tasklets = ex.tasklets
        ended = getattr(ex, "ended", None)
        if ended is not None:  # the figures taken at the execution's end
            out["watermarks"], out["queue_fill"] = dict(ended.watermarks), dict(ended.queue_fill)
        else:
            out["watermarks"], out["queue_fill"] = watermarks_and_fill(tasklets)
        if hasattr(ex, "member_watch"):  # processes > 1: the members' figures
            out["watermarks"], out["queue_fill"] = merge_members_watch(ex.member_watch)
        failure = self._failure
        if ex.coordinator is not None and ex.coordinator.last_commit is not None:
            out["snapshot"] = dict(ex.coordinator.last_commit)
        if failure is not None:
            ft = failure.tasklet
            where = f"vertex {ft.vertex_name!r}, processor {ft.index}{on_item(failure.error)}: " if ft else ""
            out["error"] = f"{where}{type(failure.error).__name__}: {failure.error}"
        elif self.snapshot_error is not None:
            out["error"] = self.snapshot_error
        warnings = dict(ended.warnings) if ended is not None else warning_figures(tasklets)
        if warnings:
            out["warnings"] = warnings
        progress = dict(ended.progress) if ended is not None else progress_figures(tasklets)
        if progress:
            out["progress"] = progress
        if hasattr(ex, "member_usage"):  # processes > 1: per member, engine/member_stats.py
            from slipstream.engine.member_stats import member_rows

            out["members"] = member_rows(ex)
        return out

    def export_snapshot(self) -> SnapshotData | None:
        """The last committed snapshot (pass it as ``restore_from`` to a new job)."""
        return self._latest_snapshot()

    def __repr__(self) -> str:
        return f"Job(id={self.id}, name={self.name!r}, status={self._status.value})"

    # -- execution ---------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            self._start_execution(self._restore_from)

    def _claim_store(
        self, store: DirectorySnapshotStore, restore: SnapshotData | None
    ) -> SnapshotData | None:
        """Make ``store`` this submission's, returning what to restore from. Another
        submission's unfinished snapshots are used only when asked (``resume``,
        ``restore_from``); a finished submission's are removed on a fresh start."""
        from slipstream.state.lineage import (
            check_not_rolled_back,
            check_same_job,
            dag_shape,
            recorded_generation,
        )

        config = self.config
        owner = store.owner()
        if restore is None and config.resume and owner is not None and not owner.completed:
            if config.name is not None:  # a generated name differs in every process
                check_same_job(store.directory, owner.job, self.name, config.allow_job_change)
            restore = store.latest()  # raises if the store cannot prove what it committed
        if owner is not None and restore is None:
            if owner.execution == "?":
                raise SnapshotStoreInUseError(
                    f"snapshot store {store.directory} holds snapshot files that cannot be "
                    f"verified with its key ({store.key_origin}): written by an older "
                    f"slipstream, with another key, or damaged. Remove {store.directory} (or "
                    f"choose another snapshot_store) to start fresh, or pass the key that "
                    f"wrote them as JobConfig(snapshot_key=...) to resume."
                )
            if not owner.completed:
                raise SnapshotStoreInUseError(
                    f"snapshot store {store.directory} holds snapshots of an unfinished "
                    f"earlier submission (job {owner.job!r}, execution {owner.execution}). "
                    f"Pass JobConfig(resume=True) (or restore_from=) to continue from them, "
                    f"or start fresh with another snapshot_store (or after removing "
                    f"{store.directory})."
                )
            log.info(
                "job %s: snapshot store %s held a completed submission's snapshots; "
                "starting fresh",
                self.name,
                store.directory,
            )
            store.clear()
        if restore is not None or config.resume:
            generation = check_not_rolled_back(
                store.directory,
                self.name,
                (restore.snapshot_id, restore.job_name) if restore is not None else None,
                config.allow_rollback,
            )
        else:
            generation = recorded_generation(store.directory)
        store.bind(self.name, self.execution_id, dag_shape(self.dag))
        if restore is not None or owner is None:
            store.clean_up()
        # snapshot ids only grow in a store (its generation), also across submissions
        self.next_snapshot_id = max(max(store.file_ids(), default=0), generation) + 1
        return restore

    def _report_resume(self, spec: Any) -> None:
        """One visible line (a WARNING: a resumed job's output continues an earlier
        run's, which the user must know) and ``metrics["__job__"]["resumed_from_snapshot"]``."""
        data = self._restore_from
        assert data is not None
        self.resumed_from_snapshot = data.snapshot_id
        if spec is None:
            assert self.store is not None
            where = f"{os.path.abspath(self.store.directory)} (JobConfig(resume=True))"
        elif isinstance(spec, str | os.PathLike):
            where = f"{os.path.abspath(spec)} (restore_from=)"
        elif hasattr(spec, "directory"):
            where = f"{os.path.abspath(spec.directory)} (restore_from=)"
        else:
            where = f"the snapshot of job {data.job_name!r} passed as restore_from="
        other = (
            f" (written by job {data.job_name!r})"
            if data.job_name and data.job_name != self.name and not where.startswith("the snapshot")
            else ""
        )
        log.warning(
            "job %r: resuming from snapshot %d in %s%s", self.name, data.snapshot_id, where, other
        )

    def _start_execution(
        self, restore: SnapshotData | None, culprit: ProcessorTasklet | None = None
    ) -> None:
        """Start a new execution. If it cannot be built (a processor supplier raises, a
        snapshot does not fit the DAG) the job fails and releases its snapshot store
        before the error propagates: a job that never ran must not keep the store locked
        for the rest of the process (every later job on it was refused as "in use").
        ``culprit`` is the processor whose failure this execution restarts after."""
        self._status = JobStatus.STARTING if not self.restarts else JobStatus.RESTARTING
        if restore is not None:
            self.next_snapshot_id = max(self.next_snapshot_id, restore.snapshot_id + 1)
        self._suspend_requested = False
        try:
            if self.engine.process_count > 1:
                from slipstream.engine.processes import ProcessExecution

                ex: Any = ProcessExecution(self, restore)
            else:
                ex = _Execution(self, restore)
        except BaseException as e:
            self._failure = TaskletFailure(culprit, e, restartable=False)
            self._end(JobStatus.FAILED)
            raise
        self._execution = ex
        self._status = JobStatus.RUNNING
        ex.start()

    def _on_commit(self, data: SnapshotData) -> None:
        # keeps nothing of ``data``: holding a committed snapshot's entries (a full save is
        # a copy of the state) until the next commit cost a copy of the state in memory;
        # export_snapshot() reads the store
        self.next_snapshot_id = data.snapshot_id + 1
        self._committed_here = True
        self._restart_streak = 0

    def _latest_snapshot(self, entries: bool = True) -> SnapshotData | None:
        """What a restart restores: the newest snapshot this submission committed, else
        the one it started from. ``entries=False`` (member processes read the chunks
        themselves): the committed one's manifest only, its chunks verified."""
        if self.store is None:
            return None
        if not self._committed_here:
            return self._restore_from
        data = self.store.latest(entries=entries)
        if data is not None:  # the store may have been rolled back under the running job
            from slipstream.state.lineage import check_not_rolled_back

            check_not_rolled_back(
                self.store.directory,
                self.name,
                (data.snapshot_id, data.job_name),
                self.config.allow_rollback,
            )
        return data

    def _restart_delay(self) -> float:
        """Seconds before the next restart: doubles with each restart in a row."""
        c = self.config
        streak = self._restart_streak
        self._restart_streak += 1
        return min(c.restart_delay_max_ms, c.restart_delay_ms * 2.0 ** min(streak, 60)) / 1000.0

    def _restart_after_delay(self, ex: _Execution) -> None:
        with self._lock:
            if ex is not self._execution or self._status.is_terminal:
                return
            if self._cancel_requested:
                self._end(JobStatus.CANCELLED)
                return
            assert ex.failure is not None
            try:
                self._start_execution(
                    self._latest_snapshot(entries=self.engine.process_count == 1),
                    culprit=ex.failure.tasklet,
                )
            except BaseException as e:  # noqa: BLE001
                log.exception("job %s could not restart", self.name)
                if not self._status.is_terminal:  # reading the snapshot failed
                    self._failure = TaskletFailure(ex.failure.tasklet, e)
                    self._end(JobStatus.FAILED)

    def _execution_ended(self, ex: _Execution) -> None:
        # whatever comes next (the job's end, its suspension, a restart with a new
        # execution), this one is over: its processors and their state go now, before
        # join() returns (engine/ended.py)
        release = getattr(ex, "release", None)
        if release is not None:
            release()
        with self._lock:
            if ex is not self._execution:
                return
            if ex.coordinator is not None:
                self.next_snapshot_id = ex.coordinator.next_id
            if self._cancel_requested:
                self._end(JobStatus.CANCELLED)
                return
            if ex.failure is not None:
                if (
                    self.store is not None
                    and ex.failure.restartable
                    # a sink found the store rolled back: every restart would find it again;
                    # a sink's server was away for longer than the outage budget the user
                    # set (JobConfig.sink_outage_timeout): the job fails at the budget
                    and not isinstance(
                        ex.failure.error, (SnapshotStoreRolledBackError, SinkUnavailableError)
                    )
                    and self.config.auto_restart
                    and self.restarts < self.config.max_restarts
                ):
                    self.restarts += 1
                    delay = self._restart_delay()
                    t = ex.failure.tasklet
                    log.warning(
                        "job %s: %s failed (%s: %s); restart %d of %d from the last snapshot "
                        "in %.3f s",
                        self.name,
                        f"{t.vertex_name}#{t.index}{on_item(ex.failure.error)}" if t else "the job",
                        type(ex.failure.error).__name__,
                        ex.failure.error,
                        self.restarts,
                        self.config.max_restarts,
                        delay,
                    )
                    self._status = JobStatus.RESTARTING
                    timer = threading.Timer(delay, self._restart_after_delay, args=(ex,))
                    timer.daemon = True
                    timer.start()
                    return
                self._failure = ex.failure
                self._end(JobStatus.FAILED)
                return
            if ex.coordinator is not None and ex.coordinator.terminal_committed:
                self._status = JobStatus.SUSPENDED
                self._suspended.set()
                return
            if self._resume_after_suspend:
                self._resume_after_suspend = False
                self.restarts += 1
                try:
                    self._start_execution(None)  # on failure the job has ended FAILED
                except BaseException:  # noqa: BLE001 - join() reports it
                    log.exception("job %s could not restart", self.name)
                return
            self._end(JobStatus.COMPLETED)

    def _end(self, status: JobStatus) -> None:
        if self.store is not None:
            if status is JobStatus.COMPLETED and self._committed_here:
                try:
                    self.store.mark_completed()  # a later resume=True starts fresh
                except (OSError, SnapshotError) as e:
                    log.warning(
                        "job %s: could not mark its snapshot store completed: %s", self.name, e
                    )
            self.store.unlock()
        self.completion_time = time.time()
        self.late_items.finish()
        self.item_errors.finish()
        self._status = status
        self._engine = None  # weakly from now on (see ``engine``)
        self._terminal.set()
        self._suspended.set()

    def _join_error(self) -> JobFailedError:
        f = self._failure
        assert f is not None
        t = f.tasklet
        restarts = f" after {self.restarts} restart(s)" if self.restarts else ""
        member = getattr(t, "member", None)
        at = f", member {member}" if member is not None else ""
        where = f"vertex {t.vertex_name!r}, processor {t.index}{at}{on_item(f.error)}: " if t else ""
        err = JobFailedError(
            f"job {self.name!r} failed{restarts}: {where}{type(f.error).__name__}: {f.error}",
            vertex=t.vertex_name if t is not None else None,
            processor_index=t.index if t is not None else None,
            cause=f.error,
            remote_traceback=f.traceback,
        )
        err.__cause__ = f.error
        return err


def _make_store(
    config: JobConfig, work_dir: str, name: str, unique_name: str
) -> DirectorySnapshotStore:
    """The job's store. The default directory is ``<work_dir>/snapshots/<name>`` for a
    named job (so that ``resume=True`` finds it again) and a directory of its own for an
    unnamed one (its generated name is not stable across processes)."""
    from slipstream.state.store import DirectorySnapshotStore

    spec = config.snapshot_store
    if isinstance(spec, DirectorySnapshotStore):
        return spec
    if spec is None:
        leaf = name if config.name else unique_name
        spec = os.path.join(work_dir, "snapshots", leaf)
    if isinstance(spec, str | os.PathLike):
        return DirectorySnapshotStore(spec, key=config.snapshot_key)
    raise TypeError(f"snapshot_store must be a directory path or a DirectorySnapshotStore, got {spec!r}")


def _load_snapshot(spec: Any, config: JobConfig, job_name: str) -> SnapshotData | None:
    """``restore_from``: a SnapshotData, a store, or a store directory (its newest
    snapshot, checked not to be older than the store's recorded generation)."""
    if spec is None:
        return None
    from slipstream.state.lineage import check_not_rolled_back
    from slipstream.state.store import DirectorySnapshotStore, SnapshotData

    if isinstance(spec, SnapshotData):
        return spec
    store = (
        spec
        if isinstance(spec, DirectorySnapshotStore)
        else DirectorySnapshotStore(spec, key=config.snapshot_key)
    )
    data = store.latest()
    if data is None:
        raise SnapshotError(f"no committed snapshot found in {store.directory}")
    check_not_rolled_back(
        store.directory, job_name, (data.snapshot_id, data.job_name), config.allow_rollback
    )
    return data


def _continued_chains(
    restore: SnapshotData, store: DirectorySnapshotStore | None, own: set[tuple[str, int]]
) -> dict[tuple[str, int], list[ChunkRef]]:
    """The chains of ``own`` (processors restored from exactly their own chain) that this
    job's snapshots may continue: ``restore`` was read from ``store`` itself, where it is
    a committed snapshot whose chunk files are all there (a snapshot passed in as data, or
    read from another store, starts new chains)."""
    source = getattr(restore, "source", None)
    if not own or store is None or source is None:
        return {}
    directory, chains = source
    if directory != os.path.realpath(store.directory):
        return {}
    if restore.snapshot_id not in store.committed_ids():
        return {}
    out = {}
    for key in own:
        chain = chains.get(key)
        if chain and all(os.path.exists(os.path.join(store.directory, r.file)) for r in chain):
            out[key] = chain
    return out


def _chain_maps(restore: SnapshotData, key: tuple[str, int]) -> dict[Any, int]:
    """The keyed-state maps of processor ``key``'s merged chain: ``(tag, detail) -> size``."""
    from slipstream.state.keyed import StateMap

    vs = restore.vertices.get(key[0])
    entries = vs.entries.get(key[1], []) if vs is not None else []
    return {(k.tag, k.detail): len(v.upserts) for k, v in entries if type(k) is StateMap}

