"""Keyed jobs stopped at chosen snapshots and restored, with oracles for their output and
for the keyed state a snapshot holds (issue 22: incremental snapshots must restore exactly
what full snapshots restore).

The jobs read from a :class:`GatedSource`: it emits its share of a fixed item list, but
only the items at positions below a *gate* the test raises step by step. Between two
steps the job is quiescent, so the snapshots taken then hold exactly the state of the
items released so far (and the keys one step touched are the only ones that change, so
with incremental snapshots its snapshots are deltas of those keys). Each key's items come
from one source processor (``owner(key) % n``), so per key the order of items is the
list's order whatever the parallelism, and rolling outputs are deterministic.

Everything here goes through the public API (Pipeline, Core DAG, ``JobConfig``,
``DirectorySnapshotStore.latest()``, ``expand_entries``, ``keyed_state``): the tests hold
while every save is full and once saves are deltas merged by the store.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sinks
from slipstream.aggregate import AggregateOperation, counting, summing, to_list
from slipstream.state import keyed as keyed_mod
from slipstream.state import live
from slipstream.state.keyed import keyed_state
from slipstream.state.keys import BroadcastKey, KeyedStateKey, expand_entries, is_broadcast
from slipstream.state.store import DirectorySnapshotStore, SnapshotData
from slipstream.window import (
    KeyedWindowResult,
    session_window_def,
    sliding_window_def,
    tumbling_window_def,
)

EO = ProcessingGuarantee.EXACTLY_ONCE

#: an item: (key, value, timestamp); a negative value removes the key (custom kind only)
Item = tuple[Any, int, int]

#: run id -> items at positions below it are released
GATES: dict[str, int] = {}
#: (run id, global source index) -> items that processor has emitted
PROGRESS: dict[tuple[str, int], int] = {}
#: run id -> (changes tracked, save mode) -> how many saves of KeyedSumP's map
SAVES: dict[str, Counter[tuple[bool, str]]] = {}
_runs = itertools.count()

#: total parallelism of the source: kept in every execution (a source position only
#: means something for the same split), on one member (lp 2) or two (lp 1 each)
SOURCE_PARALLELISM = 2

KINDS = (
    "rolling_sum",  # group_by().rolling_aggregate(summing): the additive fast path
    "rolling_count",
    "rolling_list",  # a mutable accumulator (to_list)
    "map_stateful",  # mutable per-key state, some items emit nothing
    "aggregate",  # group_by().aggregate(): two stages, emits at the end
    "tumbling",
    "sliding",
    "session",  # closed sessions remove keys
    "custom",  # a Core API processor on keyed_state(); negative values delete keys
)
#: kinds whose snapshot state has a plain-Python oracle (key -> finished value)
ORACLE_STATE_KINDS = frozenset(
    {"rolling_sum", "rolling_count", "rolling_list", "map_stateful", "aggregate", "custom"}
)
TUMBLE, SLIDE_SIZE, SLIDE, SESSION_TIMEOUT = 8, 12, 4, 5


def owner(key: Any) -> int:
    """Which source processor (modulo the source parallelism) emits ``key``'s items."""
    return key if isinstance(key, int) else int(key[1:])


def new_run() -> str:
    run = f"run{next(_runs)}-{os.getpid()}"
    GATES[run] = 0
    for i in range(SOURCE_PARALLELISM):
        PROGRESS[(run, i)] = 0
    return run


# -- the source ------------------------------------------------------------------------------


