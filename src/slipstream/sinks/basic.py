"""Basic sinks: ``list_sink``, ``map_sink``, ``write_files``, ``logger``, ``noop`` and
``write_buffered``.

A sink consumes its whole inbox in each ``process`` call and has no outbound edges.
Sinks swallow watermarks (``try_process_watermark`` returns ``True`` without emitting).

Delivery guarantees: under an exactly-once job ``list_sink`` and ``map_sink`` are
two-phase: what arrives between snapshots is published to the named structure when the
next snapshot commits (or when the job completes), so a replay after a restore never
duplicates anything. Otherwise they write directly: after a restore from an
at-least-once snapshot replayed items are written again (a list receives duplicates; a
map is overwritten with the same values). ``write_buffered`` keeps no snapshot state.
``write_files`` saves how many bytes each part file held at the snapshot and
truncates back to it on restore, so its output is exactly-once under an exactly-once
job and at-least-once otherwise.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, MutableMapping
from typing import IO, Any

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.snapshot_keys import BroadcastKey

__all__ = ["list_sink", "map_sink", "write_files", "logger", "noop", "write_buffered"]


class _SinkP(AbstractProcessor):
    """A sink swallows watermarks: nothing is downstream of it."""

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True


class _StagingSinkP(_SinkP):
    """Writes directly, or, under an exactly-once job, stages what arrives until the
    snapshot covering it commits (two-phase)."""

    _staging = False

    def __init__(self) -> None:
        self._pending: list[Any] = []

    def init_processor(self, context: Context) -> None:
        self._staging = (
            context.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            and context.snapshot_hooks is not None
        )

    def _publish(self, items: list[Any]) -> None:
        raise NotImplementedError

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._staging:
            self._pending.extend(inbox)
        else:
            self._publish(list(inbox))
        inbox.clear()

    def _stage(self, at_job_end: bool) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self.context.stage_on_commit(functools.partial(self._publish, batch), at_job_end)

    def save_to_snapshot(self) -> bool:
        self._stage(at_job_end=False)
        return True

    def complete(self) -> bool:
        self._stage(at_job_end=True)
        return True


class ListSinkP(_StagingSinkP):
    """Appends every item to the engine's named list (two-phase under exactly-once)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._list: list[Any] = []

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        self._list = context.get_list(self._name)

    def _publish(self, items: list[Any]) -> None:
        # one C-level extend: atomic under the GIL, so parallel sinks may share the list
        self._list.extend(items)


