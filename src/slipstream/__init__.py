"""slipstream: a Python dataflow engine for batch and stream processing.

Chain operators on a :class:`Pipeline` (or wire a :class:`DAG` of vertices and edges
yourself), then run it on the embedded engine (``ss.local()``) or on Apache Spark
(``ss.spark(session)``)::

    import slipstream as ss
    p = ss.Pipeline()
    p.read_from(source).flat_map(str.split).group_by(str).aggregate(counting()).write_to(sink)
    engine = ss.local()
    job = engine.new_job(p, ss.JobConfig(name="wordcount"))
    job.join()
"""

from __future__ import annotations

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms)

# Public names, imported on first use (slipstream/_lazy.py says why): `import slipstream`
# costs a few milliseconds, and a job pays only for the modules it uses.
_EXPORTS = {
    "JobConfig": "slipstream.core.config:JobConfig",
    "JobStatus": "slipstream.core.config:JobStatus",
    "ProcessingGuarantee": "slipstream.core.config:ProcessingGuarantee",
    "DAG": "slipstream.core.dag:DAG",
    "Edge": "slipstream.core.dag:Edge",
    "RoutingPolicy": "slipstream.core.dag:RoutingPolicy",
    "Vertex": "slipstream.core.dag:Vertex",
    "DagError": "slipstream.core.errors:DagError",
    "JobCancelledError": "slipstream.core.errors:JobCancelledError",
    "JobCompletedError": "slipstream.core.errors:JobCompletedError",
    "JobFailedError": "slipstream.core.errors:JobFailedError",
    "KeyFunctionError": "slipstream.core.errors:KeyFunctionError",
    "SlipstreamError": "slipstream.core.errors:SlipstreamError",
    "SinkCommitError": "slipstream.core.errors:SinkCommitError",
    "SinkUnavailableError": "slipstream.core.errors:SinkUnavailableError",
    "SnapshotError": "slipstream.core.errors:SnapshotError",
    "SnapshotStoreDamagedError": "slipstream.core.errors:SnapshotStoreDamagedError",
    "SnapshotStoreInUseError": "slipstream.core.errors:SnapshotStoreInUseError",
    "SnapshotStoreRolledBackError": "slipstream.core.errors:SnapshotStoreRolledBackError",
    "SnapshotStalledError": "slipstream.core.errors:SnapshotStalledError",
    "Inbox": "slipstream.core.inbox:Inbox",
    "Watermark": "slipstream.core.items:Watermark",
    "Outbox": "slipstream.core.outbox:Outbox",
    "AbstractProcessor": "slipstream.core.processor:AbstractProcessor",
    "Context": "slipstream.core.processor:Context",
    "Processor": "slipstream.core.processor:Processor",
    "MemberAddress": "slipstream.core.suppliers:MemberAddress",
    "ProcessorMetaSupplier": "slipstream.core.suppliers:ProcessorMetaSupplier",
    "ProcessorSupplier": "slipstream.core.suppliers:ProcessorSupplier",
    "SupplierContext": "slipstream.core.suppliers:SupplierContext",
    "Job": "slipstream.engine.job:Job",
    "LocalEngine": "slipstream.engine.local:LocalEngine",
    "Pipeline": "slipstream.pipeline.stages:Pipeline",
    # the library modules (docs/guide.md): `ss.sources.items(...)` works after `import slipstream`
    **{
        name: f"slipstream.{name}"
        for name in (
            "aggregate", "core", "engine", "pipeline", "processors", "sinks", "sources",
            "state", "testing", "watermark", "window",
        )
    },
}
_lazy.install(__name__, _EXPORTS)
# Old paths of the modules that moved into the state layer (issue 22): snapshot files
# written before the move name their classes by them, and custom processors import the
# snapshot keys from the first. Served by the package root, so that core/ keeps no
# import of state/ (slipstream/_lazy.py, install_moved).
_lazy.install_moved(
    {
        "slipstream.core.snapshot_keys": "slipstream.state.keys",
        "slipstream.engine.snapshot_store": "slipstream.state.store",
    }
)

