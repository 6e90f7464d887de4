"""``P.sort``: sort a bounded input (Jet's ``sortP``).

Every processor collects its input and, once all of it arrived (``complete()``), emits
it sorted by ``key_fn`` (Python's stable ``sorted``: items with equal keys keep their
arrival order). Each processor sorts only what it receives: for one globally sorted
stream give the vertex ``local_parallelism(1)`` behind an ``all_to_one()`` edge
(``.distributed().all_to_one()`` on several members). Jet instead merges the sorted
runs of parallel processors through an ordered edge, which slipstream does not have.

Snapshots save the items not emitted yet (in chunks, under broadcast keys of the
processor); a restore deals the chunks out again over the new processors, so the job
may be restored with another parallelism. At-least-once: items that arrived after the
barrier on an input that delivered it early are in the saved state and are replayed
after a restart, so they appear twice in the output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.processor import AbstractProcessor
from slipstream.core.traits import BUFFERS_INPUT
from slipstream.state.keys import BroadcastKey

__all__ = ["SortP", "sort"]

_CHUNK = 1024


class SortP(AbstractProcessor):
    """Collects items, sorts them in ``complete()`` and emits them in order."""

    slipstream_traits = frozenset({BUFFERS_INPUT})

    def __init__(self, key_fn: Callable[[Any], Any] | None, reverse: bool) -> None:
        self._key_fn = key_fn
        self._reverse = reverse
        self._items: list[Any] = []
        self._sorted: list[Any] | None = None
        self._pos = 0
        self._it: Any = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._items.extend(inbox)
        inbox.clear()

    def complete(self) -> bool:
        if self._sorted is None:
            try:
                self._sorted = sorted(self._items, key=self._key_fn, reverse=self._reverse)
            except TypeError as e:
                raise TypeError(
                    f"sort (vertex {self.context.vertex_name!r}): cannot order the items: {e}"
                    + ("" if self._key_fn else " (pass key_fn to sort by a comparable key)")
                ) from e
            self._items = []
            self._it = self._emitting()
        if not self.emit_from(self._it):
            return False
        self._sorted = None
        return True

    def _emitting(self) -> Any:
        items = self._sorted
        assert items is not None
        while self._pos < len(items):
            item = items[self._pos]
            self._pos += 1
            yield item

    def save_to_snapshot(self) -> bool:
        return self.save_state(self._remaining_chunks)

    def _remaining_chunks(self) -> Any:
        if self._sorted is not None:
            # completing: the engine never snapshots with an item half-offered, so
            # everything before _pos went out
            rest = self._sorted[self._pos :]
        else:
            rest = self._items
        me = self.context.global_processor_index
        for n, start in enumerate(range(0, len(rest), _CHUNK)):
            yield BroadcastKey(("sort", me, n)), rest[start : start + _CHUNK]

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        _, saved_by, _n = key.name
        c = self.context
        if saved_by % c.total_parallelism == c.global_processor_index:
            self._items.extend(value)


def sort(
    key_fn: Callable[[Any], Any] | None = None, *, reverse: bool = False
) -> Callable[[], SortP]:
    """A vertex that emits its (bounded) input sorted by ``key_fn`` once the input is
    complete; see :mod:`slipstream.processors.sort`."""
    if key_fn is not None and not callable(key_fn):
        raise TypeError(f"sort: key_fn must be callable or None, got {key_fn!r}")
    return functools.partial(SortP, key_fn, bool(reverse))
