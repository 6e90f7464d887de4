"""A processor restored from exactly its own chain continues it (issue 23, item 2): after
a restore at the same parallelism from the job's own store, the first snapshot of a
keyed processor is a delta chunk appended to the chain it was restored from, not a new
full chunk; the output stays exact. A rescaled restore, or one from another store,
starts new chains (a full chunk)."""

from __future__ import annotations

import os
import random
from types import SimpleNamespace
from typing import Any

import incremental_support as inc
import pytest

import slipstream as ss
from slipstream.state.keyed import DELTA, FULL, KeyedState, StateMap, continue_restored_chain
from slipstream.state.store import ChunkRef, DirectorySnapshotStore


def hot_key_items(kind: str, n_keys: int = 200) -> tuple[list[inc.Item], list[int]]:
    """Every key once, then 6 steps of 10 items over 3 hot keys each."""
    rnd = random.Random(23)
    items: list[inc.Item] = []
    ts = 0
    for k in range(n_keys):
        ts += 1
        items.append((k, rnd.randint(1, 9), ts))
    ends = [len(items)]
    for _ in range(6):
        hot = rnd.sample(range(n_keys), 3)
        for _ in range(10):
            ts += rnd.choice((0, 1, 3))
            value = rnd.randint(-2, 9) if kind == "custom" else rnd.randint(0, 9)
            items.append((rnd.choice(hot), value, ts))
        ends.append(len(items))
    return inc.with_tails(items, True), ends


Chains = dict[tuple[str, int], list[ChunkRef]]


def keyed_chains(store: str, snapshot_id: int) -> dict[tuple[str, int], list[ChunkRef]]:
    manifest = DirectorySnapshotStore(store).read_manifest(snapshot_id)
    return {
        (name, i): chain
        for name, vm in manifest.vertices.items()
        if name not in ("source", "sink")
        for i, chain in vm.chains.items()
    }


def run_two(
    kind: str,
    tmp_path: Any,
    second_lp: int = 1,
    backend: str = "memory",
    other_store: bool = False,
) -> tuple[Chains, Chains, int, set[tuple[str, int]]]:
    """Run ``kind`` through the base and 3 hot steps, cancel it, restore it from its store
    (``second_lp`` keyed processors; ``other_store``: its snapshot into a new store) and
    let it commit once with nothing new; then run it to the end and check the output.
    Returns the keyed chains of the stop's snapshot and of that first commit, its id, and
    the processors whose chain at the stop holds a keyed-state map."""
    items, ends = hot_key_items(kind)
    run = inc.new_run()
    store = str(tmp_path / "store")
    engines = []
    try:
        engine = ss.local(cooperative_threads=1)
        engines.append(engine)
        job = engine.new_job(inc.build(kind, run, items, 1, 1), inc.config("cont", store, backend))
        for gate in ends[:4]:
            inc.GATES[run] = gate
            inc.wait_released(job, run, items)
            inc.wait_commits(job, 2)
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(60)
        stopped = inc.latest(store)
        before = keyed_chains(store, stopped.snapshot_id)
        mapped = {
            (name, i)
            for name, i in before
            if any(type(k) is StateMap for k, _ in stopped.vertices[name].entries[i])
        }
        restore: Any = store
        second_store = store
        if other_store:
            restore = stopped
            second_store = str(tmp_path / "other")
        engine = ss.local(cooperative_threads=1)
        engines.append(engine)
        job = engine.new_job(
            inc.build(kind, run, items, 1, second_lp),
            # snapshots further apart: the first commit is still among the store's
            # retained ones when it is read (below)
            inc.config("cont", second_store, backend, interval_ms=50),
            restore_from=restore,
        )
        inc.wait_commits(job, 1)  # the gate holds: nothing changes before it
        # the first commit after the restore, not the latest: the job goes on committing
        # while this reads, and a later commit's chain has one more delta
        first = min(
            i
            for i in DirectorySnapshotStore(second_store).committed_ids_read_only()
            if other_store or i > stopped.snapshot_id
        )
        after = keyed_chains(second_store, first)
        inc.same_keyed_state(
            kind, stopped, DirectorySnapshotStore(second_store).read(first), "first commit"
        )
        inc.GATES[run] = len(items) + 1
        job.join(120)
        output = sum((engine.get_list("out") for engine in engines), [])
        assert inc.Counter(inc._hashable(x) for x in output) == inc.oracle_output(kind, items)
        return before, after, first, mapped
    finally:
        inc.GATES.pop(run, None)


