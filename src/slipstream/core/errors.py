"""The exceptions slipstream raises to users."""

from __future__ import annotations

import os
import traceback
from types import TracebackType

# The engine's driver loop: the worker threads and the tasklet that calls the processor
# (and the Spark task running the same tasklet). Their frames head every processor
# traceback and say nothing about the failure: :func:`trim_driver_frames` drops them.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DRIVER_FILES = frozenset(
    os.path.join(_PACKAGE, *parts)
    for parts in (
        ("engine", "workers.py"),
        ("execution", "tasklet.py"),
        ("execution", "fusion.py"),  # two vertices' processors in one tasklet
        ("spark", "task.py"),
    )
)


class SlipstreamError(Exception):
    """Base class of every slipstream error."""


class DagError(SlipstreamError, ValueError):
    """The DAG is invalid; the message names the vertex, edge or ordinal at fault."""


class JobFailedError(SlipstreamError):
    """A job failed. ``vertex`` and ``processor_index`` name the processor that raised
    (``None`` when the failure was not a processor's); the original exception is chained
    as ``__cause__`` and kept in ``cause``.

    The processor's traceback is shown once: Python prints the chained cause's own
    traceback, so the message adds ``remote_traceback`` (the text of a traceback
    that came from elsewhere, e.g. a Spark executor) only when the cause carries none.
    :meth:`processor_traceback` gives it as text either way."""

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
        if self.remote_traceback and not _has_traceback(self.cause):
            text += "\n--- processor traceback ---\n" + self.remote_traceback
        return text

    def processor_traceback(self) -> str | None:
        """The traceback of the processor's exception as text (the engine's own frames
        left out), or ``None`` when the failure was not a processor's."""
        cause = self.cause
        if _has_traceback(cause):
            assert cause is not None
            return "".join(traceback.format_exception(cause))
        return self.remote_traceback


def _has_traceback(error: BaseException | None) -> bool:
    return error is not None and error.__traceback__ is not None


def trim_driver_frames(error: BaseException) -> BaseException:
    """Drop the engine's driver frames (worker loop, tasklet) from the head of
    ``error``'s traceback, so that it starts at the processor's code; returns ``error``.
    A traceback made only of driver frames (an error of the engine itself) keeps them.
    Chained exceptions (``__cause__``, ``__context__``) are left as they are."""
    tb: TracebackType | None = error.__traceback__
    first = tb
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in _DRIVER_FILES:
        tb = tb.tb_next
    if tb is not None and tb is not first:
        error.__traceback__ = tb
    return error


class JobCancelledError(SlipstreamError):
    """``join()`` on a job that was cancelled."""


class JobCompletedError(SlipstreamError, RuntimeError):
    """``suspend()`` (or ``restart()``) of a job that completed before it could be
    suspended: its sources ended before the terminal snapshot was taken, so its output
    is complete and there is nothing to resume. A ``RuntimeError``, as ``suspend()`` of a
    job that is not running is."""


class SnapshotError(SlipstreamError):
    """A snapshot could not be written, read or restored."""



class SnapshotStalledError(SnapshotError):
    """A snapshot did not commit within ``JobConfig(stall_timeout_s=)``: the job made no
    durable progress for that long. The message names what the snapshot waited for
    (the processors that had not saved it, with their state, or the store write)."""

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


class SinkCommitError(SlipstreamError):
    """A sink's commit cannot succeed: e.g. the broker aborted a Kafka transaction
    (fenced producer, expired transaction). The message names the sink, the server, the
    output concerned and the cause; a restart from the last committed snapshot writes
    that output again."""


class SinkUnavailableError(SinkCommitError):
    """A sink's server stayed unreachable (or kept failing its commits) for longer than
    ``JobConfig.sink_outage_timeout``. The message names the call, the server, how long
    and how often it was tried, and the last cause; the vertex is named by the job's
    error. What the sink prepared stays prepared: a restart or ``resume=True`` commits it
    from the last committed snapshot."""
