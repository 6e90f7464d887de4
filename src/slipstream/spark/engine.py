"""The Spark engine: ``ss.spark(session)`` runs a slipstream DAG on Apache Spark.

``engine.new_job(dag)`` validates the DAG (suppliers must pickle), compiles it to RDDs
(:mod:`slipstream.spark.compile`: one RDD per vertex, one partition per processor, each
processor driven by the embedded engine's ``ProcessorTasklet`` inside its Spark task)
and runs it from a driver thread under its own Spark job group, so ``join(timeout)`` and
``cancel()`` behave as on the embedded engine.

Members: a Spark "member" is a logical group of ``local_parallelism`` processors; it
equals the number of executors (1 in ``local[N]`` mode) unless ``members=`` says
otherwise. Spark decides where each task runs, so a member is not pinned to one
executor; meta-suppliers see one :class:`~slipstream.core.suppliers.MemberAddress` per
member (the same addresses the embedded engine uses). Default local parallelism is
Spark's default parallelism divided by the member count (at least 1). Member-local edges
between vertices of one processor per member never shuffle, so
``ss.spark(session, members=<task slots>, local_parallelism=1)`` is often the fastest
shape (bench/spark_wordcount.py).

A DAG with a ``spark_stream_source`` runs as a Structured Streaming query instead, one
epoch per micro-batch, with processor state carried between epochs
(:mod:`slipstream.spark.streaming`); ``new_job(dag, config, streaming=True)`` runs a DAG
over slipstream's own replayable sources the same way, as a micro-batch loop on the
driver.

Fault tolerance is Spark's: a failed task is retried (``spark.task.maxFailures``) and
lost shuffle output is recomputed from lineage, so processors should be deterministic
given their input. A processor exception that survives the retries fails the job with
:class:`slipstream.JobFailedError` naming the vertex and processor index.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Mapping, MutableMapping
from typing import Any

from slipstream.core.config import JobConfig, JobStatus
from slipstream.core.dag import DAG, as_dag
from slipstream.core.errors import JobFailedError
from slipstream.core.job_handle import JobHandle
from slipstream.core.services import InMemoryServices
from slipstream.engine.plan import member_addresses
from slipstream.spark.compile import CompiledDag, compile_dag
from slipstream.spark.failures import (
    environment_problem,
    find_failure,
    new_failure_key,
    summarize_spark_error,
    thread_died_error,
)
from slipstream.spark.io import SparkStreamSource

__all__ = ["SparkEngine", "SparkJob"]

log = logging.getLogger("slipstream.spark")
_ids = itertools.count(1)


def _active_context_exists() -> bool:
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None


def _executor_count(sc: Any) -> int:
    """Executors registered with the driver (0 in local mode, where the driver runs tasks)."""
    try:
        return int(sc._jsc.sc().getExecutorIds().size())
    except Exception:  # noqa: BLE001 - a private API; fall back to "unknown"
        return 0


class SparkEngine:
    """``ss.spark(spark_session=None, *, master=None, members=None, local_parallelism=None,
    conf=None, **spark_conf)``.

    Without a session one is created with
    :func:`slipstream.spark.session.create_session` (``master`` defaults to
    ``local[2]``; ``conf`` and ``spark_conf`` are Spark settings, e.g.
    ``**{"spark.executor.memory": "1g"}``). A session created here is stopped by
    ``shutdown()``; a session you pass in is left running.
    """

    def __init__(
        self,
        spark_session: Any = None,
        *,
        master: str | None = None,
        members: int | None = None,
        local_parallelism: int | None = None,
        conf: Mapping[str, str] | None = None,
        app_name: str = "slipstream",
        **spark_conf: Any,
    ) -> None:
        if members is not None and (not isinstance(members, int) or members < 1):
            raise ValueError(f"members must be an int >= 1, got {members!r}")
        if local_parallelism is not None and (
            not isinstance(local_parallelism, int) or local_parallelism < 1
        ):
            raise ValueError(f"local_parallelism must be an int >= 1, got {local_parallelism!r}")
        if spark_session is None:
            from slipstream.spark.session import create_session

            settings = {str(k): str(v) for k, v in (conf or {}).items()}
            settings.update({str(k): str(v) for k, v in spark_conf.items()})
            existing = _active_context_exists()
            spark_session = create_session(master or "local[2]", app_name, settings)
            # getOrCreate may hand back a session someone else started: never stop that
            self._owns_session = not existing
        else:
            if master is not None or conf or spark_conf:
                raise ValueError(
                    "ss.spark(): master/conf settings apply only when slipstream creates the "
                    "session; configure the SparkSession you passed in instead"
                )
            if not hasattr(spark_session, "sparkContext"):
                raise TypeError(
                    f"ss.spark() needs a pyspark SparkSession, got {type(spark_session).__name__}"
                )
            self._owns_session = False
        self.session = spark_session
        self.spark_context = spark_session.sparkContext
        self._members = members
        self._local_parallelism = local_parallelism
        self.services = InMemoryServices()
        self._merge_lock = threading.Lock()
        self._dataframes: dict[str, tuple[Any, Any, Any]] = {}
        self._jobs: list[Any] = []
        self._lock = threading.Lock()

    # -- cluster shape -----------------------------------------------------------------
    @property
    def member_count(self) -> int:
        """``members=`` if given, else the number of executors (1 in local mode)."""
        if self._members is not None:
            return self._members
        sc = self.spark_context
        if str(sc.master).startswith("local") and not str(sc.master).startswith("local-cluster"):
            return 1
        return max(1, _executor_count(sc))

    @property
    def default_local_parallelism(self) -> int:
        """Processors per member for vertices without an explicit local parallelism."""
        if self._local_parallelism is not None:
            return self._local_parallelism
        return max(1, int(self.spark_context.defaultParallelism) // self.member_count)

    # -- jobs --------------------------------------------------------------------------
    def new_job(
        self,
        dag: DAG | Any,
        config: JobConfig | None = None,
        *,
        checkpoint_location: str | None = None,
        trigger: Mapping[str, Any] | None = None,
        streaming: bool = False,
        epoch_ms: float | None = None,
    ) -> Any:
        """Validate and compile ``dag``, then start it; returns the running job.

        A DAG with a :func:`~slipstream.spark.io.spark_stream_source` runs as a streaming
        job (:class:`~slipstream.spark.streaming.SparkStreamingJob`): a Structured
        Streaming query with its checkpoint and slipstream's per-epoch processor state
        under ``checkpoint_location`` (default: ``config.snapshot_store`` if it is a path,
        else ``./.slipstream/spark-streaming/<job name>``); ``trigger`` is passed to
        ``DataStreamWriter.trigger`` (e.g. ``{"processingTime": "1 second"}``).

        ``streaming=True`` runs a DAG whose sources are slipstream's own replayable
        sources (``sources.generator``, ``sources.stream_files``, ...) as a micro-batch
        loop on the driver (:class:`~slipstream.spark.streaming.SparkMicroBatchJob`):
        each source processor emits for up to ``epoch_ms`` (default 1000) per epoch,
        state and source offsets are committed per epoch under ``checkpoint_location``
        (same default as above), and once every source has completed the DAG completes
        as a batch job would. Without it such a DAG runs as a batch job.

        Raises :class:`slipstream.DagError` here, before anything runs, for an invalid
        DAG or a supplier that cannot be pickled."""
        dag = as_dag(dag)  # a Pipeline is compiled here
        config = config or JobConfig()
        job: Any
        if any(isinstance(v.meta_supplier, SparkStreamSource) for v in dag.vertices):
            from slipstream.spark.streaming import SparkStreamingJob

            if epoch_ms is not None:
                raise ValueError(
                    "epoch_ms applies to micro-batch jobs (streaming=True over slipstream's "
                    "own sources); a spark_stream_source's micro-batches follow trigger"
                )
            job = SparkStreamingJob(self, dag, config, checkpoint_location, trigger)
        elif streaming:
            from slipstream.spark.streaming import DEFAULT_EPOCH_MS, SparkMicroBatchJob

            if trigger is not None:
                raise ValueError(
                    "trigger applies to DAGs with a spark_stream_source only; a micro-batch "
                    "job's epochs are epoch_ms long"
                )
            job = SparkMicroBatchJob(
                self,
                dag,
                config,
                checkpoint_location,
                DEFAULT_EPOCH_MS if epoch_ms is None else epoch_ms,
            )
        else:
            if checkpoint_location is not None or trigger is not None or epoch_ms is not None:
                raise ValueError(
                    "checkpoint_location, trigger and epoch_ms apply to streaming jobs (DAGs "
                    "with a spark_stream_source, or new_job(..., streaming=True)) only"
                )
            job = SparkJob(self, dag, config)
        job._start()
        with self._lock:
            self._jobs.append(job)
        return job

    @property
    def jobs(self) -> list[Any]:
        return list(self._jobs)

    def _shape(self) -> tuple[int, int]:
        """``(member count, default local parallelism)``, read once per job."""
        members = self.member_count
        if self._local_parallelism is not None:
            return members, self._local_parallelism
        return members, max(1, int(self.spark_context.defaultParallelism) // members)

    # -- results -----------------------------------------------------------------------
    def get_list(self, name: str) -> list[Any]:
        return self.services.get_list(name)

    def get_map(self, name: str) -> MutableMapping[Any, Any]:
        return self.services.get_map(name)

    def get_dataframe(self, name: str) -> Any:
        """The items of ``spark_dataframe_sink(name)`` from the latest job that ran it, as
        a DataFrame (the rows stay on the executors)."""
        entry = self._dataframes.get(name)
        if entry is None:
            known = sorted(self._dataframes)
            raise KeyError(
                f"no spark_dataframe_sink named {name!r} has completed on this engine "
                f"(known: {known})"
            )
        rows, schema, _vertex_rdd = entry
        if schema is None and rows.isEmpty():
            raise ValueError(
                f"spark_dataframe_sink {name!r} received no items and has no schema, so "
                "Spark cannot infer one; pass schema= to spark_dataframe_sink"
            )
        return self.session.createDataFrame(rows, schema)

    def _set_dataframes(self, frames: Mapping[str, tuple[Any, Any, Any]]) -> None:
        with self._merge_lock:
            for name, entry in frames.items():
                old = self._dataframes.get(name)
                self._dataframes[name] = entry
                if old is not None and old[2] is not entry[2]:
                    _unpersist(old[2])

    def _services_broadcast(self) -> Any:
        """The driver's lists and maps for executors, or ``None`` if there are none."""
        with self.services._lock:
            lists = {k: list(v) for k, v in self.services.lists.items() if v}
            maps = {k: dict(v) for k, v in self.services.maps.items() if v}
        if not lists and not maps:
            return None
        return self.spark_context.broadcast((lists, maps))

    def _merge_results(self, results: list[dict[str, Any]]) -> None:
        with self._merge_lock:
            for r in results:
                for name, items in r["lists"].items():
                    self.services.get_list(name).extend(items)
                for name, (updates, deleted) in r["maps"].items():
                    m = self.services.get_map(name)
                    m.update(updates)
                    for k in deleted:
                        m.pop(k, None)

    # -- lifecycle ---------------------------------------------------------------------
    def shutdown(self, stop_session: bool | None = None) -> None:
        """Cancel running jobs; stop the SparkSession if this engine created it (or if
        ``stop_session`` is true)."""
        for job in self.jobs:
            job.cancel()
        for job in self.jobs:
            job._terminal.wait(30)
        with self._merge_lock:
            for _rows, _schema, rdd in self._dataframes.values():
                _unpersist(rdd)
            self._dataframes.clear()
        stop = self._owns_session if stop_session is None else stop_session
        if stop:
            self.session.stop()

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"SparkEngine(master={self.spark_context.master!r}, members={self.member_count}, "
            f"local_parallelism={self.default_local_parallelism})"
        )


