"""Basic sinks: ``list_sink``, ``map_sink``, ``logger``, ``stdout``, ``noop`` and
``write_buffered`` (the file sinks live in :mod:`slipstream.sinks.files`).

A sink consumes its whole inbox in each ``process`` call and has no outbound edges.
Sinks swallow watermarks (``try_process_watermark`` returns ``True`` without emitting).

Delivery guarantees: under an exactly-once job ``list_sink`` and ``map_sink`` are
two-phase: what arrives between snapshots is published to the named structure when the
next snapshot commits (or when the job completes), by ``snapshot_commit_finish`` on the
sink's own tasklet, so a replay after a restore never duplicates anything. Otherwise they write directly: after a restore from an
at-least-once snapshot replayed items are written again (a list receives duplicates; a
map is overwritten with the same values). ``write_buffered`` keeps no snapshot state.
``write_files`` and the other file sinks commit their files two-phase at snapshots
(see :class:`slipstream.sinks.files.WriteFilesP`): exactly-once under an exactly-once
job, at-least-once otherwise.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import uuid
from collections.abc import Callable, MutableMapping
from typing import Any

from slipstream.core.commit import AT_COMPLETION, PreparedCommits
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.traits import SINK
from slipstream.core.validation import check_callable, check_name
from slipstream.state.keys import BroadcastKey, tagged_broadcast_name

__all__ = ["list_sink", "map_sink", "logger", "stdout", "noop", "write_buffered"]


class _SinkP(AbstractProcessor):
    """A sink swallows watermarks: nothing is downstream of it."""

    slipstream_traits = frozenset({SINK})

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True


# Per (vertex, processor lineage, index): the newest snapshot whose batch a staging
# sink published. Process-wide, as the named structures are in-process: a restore (also
# into another engine of this process, with restore_from=) publishes only what is not
# published yet. One small entry per sink processor and execution.
_PUBLISHED: dict[tuple[str, str, int], int] = {}
#: held while a batch is published and marked (a member process reports both at once,
#: slipstream.engine.member: its coordinator holds the structures and the marks)
_PUBLISHED_LOCK = threading.RLock()


def published_marks() -> dict[tuple[str, str, int], int]:
    """A copy of this process's marks of published batches (a member process starts
    with the coordinator's: a restore there publishes only what is not published yet)."""
    with _PUBLISHED_LOCK:
        return dict(_PUBLISHED)


def merge_published(marks: dict[tuple[str, str, int], int]) -> None:
    """Take in marks of batches published elsewhere (a member process's, reported
    with the batches' items)."""
    with _PUBLISHED_LOCK:
        for k, sid in marks.items():
            if _PUBLISHED.get(k, -1) < sid:
                _PUBLISHED[k] = sid


class _StagingSinkP(_SinkP):
    """Writes directly, or, under an exactly-once job that commits snapshots, holds what
    arrives until the snapshot covering it commits (two-phase): the batch of each
    snapshot is published by ``snapshot_commit_finish``, on this processor's tasklet.

    The batches not published yet are part of the snapshot, so a snapshot that
    committed while its batch was still unpublished (the execution failed just then)
    loses nothing: the restored processor publishes it, unless it was published already
    (idempotent within the process, which is where the named structures live)."""

    snapshot_tag = "staged-output"
    _staging = False

    def __init__(self) -> None:
        self._pending: list[Any] = []
        self._prepared: PreparedCommits[list[Any]] = PreparedCommits()
        self._lineage = ""
        self._restored: list[tuple[int, str, int, list[Any]]] = []

    def init_processor(self, context: Context) -> None:
        self._staging = (
            context.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            and context.commits_snapshots
        )
        self._lineage = uuid.uuid4().hex[:12]

    def _publish(self, items: list[Any]) -> None:
        raise NotImplementedError

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._staging:
            self._pending.extend(inbox)
        else:
            self._publish(list(inbox))
        inbox.clear()

    def _stage(self, snapshot_id: int) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self._prepared.add(snapshot_id, batch)

    def _prepared_entries(self) -> list[tuple[Any, Any]]:
        index = self.context.global_processor_index
        return [
            (BroadcastKey((self.snapshot_tag, index, self._lineage, sid)), tuple(batch))
            for sid, batch in self._prepared.entries()
        ]

    def save_to_snapshot(self) -> bool:
        if not self._staging:
            return True
        self._stage(self.context.current_snapshot_id)
        return self.save_state(self._prepared_entries)

    def complete(self) -> bool:
        if not self._staging:
            return True
        self._stage(AT_COMPLETION)
        # completion state: a restore from a snapshot recording the completion publishes
        # what is not published yet
        return self.save_state(self._prepared_entries) if self._prepared else True

    def snapshot_commit_finish(self, success: bool) -> bool:
        if success:
            ctx = self.context
            for sid, batch in self._prepared.due_entries(ctx):
                with _PUBLISHED_LOCK:  # published and marked at once
                    self._publish(batch)
                    self._mark(self._lineage, ctx.global_processor_index, sid)
                self._prepared.remove(batch)
        return True

    def _mark(self, lineage: str, index: int, snapshot_id: int) -> None:
        ctx = self.context
        with _PUBLISHED_LOCK:
            _PUBLISHED[(ctx.vertex_name, lineage, index)] = snapshot_id

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        _, index, lineage, sid = tagged_broadcast_name(
            key, self.snapshot_tag, 4, self.context.vertex_name, type(self).__name__
        )
        self._restored.append((index, lineage, sid, list(value)))

    def finish_snapshot_restore(self) -> bool:
        """Publish the restored batches not published yet; processor ``i`` takes those
        of old processors ``j`` with ``j % parallelism == i``."""
        ctx = self.context
        for index, lineage, sid, batch in sorted(self._restored, key=lambda r: r[2]):
            if index % ctx.total_parallelism != ctx.global_processor_index:
                continue
            with _PUBLISHED_LOCK:
                published = _PUBLISHED.get((ctx.vertex_name, lineage, index), -1)
                if published < sid:
                    self._publish(batch)
                    self._mark(lineage, index, sid)
        self._restored = []
        return True