if TYPE_CHECKING:
    from typing import Any

    # the library modules (as-aliases: re-exported names, not part of __all__)
    from slipstream import aggregate as aggregate
    from slipstream import core as core
    from slipstream import engine as engine
    from slipstream import pipeline as pipeline
    from slipstream import processors as processors
    from slipstream import sinks as sinks
    from slipstream import sources as sources
    from slipstream import state as state
    from slipstream import testing as testing
    from slipstream import watermark as watermark
    from slipstream import window as window
    from slipstream.core.config import JobConfig, JobStatus, ProcessingGuarantee
    from slipstream.core.dag import DAG, Edge, RoutingPolicy, Vertex
    from slipstream.core.errors import (
        DagError,
        JobCancelledError,
        JobCompletedError,
        JobFailedError,
        KeyFunctionError,
        SinkCommitError,
        SinkUnavailableError,
        SlipstreamError,
        SnapshotError,
        SnapshotStalledError,
        SnapshotStoreDamagedError,
        SnapshotStoreInUseError,
        SnapshotStoreRolledBackError,
    )
    from slipstream.core.inbox import Inbox
    from slipstream.core.items import Watermark
    from slipstream.core.outbox import Outbox
    from slipstream.core.processor import AbstractProcessor, Context, Processor
    from slipstream.core.suppliers import (
        MemberAddress,
        ProcessorMetaSupplier,
        ProcessorSupplier,
        SupplierContext,
    )
    from slipstream.engine.job import Job
    from slipstream.engine.local import LocalEngine
    from slipstream.pipeline.stages import Pipeline
    from slipstream.spark.engine import SparkEngine

__version__ = "0.1.0"


def entry_key(entry: tuple[Any, Any]) -> Any:
    """The key of a ``(key, value)`` result."""
    return entry[0]


def entry_value(entry: tuple[Any, Any]) -> Any:
    """The value of a ``(key, value)`` result."""
    return entry[1]


def local(cooperative_threads: int | None = None, members: int = 1, **kwargs: Any) -> LocalEngine:
    """The embedded engine (one process, cooperative worker threads).

    ``cooperative_threads`` worker threads run the cooperative processors (default: 1
    on a Python with the GIL, else one per CPU); it is also the default local
    parallelism. On a Python with the GIL, ``cooperative_threads`` > 1 runs as 1 and
    warns (a ``GilThreadsWarning``): only one thread runs Python at a time, and a second
    worker thread made pure-Python jobs slower, never faster (docs/performance.md).
    ``allow_gil_threads=True`` (or ``SLIPSTREAM_ALLOW_GIL_THREADS=1``) runs the threads
    anyway, for processors that release the GIL. ``members=N`` simulates an N-member
    cluster. ``processes=N`` (or ``"auto"``) runs a job's members in N OS processes, so a
    job uses N cores (docs/guide.md, "Member processes"). The other keyword arguments
    are :class:`~slipstream.engine.local.LocalEngine`'s.
    """
    from slipstream.engine.local import LocalEngine

    return LocalEngine(cooperative_threads=cooperative_threads, members=members, **kwargs)


def spark_engine(spark_session: Any = None, **kwargs: Any) -> SparkEngine:
    """The Spark engine (needs pyspark, ``pip install -e '.[spark]'`` in a checkout,
    and Java); also ``ss.spark(...)``. See :class:`slipstream.spark.engine.SparkEngine` for the
    arguments."""
    from slipstream.spark.engine import SparkEngine

    return SparkEngine(spark_session, **kwargs)


# The package slipstream.spark (the engine's modules) and the factory ss.spark are two
# things with one name: ss.spark(...) is always the plain function (a lazy package keeps
# its public names when a same-named submodule is imported, see slipstream/_lazy.py), and
# `from slipstream.spark.engine import SparkEngine` / `from slipstream.spark import io`
# reach the package through the import system as usual.
spark = spark_engine


__all__ = [
    "DAG",
    "Pipeline",
    "Vertex",
    "Edge",
    "RoutingPolicy",
    "Processor",
    "AbstractProcessor",
    "Inbox",
    "Outbox",
    "Context",
    "Watermark",
    "JobConfig",
    "ProcessingGuarantee",
    "Job",
    "JobStatus",
    "LocalEngine",
    "DagError",
    "JobFailedError",
    "KeyFunctionError",
    "JobCancelledError",
    "JobCompletedError",
    "SinkCommitError",
    "SinkUnavailableError",
    "SlipstreamError",
    "SnapshotError",
    "SnapshotStoreDamagedError",
    "SnapshotStoreInUseError",
    "SnapshotStalledError",
    "SnapshotStoreRolledBackError",
    "MemberAddress",
    "ProcessorMetaSupplier",
    "ProcessorSupplier",
    "SupplierContext",
    "entry_key",
    "entry_value",
    "local",
    "spark",
    "spark_engine",
]
