"""Keys of snapshot entries, which decide where an entry goes on restore.

A plain key is routed like an item on a distributed partitioned edge keyed by that key:
to the processor that owns ``partition(key)``, so a job can restore with a different
parallelism. :class:`KeyedStateKey` routes by its ``key`` but carries extra detail (e.g.
a window frame). :class:`BroadcastKey` entries reach every processor of the vertex (for
state such as a watermark that every processor needs; restore takes e.g. the minimum).
:class:`KeyedStateBatch` hands over many keyed entries in one piece (a mapping): saving
a large state then costs one dict copy instead of an entry per key; on restore it is
split into the ``KeyedStateKey`` entries it stands for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from slipstream.state.keyed import FULL, PLAIN, StateMap


class BroadcastKey(NamedTuple):
    """Restored to every processor of the vertex."""

    name: Any


def tagged_broadcast_name(
    key: Any, tag: str, length: int, vertex: str, owner: str
) -> tuple[Any, ...]:
    """The name of ``key`` when it is a :class:`BroadcastKey` named by a tuple of
    ``length`` starting with ``tag`` (how sources and sinks tag their own entries);
    otherwise a ``ValueError`` naming ``vertex``, the key and ``owner`` (what restores)."""
    name = key.name if type(key) is BroadcastKey else None
    if not (type(name) is tuple and len(name) == length and name[0] == tag):
        raise ValueError(f"vertex {vertex!r}: unexpected snapshot entry key {key!r} for {owner}")
    return name


class KeyedStateKey(NamedTuple):
    """State of grouping key ``key``; ``detail`` distinguishes several entries of one key."""

    key: Any
    detail: Any = None


class KeyedStateBatch(NamedTuple):
    """Key of an entry whose value is a mapping ``key -> value`` that stands for one entry
    ``(KeyedStateKey(key, detail), value)`` per item. The mapping is handed over: the
    processor must not change it after offering it (offer a copy, e.g. ``dict(d)``)."""

    detail: Any = None


def expand_entries(entries: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """``entries`` with every :class:`KeyedStateBatch` entry replaced by the
    ``KeyedStateKey`` entries it stands for, and every full
    :class:`~slipstream.state.keyed.StateMap` entry by the entries of its map (what a
    processor receives on restore). A delta or dropped map must have been merged into its
    chain's full map by the snapshot store first: here it raises ``ValueError``."""
    out: list[tuple[Any, Any]] = []
    new = tuple.__new__
    for entry in entries:
        k = entry[0]
        if type(k) is KeyedStateBatch:
            detail = k.detail
            out.extend([(new(KeyedStateKey, (key, detail)), v) for key, v in entry[1].items()])
        elif type(k) is StateMap:
            save = entry[1]
            if save.mode != FULL:
                raise ValueError(
                    f"snapshot entry {k!r} is a {save.mode} of keyed state, not merged with "
                    f"the snapshot {save.base_id} it is relative to"
                )
            if k.tag == PLAIN:
                out.extend(save.upserts.items())
            else:
                detail = k.detail
                out.extend(
                    [(new(KeyedStateKey, (key, detail)), v) for key, v in save.upserts.items()]
                )
        else:
            out.append(entry)
    return out


def routing_key(snapshot_key: Any) -> Any:
    """The key whose partition decides which processor restores the entry."""
    if type(snapshot_key) is KeyedStateKey:
        return snapshot_key.key
    return snapshot_key


def is_broadcast(snapshot_key: Any) -> bool:
    return type(snapshot_key) is BroadcastKey
