"""Keyed groups: the entries of many keys travelling as one data item.

A :class:`KeyedGroup` holds ``entries``, a dict of key -> value, and a ``head`` that all
of them share. On a partitioned edge the collector routes each entry by its key, as it
would route an item whose key function gives that key, and hands each consumer one
group of the entries it owns (the edge's key function is not called on a group: its
keys are the entries'). A group is only ever produced and consumed by the engine's own
processors: the Pipeline's window stage 1 (``accumulate_rows_by_frame``) emits a
frame's partial results as one group per frame, ``(start, end)`` as the head, and its
stage 2 (``combine_to_sliding_window``) merges it into its frame; the Pipeline's keyed
aggregation's stage 1 (``GroupByKeyP`` with ``groups_out``) emits its accumulators at
its end as groups with the head ``None``, which its stage 2 (``combine_by_key``) merges.

Why: with ``processes=2`` each member's stage 1 emits a partial result for nearly every
key of every frame, and as items each cost a tuple, a key read and an append in the
split, a pickled tuple when it crosses, and an unpacking in the combine. As a group the
frame's dict is handed on as it is, split by key in one loop, pickled at C speed, and
merged into a frame that is new with ``dict.update`` (docs/performance.md, "Windows:
the partial results as one group per frame").
"""

from __future__ import annotations

from typing import Any

__all__ = ["GROUP_MAX", "KeyedGroup"]

#: most keys in one group a processor emits (more leave as several): bounds what one
#: item holds on a channel, whose credits count items
GROUP_MAX = 4096


class KeyedGroup:
    """``entries`` (key -> value) sharing ``head``; see the module docstring. Not
    iterable, so code that expects a keyed item fails on it at once."""

    __slots__ = ("head", "entries")

    def __init__(self, head: Any, entries: dict[Any, Any]) -> None:
        self.head = head
        self.entries = entries

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is KeyedGroup
            and other.head == self.head
            and other.entries == self.entries
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KeyedGroup({self.head!r}, {self.entries!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (KeyedGroup, (self.head, self.entries))
