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

* **Keeping it between epochs.** Reading the chain every epoch costs time in the size of
  the state, not of the change. So a task that wrote its processor's chunk also keeps
  the state that chunk brings its chain to (the restored chain's merged entries with the
  chunk applied) in its Python worker process (``spark.python.worker.reuse``, on by
  default, keeps the process between tasks), under (store directory, vertex, processor)
  and the chunk's identity (file name, unique per task attempt, and MAC). The next
  epoch's task for that processor, if it runs in the same process, uses it only when the
  committed manifest's chain ends with exactly that chunk: a cache left by an attempt or
  an epoch that did not commit (its chunk is not the manifest's), by another job's
  chain, or a process that never ran the processor, reads the chain as before. A task
  takes its entry out of the cache before it restores (a failed task leaves none) and
  puts the new one back only once its chunk is written. The chain's files are still
  read and their signatures checked, so a damaged or missing chunk fails the epoch as
  before; what is saved is unpickling and merging them. ``SparkStreamingJob.
  executor_state_cache = False`` turns it off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from slipstream.state import format as fmt
from slipstream.state.keyed import DELTA, DROP, FULL, StateMap, StateMapSave
from slipstream.state.keys import expand_entries, is_broadcast
from slipstream.state.restore import entry_flags
from slipstream.state.store import (
    ChunkRef,
    chunk_file_name,
    encode_chunk,
    read_chain_files,
    verified_chunk_file,
    write_chunk_file,
)

__all__ = [
    "cache_size",
    "clear_cache",
    "entry_flags",
    "remember_state",
    "restore_entries",
    "write_epoch_chunk",
]

#: This Python worker process's kept states (module doc, "Keeping it between epochs"):
#: (store directory, vertex, index) -> ((file, MAC, snapshot) of the chain's last chunk,
#: the merged entries the chain reads as), the least recently kept first.
_kept: OrderedDict[tuple[str, str, int], tuple[tuple[str, str, int], list[Any]]] = OrderedDict()
#: At most this many processors' states are kept per process (the oldest go first).
CACHE_LIMIT = 16


def cache_size() -> int:
    """How many processors' states this process keeps (for tests and the breakdown)."""
    return len(_kept)


def clear_cache() -> None:
    """Forget every kept state of this process."""
    _kept.clear()


def _chunk_id(ref: Mapping[str, Any]) -> tuple[str, str, int]:
    return (str(ref["file"]), str(ref["mac"]), int(ref["snapshot"]))


def _take_kept(
    directory: str, vertex: str, index: int, chains: list[list[Any]], restore_id: int
) -> list[Any] | None:
    """The kept merged entries of ``vertex#index`` if its committed chain (in
    ``chains``, of snapshot ``restore_id``) ends with the chunk they were kept for;
    taken out of the cache either way. Kept states of the vertex's other processors
    that are stale (of a snapshot up to ``restore_id`` that the manifest does not end
    their chain with) are dropped too: never used, they would only hold memory. (One of
    a later snapshot may be this epoch's, kept by a task that already ran.)"""
    found: list[Any] | None = None
    for j, refs, _holds_broadcast in chains:
        key = (directory, vertex, j)
        kept = _kept.get(key)
        if kept is None:
            continue
        current = bool(refs) and kept[0] == _chunk_id(refs[-1])
        if j == index:
            del _kept[key]
            if current:
                found = kept[1]
        elif not current and kept[0][2] <= restore_id:
            del _kept[key]
    named = {j for j, _r, _b in chains}
    if index not in named:
        _kept.pop((directory, vertex, index), None)
    return found


def restore_entries(
    state: Mapping[str, Any],
    vertex: str,
    index: int,
    own: dict[str, Any] | None = None,
    kept: dict[str, Any] | None = None,
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
    with a delta (:func:`~slipstream.state.keyed.continue_restored_chain`).

    ``kept`` (if given, and the epoch's ``state["cache"]`` is on) receives ``outcome``
    (``"hit"``: the own chain's state came from this process's cache, ``"miss"``: it
    was read) and ``merged``: the own chain's merged entries, which
    :func:`remember_state` brings to the chunk the task writes."""
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
        use_cache = kept is not None and bool(state.get("cache"))
        cached = (
            _take_kept(store["directory"], vertex, index, chains, sid)
            if use_cache
            else None
        )
        for j, refs, holds_broadcast in chains:
            if j != index and not holds_broadcast:
                continue
            if j == index and cached is not None:
                # integrity as when reading: every chunk of the chain is still there and
                # passes its signature check (a damaged or missing one fails the epoch);
                # only unpickling and merging are saved
                for r in refs:
                    verified_chunk_file(
                        store["directory"], store["key"], ChunkRef.from_json(r), vertex, j, sid
                    )
                entries = cached
            else:
                entries = read_chain_files(
                    store["directory"],
                    store["key"],
                    [ChunkRef.from_json(r) for r in refs],
                    vertex,
                    j,
                    sid,
                )
            if j == index:
                if use_cache:
                    assert kept is not None
                    kept["outcome"] = "hit" if cached is not None else "miss"
                    kept["merged"] = entries
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


def remember_state(
    state: Mapping[str, Any],
    vertex: str,
    index: int,
    kept: Mapping[str, Any],
    entries: list[tuple[Any, Any]],
    written: Mapping[str, Any],
) -> bool:
    """After processor ``vertex#index`` wrote ``entries`` as the chunk ``written``
    describes (:func:`write_epoch_chunk`'s result): keep the state that chunk brings
    its chain to in this process (module doc), if the epoch's cache is on. A full chunk
    is the state; a delta is applied to the merged entries the task restored
    (``kept["merged"]``, from :func:`restore_entries`), as
    :func:`~slipstream.state.format.merge_chain` applies it when the chain is read.
    Returns whether it kept it (not without a chunk, without the restored state a
    delta continues, or with a map that is not a plain dict)."""
    chunk = written.get("chunk")
    if not state.get("cache") or chunk is None:
        return False
    if fmt.chunk_mode(entries) == fmt.CHUNK_FULL:
        merged: list[Any] | None = list(entries)
        if any(type(k) is StateMap and type(v.upserts) is not dict for k, v in entries):
            merged = None
    else:
        merged = _apply_delta(kept.get("merged"), entries)
    if merged is None:
        return False
    key = (state["store"]["directory"], vertex, index)
    _kept.pop(key, None)
    _kept[key] = (_chunk_id(chunk), merged)
    while len(_kept) > CACHE_LIMIT:
        _kept.popitem(last=False)
    return True


def _apply_delta(base: list[Any] | None, entries: list[tuple[Any, Any]]) -> list[Any] | None:
    """``base`` (merged entries: other entries, then full maps) with the delta chunk's
    ``entries`` applied: the chunk's other entries replace the base's, its maps update
    the base's maps in place (``base`` is the task's own). ``None`` if it cannot."""
    if base is None:
        return None
    maps: dict[tuple[str, Any], dict[Any, Any]] = {}
    for k, v in base:
        if type(k) is StateMap:
            maps[(k.tag, k.detail)] = v.upserts
    other: list[tuple[Any, Any]] = []
    for k, v in entries:
        if type(k) is not StateMap:
            other.append((k, v))
            continue
        name = (k.tag, k.detail)
        if type(v.upserts) is not dict:
            return None
        if v.mode == FULL:
            maps[name] = v.upserts
        elif v.mode == DELTA:
            m = maps.get(name)
            if m is None:
                return None
            m.update(v.upserts)
            for gone in v.removed:
                m.pop(gone, None)
        elif v.mode == DROP:
            maps.pop(name, None)
        else:
            return None
    for (tag, detail), m in maps.items():
        other.append((StateMap(tag, detail), StateMapSave(FULL, m, (), 0)))
    return other


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
