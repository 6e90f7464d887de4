"""The Spark engine: ``ss.spark(session)`` runs a slipstream DAG on Apache Spark.

``engine.new_job(dag)`` validates the DAG (suppliers must pickle), compiles it to RDDs
(:mod:`slipstream.spark.compile`: one RDD per vertex, one partition per processor, each
processor driven by the embedded engine's ``ProcessorTasklet`` inside its Spark task)
and runs it from a driver thread under its own Spark job group, so ``join(timeout)`` and
``cancel()`` behave as on the embedded engine.

Members: a Spark "member" is a logical group of ``local_parallelism`` processors. Spark
decides where each task runs, so a member is not pinned to an executor; meta-suppliers
see one :class:`~slipstream.core.suppliers.MemberAddress` per member (the same addresses
the embedded engine uses). By default there is one member per task slot (Spark's
default parallelism) with local parallelism 1: every member-local edge between vertices
of default parallelism is then narrow (no shuffle; producer and consumer run pipelined
in one Python worker), which made word count about 2x faster than one member with local
parallelism 2 (bench/spark_wordcount.py, docs/performance.md). ``members=`` and
``local_parallelism=`` override this; given only one of them, the other is the task
slots divided by it (at least 1).

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

import logging
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from slipstream.core.config import JobConfig
from slipstream.core.dag import DAG, as_dag
from slipstream.core.dead_letters import with_dead_letters
from slipstream.core.services import InMemoryServices
from slipstream.spark.io import SparkStreamSource, spark_rows
from slipstream.spark.jobs import (
    SparkJob,
    SparkJobBase,
    failure_error,
    ordered_results,
    unpersist,
)
from slipstream.spark.shipping import ship_slipstream
from slipstream.spark.streaming import (
    DEFAULT_EPOCH_MS,
    DEFAULT_MAX_LIST_ITEMS,
    SparkMicroBatchJob,
    SparkStreamingJob,
)
from slipstream.spark.task import PickledList

__all__ = ["SparkEngine", "SparkJob", "failure_error", "ordered_results"]

log = logging.getLogger("slipstream.spark")


def _active_context_exists() -> bool:
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None


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
        # executors import this slipstream from a shipped zip, installed there or not
        ship_slipstream(self.spark_context)
        self._members = members
        self._local_parallelism = local_parallelism
        self.services = InMemoryServices()
        self._merge_lock = threading.Lock()
        self._dataframes: dict[str, tuple[Any, Any, Any]] = {}
        self._jobs: list[SparkJobBase] = []
        self._lock = threading.Lock()

    # -- cluster shape -----------------------------------------------------------------
    @property
    def task_slots(self) -> int:
        """Spark's default parallelism: the tasks the cluster runs at once."""
        return max(1, int(self.spark_context.defaultParallelism))

    @property
    def member_count(self) -> int:
        """``members=`` if given, else the task slots divided by ``local_parallelism=``
        (one member per slot when that is not given either)."""
        if self._members is not None:
            return self._members
        return max(1, self.task_slots // (self._local_parallelism or 1))

    @property
    def default_local_parallelism(self) -> int:
        """Processors per member for vertices without an explicit local parallelism:
        ``local_parallelism=`` if given, else the task slots divided by the members."""
        return self.shape()[1]

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
        max_list_items: int | None = DEFAULT_MAX_LIST_ITEMS,
        epoch_max_items: int | None = None,
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
        ``epoch_max_items`` also ends a source processor's epoch once it emitted that
        many items (about: checked between its polls), a bounded batch per epoch.

        In both kinds of streaming job a list sink keeps only its newest
        ``max_list_items`` items on the driver (``None``: all), so a long-running query
        does not grow the driver's memory; a map sink holds one entry per key. For
        output that must all be kept, use ``spark_dataframe_sink(name, path=...)``,
        which writes each epoch through a Spark writer, exactly once per epoch.

        Raises :class:`slipstream.DagError` here, before anything runs, for an invalid
        DAG or a supplier that cannot be pickled."""
        dag = as_dag(dag)  # a Pipeline is compiled here
        config = config or JobConfig()
        check_state_backend(dag, config)
        # the dead-letter vertices and edges compile to RDDs as any others (job.dag)
        dag = with_dead_letters(dag, config.on_item_error)
        job: SparkJobBase
        if any(isinstance(v.meta_supplier, SparkStreamSource) for v in dag.vertices):
            if epoch_ms is not None or epoch_max_items is not None:
                raise ValueError(
                    "epoch_ms and epoch_max_items apply to micro-batch jobs (streaming=True "
                    "over slipstream's own sources); a spark_stream_source's micro-batches "
                    "follow trigger"
                )
            job = SparkStreamingJob(self, dag, config, checkpoint_location, trigger, max_list_items)
        elif streaming:
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
                max_list_items,
                epoch_max_items,
            )
        else:
            if (
                checkpoint_location is not None
                or trigger is not None
                or epoch_ms is not None
                or epoch_max_items is not None
            ):
                raise ValueError(
                    "checkpoint_location, trigger, epoch_ms and epoch_max_items apply to "
                    "streaming jobs (DAGs with a spark_stream_source, or new_job(..., "
                    "streaming=True)) only"
                )
            job = SparkJob(self, dag, config)
        job._start()
        with self._lock:
            self._jobs.append(job)
        return job

    @property
    def jobs(self) -> list[SparkJobBase]:
        return list(self._jobs)

    def shape(self) -> tuple[int, int]:
        """``(member count, default local parallelism)``, read once per job."""
        members = self.member_count
        if self._local_parallelism is not None:
            return members, self._local_parallelism
        return members, max(1, self.task_slots // members)

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
        return self.session.createDataFrame(spark_rows(rows, schema), schema)

    def set_dataframes(self, frames: Mapping[str, tuple[Any, Any, Any]]) -> None:
        with self._merge_lock:
            for name, entry in frames.items():
                old = self._dataframes.get(name)
                self._dataframes[name] = entry
                if old is not None and old[2] is not entry[2]:
                    unpersist(old[2])

    def trim_lists(self, names: Iterable[str], limit: int) -> None:
        """Keep only the newest ``limit`` items of the named lists (a streaming job's
        bound on sink output held by the driver)."""
        with self._merge_lock:
            for name in names:
                lst = self.services.lists.get(name)
                if lst is not None and len(lst) > limit:
                    del lst[: len(lst) - limit]

    def services_broadcast(self) -> Any:
        """The driver's lists and maps for executors, or ``None`` if there are none."""
        with self.services._lock:
            lists = {k: list(v) for k, v in self.services.lists.items() if v}
            maps = {k: dict(v) for k, v in self.services.maps.items() if v}
        if not lists and not maps:
            return None
        return self.spark_context.broadcast((lists, maps))

    def merge_results(self, results: list[dict[str, Any]]) -> None:
        with self._merge_lock:
            for r in results:
                for name, items in r["lists"].items():
                    self.services.get_list(name).extend(PickledList.load(items))
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
                unpersist(rdd)
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


def check_state_backend(dag: DAG, config: JobConfig) -> None:
    """Refuse a disk-backed keyed state (``state_backend="sqlite"``, the job's or a
    vertex's): a Spark task's state lives in its task and is handed from epoch to epoch
    in memory, so the setting would be silently ignored."""
    named = [
        f"vertex {v.name!r}" for v in dag.vertices if v.get_state_backend() not in (None, "memory")
    ]
    if config.state_backend != "memory":
        named.insert(0, "JobConfig")
    if named:
        raise ValueError(
            f"state_backend='sqlite' ({', '.join(named)}) keeps keyed state on the embedded "
            f"engine's disk; the Spark engine keeps each task's state in memory. Run the job "
            f"on ss.local() for state beyond memory, or use state_backend='memory'"
        )
