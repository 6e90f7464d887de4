"""The embedded engine: execution plan, tasklets, queues, cooperative workers, jobs."""

from slipstream.engine.job import Job
from slipstream.engine.local import LocalEngine

__all__ = ["Job", "LocalEngine"]
