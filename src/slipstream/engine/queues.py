"""Bounded single-producer single-consumer queues between two processors.

An entry is either a ``list`` of data items (a chunk) or one special item (watermark,
idle mark, barrier, done). ``collections.deque`` appends and pops are atomic under the
GIL; the size is derived from two counters that each have a single writer (the producer
owns ``put_count``, the consumer ``take_count``), so no lock is needed and a stale read
only ever over-estimates the size. A queue accepts an entry while it holds fewer than
``capacity`` items, so it overshoots by at most one chunk.
"""

from __future__ import annotations

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
