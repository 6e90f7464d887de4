"""The model both engines share: DAG, vertices, edges, processors, inbox/outbox,
suppliers, special items, configuration and errors."""

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
# imported on first use (slipstream/_lazy.py says why)
_lazy.install(
    __name__,
    {
        "JobConfig": "slipstream.core.config:JobConfig",
        "JobStatus": "slipstream.core.config:JobStatus",
        "ProcessingGuarantee": "slipstream.core.config:ProcessingGuarantee",
        "DAG": "slipstream.core.dag:DAG",
        "Edge": "slipstream.core.dag:Edge",
        "RoutingPolicy": "slipstream.core.dag:RoutingPolicy",
        "Vertex": "slipstream.core.dag:Vertex",
        "DagError": "slipstream.core.errors:DagError",
        "JobCancelledError": "slipstream.core.errors:JobCancelledError",
        "JobFailedError": "slipstream.core.errors:JobFailedError",
        "SlipstreamError": "slipstream.core.errors:SlipstreamError",
        "SnapshotError": "slipstream.core.errors:SnapshotError",
        "SnapshotStoreDamagedError": "slipstream.core.errors:SnapshotStoreDamagedError",
        "SnapshotStoreInUseError": "slipstream.core.errors:SnapshotStoreInUseError",
        "Inbox": "slipstream.core.inbox:Inbox",
        "IDLE_MESSAGE": "slipstream.core.items:IDLE_MESSAGE",
        "SnapshotBarrier": "slipstream.core.items:SnapshotBarrier",
        "Watermark": "slipstream.core.items:Watermark",
        "Outbox": "slipstream.core.outbox:Outbox",
        "AbstractProcessor": "slipstream.core.processor:AbstractProcessor",
        "Context": "slipstream.core.processor:Context",
        "Processor": "slipstream.core.processor:Processor",
        "MemberAddress": "slipstream.core.suppliers:MemberAddress",
        "ProcessorMetaSupplier": "slipstream.core.suppliers:ProcessorMetaSupplier",
        "ProcessorSupplier": "slipstream.core.suppliers:ProcessorSupplier",
        "SupplierContext": "slipstream.core.suppliers:SupplierContext",
    },
)

if TYPE_CHECKING:
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