class MapSinkP(_StagingSinkP):
    """Puts ``(key, value)`` items into the engine's named map; a later put of a key
    wins (two-phase under exactly-once)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._map: MutableMapping[Any, Any] = {}

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        self._map = context.get_map(self._name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        for item in inbox:
            if (type(item) is not tuple and not isinstance(item, tuple)) or len(item) != 2:
                raise TypeError(
                    f"vertex {self.context.vertex_name!r}: map_sink({self._name!r}) needs "
                    f"(key, value) tuples, got {item!r}"
                )
        super().process(ordinal, inbox)

    def _publish(self, items: list[Any]) -> None:
        m = self._map
        for k, v in items:
            m[k] = v


class WriteFilesP(_SinkP):
    """Writes ``str(item)`` lines (UTF-8) to ``<directory>/part-<global index:05d>``.

    The lines go to the hidden temporary file ``.part-<index>.tmp`` in the same
    directory, which is renamed to its final name when the input is complete, so a
    reader never sees a half-written part file. A failed or cancelled job leaves no
    temporary file behind (it is removed in ``close``) unless snapshotting is on, when
    it is kept for the restore.

    Snapshot: the byte length of the temporary file, under
    ``BroadcastKey(("write-files-offset", global_index))``; on restore the file is
    truncated to that length, so items after the snapshot are written exactly once when
    the job restores from an exactly-once snapshot (at-least-once: the items that passed
    the barrier before the snapshot was taken are written twice). Restore needs the same
    total parallelism.
    """

    snapshot_tag = "write-files-offset"

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._fh: IO[bytes] | None = None
        self._written = 0
        self._restore_offset: int | None = None
        self._final = ""
        self._temp = ""
        self._done = False

    def is_cooperative(self) -> bool:
        # file system calls can block for an unbounded time
        return False

    def init_processor(self, context: Context) -> None:
        try:
            os.makedirs(self._directory, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"vertex {context.vertex_name!r}: cannot create write_files directory "
                f"{self._directory!r}: {e}"
            ) from e
        name = f"part-{context.global_processor_index:05d}"
        self._final = os.path.join(self._directory, name)
        self._temp = os.path.join(self._directory, f".{name}.tmp")

    def _file(self) -> IO[bytes]:
        fh = self._fh
        if fh is None:
            offset = self._restore_offset
            if offset is None:
                fh = open(self._temp, "wb")  # closed in complete() / close()
                self._written = 0
            else:
                if not os.path.exists(self._temp):
                    raise FileNotFoundError(
                        f"vertex {self.context.vertex_name!r}: restoring write_files needs "
                        f"the temporary file {self._temp!r}, which is missing"
                    )
                fh = open(self._temp, "r+b")
                fh.truncate(offset)
                fh.seek(offset)
                self._written = offset
            self._fh = fh
        return fh

    def process(self, ordinal: int, inbox: Inbox) -> None:
        data = ("\n".join(map(str, inbox)) + "\n").encode("utf-8")
        self._file().write(data)
        self._written += len(data)
        inbox.clear()

    def complete(self) -> bool:
        fh = self._file()
        fh.close()
        self._fh = None
        os.replace(self._temp, self._final)
        self._done = True
        return True

    def save_to_snapshot(self) -> bool:
        fh = self._file()
        fh.flush()
        os.fsync(fh.fileno())  # the snapshot must not claim bytes a crash could lose
        ctx = self.context
        return self.outbox.offer_to_snapshot(
            BroadcastKey((self.snapshot_tag, ctx.global_processor_index)),
            (ctx.total_parallelism, self._written),
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        ctx = self.context
        name = key.name if type(key) is BroadcastKey else None
        if not (type(name) is tuple and len(name) == 2 and name[0] == self.snapshot_tag):
            raise ValueError(
                f"vertex {ctx.vertex_name!r}: unexpected snapshot entry key {key!r} for write_files"
            )
        saved_parallelism, offset = value
        if saved_parallelism != ctx.total_parallelism:
            raise ValueError(
                f"vertex {ctx.vertex_name!r}: write_files snapshot was taken with total "
                f"parallelism {saved_parallelism}, the job now runs "
                f"{ctx.total_parallelism}; it restores only with the same parallelism"
            )
        if name[1] == ctx.global_processor_index:
            self._restore_offset = offset

    def close(self) -> None:
        fh = self._fh
        if fh is not None:
            self._fh = None
            fh.close()
        snapshotting = getattr(self, "context", None) is not None and (
            self.context.snapshotting_enabled
        )
        if not self._done and self._temp and not snapshotting:
            try:
                os.remove(self._temp)
            except FileNotFoundError:
                pass


class LoggerP(_SinkP):
    """Logs every item at INFO level with the processor's logger (for demos and
    debugging; not meant for volume). Watermarks are logged at DEBUG."""

    def __init__(self, to_string: Callable[[Any], str]) -> None:
        self._to_string = to_string

    def process(self, ordinal: int, inbox: Inbox) -> None:
        log = self.context.logger
        if log.isEnabledFor(logging.INFO):
            to_string = self._to_string
            for item in inbox:
                log.info("%s", to_string(item))
        inbox.clear()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.context.logger.debug("%r", watermark)
        return True


class NoopP(_SinkP):
    """Discards every item."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        inbox.clear()