class GatedSource(ss.AbstractProcessor):
    """Emits, in list order, the items of ``items`` whose key it owns and whose position
    is below ``GATES[run]``; completes once its share is emitted. Saves its offset under
    ``BroadcastKey(("gated", global_index))`` as ``(total_parallelism, offset)``."""

    def __init__(self, run: str, items: list[Item]) -> None:
        self.run = run
        self.items = items
        self.offset = 0

    def init_processor(self, context: ss.Context) -> None:
        i, n = context.global_processor_index, context.total_parallelism
        self.index = i
        self.share = [(pos, it) for pos, it in enumerate(self.items) if owner(it[0]) % n == i]

    def complete(self) -> bool:
        gate = GATES[self.run]
        share = self.share
        while self.offset < len(share) and share[self.offset][0] < gate:
            if not self.try_emit(share[self.offset][1]):
                break
            self.offset += 1
        PROGRESS[(self.run, self.index)] = self.offset
        return self.offset >= len(share)

    def save_to_snapshot(self) -> bool:
        n = self.context.total_parallelism
        return self.try_emit_to_snapshot(BroadcastKey(("gated", self.index)), (n, self.offset))

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        n, offset = value
        assert n == self.context.total_parallelism, (n, self.context.total_parallelism)
        if key.name == ("gated", self.index):
            self.offset = PROGRESS[(self.run, self.index)] = offset


def share_count(items: list[Item], index: int, gate: int) -> int:
    """How many items source processor ``index`` emits below ``gate``."""
    return sum(
        1 for pos, it in enumerate(items[:gate]) if owner(it[0]) % SOURCE_PARALLELISM == index
    )


def last_positions(items: list[Item]) -> dict[int, int]:
    """Each source processor's last item's position (see :func:`with_tails`)."""
    last = {}
    for pos, it in enumerate(items):
        last[owner(it[0]) % SOURCE_PARALLELISM] = pos
    assert len(last) == SOURCE_PARALLELISM, "every source processor needs an item"
    return last


def with_tails(items: list[Item], int_keys: bool) -> list[Item]:
    """``items`` and one more item for each source processor (so that every processor
    has a last item to hold back until the end)."""
    ts = items[-1][2] if items else 0
    tails = [(i if int_keys else f"k{i}", 1, ts) for i in range(SOURCE_PARALLELISM)]
    return [*items, *tails]


def emitted_items(items: list[Item], offsets: dict[int, int]) -> list[Item]:
    """The items the source processors had emitted at ``offsets`` (index -> offset), in
    list order (each key's items come from one processor, so per key this is their order)."""
    taken = {i: 0 for i in range(SOURCE_PARALLELISM)}
    out = []
    for it in items:
        i = owner(it[0]) % SOURCE_PARALLELISM
        if taken[i] < offsets.get(i, 0):
            taken[i] += 1
            out.append(it)
    return out


# -- the keyed custom processor ----------------------------------------------------------------


class KeyedSumP(ss.AbstractProcessor):
    """A custom keyed processor on :func:`keyed_state`: per key a running sum of the
    values; a negative value removes the key. Emits ``(key, sum)`` (``(key, None)`` for a
    removal). Written the way the keyed-state module documents it."""

    def __init__(self, run: str = "") -> None:
        self.run = run

    def init_processor(self, context: ss.Context) -> None:
        self.sums = keyed_state(context)
        if LIVE:
            self.sums.values_replaced = True  # ints, replaced: copy-on-write saves

    def process(self, ordinal: int, inbox: Any) -> None:
        sums, dirty = self.sums, self.sums.dirty
        while inbox:
            key, value, _ts = inbox[0]
            if value < 0:
                out = (key, None)
            else:
                out = (key, sums.get(key, 0) + value)
            if not self.try_emit(out):
                return
            inbox.popleft()
            if value < 0:
                sums.pop(key, None)
            else:
                sums[key] = out[1]
            if dirty is not None:
                dirty.add(key)

    def save_to_snapshot(self) -> bool:
        key, save = self.sums.snapshot_entry()
        if not self.outbox.offer_to_snapshot(key, save):
            return False
        # what the saves were: full or delta, and whether changes were tracked at all
        SAVES.setdefault(self.run, Counter())[(self.sums.dirty is not None, save.mode)] += 1
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


