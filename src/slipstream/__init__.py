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

import importlib
from typing import TYPE_CHECKING, Any

from slipstream.core.config import JobConfig, JobStatus, ProcessingGuarantee
from slipstream.core.dag import DAG, Edge, RoutingPolicy, Vertex
from slipstream.core.errors import (
    DagError,
    JobCancelledError,
    JobFailedError,
    SlipstreamError,
    SnapshotError,
    SnapshotStoreDamagedError,
    SnapshotStoreInUseError,
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
from slipstream.pipeline import Pipeline

__version__ = "0.1.0"


def entry_key(entry: tuple[Any, Any]) -> Any:
    """The key of a ``(key, value)`` result."""
    return entry[0]


def entry_value(entry: tuple[Any, Any]) -> Any:
    """The value of a ``(key, value)`` result."""
    return entry[1]


def local(cooperative_threads: int | None = None, members: int = 1, **kwargs: Any) -> LocalEngine:
    """The embedded engine (one process, cooperative worker threads)."""
    return LocalEngine(cooperative_threads=cooperative_threads, members=members, **kwargs)


if TYPE_CHECKING:
    from slipstream.spark.engine import SparkEngine


def spark_engine(spark_session: Any = None, **kwargs: Any) -> SparkEngine:
    """The Spark engine (needs ``pip install 'slipstream[spark]'`` and Java); also
    ``ss.spark(...)``. See :class:`slipstream.spark.engine.SparkEngine` for the
    arguments."""
    from slipstream.spark.engine import SparkEngine

    return SparkEngine(spark_session, **kwargs)


# The package slipstream.spark (the engine's modules) and the factory ss.spark are two
# things with one name. Importing a package binds it as an attribute of its parent the
# first time only, so the (pyspark-free) package is imported here first and the name is
# then bound to the factory for good: ss.spark(...) is always the plain function, and
# `from slipstream.spark.engine import SparkEngine` / `from slipstream.spark import io`
# reach the package through the import system as usual.
importlib.import_module("slipstream.spark")
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
    "JobCancelledError",
    "SlipstreamError",
    "SnapshotError",
    "SnapshotStoreDamagedError",
    "SnapshotStoreInUseError",
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
