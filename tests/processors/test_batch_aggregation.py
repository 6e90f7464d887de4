"""Batch aggregation processors (docs/semantics.md §8): hand-driven with outbox capacity 1 and
snapshot/restore between items, and through the embedded engine against dict oracles."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import (
    AggregateOperation,
    all_of,
    averaging,
    counting,
    max_by,
    min_by,
    summing,
    to_list,
)
from slipstream.core.groups import GROUP_MAX, KeyedGroup
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.partition import default_partitioner
from slipstream.core.processor import Context, Processor
from slipstream.processors.aggregation import accumulate_by_key_groups
from slipstream.state.keys import expand_entries

Op = AggregateOperation[Any, Any, Any]


# -- hand driver with snapshots ---------------------------------------------------------


class Driver:
    """Drives one processor like the tasklet does, with optional save+restore (into a
    fresh processor) whenever the inbox is empty and during the complete() loop."""

    def __init__(
        self,
        supplier: Callable[[], Processor],
        *,
        capacity: int = 1,
        context: Callable[[], Context] = Context,
        restore: bool = False,
    ) -> None:
        self.supplier = supplier
        self.capacity = capacity
        self.make_context = context
        self.restore = restore
        self.out: list[Any] = []
        self.restores = 0
        self._new_processor()

    def _new_processor(self) -> None:
        self.proc = self.supplier()
        self.outbox = Outbox(1, self.capacity)
        self.proc.init(self.outbox, self.make_context())

    def drain(self) -> None:
        b = self.outbox.buckets[0]
        self.out.extend(b)
        b.clear()

    def save(self) -> list[tuple[Any, Any]]:
        entries: list[tuple[Any, Any]] = []
        for _ in range(100_000):
            done = self.proc.save_to_snapshot()
            entries.extend(self.outbox.snapshot_bucket)
            self.outbox.snapshot_bucket.clear()
            if done:
                return entries
        raise AssertionError("save_to_snapshot() never returned True")

    def restore_into_new(self, entries: list[tuple[Any, Any]]) -> None:
        self.proc.close()
        self._new_processor()
        inbox = Inbox(expand_entries(entries))  # as the engine does: maps become entries
        while inbox:
            before = len(inbox)
            self.proc.restore_from_snapshot(inbox)
            assert len(inbox) < before
        while not self.proc.finish_snapshot_restore():
            pass
        self.restores += 1

    def snapshot_point(self) -> None:
        if self.restore:
            self.restore_into_new(self.save())

    def run(self, items: Iterable[Any], batch: int = 1) -> list[Any]:
        items = list(items)
        self.snapshot_point()
        inbox = Inbox()
        for start in range(0, len(items), batch):
            inbox.extend(items[start : start + batch])
            while inbox:
                before = len(inbox)
                self.proc.process(0, inbox)
                self.drain()
                assert len(inbox) < before or self.outbox.buckets[0] == []
            self.snapshot_point()
        for _ in range(100_000):
            emitted_before = len(self.out)
            done = self.proc.complete()
            self.drain()
            if done:
                break
            if len(self.out) > emitted_before:
                self.snapshot_point()
        else:
            raise AssertionError("complete() never returned True")
        self.proc.close()
        return self.out


# -- oracles ------------------------------------------------------------------------------


def fold(op: Op, items: Iterable[Any]) -> Any:
    acc = op.create()
    for x in items:
        acc = op.accumulate(acc, x)
    return acc


def grouped(key_fn: Callable[[Any], Any], items: Iterable[Any]) -> dict[Any, list[Any]]:
    groups: dict[Any, list[Any]] = {}
    for x in items:
        groups.setdefault(key_fn(x), []).append(x)
    return groups


def normalize(value: Any) -> Any:
    """Make order-insensitive what two-stage aggregation may reorder (to_list)."""
    if isinstance(value, list):
        return sorted(value)
    if isinstance(value, tuple):
        return tuple(normalize(v) for v in value)
    if isinstance(value, float):
        return round(value, 6)
    return value


def keyed_result(entries: Iterable[tuple[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in entries:
        assert k not in out, f"key {k!r} emitted twice"
        out[k] = normalize(v)
    return out


# named functions so the suppliers pickle by reference
def mod3(x: int) -> int:
    return x % 3


def mod7(x: int) -> int:
    return x % 7


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


def as_str(x: int) -> str:
    return str(abs(x) % 10)


def pair_key(x: int) -> tuple[int, bool]:
    return (x % 4, x > 0)


def constant(x: int) -> str:
    return "k"


def identity_key(x: int) -> int:
    return x


def by_abs(x: int) -> tuple[int, int]:
    # no ties: with ties min_by/max_by keep the first item, and which item comes first
    # depends on how the input was split between stage-1 processors
    return (abs(x), x)


KEY_FNS = [mod3, mod7, sign, as_str, pair_key, constant, identity_key]


def plain_counting() -> Op:
    """counting() written out, so the generic (non fast-path) loop runs."""
    return AggregateOperation(lambda: 0, lambda a, x: a + 1, operator.add)


OPS: list[Callable[[], Op]] = [
    counting,
    plain_counting,
    summing,
    averaging,
    to_list,
    lambda: min_by(by_abs),
    lambda: max_by(by_abs),
    lambda: all_of(counting(), summing(), to_list()),
]

ints = st.lists(st.integers(-30, 30), max_size=40)


# -- unkeyed: aggregate / accumulate / combine ------------------------------------------


@pytest.mark.parametrize("restore", [False, True])
@pytest.mark.parametrize("op_index", range(len(OPS)))
def test_aggregate_hand_driven(op_index: int, restore: bool) -> None:
    op = OPS[op_index]()
    items = list(range(-5, 12))
    out = Driver(P.aggregate(op), restore=restore).run(items)
    assert [normalize(v) for v in out] == [normalize(op.finish(fold(op, items)))]


@pytest.mark.parametrize("op_index", range(len(OPS)))
def test_aggregate_emits_exactly_one_item_without_input(op_index: int) -> None:
    op = OPS[op_index]()
    for restore in (False, True):
        out = Driver(P.aggregate(op), restore=restore).run([])
        assert [normalize(v) for v in out] == [normalize(op.finish(op.create()))]


def test_accumulate_emits_the_accumulator_and_combine_finishes() -> None:
    op = averaging()
    items = [3, 4, 8]
    (acc,) = Driver(P.accumulate(op), restore=True).run(items)
    assert acc == (3, 15)
    parts = [[1, 2], [], [3, 4, 5]]
    accs = [Driver(P.accumulate(op)).run(p)[0] for p in parts]
    assert Driver(P.combine(op), restore=True).run(accs) == [3.0]


def test_combine_does_not_mutate_incoming_accumulators() -> None:
    op = to_list()
    incoming = [[1, 2], [3]]
    assert Driver(P.combine(op)).run(incoming) == [[1, 2, 3]]
    assert incoming == [[1, 2], [3]]


@given(
    items=ints,
    old_parallelism=st.integers(1, 4),
    new_parallelism=st.integers(1, 4),
)
def test_unkeyed_restore_with_other_parallelism_counts_state_once(
    items: list[int], old_parallelism: int, new_parallelism: int
) -> None:
    """Each of n processors saves its accumulator; the entries are routed (by the
    partition of their key, as the engine does) to m processors, each of which combines
    what it gets. The accumulators emitted then add up to the saved total, once."""
    op = summing()
    saved: list[tuple[Any, Any]] = []
    for i in range(old_parallelism):
        proc = P.accumulate(op)()
        outbox = Outbox(1, 1)
        proc.init(outbox, Context(global_processor_index=i, total_parallelism=old_parallelism))
        proc.process(0, Inbox(items[i::old_parallelism]))
        assert proc.save_to_snapshot()
        saved.extend(outbox.snapshot_bucket)
    assert len({k for k, _ in saved}) == old_parallelism  # one distinct key each
    total = 0
    for j in range(new_parallelism):
        proc = P.accumulate(op)()
        outbox = Outbox(1, 1)
        proc.init(outbox, Context(global_processor_index=j, total_parallelism=new_parallelism))
        mine = [e for e in saved if default_partitioner(e[0], 271) % new_parallelism == j]
        proc.restore_from_snapshot(Inbox(mine))
        assert proc.complete()
        (acc,) = outbox.buckets[0]
        total += acc
    assert total == sum(items)


def test_unkeyed_snapshot_without_combine_fails_clearly_when_parallel() -> None:
    op: Op = AggregateOperation(lambda: 0, lambda a, x: a + x)  # no combine
    proc = P.aggregate(op)()
    proc.init(Outbox(1, 1), Context(vertex_name="agg", total_parallelism=2))
    with pytest.raises(ValueError, match="agg.*combine"):
        proc.save_to_snapshot()
    # with total parallelism 1 the single accumulator is saved and restored as is
    out = Driver(P.aggregate(op), restore=True).run([1, 2, 3])
    assert out == [6]


def test_complete_resumes_when_outbox_full() -> None:
    proc = P.aggregate(counting())()
    outbox = Outbox(1, 1)
    proc.init(outbox, Context())
    proc.process(0, Inbox([1, 2]))
    outbox.buckets[0].append("blocker")
    assert not proc.complete()
    assert outbox.buckets[0] == ["blocker"]
    outbox.buckets[0].clear()
    assert proc.complete()
    assert outbox.buckets[0] == [2]


# -- keyed -----------------------------------------------------------------------------


@pytest.mark.parametrize("restore", [False, True])
@pytest.mark.parametrize("op_index", range(len(OPS)))
def test_aggregate_by_key_hand_driven(op_index: int, restore: bool) -> None:
    op = OPS[op_index]()
    items = [x * 7 % 23 - 11 for x in range(40)]
    driver = Driver(P.aggregate_by_key(mod3, op), restore=restore)
    out = driver.run(items, batch=3)
    expected = {k: normalize(op.finish(fold(op, g))) for k, g in grouped(mod3, items).items()}
    assert keyed_result(out) == expected
    assert all(type(e) is tuple and len(e) == 2 for e in out)
    if restore:
        # snapshots were also taken between complete() calls, mid-emission
        assert driver.restores > len(items) // 3 + 2


@given(items=ints, key_index=st.integers(0, len(KEY_FNS) - 1), op_index=st.integers(0, 7))
@settings(max_examples=60)
def test_keyed_rows_match_dict_oracle_hand_driven(
    items: list[int], key_index: int, op_index: int
) -> None:
    key_fn = KEY_FNS[key_index]
    op = OPS[op_index]()
    groups = grouped(key_fn, items)
    expected_acc = {k: normalize(fold(op, g)) for k, g in groups.items()}
    expected = {k: normalize(op.finish(fold(op, g))) for k, g in groups.items()}

    assert keyed_result(Driver(P.aggregate_by_key(key_fn, op), restore=True).run(items)) == (
        expected
    )
    accs = Driver(P.accumulate_by_key(key_fn, op), restore=True).run(items, batch=4)
    assert keyed_result(accs) == expected_acc
    # stage 2 over the accumulators of two stage-1 halves equals the single stage
    halves = [
        Driver(P.accumulate_by_key(key_fn, op)).run(items[0::2]),
        Driver(P.accumulate_by_key(key_fn, op)).run(items[1::2]),
    ]
    stage2 = Driver(P.combine_by_key(op), restore=True).run(halves[0] + halves[1], batch=2)
    assert keyed_result(stage2) == expected
    # the Pipeline's stage 1 emits the same accumulators as KeyedGroup items, which stage
    # 2 takes as it takes pairs (pairs after groups, in one inbox too)
    grouped_halves = [
        Driver(accumulate_by_key_groups(key_fn, op), restore=True).run(items[0::2], batch=4),
        Driver(accumulate_by_key_groups(key_fn, op)).run(items[1::2]),
    ]
    assert all(type(g) is KeyedGroup and g.head is None for h in grouped_halves for g in h)
    assert keyed_result(group_entries(grouped_halves[0])) == keyed_result(halves[0])
    stage2 = Driver(P.combine_by_key(op), restore=True).run(grouped_halves[0] + halves[1], batch=2)
    assert keyed_result(stage2) == expected
    stage2 = Driver(P.combine_by_key(op)).run(grouped_halves[0] + grouped_halves[1], batch=3)
    assert keyed_result(stage2) == expected


def group_entries(groups: Iterable[KeyedGroup]) -> list[tuple[Any, Any]]:
    return [pair for g in groups for pair in g.entries.items()]


def test_accumulate_by_key_groups_emits_groups_of_at_most_group_max_keys() -> None:
    """Stage 1's accumulators leave as groups of at most GROUP_MAX keys, one group per
    item of outbox room, each key once, also across a snapshot and restore taken between
    complete() calls (the emitted keys are not saved again)."""
    keys = 2 * GROUP_MAX + 5
    items = [f"w{i % keys}" for i in range(3 * keys)]
    driver = Driver(accumulate_by_key_groups(str.upper, counting()), capacity=2, restore=True)
    out = driver.run(items, batch=keys)
    assert [len(g.entries) for g in out] == [GROUP_MAX, GROUP_MAX, 5]
    assert keyed_result(group_entries(out)) == {f"W{i}": 3 for i in range(keys)}
    assert driver.restores >= 3  # one between the complete() calls


def test_combine_by_key_adds_groups_without_adopting_mutable_accumulators() -> None:
    """An additive op takes a group of keys new to it with one dict.update and adds
    the next ones inline; an op with mutable accumulators combines into fresh ones."""
    first = KeyedGroup(None, {"a": 2, "b": 3})
    out = Driver(P.combine_by_key(counting())).run([first, KeyedGroup(None, {"a": 5})], batch=2)
    assert sorted(out) == [("a", 7), ("b", 3)]
    assert first.entries == {"a": 2, "b": 3}
    incoming = [KeyedGroup(None, {"a": [1]}), KeyedGroup(None, {"a": [2], "b": [3]})]
    out = Driver(P.combine_by_key(to_list())).run(incoming, batch=2)
    assert sorted(out) == [("a", [1, 2]), ("b", [3])]
    assert [g.entries for g in incoming] == [{"a": [1]}, {"a": [2], "b": [3]}]
    proc = P.combine_by_key(counting())()
    proc.init(Outbox(1, 1), Context(vertex_name="comb"))
    with pytest.raises(TypeError, match=r"comb.*\('x', 1, 2\)"):
        proc.process(0, Inbox([KeyedGroup(None, {"a": 1}), ("x", 1, 2)]))


def test_keyed_emits_nothing_without_input() -> None:
    assert Driver(P.aggregate_by_key(mod3, counting()), restore=True).run([]) == []
    assert Driver(P.combine_by_key(counting())).run([]) == []


def test_keyed_snapshot_mid_emission_keeps_only_unemitted_keys() -> None:
    proc = P.accumulate_by_key(mod7, counting())()
    outbox = Outbox(1, 1)
    proc.init(outbox, Context())
    proc.process(0, Inbox(range(70)))
    assert not proc.complete()
    first = outbox.buckets[0].pop()
    saved: list[tuple[Any, Any]] = []
    while True:  # snapshot bucket capacity 1
        done = proc.save_to_snapshot()
        saved.extend(outbox.snapshot_bucket)
        outbox.snapshot_bucket.clear()
        if done:
            break
    saved = expand_entries(saved)  # the keyed state is saved as one map
    assert first not in saved
    assert sorted(saved + [first]) == [(k, 10) for k in range(7)]
    # emission goes on after the snapshot with the keys not emitted yet
    rest = []
    while True:
        done = proc.complete()
        rest.extend(outbox.buckets[0])
        outbox.buckets[0].clear()
        if done:
            break
    assert sorted(rest) == sorted(saved)


def test_keyed_restore_combines_a_key_arriving_twice() -> None:
    proc = P.combine_by_key(to_list())()
    outbox = Outbox(1, 10)
    proc.init(outbox, Context())
    proc.restore_from_snapshot(Inbox([("a", [1]), ("b", [2]), ("a", [3])]))
    assert proc.finish_snapshot_restore()
    assert proc.complete()
    assert sorted(outbox.buckets[0]) == [("a", [1, 3]), ("b", [2])]


def test_counting_fast_path_equals_generic_path() -> None:
    items = [f"w{i % 13}" for i in range(500)]
    fast = Driver(P.accumulate_by_key(str.upper, counting()), capacity=4).run(items, batch=64)
    slow = Driver(P.accumulate_by_key(str.upper, plain_counting()), capacity=4).run(items, batch=64)
    assert keyed_result(fast) == keyed_result(slow)
    assert sum(v for _, v in fast) == 500


def test_mutable_accumulators_are_not_shared_between_keys() -> None:
    out = Driver(P.accumulate_by_key(mod3, to_list())).run(range(9))
    assert keyed_result(out) == {0: [0, 3, 6], 1: [1, 4, 7], 2: [2, 5, 8]}


def test_combine_by_key_does_not_adopt_incoming_accumulators() -> None:
    incoming = [("a", [1]), ("a", [2])]
    out = Driver(P.combine_by_key(to_list())).run(incoming, batch=2)
    assert out == [("a", [1, 2])]
    assert incoming == [("a", [1]), ("a", [2])]


def test_combine_by_key_rejects_non_pairs_naming_the_item() -> None:
    proc = P.combine_by_key(counting())()
    proc.init(Outbox(1, 1), Context(vertex_name="comb"))
    with pytest.raises(TypeError, match=r"comb.*\('x', 1, 2\)"):
        proc.process(0, Inbox([("a", 1), ("x", 1, 2)]))


def test_keyed_complete_to_several_ordinals() -> None:
    proc = P.aggregate_by_key(mod3, summing())()
    outbox = Outbox(2, 1)
    proc.init(outbox, Context())
    proc.process(0, Inbox(range(10)))
    got: list[list[Any]] = [[], []]
    while True:
        done = proc.complete()
        for i, b in enumerate(outbox.buckets):
            got[i].extend(b)
            b.clear()
        if done:
            break
    expected = {k: sum(g) for k, g in grouped(mod3, range(10)).items()}
    assert keyed_result(got[0]) == expected == keyed_result(got[1])


# -- through the engine -----------------------------------------------------------------


def run_engine(dag: DAG, members: int) -> list[Any]:
    engine = ss.local(members=members)
    engine.new_job(dag).join(timeout=60)
    return list(engine.get_list("out"))


def keyed_dag(
    items: list[Any], key_fn: Callable[[Any], Any], op: Op, *, two_stage: bool, lp: int = 2
) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", sources.items(items)).local_parallelism(lp)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    if two_stage:
        acc = dag.new_vertex("accumulate", P.accumulate_by_key(key_fn, op)).local_parallelism(lp)
        comb = dag.new_vertex("combine", P.combine_by_key(op)).local_parallelism(lp)
        dag.edge(Edge.between(src, acc).partitioned(key_fn))
        dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
        dag.edge(Edge.between(comb, sink).distributed())
    else:
        agg = dag.new_vertex("aggregate", P.aggregate_by_key(key_fn, op)).local_parallelism(lp)
        dag.edge(Edge.between(src, agg).distributed().partitioned(key_fn))
        dag.edge(Edge.between(agg, sink).distributed())
    return dag


@settings(max_examples=30, deadline=None)
@given(
    items=st.lists(st.integers(-100, 100), max_size=300),
    key_index=st.integers(0, len(KEY_FNS) - 1),
    op_index=st.integers(0, 7),
    members=st.integers(1, 2),
)
def test_engine_two_stage_equals_single_stage_equals_oracle(
    items: list[int], key_index: int, op_index: int, members: int
) -> None:
    key_fn = KEY_FNS[key_index]
    op = OPS[op_index]()
    expected = {k: normalize(op.finish(fold(op, g))) for k, g in grouped(key_fn, items).items()}
    single = keyed_result(run_engine(keyed_dag(items, key_fn, op, two_stage=False), members))
    double = keyed_result(run_engine(keyed_dag(items, key_fn, op, two_stage=True), members))
    assert single == double == expected


def same_items(a: list[Any], b: list[Any]) -> bool:
    return sorted(map(repr, a)) == sorted(map(repr, b))


@pytest.mark.parametrize("members", [1, 2])
@pytest.mark.parametrize("op_index", range(len(OPS)))
def test_engine_unkeyed_global_aggregate(members: int, op_index: int) -> None:
    """Local parallelism 1 still means one processor *per member*: with two members the
    processor that the all-to-one edge does not feed emits the empty result (exactly one
    item per processor, as in Jet)."""
    op = OPS[op_index]()
    items = list(range(-40, 60))
    expected = normalize(op.finish(fold(op, items)))
    empty = normalize(op.finish(op.create()))
    expected_out = [expected] + [empty] * (members - 1)

    dag = DAG()
    src = dag.new_vertex("source", sources.items(items)).local_parallelism(2)
    agg = dag.new_vertex("aggregate", P.aggregate(op)).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, agg).distributed().all_to_one())
    dag.edge(Edge.between(agg, sink).distributed())
    assert same_items([normalize(v) for v in run_engine(dag, members)], expected_out)

    dag = DAG()
    src = dag.new_vertex("source", sources.items(items)).local_parallelism(2)
    acc = dag.new_vertex("accumulate", P.accumulate(op)).local_parallelism(2)
    comb = dag.new_vertex("combine", P.combine(op)).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, acc))
    dag.edge(Edge.between(acc, comb).distributed().all_to_one())
    dag.edge(Edge.between(comb, sink).distributed())
    assert same_items([normalize(v) for v in run_engine(dag, members)], expected_out)


@pytest.mark.parametrize("members", [1, 2])
def test_engine_unkeyed_aggregate_without_input_emits_one_item_per_processor(
    members: int,
) -> None:
    dag = DAG()
    src = dag.new_vertex("source", sources.items([]))
    agg = dag.new_vertex("aggregate", P.aggregate(counting())).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, agg).distributed().all_to_one())
    dag.edge(Edge.between(agg, sink).distributed())
    assert run_engine(dag, members) == [0] * members


@pytest.mark.parametrize("members", [1, 2])
def test_engine_word_count(members: int) -> None:
    lines = [" ".join(f"w{(i * j) % 37}" for j in range(i % 9)) for i in range(800)]
    expected: dict[str, int] = {}
    for line in lines:
        for w in line.split():
            expected[w] = expected.get(w, 0) + 1
    dag = DAG()
    src = dag.new_vertex("source", sources.items(lines))
    tok = dag.new_vertex("tokenize", P.flat_map(str.split))
    acc = dag.new_vertex("accumulate", P.accumulate_by_key(str, counting()))
    comb = dag.new_vertex("combine", P.combine_by_key(counting()))
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, tok))
    dag.edge(Edge.between(tok, acc).partitioned(str))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out).distributed())
    assert keyed_result(run_engine(dag, members)) == expected


# -- factories -------------------------------------------------------------------------


def test_factories_validate_arguments() -> None:
    with pytest.raises(TypeError, match="'op'.*AggregateOperation"):
        P.aggregate("count")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key_fn"):
        P.aggregate_by_key(3, counting())  # type: ignore[arg-type]
    no_combine: Op = AggregateOperation(lambda: 0, lambda a, x: a + 1)
    with pytest.raises(ValueError, match="combine"):
        P.combine(no_combine)
    with pytest.raises(ValueError, match="combine"):
        P.combine_by_key(no_combine)
    # stage 1 and single stage do not need combine
    P.accumulate(no_combine)
    P.aggregate_by_key(mod3, no_combine)


def test_suppliers_pickle() -> None:
    for supplier in (
        P.aggregate(counting()),
        P.accumulate(summing()),
        P.combine(to_list()),
        P.aggregate_by_key(mod3, averaging()),
        P.accumulate_by_key(mod3, counting()),
        P.combine_by_key(counting()),
    ):
        clone = cloudpickle.loads(cloudpickle.dumps(supplier))
        assert isinstance(clone(), Processor)


# -- the processor test harness (slipstream.testing) ------------------------------------


@pytest.mark.parametrize("op_index", range(len(OPS)))
def test_verify_processor_harness(op_index: int) -> None:
    from slipstream.testing import SAME_ITEMS_ANY_ORDER, verify_processor

    op = OPS[op_index]()
    items = [x * 5 % 17 - 8 for x in range(25)]
    groups = grouped(mod3, items)

    def same(expected: list[Any], actual: list[Any]) -> bool:
        return sorted(map(repr, map(normalize, expected))) == sorted(
            map(repr, map(normalize, actual))
        )

    verify_processor(P.aggregate(op)).input(items).output_checker(same).expect_output(
        [op.finish(fold(op, items))]
    )
    verify_processor(P.aggregate(op)).input([]).output_checker(same).expect_output(
        [op.finish(op.create())]
    )
    verify_processor(P.accumulate(op)).input(items).output_checker(same).expect_output(
        [fold(op, items)]
    )
    halves = [fold(op, items[:10]), fold(op, items[10:])]
    verify_processor(P.combine(op)).input(halves).output_checker(same).expect_output(
        [op.finish(fold(op, items))]
    )
    keyed = [(k, op.finish(fold(op, g))) for k, g in groups.items()]
    keyed_accs = [(k, fold(op, g)) for k, g in groups.items()]
    verify_processor(P.aggregate_by_key(mod3, op)).input(items).output_checker(same).expect_output(
        keyed
    )
    verify_processor(P.accumulate_by_key(mod3, op)).input(items).output_checker(same).expect_output(
        keyed_accs
    )
    stage1 = [
        (k, fold(op, g))
        for half in (items[:10], items[10:])
        for k, g in grouped(mod3, half).items()
    ]
    verify_processor(P.combine_by_key(op)).input(stage1).output_checker(same).expect_output(keyed)
    # counting fast path, checked with the harness's own order-insensitive checker
    words = [f"w{i % 5}" for i in range(23)]
    verify_processor(P.accumulate_by_key(str, counting())).input(words).output_checker(
        SAME_ITEMS_ANY_ORDER
    ).expect_output([(w, words.count(w)) for w in sorted(set(words))])