@pytest.mark.parametrize(
    ("kind", "backend"),
    [
        ("custom", "memory"),
        ("custom", "sqlite"),
        ("rolling_count", "memory"),
        ("map_stateful", "memory"),
        ("tumbling", "memory"),
        ("session", "sqlite"),
    ],
)
def test_a_resumed_jobs_first_snapshot_continues_the_restored_chains(
    tmp_path: Any, kind: str, backend: str
) -> None:
    before, after, first, mapped = run_two(kind, tmp_path, backend=backend)
    assert mapped and set(after) == set(before)
    for key, chain in before.items():
        got = after[key]
        if key not in mapped:  # no keyed-state map (a window's first stage): all in full
            assert [(r.mode, r.snapshot_id) for r in got] == [(FULL, first)], key
            continue
        assert got[:-1] == chain, f"{key}: the chain restored from is not continued"
        assert (got[-1].mode, got[-1].snapshot_id) == (DELTA, first), key
        assert os.path.exists(str(tmp_path / "store" / got[0].file))


@pytest.mark.parametrize("kind", ["custom", "rolling_count", "tumbling"])
def test_a_rescaled_restore_starts_new_chains(tmp_path: Any, kind: str) -> None:
    _before, after, first, _mapped = run_two(kind, tmp_path, second_lp=2)
    assert after
    for key, chain in after.items():
        assert [(r.mode, r.snapshot_id) for r in chain] == [(FULL, first)], key


def test_a_snapshot_restored_into_another_store_starts_new_chains(tmp_path: Any) -> None:
    _before, after, first, _mapped = run_two("custom", tmp_path, other_store=True)
    assert after
    for key, chain in after.items():
        assert [(r.mode, r.snapshot_id) for r in chain] == [(FULL, first)], key


def context(restored: int, maps: dict[Any, int]) -> Any:
    return SimpleNamespace(
        incremental_snapshots=True,
        current_snapshot_id=0,
        committed_snapshot_id=restored,
        restored_snapshot_id=restored,
        _restored_maps=maps,
        _restored_states=[],
    )


def test_maps_that_equal_the_chain_save_a_delta_of_what_changed_after_the_restore() -> None:
    ctx = context(7, {("e", None): 2})
    state = KeyedState(context=ctx)
    assert state.dirty is not None
    state["a"] = 1  # what restore_from_snapshot_entry writes
    state["b"] = 2
    state.dirty.add("a")  # a processor that marks what it restores
    assert continue_restored_chain(ctx) and ctx.restored_snapshot_id == 7
    assert state.saved_id == 7 and not state.dirty
    late = KeyedState("k", "frame", ctx)  # made after the restore: a new map
    state["b"] = 3
    state.dirty.add("b")
    ctx.current_snapshot_id = 8
    assert state.snapshot_entry()[1] == (DELTA, {"b": 3}, (), 7)
    assert late.snapshot_entry()[1].mode == FULL


@pytest.mark.parametrize(
    "maps",
    [
        {("e", None): 3},  # the processor dropped a restored entry
        {("e", None): 2, ("k", 5): 1},  # a map of the chain was not made again
    ],
)
def test_maps_that_differ_from_the_chain_save_in_full(maps: dict[Any, int]) -> None:
    ctx = context(7, maps)
    state = KeyedState(context=ctx)
    state["a"] = 1
    state["b"] = 2
    assert not continue_restored_chain(ctx) and ctx.restored_snapshot_id == 0
    ctx.current_snapshot_id = 8
    assert state.snapshot_entry()[1] == (FULL, {"a": 1, "b": 2}, (), 0)
