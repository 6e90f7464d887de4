"""The embedded engine (the driver): jobs and their executions, the local engine, the
cooperative workers, the snapshot coordinator. The kernel it runs is
:mod:`slipstream.execution`, its snapshots :mod:`slipstream.state`."""

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
# imported on first use (slipstream/_lazy.py says why)
_lazy.install(
    __name__,
    {
        "Job": "slipstream.engine.job:Job",
        "LocalEngine": "slipstream.engine.local:LocalEngine",
    },
)

if TYPE_CHECKING:
    from slipstream.engine.job import Job
    from slipstream.engine.local import LocalEngine

__all__ = ["Job", "LocalEngine"]