# -- the jobs ------------------------------------------------------------------------------------


def key0(item: Item) -> Any:
    return item[0]


def val1(item: Item) -> int:
    return item[1]


def ts2(item: Item) -> int:
    return item[2]


def new_state() -> dict[str, Any]:
    return {"n": 0, "vals": []}


def stateful(state: dict[str, Any], key: Any, item: Item) -> Any:
    """Mutates the key's state in place; items with a value divisible by 3 emit nothing."""
    state["n"] += 1
    state["vals"].append(item[1])
    if item[1] % 3 == 0:
        return None
    return (key, state["n"], sum(state["vals"]))


def rolling_op(kind: str) -> AggregateOperation[Any, Any, Any]:
    if kind == "rolling_sum":
        return summing(val1)
    if kind == "rolling_count":
        return counting()
    return to_list()


def build(kind: str, run: str, items: list[Item], members: int, keyed_lp: int) -> Any:
    """The job of ``kind`` (a Pipeline, or a DAG for ``custom``) writing to list ``out``."""
    source = functools.partial(GatedSource, run, items)
    src_lp = SOURCE_PARALLELISM // members
    if kind == "custom":
        dag = DAG()
        s = dag.new_vertex("source", source).local_parallelism(src_lp)
        k = dag.new_vertex("keyed", functools.partial(KeyedSumP, run)).local_parallelism(keyed_lp)
        o = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
        dag.edge(Edge.between(s, k).partitioned(key0).distributed()).edge(Edge.between(k, o))
        return dag
    p = ss.Pipeline()
    s = p.read_from(source).set_local_parallelism(src_lp)
    if kind.startswith("rolling"):
        stage = s.group_by(key0).rolling_aggregate(rolling_op(kind))
    elif kind == "map_stateful":
        stage = s.group_by(key0).map_stateful(new_state, stateful)
    elif kind == "aggregate":
        stage = s.group_by(key0).aggregate(summing(val1))
    else:
        wdef: Any = {
            "tumbling": tumbling_window_def(TUMBLE),
            "sliding": sliding_window_def(SLIDE_SIZE, SLIDE),
            "session": session_window_def(SESSION_TIMEOUT),
        }[kind]
        stage = s.with_timestamps(ts2, 0).group_by(key0).window(wdef).aggregate(summing(val1))
    stage.set_local_parallelism(keyed_lp).write_to(sinks.list_sink("out"))
    return p


# -- oracles ---------------------------------------------------------------------------------------


def oracle_output(kind: str, items: list[Item]) -> Counter[Any]:
    """What the job emits for ``items`` (as a multiset)."""
    out: list[Any] = []
    if kind.startswith("rolling"):
        op = rolling_op(kind)
        accs: dict[Any, Any] = {}
        for it in items:
            acc = accs[it[0]] = op.accumulate(accs.get(it[0], op.create()), it)
            out.append((it[0], op.finish(acc)))
    elif kind == "map_stateful":
        states: dict[Any, Any] = defaultdict(new_state)
        for it in items:
            r = stateful(states[it[0]], it[0], it)
            if r is not None:
                out.append(r)
    elif kind == "aggregate":
        sums: dict[Any, int] = defaultdict(int)
        for it in items:
            sums[it[0]] += it[1]
        out = list(sums.items())
    elif kind == "custom":
        out = []
        state: dict[Any, int] = {}
        for key, value, _ in items:
            if value < 0:
                state.pop(key, None)
                out.append((key, None))
            else:
                state[key] = state.get(key, 0) + value
                out.append((key, state[key]))
    elif kind in ("tumbling", "sliding"):
        size, slide = (TUMBLE, TUMBLE) if kind == "tumbling" else (SLIDE_SIZE, SLIDE)
        wins: dict[tuple[int, Any], int] = defaultdict(int)
        for key, value, ts in items:
            first_end = ts - ts % slide + slide
            for end in range(first_end, first_end + size, slide):
                wins[(end, key)] += value
        out = [KeyedWindowResult(end - size, end, k, v) for (end, k), v in wins.items()]
    elif kind == "session":
        by_key: dict[Any, list[Item]] = defaultdict(list)
        for it in items:
            by_key[it[0]].append(it)
        for key, evs in by_key.items():
            start = end = total = 0
            for n, (_, value, ts) in enumerate(evs):
                if n and ts >= end:
                    out.append(KeyedWindowResult(start, end, key, total))
                    n = 0
                if n == 0:
                    start, total = ts, 0
                total += value
                end = ts + SESSION_TIMEOUT
            if evs:
                out.append(KeyedWindowResult(start, end, key, total))
    else:
        raise AssertionError(kind)
    return Counter(_hashable(x) for x in out)


