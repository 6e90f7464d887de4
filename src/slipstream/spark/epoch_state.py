"""Keyed state on the executors: what a Spark task of a streaming epoch does with its
processor's state (issue 23, item 1).

The driver commits each epoch's snapshot as a format-3 manifest
(:mod:`slipstream.state.format`) under the checkpoint location, but it never holds the
processors' entries:

* **Saving.** At the epoch's terminal barrier each task writes its processor's entries
  as one full chunk into the store directory itself (:func:`write_epoch_chunk`, signed
  with the store's key, which the driver hands to the executors in the epoch's state
  broadcast; the file name is unique per task attempt, so a retried, speculative or
  replayed task never overwrites a chunk another attempt wrote). The task's result
  carries only the chunk's ref (file, MAC, mode, bytes) and two flags; the driver
  builds the manifest from the refs and commits it (temp + fsync + rename,
  ``MANIFEST.json``, the generation: :meth:`DirectorySnapshotStore.commit`). Chunks of
  attempts that no committed manifest names are removed by the store's garbage
  collection at the next commit.
* **Restoring.** At the same parallelism each task reads its own processor's chain from
  the checkpoint (:func:`restore_entries`; the driver sends the refs of the committed
  manifest, never the state). Restore routing (:func:`~slipstream.state.restore.
  restore_plan`) also gives every processor of a vertex the ``BroadcastKey`` entries of
  all of them, and moves a keyed entry to the processor owning its key: so a task also
  reads the chains of its vertex that hold broadcast entries (keeping only those). A
  vertex any of whose chains holds an entry its writer does not own (the ``spill``
  flag), and every vertex whose parallelism changed, is rerouted by key through a Spark
  shuffle before the epoch (:mod:`slipstream.spark.rescale`), never on the driver.

The two flags are recorded per chain in the manifest's ``extra`` (``executor_state``,
see :mod:`slipstream.spark.streaming`), so a restarted driver decides without reading a
chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from slipstream.state import format as fmt
from slipstream.state.keyed import StateMap
from slipstream.state.keys import KeyedStateBatch, KeyedStateKey, expand_entries, is_broadcast
from slipstream.state.store import (
    ChunkRef,
    chunk_file_name,
    encode_chunk,
    read_chain_files,
    write_chunk_file,
)

__all__ = ["entry_flags", "restore_entries", "write_epoch_chunk"]


def restore_entries(
    state: Mapping[str, Any], vertex: str, index: int, own: dict[str, Any] | None = None
) -> list[Any] | None:
    """The entries processor ``vertex#index`` restores from the epoch's ``state`` (the
    value of its broadcast, see :class:`~slipstream.spark.compile.EpochInput`): entries
    the driver routed (``restore``: a store of an older version), those rerouted by key
    through Spark (``rescaled``: per vertex, ``{index: [ref json]}``, see
    :mod:`slipstream.spark.rescale`) and those of the chains this task reads itself
    (``chains``: per vertex, ``[[index, [ref json, ...], holds_broadcast], ...]`` by
    index): all of its own chain's, the ``BroadcastKey`` entries of the others that hold
    some, in the order restore routing gives them. ``None``: nothing to restore.

    ``own`` (if given) receives, when the task reads its own chain (its vertex is
    restored on the tasks: the same parallelism, no key away from its owner),
    ``snapshot`` (the chain's last snapshot) and ``maps`` (its keyed-state maps,
    ``(tag, detail) -> size``): the processor's keyed state may then continue the chain
    with a delta (:func:`~slipstream.state.keyed.continue_restored_chain`)."""
    routed = state.get("restore")
    chains = (state.get("chains") or {}).get(vertex)
    rescaled = (state.get("rescaled") or {}).get(vertex)
    if routed is None and chains is None and rescaled is None:
        return None
    out: list[Any] = list(routed.get((vertex, index), [])) if routed is not None else []
    if rescaled and rescaled.get(index):
        # rerouted by key through Spark (slipstream.spark.rescale): one full chunk of the
        # snapshot this epoch writes, holding this processor's entries in restore order
        store = state["store"]
        out.extend(
            expand_entries(
                read_chain_files(
                    store["directory"],
                    store["key"],
                    [ChunkRef.from_json(r) for r in rescaled[index]],
                    vertex,
                    index,
                    state["write_id"],
                )
            )
        )
    if chains:
        store = state["store"]
        sid = state["restore_id"]
        for j, refs, holds_broadcast in chains:
            if j != index and not holds_broadcast:
                continue
            entries = read_chain_files(
                store["directory"],
                store["key"],
                [ChunkRef.from_json(r) for r in refs],
                vertex,
                j,
                sid,
            )
            if j == index:
                if own is not None and refs:
                    own["snapshot"] = int(refs[-1]["snapshot"])
                    own["maps"] = {
                        (k.tag, k.detail): len(v.upserts)
                        for k, v in entries
                        if type(k) is StateMap
                    }
                out.extend(expand_entries(entries))
            else:
                out.extend(e for e in entries if is_broadcast(e[0]))
    return out


def _keys(entries: Iterable[tuple[Any, Any]]) -> Iterable[Any]:
    """The routing key of every keyed entry (``BroadcastKey`` entries are skipped)."""
    for k, v in entries:
        t = type(k)
        if t is StateMap:
            yield from v.upserts
        elif t is KeyedStateBatch:
            yield from v
        elif t is KeyedStateKey:
            yield k.key
        elif not is_broadcast(k):
            yield k


def entry_flags(
    entries: list[tuple[Any, Any]], index: int, owner: Callable[[Any], int]
) -> tuple[bool, bool]:
    """``(spill, broadcast)`` of a processor's saved entries: whether one keyed entry
    belongs to another processor than ``index`` (``owner``: the vertex's restore
    routing), and whether one is a ``BroadcastKey`` entry."""
    broadcast = any(is_broadcast(k) for k, _v in entries)
    spill = any(owner(key) != index for key in _keys(entries))
    return spill, broadcast


def write_epoch_chunk(
    store: Mapping[str, Any],
    snapshot_id: int,
    vertex: str,
    index: int,
    attempt: str,
    entries: list[tuple[Any, Any]],
    owner: Callable[[Any], int],
) -> dict[str, Any]:
    """Write processor ``vertex#index``'s saved ``entries`` as a chunk of snapshot
    ``snapshot_id`` into ``store`` (``{"directory", "key"}``) under a name of its own
    (``attempt``); returns what the task's result carries to the driver: the chunk's
    ref as JSON (``None`` without entries), the flags of :func:`entry_flags` and
    ``base``: for a delta chunk (the processor continued the chain it restored, see
    :func:`restore_entries`) the snapshot it is relative to, the chain's last, which
    the driver checks before it appends the chunk to that chain (``None``: a full
    chunk, a new chain)."""
    if not entries:
        return {"chunk": None, "spill": False, "broadcast": False, "base": None}
    spill, broadcast = entry_flags(entries, index, owner)
    mode = fmt.chunk_mode(entries)
    base = None
    if mode == fmt.CHUNK_DELTA:
        bases = fmt.delta_bases(entries)
        if len(bases) != 1:
            raise ValueError(
                f"{vertex}#{index}: the keyed state of snapshot {snapshot_id} holds deltas "
                f"relative to snapshots {sorted(bases)}; a chunk continues one chain"
            )
        base = bases.pop()
    payload = encode_chunk(entries, snapshot_id, vertex, index)
    name = chunk_file_name(snapshot_id, vertex, index, attempt=attempt)
    ref = write_chunk_file(
        store["directory"], store["key"], name, snapshot_id, vertex, index, mode, payload
    )
    return {"chunk": ref.as_json(), "spill": spill, "broadcast": broadcast, "base": base}
