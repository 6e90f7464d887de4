"""Incremental snapshots with member processes (``ss.local(processes=2)``, issue 24 on
issue 22's state layer): each member writes delta chunks for its processors' chains,
the coordinator names base + deltas per chain in the manifest and compacts long chains
over the store, and a restore reads them, at the same process count or another.

- Differential: the keyed state a snapshot holds as a chain of a (compacted) base and
  deltas equals what a full save would hold (the oracle's sums over exactly the items
  the sources had emitted at that snapshot); restored at one process the job's output
  is exact (hypothesis, few examples).
- Bytes written follow the change: once the state stopped growing, each snapshot writes
  delta chunks a small fraction of the full chunk's size.
- A resume at the same shape continues the members' chains (first saves are deltas).
- Copy-on-write saves (20,000 keys or more) flag their chains as holding only their own
  processor's keys, so a restore at the same shape reads one chain per processor.

Tests wait for events (commits, output), never for time.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import snapshot_test_procs as stp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slipstream as ss
from process_support import functions_by_value
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
from slipstream.state import compact
from slipstream.state.keyed import DELTA, FULL
from slipstream.state.store import DirectorySnapshotStore

GUARD_S = 120
EO = ProcessingGuarantee.EXACTLY_ONCE


@pytest.fixture(scope="module", autouse=True)
def by_value() -> Iterator[None]:
    """This module's classes travel to the members by value (by reference, each member
    would import the test module, and hypothesis with it)."""
    with functions_by_value(sys.modules[__name__]):
        yield


def wait_for(cond: Callable[[], bool], what: str) -> None:
    """Wait for an event; the deadline only bounds a hang."""
    deadline = time.monotonic() + GUARD_S / 2
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def config(store: str, **kw: Any) -> JobConfig:
    kw.setdefault("name", "procdelta")
    return JobConfig(processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=store, **kw)


def keyed_dag(n: int, keys: int, rate: float, processes: int) -> DAG:
    """PacedSource(range(n)), two source processors at any process count (their
    offsets restore only at the same parallelism) -> KeyedRunningSum by ``x % keys``
    (two per member: rescaled by key) -> list sink ``out``."""
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, n, rate))
    src.local_parallelism(2 // processes)
    rs = dag.new_vertex("sum", functools.partial(stp.KeyedRunningSum, keys)).local_parallelism(2)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, rs).partitioned(functools.partial(_mod, keys)).distributed())
    dag.edge(Edge.between(rs, sink))
    return dag


def _mod(keys: int, x: int) -> int:
    return x % keys


def compacted_head_then_delta(store_dir: str) -> bool:
    """The last committed manifest names a chain of 'sum' that starts with a compaction
    output and continues with a delta."""
    manifest = stp.newest_manifest(store_dir)  # a read that a commit's pruning may race
    chains = manifest.vertices.get("sum") if manifest is not None else None
    return chains is not None and any(
        c[0].file.endswith("-c.bin") and len(c) > 1 and c[-1].mode == DELTA
        for c in chains.chains.values()
    )


@pytest.mark.timeout(GUARD_S)
@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# an even number of keys: every item of a key comes from one source processor (x and
# x + keys have one parity), so its running sums arrive in x's order whatever the skew
# between the two sources (a member that started late or stalled under load); the
# engine orders nothing between two upstream processors, and with an odd number, a key
# whose items alternate between the sources emits other sums than the oracle's once one
# source runs keys / 2 items ahead (0.25-1 s at 2,000 items/s)
@given(keys=st.integers(500, 2000).map(lambda half: 2 * half))
def test_delta_chains_hold_the_full_state_and_restore_at_one_process(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, keys: int
) -> None:
    monkeypatch.setattr(compact, "DEFAULT_MAX_DELTAS", 1)  # the coordinator compacts soon
    store_dir = str(tmp_path_factory.mktemp("store"))
    engine = ss.local(processes=2)
    job = engine.new_job(keyed_dag(10**7, keys, 2000.0, 2), config(store_dir))
    try:
        wait_for(lambda: compacted_head_then_delta(store_dir), "a compacted chain and a delta")
    finally:  # also when the wait fails: hypothesis replays it, beside this job if left
        job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(GUARD_S)
    first = list(engine.get_list("out"))
    data = DirectorySnapshotStore(store_dir).latest()
    assert data is not None
    # the state the chains hold (base + deltas, merged) is what a full save would hold:
    # the sums over the items the two sources had emitted at that snapshot
    offsets = {k.name[1]: v for es in data.vertices["src"].entries.values() for k, v in es}
    assert sorted(offsets) == [0, 1]
    sums: dict[int, int] = {}
    for g, off in offsets.items():
        for x in range(g, g + 2 * off, 2):
            sums[x % keys] = sums.get(x % keys, 0) + x
    state: dict[int, int] = {}
    for entries in data.vertices["sum"].entries.values():
        for _key, save in entries:
            assert save.mode == FULL
            assert not set(state) & set(save.upserts)  # each key in one chain
            state.update(save.upserts)
    assert state == sums
    # restored at one process (the chains' keys routed to its two processors): exact
    n = max(g + 2 * off for g, off in offsets.items()) + 400
    engine1 = ss.local(processes=1)
    job1 = engine1.new_job(keyed_dag(n, keys, 1e9, 1), config(store_dir, resume=True))
    job1.join(GUARD_S)
    assert job1.resumed_from_snapshot == data.snapshot_id
    assert Counter(first) + Counter(engine1.get_list("out")) == stp.expected_keyed_sums(n, keys)


class GatedKeys(ss.AbstractProcessor):
    """Emits each of ``range(keys)`` once (its share), then, once the file ``gate``
    exists, ``hot`` items of the keys ``0 .. 3`` (processor 0); never completes (the test
    cancels the job). Saves nothing: the test does not restore it."""

    def __init__(self, keys: int, hot: int, gate: str) -> None:
        self.keys, self.hot, self.gate = keys, hot, gate

    def init_processor(self, context: ss.Context) -> None:
        g, total = context.global_processor_index, context.total_parallelism
        self.items = list(range(g, self.keys, total))
        self.later = [self.keys + j % 4 for j in range(self.hot)] if g == 0 else []
        self.pos = 0

    def complete(self) -> bool:
        if self.pos == len(self.items) and self.later and os.path.exists(self.gate):
            self.items += self.later
            self.later = []
        while self.pos < len(self.items):
            if not self.try_emit(self.items[self.pos]):
                return False
            self.pos += 1
        return False


def test_each_member_writes_deltas_the_size_of_the_change(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """6000 keys, then 40 changes of 4 keys: after the state stopped growing, the
    members' snapshots of 'sum' are delta chunks (one per processor and snapshot), each
    a small fraction of that processor's full chunk."""
    keys, hot = 6000, 40
    written: list[tuple[int, list[tuple[str, int, int]]]] = []  # (id, [(mode, size, index)])
    commit = DirectorySnapshotStore.commit

    def recording(self: Any, manifest: Any, *a: Any, **kw: Any) -> Any:
        out = commit(self, manifest, *a, **kw)
        vm = manifest.vertices.get("sum")
        sid = manifest.snapshot_id
        new = (
            []
            if vm is None
            else [
                (r.mode, r.size, i) for i, c in vm.chains.items() for r in c if r.snapshot_id == sid
            ]
        )
        written.append((sid, new))
        return out

    monkeypatch.setattr(DirectorySnapshotStore, "commit", recording)
    gate = str(tmp_path / "gate")
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(GatedKeys, keys, hot, gate))
    rs = dag.new_vertex("sum", functools.partial(stp.KeyedRunningSum, keys))
    sink = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, rs).partitioned(functools.partial(_mod, keys)).distributed())
    dag.edge(Edge.between(rs, sink))
    for v in (src, rs, sink):
        v.local_parallelism(1)
    engine = ss.local(processes=2)
    job = engine.new_job(dag, config(str(tmp_path / "store")))
    out = engine.get_list("out")
    wait_for(lambda: len(out) >= keys, "every key's first sum")
    grown = len(written)
    wait_for(lambda: len(written) >= grown + 2, "two more snapshots")
    boundary = len(written)  # the state no longer grows after these
    with open(gate, "w"):
        pass
    wait_for(lambda: len(out) >= keys + hot, "the hot keys' sums")
    done = len(written)
    wait_for(lambda: len(written) >= done + 2, "two more snapshots")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(GUARD_S)
    # key k's first sum is k, then each hot item adds keys + k
    hot_sums = Counter((j % 4, j % 4 + (j // 4 + 1) * (keys + j % 4)) for j in range(hot))
    assert Counter(out) == stp.expected_keyed_sums(keys, keys) + hot_sums
    full = {i: size for _, new in written[:boundary] for mode, size, i in new if mode == FULL}
    # ~3000 keys each: ~13 KB pickled, ~7 KB as written (compressed, format.COMPRESS_MAX)
    assert sorted(full) == [0, 1] and min(full.values()) > 5_000
    after = [new for _, new in written[boundary:]]
    deltas = [(size, i) for new in after for mode, size, i in new if mode == DELTA]
    # a processor may save in full when it aligned on a barrier before it heard that
    # the snapshot before committed (a member learns it over its pipe): rare, allowed
    assert len(deltas) >= len(after)
    for size, i in deltas:
        assert size * 20 < full[i], (size, full[i])


def test_a_resume_at_the_same_shape_continues_the_members_chains(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled once a chain of 'sum' holds a delta, resumed from its store at two
    processes again: the members' first saves are deltas continuing the chains they
    restored from (a manifest after the resume names chunks of the restored snapshot
    followed by a delta), and the output is exact."""
    keys = 2000
    store_dir = str(tmp_path / "store")
    manifests: list[Any] = []
    commit = DirectorySnapshotStore.commit

    def recording(self: Any, manifest: Any, *a: Any, **kw: Any) -> Any:
        out = commit(self, manifest, *a, **kw)
        manifests.append(manifest)
        return out

    monkeypatch.setattr(DirectorySnapshotStore, "commit", recording)

    def last_has_delta() -> bool:
        vm = manifests[-1].vertices.get("sum") if manifests else None
        return vm is not None and any(c[-1].mode == DELTA for c in vm.chains.values())

    engine = ss.local(processes=2)
    job = engine.new_job(keyed_dag(10**7, keys, 2000.0, 2), config(store_dir))
    wait_for(last_has_delta, "a delta")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(GUARD_S)
    first = list(engine.get_list("out"))
    data = DirectorySnapshotStore(store_dir).latest()
    assert data is not None
    restored = data.snapshot_id
    offsets = {k.name[1]: v for es in data.vertices["src"].entries.values() for k, v in es}
    n = max(g + 2 * off for g, off in offsets.items()) + 3000
    manifests.clear()
    engine2 = ss.local(processes=2)
    job2 = engine2.new_job(keyed_dag(n, keys, 2000.0, 2), config(store_dir, resume=True))
    job2.join(GUARD_S)
    assert job2.resumed_from_snapshot == restored
    assert Counter(first) + Counter(engine2.get_list("out")) == stp.expected_keyed_sums(n, keys)
    continued = [
        c
        for m in manifests
        for c in m.vertices["sum"].chains.values()
        if c[0].snapshot_id <= restored < c[-1].snapshot_id and c[-1].mode == DELTA
    ]
    assert continued, [
        [(r.snapshot_id, r.mode) for r in c]
        for m in manifests
        for c in m.vertices["sum"].chains.values()
    ][:8]


class TwoRounds(GatedKeys):
    """Emits its share of ``range(first)``, then, once the file ``gate`` exists, of
    ``range(second)`` (the same keys again); never completes (the test cancels)."""

    def __init__(self, first: int, second: int, gate: str) -> None:
        self.first, self.second, self.gate = first, second, gate

    def init_processor(self, context: ss.Context) -> None:
        g, total = context.global_processor_index, context.total_parallelism
        self.items = list(range(g, self.first, total))
        self.later = list(range(g, self.second, total))
        self.pos = 0


class ReplacedSums(ss.AbstractProcessor):
    """The sum of the items per key (the item), in a keyed state whose values are
    replaced, never changed in place: a save of 20,000 keys or more (full or delta) is
    copy-on-write (state/live.py). Emits nothing."""

    def init_processor(self, context: ss.Context) -> None:
        from slipstream.state.keyed import keyed_state

        self.sums = keyed_state(context)
        self.sums.values_replaced = True

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.sums[item] = self.sums.get(item, 0) + item
        if self.sums.dirty is not None:
            self.sums.dirty.add(item)
        return True

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(*self.sums.snapshot_entry())

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


def _identity(x: int) -> int:
    return x


def test_copy_on_write_saves_record_that_each_chain_holds_only_its_own_keys(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """48,000 keys over two members (~24,000 a processor: full saves copy-on-write),
    then 42,000 of them again (deltas of ~21,000 changed keys, copy-on-write when one
    snapshot takes them all). Every chain of 'sum' is flagged as holding only its own
    processor's keys, so a restore at the same shape reads one chain per processor:
    each member's restore reads only its own chain and gets exactly its keys' sums.
    On main the copy-on-write saves flagged every chain as spilling: each member read
    both chains."""
    from slipstream.engine.member_snapshots import FLAGS, restore_routing
    from slipstream.engine.processes import bare_plans

    first, second = 48_000, 42_000
    store_dir = str(tmp_path / "store")
    gate = str(tmp_path / "gate")
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(TwoRounds, first, second, gate))
    rs = dag.new_vertex("sum", ReplacedSums)
    dag.edge(Edge.between(src, rs).partitioned(_identity).distributed())
    for v in (src, rs):
        v.local_parallelism(1)
    engine = ss.local(processes=2)
    job = engine.new_job(dag, config(store_dir, name="cowflags"))

    def settled(items: int) -> None:
        wait_for(lambda: job.metrics.get("sum", {}).get("items_in", 0) >= items, f"{items} in")
        taken = job.metrics["__job__"]["snapshots"]
        wait_for(lambda: job.metrics["__job__"]["snapshots"] >= taken + 2, "two snapshots")

    settled(first)
    with open(gate, "w"):
        pass
    settled(first + second)
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(GUARD_S)
    store = DirectorySnapshotStore(store_dir)
    sid = store.committed_ids()[-1]
    manifest = store.read_manifest(sid)
    assert manifest.extra[FLAGS]["sum"]["chains"] == {"0": [False, False], "1": [False, False]}
    read: list[Any] = []
    store_read = DirectorySnapshotStore.read

    def recording(self: Any, snapshot_id: int, wanted: Any = None) -> Any:
        read.append(wanted)
        return store_read(self, snapshot_id, wanted)

    monkeypatch.setattr(DirectorySnapshotStore, "read", recording)
    plans = bare_plans(dag, 2, 1)
    setup = {"restore": ("store", store_dir, store.key, sid)}
    state: dict[int, int] = {}
    for member in (0, 1):
        routed = restore_routing(setup, dag, plans, member)
        assert routed is not None
        assert read[-1] is not None and {k for k in read[-1] if k[0] == "sum"} == {("sum", member)}
        mine = dict(routed[0][("sum", member)])  # (key, sum) entries
        assert not set(state) & set(mine)
        state.update(mine)
    assert state == {k: k * (2 if k < second else 1) for k in range(first)}