def _unpersist(rdd: Any) -> None:
    try:
        rdd.unpersist(blocking=False)
    except Exception:  # noqa: BLE001 - the context may be gone
        log.debug("unpersist failed", exc_info=True)


class SparkJob(JobHandle):
    """A job on the Spark engine: ``join``, ``cancel``, ``status``, ``metrics``, ``id``.

    ``metrics`` (per vertex: ``items_in``, ``items_out`` and the processors' own
    counters) is filled when the job completes; Spark reports nothing per processor
    while tasks run.
    """

    def __init__(self, engine: SparkEngine, dag: DAG, config: JobConfig) -> None:
        self.id = next(_ids)
        self.engine = engine
        self.dag = dag
        self.config = config
        self.name = config.name or f"job-{self.id}"
        self.job_group = f"slipstream-{self.id}-{uuid.uuid4().hex[:12]}"
        self._status = JobStatus.NOT_RUNNING
        self._lock = threading.Lock()
        self._terminal = threading.Event()
        self._cancel_requested = False
        self._error: JobFailedError | None = None
        self._metrics: dict[str, dict[str, int]] = {}
        self._compiled: CompiledDag | None = None
        self._broadcast: Any = None
        self._thread: threading.Thread | None = None
        self.failure_key = new_failure_key()
        self.submission_time = time.time()
        self.completion_time: float | None = None

    # -- public API --------------------------------------------------------------------
    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        return {k: dict(v) for k, v in self._metrics.items()}

    def _join_error(self) -> JobFailedError:
        assert self._error is not None
        return self._error

    def watch(self) -> dict[str, Any]:
        """See :meth:`JobHandle.watch`: a batch job on Spark reports its parallelism and
        error; its counters arrive when it completes."""
        out: dict[str, Any] = {}
        compiled = self._compiled
        if compiled is not None:
            out["parallelism"] = dict(compiled.total_parallelism)
        if self._error is not None:
            out["error"] = str(self._error)
        return out

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

    def suspend(self) -> None:
        raise NotImplementedError("suspend() is not supported for batch jobs on the Spark engine")

    def resume(self) -> None:
        raise NotImplementedError("resume() is not supported for batch jobs on the Spark engine")

    def restart(self) -> None:
        raise NotImplementedError("restart() is not supported for batch jobs on the Spark engine")

    def __repr__(self) -> str:
        return f"SparkJob(id={self.id}, name={self.name!r}, status={self._status.value})"

    # -- execution ---------------------------------------------------------------------
    def _start(self) -> None:
        from pyspark import InheritableThread

        engine = self.engine
        self._status = JobStatus.STARTING
        members, lp = engine._shape()
        self._broadcast = engine._services_broadcast()
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
            results = self._check_results(compiled, [payload for _t, (_tag, payload) in records])
            self.engine._merge_results(results)
            self._metrics = _sum_metrics(results, compiled.order)
            self.engine._set_dataframes(compiled.dataframes)
        except BaseException as exc:  # noqa: BLE001 - reported through join()
            error = exc
        finally:
            try:
                self._finish(error)
            except BaseException as exc:  # noqa: BLE001 - join() must return, whatever failed
                self._thread_died(exc)

    def _thread_died(self, exc: BaseException) -> None:
        log.error("job %s: the driver thread died", self.name, exc_info=exc)
        self._error = thread_died_error(self.name, threading.current_thread().name, exc)
        self._status = JobStatus.FAILED
        self._terminal.set()

    def _check_results(
        self, compiled: CompiledDag, payloads: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        return ordered_results(compiled, payloads)

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
            self._error = self._failure_error(error)
            self._status = JobStatus.FAILED
        self._terminal.set()

    def _release(self, keep: set[int] | None = None) -> None:
        compiled = self._compiled
        if compiled is not None:
            for rdd in compiled.persisted:
                if keep is None or id(rdd) not in keep:
                    _unpersist(rdd)
        if self._broadcast is not None:
            try:
                self._broadcast.unpersist()
            except Exception:  # noqa: BLE001
                log.debug("broadcast unpersist failed", exc_info=True)
            self._broadcast = None

    def _failure_error(self, error: BaseException) -> JobFailedError:
        return failure_error(self.name, error, self.failure_key)


class _CancelledBeforeStart(Exception):
    pass


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


def _sum_metrics(results: list[dict[str, Any]], order: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {name: {"items_in": 0, "items_out": 0} for name in order}
    for r in results:
        m = out[r["vertex"]]
        for k, v in r["metrics"].items():
            m[k] = m.get(k, 0) + v
    # as on the embedded engine; a batch job on Spark never restarts or snapshots
    # (Spark retries failed tasks itself)
    out["__job__"] = {"restarts": 0, "snapshots": 0}
    return out
