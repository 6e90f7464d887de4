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
``write_files`` commits its files two-phase at snapshots (see :class:`WriteFilesP`):
exactly-once under an exactly-once job, at-least-once otherwise.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Callable, MutableMapping
from typing import IO, Any

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.snapshot_keys import BroadcastKey
from slipstream.core.validation import check_callable, check_name, check_path

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

    def _stage(self, at_completion: bool) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self.context.stage_on_commit(functools.partial(self._publish, batch), at_completion)

    def save_to_snapshot(self) -> bool:
        self._stage(at_completion=False)
        return True

    def complete(self) -> bool:
        self._stage(at_completion=True)
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
    """Writes ``str(item)`` lines (UTF-8) to part files in ``directory``.

    Lines go to a hidden temporary file in the same directory that is renamed to its
    final name only when its content is final, so a reader never sees a half-written or
    uncommitted part file:

    * without snapshots: ``part-<global index:05d>``, renamed when the input is complete;
    * with snapshots (two-phase): at every snapshot the current temporary file is fsynced
      and *prepared*; when the snapshot commits it is renamed to
      ``part-<index:05d>-<sequence:06d>``, so a streaming job's output appears snapshot by
      snapshot. The snapshot records the prepared files, and a restore commits any that a
      crash left uncommitted, then deletes temporary files written after the snapshot
      (they are written again by the replay). Exactly-once under an exactly-once job; under
      at-least-once, items that passed the barrier before the snapshot are written again.
      A job may restore with another parallelism.
    """

    snapshot_tag = "write-files"

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._fh: IO[bytes] | None = None
        self._temp = ""
        self._sequence = 0
        self._two_phase = False
        self._done = False
        self._restored: list[tuple[int, list[tuple[str, str]]]] = []

    def is_cooperative(self) -> bool:
        # file system calls (fsync) can block for an unbounded time
        return False

    def init_processor(self, context: Context) -> None:
        try:
            os.makedirs(self._directory, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"vertex {context.vertex_name!r}: cannot create write_files directory "
                f"{self._directory!r}: {e}"
            ) from e
        self._two_phase = context.snapshotting_enabled

    def _name(self) -> str:
        i = self.context.global_processor_index
        return f"part-{i:05d}-{self._sequence:06d}" if self._two_phase else f"part-{i:05d}"

    def _file(self) -> IO[bytes]:
        fh = self._fh
        if fh is None:
            # unique per attempt: a retried or speculative Spark task never writes into
            # another attempt's file, and the final rename is atomic
            self._temp = os.path.join(
                self._directory, f".{self._name()}.{uuid.uuid4().hex[:12]}.tmp"
            )
            fh = self._fh = open(self._temp, "wb")  # closed in _seal / close()
        return fh

    def process(self, ordinal: int, inbox: Inbox) -> None:
        data = ("\n".join(map(str, inbox)) + "\n").encode("utf-8")
        self._file().write(data)
        inbox.clear()

    def _seal(self) -> tuple[str, str] | None:
        """Close the current temporary file; returns (temp, final) or None if empty."""
        fh = self._fh
        if fh is None:
            return None
        self._fh = None
        fh.flush()
        os.fsync(fh.fileno())  # a committed snapshot must not claim bytes a crash loses
        fh.close()
        pair = (self._temp, os.path.join(self._directory, self._name()))
        self._sequence += 1
        return pair

    def complete(self) -> bool:
        pair = self._seal()
        if self._two_phase:
            if pair is not None:
                commit = functools.partial(_commit_files, [pair])
                if not self.context.stage_on_commit(commit, at_completion=True):
                    commit()  # no coordinator (e.g. the test harness): final now
        elif pair is not None:
            os.replace(*pair)
        else:  # no input at all: still leave an (empty) part file
            open(os.path.join(self._directory, self._name()), "wb").close()
        self._done = True
        return True

    def save_to_snapshot(self) -> bool:
        pair = self._seal()
        prepared = [pair] if pair is not None else []
        if prepared:
            commit = functools.partial(_commit_files, prepared)
            if not self.context.stage_on_commit(commit):
                commit()  # no coordinator (e.g. the test harness): the snapshot is the commit
        ctx = self.context
        return self.outbox.offer_to_snapshot(
            BroadcastKey((self.snapshot_tag, ctx.global_processor_index)),
            (self._sequence, [(os.path.basename(t), os.path.basename(f)) for t, f in prepared]),
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        name = key.name if type(key) is BroadcastKey else None
        if not (type(name) is tuple and len(name) == 2 and name[0] == self.snapshot_tag):
            raise ValueError(
                f"vertex {self.context.vertex_name!r}: unexpected snapshot entry key {key!r} "
                "for write_files"
            )
        sequence, prepared = value
        self._restored.append((name[1], prepared))
        if name[1] == self.context.global_processor_index:
            self._sequence = sequence

    def finish_snapshot_restore(self) -> bool:
        # Commit what the snapshot prepared (a crash may have come between the snapshot's
        # commit and the renames), then drop temporary files written after it. Processor
        # 0 also takes care of indices that no longer exist at this parallelism.
        ctx = self.context
        mine = {ctx.global_processor_index}
        if ctx.global_processor_index == 0:
            mine |= {i for i, _ in self._restored if i >= ctx.total_parallelism}
        d = self._directory
        for index, prepared in self._restored:
            if index in mine:
                _commit_files([(os.path.join(d, t), os.path.join(d, f)) for t, f in prepared])
        for n in os.listdir(d):
            if n.startswith(".part-") and n.endswith(".tmp"):
                try:
                    index = int(n[len(".part-") :].split("-")[0].split(".")[0])
                except ValueError:
                    continue
                if index in mine:
                    os.remove(os.path.join(d, n))
        self._restored = []
        return True

    def close(self) -> None:
        fh = self._fh
        if fh is not None:
            self._fh = None
            fh.close()
            if not self._two_phase and not self._done:
                try:
                    os.remove(self._temp)
                except FileNotFoundError:
                    pass


def _commit_files(pairs: list[tuple[str, str]]) -> None:
    """Rename prepared temporary files to their final names (idempotent)."""
    for temp, final in pairs:
        try:
            os.replace(temp, final)
        except FileNotFoundError:
            if not os.path.exists(final):
                raise


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


def list_sink(name: str) -> functools.partial[ListSinkP]:
    """Appends every item to ``engine.get_list(name)``."""
    check_name(name, "list_sink")
    return functools.partial(ListSinkP, name)


def map_sink(name: str) -> functools.partial[MapSinkP]:
    """Puts ``(key, value)`` items into ``engine.get_map(name)``; a later put wins. Any
    other item fails the job with an error naming it."""
    check_name(name, "map_sink")
    return functools.partial(MapSinkP, name)


def write_files(directory: str | os.PathLike[str]) -> functools.partial[WriteFilesP]:
    """Writes ``str(item)`` per line (UTF-8) into ``directory`` (created if missing),
    one file ``part-<global processor index:05d>`` per processor."""
    check_path(directory, "write_files")
    return functools.partial(WriteFilesP, os.fspath(directory))


def logger(to_string: Callable[[Any], str] = str) -> functools.partial[LoggerP]:
    """Logs each item (``to_string(item)``) at INFO with the processor's logger."""
    check_callable(to_string, "to_string", "logger")
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
    check_callable(create_buffer, "create_buffer", "write_buffered")
    check_callable(add_to_buffer, "add_to_buffer", "write_buffered")
    check_callable(flush_buffer, "flush_buffer", "write_buffered")
    check_callable(destroy_buffer, "destroy_buffer", "write_buffered", optional=True)
    return functools.partial(
        WriteBufferedP, create_buffer, add_to_buffer, flush_buffer, destroy_buffer
    )