class WriteBufferedP(_SinkP):
    """Jet's ``writeBufferedP``: ``create_buffer(context)`` once at init,
    ``add_to_buffer(buffer, item)`` for each item, ``flush_buffer(buffer)`` after each
    inbox drain, ``destroy_buffer(buffer)`` at close (also after a failure).

    Non-cooperative: user buffers usually do blocking I/O. No snapshot state: after an
    at-least-once restore the replayed items are added (and flushed) again.
    """

    def __init__(
        self,
        create_buffer: Callable[[Context], Any],
        add_to_buffer: Callable[[Any, Any], Any],
        flush_buffer: Callable[[Any], Any],
        destroy_buffer: Callable[[Any], Any] | None,
    ) -> None:
        self._create = create_buffer
        self._add = add_to_buffer
        self._flush = flush_buffer
        self._destroy = destroy_buffer
        self._buffer: Any = None
        self._created = False

    def is_cooperative(self) -> bool:
        return False

    def init_processor(self, context: Context) -> None:
        self._buffer = self._create(context)
        self._created = True

    def process(self, ordinal: int, inbox: Inbox) -> None:
        add = self._add
        buffer = self._buffer
        for item in inbox:
            add(buffer, item)
        inbox.clear()
        self._flush(buffer)

    def close(self) -> None:
        if self._created and self._destroy is not None:
            self._created = False
            self._destroy(self._buffer)


# -- factories -----------------------------------------------------------------------


def _check_name(name: Any, factory: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{factory}(): argument 'name' must be a non-empty str, got {name!r}")


def _check_callable(fn: Any, argument: str, factory: str, optional: bool = False) -> None:
    if fn is None and optional:
        return
    if not callable(fn):
        raise TypeError(f"{factory}(): argument {argument!r} must be callable, got {fn!r}")


def list_sink(name: str) -> functools.partial[ListSinkP]:
    """Appends every item to ``engine.get_list(name)``."""
    _check_name(name, "list_sink")
    return functools.partial(ListSinkP, name)


def map_sink(name: str) -> functools.partial[MapSinkP]:
    """Puts ``(key, value)`` items into ``engine.get_map(name)``; a later put wins. Any
    other item fails the job with an error naming it."""
    _check_name(name, "map_sink")
    return functools.partial(MapSinkP, name)


def write_files(directory: str | os.PathLike[str]) -> functools.partial[WriteFilesP]:
    """Writes ``str(item)`` per line (UTF-8) into ``directory`` (created if missing),
    one file ``part-<global processor index:05d>`` per processor."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"write_files(): argument 'directory' must be a path, got {directory!r}")
    return functools.partial(WriteFilesP, os.fspath(directory))


def logger(to_string: Callable[[Any], str] = str) -> functools.partial[LoggerP]:
    """Logs each item (``to_string(item)``) at INFO with the processor's logger."""
    _check_callable(to_string, "to_string", "logger")
    return functools.partial(LoggerP, to_string)


def noop() -> functools.partial[NoopP]:
    """Discards every item."""
    return functools.partial(NoopP)


def write_buffered(
    create_buffer: Callable[[Context], Any],
    add_to_buffer: Callable[[Any, Any], Any],
    flush_buffer: Callable[[Any], Any],
    destroy_buffer: Callable[[Any], Any] | None = None,
) -> functools.partial[WriteBufferedP]:
    """A sink built from buffer functions (Jet's ``writeBufferedP``); see
    :class:`WriteBufferedP`."""
    _check_callable(create_buffer, "create_buffer", "write_buffered")
    _check_callable(add_to_buffer, "add_to_buffer", "write_buffered")
    _check_callable(flush_buffer, "flush_buffer", "write_buffered")
    _check_callable(destroy_buffer, "destroy_buffer", "write_buffered", optional=True)
    return functools.partial(
        WriteBufferedP, create_buffer, add_to_buffer, flush_buffer, destroy_buffer
    )
