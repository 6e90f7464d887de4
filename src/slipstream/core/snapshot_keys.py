"""Keys of snapshot entries, which decide where an entry goes on restore.

A plain key is routed like an item on a distributed partitioned edge keyed by that key:
to the processor that owns ``partition(key)``, so a job can restore with a different
parallelism. :class:`KeyedStateKey` routes by its ``key`` but carries extra detail (e.g.
a window frame). :class:`BroadcastKey` entries reach every processor of the vertex (for
state such as a watermark that every processor needs; restore takes e.g. the minimum).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class BroadcastKey(NamedTuple):
    """Restored to every processor of the vertex."""

    name: Any


class KeyedStateKey(NamedTuple):
    """State of grouping key ``key``; ``detail`` distinguishes several entries of one key."""

    key: Any
    detail: Any = None


def routing_key(snapshot_key: Any) -> Any:
    """The key whose partition decides which processor restores the entry."""
    if type(snapshot_key) is KeyedStateKey:
        return snapshot_key.key
    return snapshot_key


def is_broadcast(snapshot_key: Any) -> bool:
    return type(snapshot_key) is BroadcastKey