def oracle_state(kind: str, items: list[Item]) -> dict[Any, Any]:
    """The keyed state after ``items``, as key -> finished value (see :func:`state_values`)."""
    if kind.startswith("rolling"):
        op = rolling_op(kind)
        accs: dict[Any, Any] = {}
        for it in items:
            accs[it[0]] = op.accumulate(accs.get(it[0], op.create()), it)
        return {k: op.finish(a) for k, a in accs.items()}
    if kind == "map_stateful":
        states: dict[Any, Any] = defaultdict(new_state)
        for it in items:
            stateful(states[it[0]], it[0], it)
        return dict(states)
    if kind == "aggregate":
        sums: dict[Any, int] = defaultdict(int)
        for it in items:
            sums[it[0]] += it[1]
        return dict(sums)
    if kind == "custom":
        state: dict[Any, int] = {}
        for key, value, _ in items:
            if value < 0:
                state.pop(key, None)
            else:
                state[key] = state.get(key, 0) + value
        return state
    raise AssertionError(kind)


def _hashable(x: Any) -> Any:
    if isinstance(x, list):
        return ("list", tuple(_hashable(v) for v in x))
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_hashable(v) for v in x)
    return x


# -- reading snapshots ------------------------------------------------------------------------------


def keyed_entries(data: SnapshotData, vertex: str) -> list[tuple[Any, Any, Any]]:
    """``(routing key, detail, value)`` of every keyed entry ``vertex`` saved in ``data``
    (what its processors would restore: maps merged and expanded), sorted by key."""
    vs = data.vertices.get(vertex)
    if vs is None:
        return []
    out = []
    for entries in vs.entries.values():
        for k, v in expand_entries(entries):
            if is_broadcast(k):
                continue
            if type(k) is KeyedStateKey:
                out.append((k.key, k.detail, v))
            else:
                out.append((k, None, v))
    out.sort(key=lambda e: (repr(e[0]), repr(e[1]), repr(e[2])))
    return out


def broadcast_entries(data: SnapshotData, vertex: str) -> dict[Any, Any]:
    vs = data.vertices[vertex]
    out = {}
    for entries in vs.entries.values():
        for k, v in expand_entries(entries):
            if is_broadcast(k):
                out[k.name] = v
    return out


def source_offsets(data: SnapshotData, items: list[Item]) -> dict[int, int]:
    """Each source processor's saved offset (a completed processor: its whole share)."""
    vs = data.vertices["source"]
    offsets = {name[1]: value[1] for name, value in broadcast_entries(data, "source").items()}
    for g in getattr(vs, "completed", ()):
        offsets.setdefault(g, share_count(items, g, len(items)))
    return offsets


def keyed_vertices(data: SnapshotData) -> list[str]:
    return sorted(n for n in data.vertices if n not in ("source", "sink"))


