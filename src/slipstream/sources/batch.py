"""Batch sources: ``items``, ``list_source``, ``map_source`` (the file sources, which
share this module's snapshot handling, live in :mod:`slipstream.sources.files`).

A source has no inputs: the engine calls ``complete()`` repeatedly until it returns
``True``. Each call emits as much as the outbox takes right now (bounded by its room, so
calls stay short) and the next call resumes where it stopped. Every item goes to every
outbound ordinal.

The data is split across *all* processors of *all* members by position: the processor
with global index ``i`` of ``n`` takes elements ``i, i + n, i + 2n, ...`` (``read_files``
and ``read_jsonl`` split by byte ranges instead, ``read_csv`` and ``read_parquet`` take
files ``i, i + n, ...`` of the sorted file list: :mod:`slipstream.sources.files`).

Snapshots: a source saves its position under ``BroadcastKey((<tag>, global_index))``,
so every processor receives every saved position on restore and picks the entry of its
own global index. A position only means something for the same split, so **sources
restore only with the same total parallelism** (but for the byte ranges of ``read_files``
and ``read_jsonl``, which are cut again); a restore with another parallelism
raises an error naming the vertex. Sources replay from the saved position: with
at-least-once, items emitted after the snapshot are emitted again after a restore.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.traits import BOUNDED
from slipstream.core.validation import check_name
from slipstream.state.keys import BroadcastKey, tagged_broadcast_name

__all__ = ["items", "list_source", "map_source", "snapshot"]


def _data_buckets(outbox: Outbox) -> list[list[Any]]:
    """The buckets a source emits its items to: every one but the side ordinal of
    ``on_item_error=<sink>`` (which only dead letters reach)."""
    side = outbox.side_ordinal
    return outbox.buckets if side is None else outbox.buckets[:side]


def _emit_room(outbox: Outbox) -> int:
    """How many items fit into *every* bucket right now (sources emit to all ordinals
    by writing into the buckets directly, bounded by their real free space)."""
    buckets = _data_buckets(outbox)
    if not buckets:
        return 1 << 30
    cap = outbox.capacity
    room = cap - len(buckets[0])
    for b in buckets[1:]:
        r = cap - len(b)
        if r < room:
            room = r
    return room


def _emit_chunk(outbox: Outbox, chunk: list[Any]) -> None:
    for b in _data_buckets(outbox):
        b.extend(chunk)


class _PositionedSource(AbstractProcessor):
    """Common snapshot handling: save ``self._position()`` under a broadcast key and
    restore the entry of this processor's own global index.

    At-least-once: a source saves its position before it emits the barrier, so a
    restore replays exactly what was emitted after the snapshot; duplicates downstream
    come only from at-least-once alignment there. Restore needs the same total
    parallelism (else a clear error).
    """

    snapshot_tag = "offset"
    #: its input ends: a job whose every source is bounded is a batch job
    slipstream_traits = frozenset({BOUNDED})

    def _position(self) -> Any:
        raise NotImplementedError

    def _seek(self, position: Any) -> None:
        raise NotImplementedError

    def save_to_snapshot(self) -> bool:
        ctx = self.context
        return self.outbox.offer_to_snapshot(
            BroadcastKey((self.snapshot_tag, ctx.global_processor_index)),
            (ctx.total_parallelism, self._position()),
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        ctx = self.context
        tagged_broadcast_name(
            key, self.snapshot_tag, 2, ctx.vertex_name, f"a {type(self).__name__} source"
        )
        saved_parallelism, position = value
        if saved_parallelism != ctx.total_parallelism:
            raise ValueError(
                f"vertex {ctx.vertex_name!r}: the snapshot was taken with total "
                f"parallelism {saved_parallelism}, the job now runs "
                f"{ctx.total_parallelism}; batch sources restore only with the same "
                "parallelism"
            )
        if key.name[1] == ctx.global_processor_index:
            self._seek(position)


class ListSourceP(_PositionedSource):
    """Emits this processor's share of a list. Subclasses decide where the list comes
    from in ``_load``; the share is copied at ``init`` time, so later changes to the
    underlying structure do not affect a running job."""

    def __init__(self) -> None:
        self._data: list[Any] = []
        self._pos = 0

    def _load(self, context: Context) -> list[Any]:
        raise NotImplementedError

    def init_processor(self, context: Context) -> None:
        data = self._load(context)
        n = context.total_parallelism
        # a sole processor emits the list itself: no copy of what may be millions of items
        self._data = data if n == 1 else data[context.global_processor_index :: n]

    def complete(self) -> bool:
        data = self._data
        pos = self._pos
        end = len(data)
        if pos < end:
            outbox = self.outbox
            room = _emit_room(outbox)
            if room <= 0:
                return False
            stop = pos + room if pos + room < end else end
            _emit_chunk(outbox, data[pos:stop])
            self._pos = pos = stop
        return pos >= end

    def _position(self) -> Any:
        return self._pos

    def progress(self) -> tuple[int, int]:
        """(items emitted, items in this processor's share): for progress bars."""
        return self._pos, len(self._data)

    def _seek(self, position: Any) -> None:
        self._pos = position


class ItemsP(ListSourceP):
    """Emits this processor's share of items given when the DAG was built."""

    snapshot_tag = "items-offset"

    def __init__(self, all_items: list[Any]) -> None:
        super().__init__()
        self._all = all_items

    def _load(self, context: Context) -> list[Any]:
        return self._all


class NamedListSourceP(ListSourceP):
    """Emits this processor's share of ``context.get_list(name)``."""

    snapshot_tag = "list-offset"

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def _load(self, context: Context) -> list[Any]:
        return list(context.get_list(self._name))

    def init_processor(self, context: Context) -> None:
        # only this processor's share (in a member process it comes from the
        # coordinator, which holds the list; core/services.py)
        share = getattr(context.services, "list_share", None)
        if share is None:
            super().init_processor(context)
            return
        self._data = share(self._name, context.global_processor_index, context.total_parallelism)


class NamedMapSourceP(ListSourceP):
    """Emits this processor's share of ``context.get_map(name)`` as ``(key, value)``
    tuples (positions follow the map's iteration order at ``init``)."""

    snapshot_tag = "map-offset"

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def _load(self, context: Context) -> list[Any]:
        return list(context.get_map(self._name).items())

    def init_processor(self, context: Context) -> None:
        share = getattr(context.services, "map_share", None)  # as NamedListSourceP's
        if share is None:
            super().init_processor(context)
            return
        self._data = share(self._name, context.global_processor_index, context.total_parallelism)


# -- factories -----------------------------------------------------------------------


def items(iterable: Iterable[Any]) -> functools.partial[ItemsP]:
    """A source emitting the given items (materialised into a list now, when the DAG is
    built). With several processors, global processor ``i`` of ``n`` emits
    ``items[i::n]``; order holds within each processor."""
    if isinstance(iterable, (str, bytes)) or not isinstance(iterable, Iterable):
        raise TypeError(
            f"items(): argument 'iterable' must be an iterable of items (not a string), "
            f"got {type(iterable).__name__}"
        )
    return functools.partial(ItemsP, list(iterable))


def list_source(name: str) -> functools.partial[NamedListSourceP]:
    """A source emitting the elements of the engine's named list ``name``
    (``engine.get_list(name)``), split by position across all processors."""
    check_name(name, "list_source")
    return functools.partial(NamedListSourceP, name)


def map_source(name: str) -> functools.partial[NamedMapSourceP]:
    """A source emitting ``(key, value)`` tuples of the engine's named map ``name``
    (``engine.get_map(name)``), split by position across all processors."""
    check_name(name, "map_source")
    return functools.partial(NamedMapSourceP, name)


class SnapshotSourceP(ListSourceP):
    """Emits this processor's share of the rows (``StateRow``) of one committed snapshot
    of a store, read (and verified) when the processor starts."""

    snapshot_tag = "snapshot-offset"

    def __init__(
        self, directory: str, vertex: str | None, snapshot_id: int, key: bytes | str | None
    ) -> None:
        super().__init__()
        self._where = (directory, vertex, snapshot_id, key)

    def _load(self, context: Context) -> list[Any]:
        from slipstream.state.reader import read
        from slipstream.state.store import DirectorySnapshotStore

        directory, vertex, snapshot_id, key = self._where
        return read(DirectorySnapshotStore(directory, key=key), vertex, snapshot_id)


def snapshot(
    store: Any, vertex: str | None = None, snapshot_id: int | None = None
) -> functools.partial[SnapshotSourceP]:
    """A batch source emitting the entries of a committed snapshot of ``store`` (a store
    directory, a ``DirectorySnapshotStore`` or a job) as ``StateRow`` s, as
    ``ss.state.read(store, vertex, snapshot_id)`` returns them: a job's state processed
    with the Pipeline API like any data. The snapshot is chosen now (the newest unless
    ``snapshot_id``; its id is fixed, so a restarted job reads the same rows) and read
    when the job starts; an unknown vertex or snapshot fails here."""
    from slipstream.state.reader import _snapshot, open_store

    s = open_store(store)
    ids = s.committed_ids_read_only()
    if snapshot_id is None and ids:
        snapshot_id = ids[-1]
    sid, _data = _snapshot(s, vertex, snapshot_id)
    return functools.partial(SnapshotSourceP, s.directory, vertex, sid, s._explicit_key)
