"""Bounded single-producer single-consumer queues between two processors.

An entry is either a ``list`` of data items (a chunk) or one special item (watermark,
idle mark, barrier, done). ``collections.deque`` appends and pops are atomic under the
GIL; the size is derived from two counters that each have a single writer (the producer
owns ``put_count``, the consumer ``take_count``), so no lock is needed and a stale read
only ever over-estimates the size. A queue accepts an entry while it holds fewer than
``capacity`` items, so it overshoots by at most one chunk.

:class:`CrossMemberQueue` joins two processors of different simulated members
(``ss.local(members=2)``) on a distributed edge: it checks that its first item pickles.
"""

from __future__ import annotations

import pickle
from collections import deque
from typing import Any


class SpscQueue:
    __slots__ = ("entries", "capacity", "put_count", "take_count", "name")

    def __init__(self, capacity: int, name: str = "") -> None:
        self.entries: deque[Any] = deque()
        self.capacity = capacity
        self.put_count = 0
        self.take_count = 0
        self.name = name

    def offer(self, entry: Any, size: int) -> bool:
        if self.put_count - self.take_count >= self.capacity:
            return False
        self.entries.append(entry)
        self.put_count += size
        return True

    def size(self) -> int:
        return self.put_count - self.take_count

    def __repr__(self) -> str:
        return f"SpscQueue({self.name}, size={self.size()}/{self.capacity})"


UNBOUNDED = 1 << 62


class CrossMemberQueue(SpscQueue):
    """A queue between simulated members: the first data item offered must pickle, as
    every item that travels between Spark tasks must, so a DAG that runs here with
    ``members`` > 1 does not fail on Spark with items it never shipped. Once one item
    passed, the queue turns into a plain :class:`SpscQueue` (same slots), so later
    offers pay nothing. ``name`` names the edge and the two processors (the error
    quotes it). Only the first item is checked: a later item of another type goes
    unchecked."""

    __slots__ = ()

    def offer(self, entry: Any, size: int) -> bool:
        if type(entry) is list and entry:
            item = entry[0]
            try:
                pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise pickle.PicklingError(
                    f"{self.name}: an item of type {_type_name(item)} cannot be pickled "
                    f"({type(exc).__name__}: {exc}); items that travel between members "
                    "(distributed edges) must pickle, as between Spark tasks "
                    "(ss.local(members=...) checks the first item between each two processors)"
                ) from exc
            self.__class__ = SpscQueue  # type: ignore[assignment]  # checked: plain from now on
        return SpscQueue.offer(self, entry, size)


def _type_name(item: Any) -> str:
    t = type(item)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
