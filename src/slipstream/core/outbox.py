"""The processor's output buffer: one bounded bucket per outbound ordinal plus one for
snapshot state.

Buckets are plain lists. ``offer`` refuses (returns ``False``) when a bucket is full; the
processor must then return and offer the same item again on its next call. Between
processor calls the engine moves bucket contents into the edge queues. Watermarks
offered here are broadcast downstream by the engine.

An outbox may have a *side ordinal* (:meth:`Outbox.reserve_side_ordinal`, the
dead-letter edge of ``on_item_error=<sink>``): ``offer(item)`` to "every ordinal" leaves it
out, so only what a processor sends there on purpose goes there.

A non-cooperative processor gets a *blocking* outbox (``flush_fn`` set): instead of
refusing, a full bucket is flushed by the processor's own thread, waiting for room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

from slipstream.core.items import IdleMessage, Watermark

_SPECIAL_TYPES = frozenset((Watermark, IdleMessage))

DEFAULT_BUCKET_CAPACITY = 2048


SPECIAL_AT_TAIL = 2
"""``Outbox.specials`` value (truthy): the one bucket holds a single special item, a
watermark, as its last entry (set by ``insert_watermarks``, which builds its bucket
itself), so the engine hands it over without scanning the bucket."""


class Outbox:
    """Jet's ``Outbox`` (punctuation-era flavour: buffered buckets with a capacity)."""

    __slots__ = (
        "specials",
        "unfinished",
        "buckets",
        "snapshot_bucket",
        "capacity",
        "snapshot_capacity",
        "_all",
        "_flush_fn",
        "side_ordinal",
        "on_refused",
    )

    def __init__(
        self,
        ordinal_count: int,
        capacity: int = DEFAULT_BUCKET_CAPACITY,
        snapshot_capacity: int | None = None,
        flush_fn: Callable[[], None] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"outbox capacity must be >= 1, got {capacity}")
        self.buckets: list[list[Any]] = [[] for _ in range(ordinal_count)]
        self.snapshot_bucket: list[tuple[Any, Any]] = []
        self.capacity = capacity
        self.snapshot_capacity = capacity if snapshot_capacity is None else snapshot_capacity
        self._all = tuple(range(ordinal_count))
        self._flush_fn = flush_fn
        #: an ordinal that ``offer(item)`` (to every ordinal) leaves out, if any
        self.side_ordinal: int | None = None
        # set when a watermark or idle mark was offered: the engine then looks for special
        # items while moving buckets downstream (it skips that scan otherwise);
        # SPECIAL_AT_TAIL when the only one is a watermark at the end of the only bucket
        self.specials: bool | int = False
        # True while the last offer was refused: the processor holds an item it must
        # offer again, so the engine does not start a snapshot at a source then
        self.unfinished = False
        #: called when an offer is refused (``unfinished`` set): AbstractProcessor's
        #: try_emit then leaves its fast path, which does not clear ``unfinished``
        self.on_refused: Callable[[], None] | None = None

    @property
    def bucket_count(self) -> int:
        return len(self.buckets)

    @property
    def data_ordinal_count(self) -> int:
        """How many ordinals ``offer(item)`` (``ordinal=None``) reaches: every one but
        the side ordinal. Bulk paths that write into ``buckets[0]`` check that it is 1."""
        return len(self._all)

    def reserve_side_ordinal(self, ordinal: int) -> None:
        """Make ``ordinal`` (the last one) a side output: ``offer(item)`` and watermarks
        no longer reach it; only offers to it by number (or writes into its bucket) do."""
        if ordinal != len(self.buckets) - 1:
            raise ValueError(
                f"the side ordinal must be the last one ({len(self.buckets) - 1}), got {ordinal}"
            )
        self.side_ordinal = ordinal
        self._all = tuple(range(ordinal))

    def offer(self, item: Any, ordinal: int | Sequence[int] | None = None) -> bool:
        """Add ``item`` to the bucket of ``ordinal`` (``None``: every outbound ordinal; a
        sequence: those ordinals). All-or-nothing: returns ``False`` without adding
        anything if any target bucket is full."""
        buckets = self.buckets
        cap = self.capacity
        t = type(item)
        if t is Watermark or t is IdleMessage:
            self.specials = True
        if ordinal is None:
            if len(self._all) == 1:
                b = buckets[0]
                if len(b) >= cap:
                    if self._flush_fn is None:
                        return self._refuse()
                    self._flush_fn()
                b.append(item)
                self.unfinished = False
                return True
            ordinals: Sequence[int] = self._all
        elif isinstance(ordinal, int):
            if ordinal < 0 or ordinal >= len(buckets):
                raise IndexError(
                    f"outbox has ordinals 0..{len(buckets) - 1}, offered to ordinal {ordinal}"
                )
            b = buckets[ordinal]
            if len(b) >= cap:
                if self._flush_fn is None:
                    return self._refuse()
                self._flush_fn()
            b.append(item)
            self.unfinished = False
            return True
        else:
            ordinals = ordinal
        for o in ordinals:
            if len(buckets[o]) >= cap:
                if self._flush_fn is None:
                    return self._refuse()
                self._flush_fn()
                break
        for o in ordinals:
            buckets[o].append(item)
        self.unfinished = False
        return True

    def offer_many(self, items: Iterable[Any], ordinal: int = 0, plain: bool = False) -> Any:
        """Add items to one bucket until it is full, at C speed. Returns ``None`` if
        everything was added, else an iterator whose first item is the refused one,
        followed by the rest (the caller offers them again later). ``plain``: the caller
        knows no item is a watermark or idle mark, so their types are not checked (~18 ns
        an item: 9 ms of the 500,000 values a Spark micro-batch's source emits)."""
        b = self.buckets[ordinal]
        if self._flush_fn is not None:
            for item in items:
                if len(b) >= self.capacity:
                    self._flush_fn()
                b.append(item)
            return None
        room = self.capacity - len(b)
        it = iter(items)
        added = list(islice(it, room)) if room > 0 else []
        if added:
            b.extend(added)
            if not plain and not _SPECIAL_TYPES.isdisjoint(map(type, added)):
                self.specials = True
        if len(added) == room:
            for item in it:  # one more: the bucket is full, so it is refused
                self._refuse()
                return _Prepend(item, it)
        self.unfinished = False
        return None

    def offer_to_snapshot(self, key: Any, value: Any) -> bool:
        """Add a ``(key, value)`` entry of the processor's state to the current snapshot."""
        sb = self.snapshot_bucket
        if len(sb) >= self.snapshot_capacity:
            if self._flush_fn is None:
                return False
            self._flush_fn()
        sb.append((key, value))
        return True

    def _refuse(self) -> bool:
        """An offer is refused: set ``unfinished``, tell ``on_refused``; ``False``."""
        self.unfinished = True
        if self.on_refused is not None:
            self.on_refused()
        return False

    def has_unfinished_item(self) -> bool:
        """Whether the last offer was refused (its item must be offered again)."""
        return self.unfinished

    def is_cooperative_outbox(self) -> bool:
        """``False`` for a blocking outbox (non-cooperative processors)."""
        return self._flush_fn is None

    def is_empty(self) -> bool:
        if self.snapshot_bucket:
            return False
        return not any(self.buckets)

    def room(self, ordinal: int = 0) -> int:
        """How many more items the bucket of ``ordinal`` takes right now."""
        if self._flush_fn is not None:
            return self.capacity
        return self.capacity - len(self.buckets[ordinal])

    def __repr__(self) -> str:
        sizes = [len(b) for b in self.buckets]
        return f"Outbox(buckets={sizes}, snapshot={len(self.snapshot_bucket)}, capacity={self.capacity})"


class _Prepend:
    """An iterator that yields ``first`` and then the rest of ``rest``."""

    __slots__ = ("first", "rest")

    def __init__(self, first: Any, rest: Any) -> None:
        self.first: Any = _Prepend
        self.first = first
        self.rest = rest

    def __iter__(self) -> _Prepend:
        return self

    def __next__(self) -> Any:
        first = self.first
        if first is not _Prepend:
            self.first = _Prepend
            return first
        return next(self.rest)