def state_values(kind: str, data: SnapshotData) -> dict[Any, Any]:
    """key -> finished value of the keyed state in ``data`` (the accumulators of both
    stages of an aggregation combined), comparable with :func:`oracle_state`."""
    out: dict[Any, Any] = {}
    op = rolling_op(kind) if kind.startswith("rolling") else None
    for vertex in keyed_vertices(data):
        for key, detail, value in keyed_entries(data, vertex):
            assert detail is None, (vertex, key, detail)
            if kind == "aggregate":
                out[key] = out.get(key, 0) + value
                continue
            assert key not in out, f"{vertex}: two entries for key {key!r}"
            out[key] = op.finish(value) if op is not None else value
    return out


def delta_chunks(store_dir: str, data: SnapshotData) -> int:
    """How many delta chunks the chains of ``data``'s keyed vertices hold (format 3: the
    manifest names a chain of a full chunk and deltas per processor)."""
    manifest = DirectorySnapshotStore(store_dir).read_manifest(data.snapshot_id)
    return sum(
        ref.mode == "delta"
        for name, vm in manifest.vertices.items()
        if name not in ("source", "sink")
        for chain in vm.chains.values()
        for ref in chain
    )


def latest(store_dir: str) -> SnapshotData:
    data = DirectorySnapshotStore(store_dir).latest()
    assert data is not None, f"no committed snapshot in {store_dir}"
    return data


# -- driving a job through stops and restores -------------------------------------------------------