class ListSinkP(_StagingSinkP):
    """Appends every item to the engine's named list (two-phase under exactly-once)."""

    #: in a job that takes no snapshots the engine may run it inside its only
    #: producer's tasklet (execution/fusion.py; read from this class's own namespace,
    #: not a subclass's): it takes every inbox whole, swallows watermarks and keeps no
    #: state there
    runs_in_producer = True

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._list: list[Any] = []

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        # what the sink writes to, without the list's content (in a member process the
        # coordinator holds that, core/services.py)
        target = getattr(context.services, "sink_list", None)
        self._list = target(self._name) if target is not None else context.get_list(self._name)

    def _publish(self, items: list[Any]) -> None:
        # one C-level extend: atomic under the GIL, so parallel sinks may share the list
        self._list.extend(items)


_PAIRS = {2}


def _plain_tuples(items: Any) -> bool:
    """Whether every item of ``items`` is exactly a ``tuple``: one scan of the types at C
    speed, so that a batch of plain tuples goes to the map at once."""
    return list(map(type, items)).count(tuple) == len(items)


class MapSinkP(_StagingSinkP):
    """Puts ``(key, value)`` items into the engine's named map; a later put of a key
    wins (two-phase under exactly-once)."""

    runs_in_producer = True  # see ListSinkP

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._map: MutableMapping[Any, Any] = {}
        self._put_tuples: Callable[[Any], Any] = self._map.update

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        target = getattr(context.services, "sink_map", None)  # as ListSinkP's
        self._map = target(self._name) if target is not None else context.get_map(self._name)
        # a batch of plain tuples: a member's map (engine/member.py's TrackedDict) takes
        # it without re-reading the types, marking the pairs' keys for the coordinator
        # (docs/performance.md, "The running sum with two processes"); a dict updates
        self._put_tuples = getattr(self._map, "put_pairs", None) or self._map.update

    def process(self, ordinal: int, inbox: Inbox) -> None:
        # at C speed when every item is a plain tuple: one scan of the types here, and
        # dict.update checks that each one is a pair
        plain = _plain_tuples(inbox)
        if not plain:
            for item in inbox:
                self._check(item)
        if self._staging:
            if set(map(len, inbox)) != _PAIRS:  # published later: check now
                for item in inbox:
                    self._check(item)
            self._pending.extend(inbox)
        else:
            try:
                # in order: a later put of a key wins
                (self._put_tuples if plain else self._map.update)(inbox)
            except ValueError:  # a tuple that is not a pair: name it
                for item in inbox:
                    self._check(item)
                raise
        inbox.clear()

    def _check(self, item: Any) -> None:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(
                f"vertex {self.context.vertex_name!r}: map_sink({self._name!r}) needs "
                f"(key, value) tuples, got {item!r}"
            )

    def _publish(self, items: list[Any]) -> None:
        # in order: a later put of a key wins
        (self._put_tuples if _plain_tuples(items) else self._map.update)(items)


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


class StdoutP(_SinkP):
    """Prints every item (``to_string(item)``, one line each) to standard output: the
    sink for demos and quick looks, which, unlike :class:`LoggerP`, needs no logging
    set-up. Non-cooperative: a slow terminal or a full pipe blocks ``write``. On the
    Spark engine the lines go to the executors' standard output (the console in
    ``local[*]``, the executor logs on a cluster)."""

    def __init__(self, to_string: Callable[[Any], str]) -> None:
        self._to_string = to_string

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        text = "".join([self._to_string(item) + "\n" for item in inbox])
        inbox.clear()
        out = sys.stdout
        out.write(text)
        out.flush()


class NoopP(_SinkP):
    """Discards every item."""

    runs_in_producer = True  # see ListSinkP

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


def logger(to_string: Callable[[Any], str] = str) -> functools.partial[LoggerP]:
    """Logs each item (``to_string(item)``) at INFO with the processor's logger."""
    check_callable(to_string, "to_string", "logger")
    return functools.partial(LoggerP, to_string)


def stdout(to_string: Callable[[Any], str] = str) -> functools.partial[StdoutP]:
    """Prints each item (``to_string(item)``) as a line on standard output."""
    check_callable(to_string, "to_string", "stdout")
    return functools.partial(StdoutP, to_string)


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
