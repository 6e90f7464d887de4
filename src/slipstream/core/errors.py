"""The exceptions slipstream raises to users."""

from __future__ import annotations


class SlipstreamError(Exception):
    """Base class of every slipstream error."""


class DagError(SlipstreamError, ValueError):
    """The DAG is invalid; the message names the vertex, edge or ordinal at fault."""


class JobFailedError(SlipstreamError):
    """A job failed. ``vertex`` and ``processor_index`` name the processor that raised
    (``None`` when the failure was not a processor's); the original exception is chained
    as ``__cause__`` and kept in ``cause``."""

    def __init__(
        self,
        message: str,
        *,
        vertex: str | None = None,
        processor_index: int | None = None,
        cause: BaseException | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.vertex = vertex
        self.processor_index = processor_index
        self.cause = cause
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        text = super().__str__()
        if self.remote_traceback:
            text += "\n--- processor traceback ---\n" + self.remote_traceback
        return text


class JobCancelledError(SlipstreamError):
    """``join()`` on a job that was cancelled."""


class SnapshotError(SlipstreamError):
    """A snapshot could not be written, read or restored."""


class SqlError(SlipstreamError):
    """A query of the SQL source or a statement of the SQL sink failed; the message names
    the vertex and, for the sink, the failing row."""


class SnapshotStoreDamagedError(SnapshotError):
    """The snapshot store cannot prove what was committed (a committed snapshot is
    missing, corrupt or fails its signature check). Restoring an older snapshot would
    republish output, so the engine stops instead; the message says how to proceed."""


class SnapshotStoreInUseError(SnapshotError):
    """A snapshot store holds another execution's snapshots and the job did not ask to
    resume from them (``JobConfig(resume=True)`` or ``restore_from=``)."""


class KeyFunctionError(SlipstreamError, ValueError):
    """The key function (or the partitioner) of a partitioned edge raised. The message
    names the edge, the function and the item; the function's own exception is chained
    as ``__cause__``. The key function runs in the processors that send on the edge, so
    a job failing with it names the edge's source vertex as the failing one."""


class SnapshotStoreRolledBackError(SnapshotError):
    """The snapshot store would resume from an older snapshot than one already committed
    in it (the store was restored from a backup, or its newest snapshot and manifest were
    removed): the sinks may have published the output after that older snapshot, so
    resuming would publish it again. The message names the store and both snapshot ids;
    ``JobConfig(allow_rollback=True)`` resumes anyway and accepts the replay."""