def wait_until(job: Any, cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll ``cond`` (an event: a count reached) until it holds; fail at once, with the
    job's error, if the job ends meanwhile."""
    deadline = time.monotonic() + timeout
    while not cond():
        if job.status.is_terminal and not cond():
            job.join(1)  # raises the job's failure
            raise AssertionError(f"the job ended ({job.status}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def commits(job: Any) -> int:
    return int(job.metrics["__job__"]["snapshots"])


def wait_commits(job: Any, n: int) -> None:
    """Wait until the current execution committed ``n`` more snapshots than now: the
    last of them was requested after this call (everything emitted before is in it)."""
    target = commits(job) + n
    wait_until(job, lambda: commits(job) >= target, f"{n} more committed snapshots")


def wait_released(job: Any, run: str, items: list[Item]) -> None:
    """Wait until the source processors emitted every item below the gate."""
    gate = GATES[run]
    want = {i: share_count(items, i, gate) for i in range(SOURCE_PARALLELISM)}

    def done() -> bool:
        return all(PROGRESS.get((run, i), -1) >= n for i, n in want.items())

    wait_until(job, done, f"the source to emit the items below {gate}")


@dataclass
class Execution:
    """One execution of a scenario: its engine shape, the gates it raises (each followed
    by ``extra`` more committed snapshots), and how it stops (``None``: runs to the end).

    Stops: ``suspend`` (then ``resume()`` on the same job), ``export`` (suspend, then
    ``restore_from=job.export_snapshot()`` in a new job), ``cancel`` (then
    ``restore_from=<store directory>``), ``inflight`` (raise the gate, cancel after the
    next commit: the snapshot holds a cut in mid-stream)."""

    members: int = 1
    keyed_lp: int = 1
    gates: list[int] = field(default_factory=list)
    extra: int = 0
    stop: str | None = None
    new_store: bool = False
    #: ``JobConfig.state_backend``: "memory" or "sqlite" (state on disk)
    backend: str = "memory"


@dataclass
class Outcome:
    output: Counter[Any]
    #: how each stop went and the id of the snapshot it left
    stops: list[tuple[str, int]] = field(default_factory=list)
    #: the custom kind's saves: (changes tracked, mode) -> count
    saves: Counter[tuple[bool, str]] = field(default_factory=Counter)
    #: per stop, the delta chunks in the keyed vertices' chains of its snapshot (how
    #: many deltas the restore merged)
    deltas: list[int] = field(default_factory=list)


#: ``JobConfig.snapshot_writer`` of the scenarios' jobs (the tests run both writers)
WRITER = "thread"
#: whether KeyedSumP declares its values replaced, never changed in place (its saves are
#: then copy-on-write, state/live.py, as the additive rolling aggregates' are)
LIVE = False


def use_writer(monkeypatch: Any, writer: str) -> str:
    """Make the scenarios' jobs use ``writer``: ``thread`` or ``fork``
    (``JobConfig.snapshot_writer``), or ``live``: the thread writer with copy-on-write
    saves (state/live.py) for every map whose values are replaced, however small, two
    entries per step (a layered map is then diffed only until its first save). With
    ``thread`` a layered map is diffed up to 20 keys (state/keyed.py DIFF_MAX), so that
    the scenarios' larger maps leave that mode mid-interval. For the writer fixtures of
    the scenario tests; returns ``writer``."""
    module = sys.modules[__name__]
    if writer == "thread":
        monkeypatch.setattr(keyed_mod, "DIFF_MAX", 20)
    if writer == "live":
        monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 0)
        monkeypatch.setattr(live, "LIVE_SAVE_STEP", 2)
        monkeypatch.setattr(keyed_mod, "MARKS_SEAL", 3)  # deltas from several sets of marks
        monkeypatch.setattr(module, "LIVE", True)
        monkeypatch.setattr(module, "WRITER", "thread")
    else:
        monkeypatch.setattr(module, "WRITER", writer)
    return writer


def config(name: str, store: str, backend: str = "memory", interval_ms: int = 10) -> JobConfig:
    return JobConfig(
        name=name,
        processing_guarantee=EO,
        snapshot_interval_ms=interval_ms,
        snapshot_store=store,
        auto_restart=False,
        state_backend=backend,
        snapshot_writer=WRITER,
    )


def check_state(kind: str, items: list[Item], data: SnapshotData, where: str) -> None:
    """The keyed state ``data`` holds is the oracle's state after the items its source
    offsets say were emitted."""
    if kind not in ORACLE_STATE_KINDS:
        return
    seen = emitted_items(items, source_offsets(data, items))
    got = state_values(kind, data)
    want = oracle_state(kind, seen)
    assert got == want, f"{where}: snapshot {data.snapshot_id} holds other keyed state"


def same_keyed_state(kind: str, before: SnapshotData, after: SnapshotData, where: str) -> None:
    """Both snapshots hold the same keyed entries, vertex by vertex (what the processors
    restore from them), and the same source offsets. The first stage of an aggregation
    accumulates per member (a key may have an accumulator on each), so there the
    accumulators are compared combined per key."""
    assert broadcast_entries(before, "source") == broadcast_entries(after, "source"), where
    if kind == "aggregate":
        assert state_values(kind, before) == state_values(kind, after), where
        return
    for vertex in sorted(set(keyed_vertices(before)) | set(keyed_vertices(after))):
        a, b = keyed_entries(before, vertex), keyed_entries(after, vertex)
        assert a == b, (
            f"{where}: vertex {vertex!r}: snapshot {after.snapshot_id} (a full save of the "
            f"restored state) differs from snapshot {before.snapshot_id} it was restored from"
        )


def run_scenario(
    kind: str, items: list[Item], executions: list[Execution], store_root: str
) -> Outcome:
    """Run ``kind`` over ``items`` through ``executions``; check the keyed state at every
    stop (against the oracle, and against a full save of the restored state) and return
    the output published by all executions together. An execution after a ``suspend``
    stop is the same job resumed (its engine shape is the previous one's)."""
    run = new_run()
    name = f"inc-{kind}"
    stores = itertools.count()
    store = os.path.join(store_root, f"store{next(stores)}")
    engines: list[Any] = []
    outcome = Outcome(Counter())
    restore: Any = None
    job: Any = None
    data: SnapshotData | None = None
    everything = len(items) + 1
    # each source processor's last item comes only at the end: no processor completes
    # before (a vertex some of whose processors completed restores only at the same
    # parallelism)
    hold = min(last_positions(items).values())
    reached = 0  # the highest gate the job went quiet at
    floor = {i: 0 for i in range(SOURCE_PARALLELISM)}  # offsets of the last stop
    try:
        for n, ex in enumerate(executions):
            last = n == len(executions) - 1
            if job is None:
                if ex.new_store and restore is not None:
                    store = os.path.join(store_root, f"store{next(stores)}")
                engine = ss.local(members=ex.members, cooperative_threads=1)
                engines.append(engine)
                job = engine.new_job(
                    build(kind, run, items, ex.members, ex.keyed_lp),
                    config(name, store, ex.backend),
                    restore_from=restore,
                )
            else:
                job.resume()  # after a suspend stop
            if data is not None:
                # the gate holds: the restored job emits nothing new, so what it saves is
                # exactly the state it restored (a delta continuing its chain when it was
                # restored at the same parallelism from its own store, else a full save)
                wait_commits(job, 1)
                job.suspend()
                after = latest(store)
                same_keyed_state(kind, data, after, f"execution {n}")
                check_state(kind, items, after, f"execution {n} (restored)")
                job.resume()
            for gate in ex.gates:
                GATES[run] = gate = min(gate, hold)
                reached = max(reached, gate)
                wait_released(job, run, items)
                wait_commits(job, 2 + ex.extra)
            if not ex.gates:
                wait_commits(job, 1 + ex.extra)
            if last:
                GATES[run] = everything
                job.join(120)
                assert job.status is JobStatus.COMPLETED
                break
            stop = ex.stop
            if stop == "inflight":
                # release the rest but the sources' last items (the job cannot complete)
                # and cancel after the next commit: it cuts through the stream
                GATES[run] = hold
                wait_commits(job, 1)
            if stop in ("suspend", "export"):
                try:
                    job.suspend()
                except ss.JobCompletedError:  # the sources ended first
                    assert job.status is JobStatus.COMPLETED
            else:
                job.cancel()
                try:
                    job.join(60)
                except ss.JobCancelledError:
                    pass
            if job.status is JobStatus.COMPLETED:  # the in-flight stop came too late
                break
            data = latest(store)
            outcome.stops.append((stop or "", data.snapshot_id))
            outcome.deltas.append(delta_chunks(store, data))
            check_state(kind, items, data, f"stop {n} ({stop})")
            offsets = source_offsets(data, items)
            if stop != "inflight":
                assert offsets == {
                    i: max(floor[i], share_count(items, i, reached)) for i in floor
                }, f"stop {n} ({stop}): the source offsets are not where the job went quiet"
            floor = offsets
            GATES[run] = 0  # hold until the next execution restored and saved
            if stop == "export":
                restore = job.export_snapshot()
                assert restore is not None and restore.snapshot_id == data.snapshot_id
                job.cancel()
                try:  # it holds its store until it has ended
                    job.join(60)
                except ss.JobCancelledError:
                    pass
                job = None
            elif stop != "suspend":
                restore = store
                job = None
        for engine in engines:
            outcome.output.update(_hashable(x) for x in engine.get_list("out"))
        outcome.saves = SAVES.get(run, Counter())
        return outcome
    finally:
        GATES.pop(run, None)
        SAVES.pop(run, None)
        for key in [k for k in PROGRESS if k[0] == run]:
            del PROGRESS[key]
        if job is not None and not job.status.is_terminal:
            job.cancel()


def uninterrupted(kind: str, items: list[Item], members: int, keyed_lp: int) -> Counter[Any]:
    """The output of one run without a processing guarantee or a stop."""
    run = new_run()
    GATES[run] = len(items) + 1
    try:
        engine = ss.local(members=members, cooperative_threads=1)
        engine.new_job(build(kind, run, items, members, keyed_lp)).join(120)
        return Counter(_hashable(x) for x in engine.get_list("out"))
    finally:
        GATES.pop(run, None)

