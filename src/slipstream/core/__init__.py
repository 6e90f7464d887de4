"""The model both engines share: DAG, vertices, edges, processors, inbox/outbox,
suppliers, special items, configuration and errors."""

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
from slipstream.core.items import IDLE_MESSAGE, SnapshotBarrier, Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.core.suppliers import (
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)

__all__ = [
    "DAG",
    "Edge",
    "Vertex",
    "RoutingPolicy",
    "JobConfig",
    "JobStatus",
    "ProcessingGuarantee",
    "DagError",
    "JobCancelledError",
    "JobFailedError",
    "SlipstreamError",
    "SnapshotError",
    "SnapshotStoreDamagedError",
    "SnapshotStoreInUseError",
    "Inbox",
    "Outbox",
    "Processor",
    "AbstractProcessor",
    "Context",
    "Watermark",
    "SnapshotBarrier",
    "IDLE_MESSAGE",
    "MemberAddress",
    "ProcessorMetaSupplier",
    "ProcessorSupplier",
    "SupplierContext",
]
