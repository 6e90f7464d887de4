"""Bookkeeping for two-phase sinks: what was prepared, and when it may be committed.

A sink that publishes only at snapshot commits (Jet's two-phase commit) prepares
something per snapshot (a prepared transaction, a sealed temporary file, held records)
and commits it in ``Processor.snapshot_commit_finish(True)``. :class:`PreparedCommits`
files each prepared thing under the snapshot that covers it, or under
:data:`AT_COMPLETION` for what ``complete()`` prepared, and answers which of them the
current ``snapshot_commit_finish(True)`` may commit::

    class MySink(AbstractProcessor):
        def init_processor(self, context):
            self.prepared = PreparedCommits()

        def snapshot_commit_prepare(self):
            txn = self.prepare_transaction()
            self.prepared.add(self.context.current_snapshot_id, txn)
            # a snapshot names every transaction not committed yet (a failed snapshot
            # leaves its own to the next one, and a restore from that must commit it)
            return self.outbox.offer_to_snapshot(BroadcastKey(("txns", index)), self.prepared.items())

        def snapshot_commit_finish(self, success):
            if success:
                for txn in self.prepared.due(self.context):
                    self.commit(txn)  # idempotent: a restore may commit it again
                    self.prepared.remove(txn)
            return True
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["AT_COMPLETION", "PreparedCommits"]

T = TypeVar("T")

#: The snapshot id under which output prepared in ``complete()`` is filed: it may be
#: committed only once a snapshot recording the processor as completed committed
#: (``context.completion_committed``), not with an earlier snapshot.
AT_COMPLETION = 1 << 62


class PreparedCommits(Generic[T]):
    """Prepared things of one processor, in preparation order, each with the snapshot
    that covers it. Used on the processor's own thread only (no lock)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[int, T]] = []

    def add(self, snapshot_id: int, item: T) -> None:
        """``item`` becomes final when snapshot ``snapshot_id`` commits (use
        :data:`AT_COMPLETION` for what ``complete()`` prepared)."""
        self._entries.append((snapshot_id, item))

    def due(self, context: Any) -> list[T]:
        """What ``snapshot_commit_finish(True)`` may commit now: everything filed under
        a snapshot up to ``context.committed_snapshot_id``, and, once
        ``context.completion_committed``, what ``complete()`` prepared."""
        bound = AT_COMPLETION if context.completion_committed else context.committed_snapshot_id
        return [item for sid, item in self._entries if sid <= bound]

    def due_entries(self, context: Any) -> list[tuple[int, T]]:
        """:meth:`due` with the snapshot id each item is filed under."""
        bound = AT_COMPLETION if context.completion_committed else context.committed_snapshot_id
        return [(sid, item) for sid, item in self._entries if sid <= bound]

    def entries(self) -> list[tuple[int, T]]:
        """``(snapshot id, item)`` of everything not committed yet, oldest first."""
        return list(self._entries)

    def remove(self, item: T) -> None:
        """``item`` was committed (compared by identity, then equality)."""
        for i, (_sid, x) in enumerate(self._entries):
            if x is item:
                del self._entries[i]
                return
        for i, (_sid, x) in enumerate(self._entries):
            if x == item:
                del self._entries[i]
                return

    def items(self) -> list[T]:
        """Everything prepared and not committed yet, oldest first."""
        return [item for _sid, item in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __repr__(self) -> str:
        return f"PreparedCommits({self._entries!r})"
