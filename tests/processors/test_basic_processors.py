"""map / filter / flat_map / no_op: driven by hand with tiny outboxes (resumption) and
through the embedded engine, against plain-Python oracles."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context, Processor

# -- a hand driver ---------------------------------------------------------------------


def drive(
    supplier: Callable[[], Processor],
    batches: list[list[Any]],
    *,
    capacity: int = 1,
    ordinal_count: int = 1,
) -> list[list[Any]]:
    """Feed ``batches`` through one processor with an outbox of ``capacity`` per bucket,
    moving bucket contents out between calls like the tasklet does. Whenever a call
    leaves the outbox full with items still in the inbox, call ``process`` once more
    *without* draining: the processor must cope (change nothing). Returns the items
    emitted per ordinal."""
    proc = supplier()
    outbox = Outbox(ordinal_count, capacity)
    proc.init(outbox, Context())
    out: list[list[Any]] = [[] for _ in range(ordinal_count)]

    def drain() -> None:
        for i, b in enumerate(outbox.buckets):
            out[i].extend(b)
            b.clear()

    inbox = Inbox()
    for batch in batches:
        inbox.extend(batch)
        calls = 0
        while inbox:
            before = (len(inbox), [len(b) for b in outbox.buckets])
            proc.process(0, inbox)
            after = (len(inbox), [len(b) for b in outbox.buckets])
            assert before != after, "process() made no progress with an empty outbox"
            if inbox and any(len(b) >= capacity for b in outbox.buckets):
                proc.process(0, inbox)
                assert (len(inbox), [len(b) for b in outbox.buckets]) == after, (
                    "process() changed something while the outbox was full"
                )
            drain()
            calls += 1
            assert calls < 100_000
    for _ in range(100_000):
        done = proc.complete()
        drain()
        if done:
            break
    proc.close()
    return out


def run_dag(
    processor_supplier: Callable[[], Processor],
    data: list[Any],
    *,
    members: int = 1,
    parallelism: int = 2,
) -> list[Any]:
    dag = DAG()
    src = dag.new_vertex("source", sources.items(data)).local_parallelism(parallelism)
    mid = dag.new_vertex("middle", processor_supplier).local_parallelism(parallelism)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, mid)).edge(Edge.between(mid, out).distributed())
    engine = ss.local(members=members)
    engine.new_job(dag).join(timeout=30)
    return list(engine.get_list("out"))


# -- functions used below (module level: picklable) -------------------------------------


def inc(x: int) -> int:
    return x + 1


def is_even(x: int) -> bool:
    return x % 2 == 0


def to_none(x: Any) -> None:
    return None


def repeat_n(x: int) -> list[int]:
    return [x] * (x % 4)


def repeat_tuple(x: int) -> tuple[int, ...]:
    return (x,) * (x % 3)


def repeat_gen(x: int) -> Iterator[int]:
    yield from [x] * (x % 5)


def range_of(x: int) -> range:
    return range(x % 4)


def oracle_flat(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    return [y for x in items for y in fn(x)]


FLAT_FNS = [repeat_n, repeat_tuple, repeat_gen, range_of, str.split]

batches_st = st.lists(st.lists(st.integers(-50, 50), max_size=12), max_size=6)


# -- map -------------------------------------------------------------------------------


@given(batches=batches_st, capacity=st.integers(1, 5))
def test_map_equals_builtin_map_with_small_outboxes(
    batches: list[list[int]], capacity: int
) -> None:
    flat = list(itertools.chain.from_iterable(batches))
    assert drive(P.map(inc), batches, capacity=capacity) == [[inc(x) for x in flat]]


@given(batches=batches_st, capacity=st.integers(1, 3))
def test_map_sends_every_result_to_every_ordinal(batches: list[list[int]], capacity: int) -> None:
    flat = list(itertools.chain.from_iterable(batches))
    expected = [inc(x) for x in flat]
    assert drive(P.map(inc), batches, capacity=capacity, ordinal_count=3) == [expected] * 3


def test_map_calls_fn_once_per_item_even_when_refused() -> None:
    calls: list[int] = []

    def spy(x: int) -> int:
        calls.append(x)
        return x

    data = list(range(10))
    assert drive(lambda: P.map(spy)(), [data], capacity=1, ordinal_count=2) == [data, data]
    assert calls == data


def none_for_odd(x: int) -> int | None:
    return None if x % 2 else x * 10


def test_map_drops_none_results_like_jets_mapP() -> None:
    assert drive(P.map(to_none), [[1, 2, 3]], capacity=2) == [[]]


@given(batches=batches_st, capacity=st.integers(1, 5), ordinals=st.integers(1, 3))
def test_map_returning_none_filters(
    batches: list[list[int]], capacity: int, ordinals: int
) -> None:
    flat = list(itertools.chain.from_iterable(batches))
    expected = [none_for_odd(x) for x in flat if none_for_odd(x) is not None]
    got = drive(P.map(none_for_odd), batches, capacity=capacity, ordinal_count=ordinals)
    assert got == [expected] * ordinals


def test_map_without_outbound_edges_consumes_input() -> None:
    assert drive(P.map(inc), [[1, 2, 3]], ordinal_count=0) == []


# -- filter ----------------------------------------------------------------------------


@given(batches=batches_st, capacity=st.integers(1, 5), ordinals=st.integers(1, 3))
def test_filter_equals_builtin_filter(
    batches: list[list[int]], capacity: int, ordinals: int
) -> None:
    flat = list(itertools.chain.from_iterable(batches))
    expected = [x for x in flat if is_even(x)]
    assert (
        drive(P.filter(is_even), batches, capacity=capacity, ordinal_count=ordinals)
        == [expected] * ordinals
    )


def test_filter_evaluates_predicate_once_per_item_on_refusal() -> None:
    calls: list[int] = []

    def spy(x: int) -> bool:
        calls.append(x)
        return True

    data = list(range(6))
    assert drive(lambda: P.filter(spy)(), [data], ordinal_count=2) == [data, data]
    assert calls == data


# -- flat_map --------------------------------------------------------------------------


@given(
    batches=batches_st,
    capacity=st.integers(1, 5),
    fn_index=st.integers(0, len(FLAT_FNS) - 2),
    ordinals=st.integers(1, 2),
)
def test_flat_map_equals_nested_comprehension(
    batches: list[list[int]], capacity: int, fn_index: int, ordinals: int
) -> None:
    fn = FLAT_FNS[fn_index]
    flat = list(itertools.chain.from_iterable(batches))
    expected = oracle_flat(fn, flat)
    got = drive(P.flat_map(fn), batches, capacity=capacity, ordinal_count=ordinals)
    assert got == [expected] * ordinals


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 2048])
def test_flat_map_keeps_rest_of_partially_emitted_item(capacity: int) -> None:
    lines = ["a b c d e", "", "f", "g h i j k l m n o p q r s"]
    expected = oracle_flat(str.split, lines)
    assert drive(P.flat_map(str.split), [lines], capacity=capacity) == [expected]


def test_flat_map_calls_fn_once_per_item() -> None:
    calls: list[int] = []

    def spy(x: int) -> Iterator[int]:
        calls.append(x)
        return iter(range(x))

    data = [3, 0, 5, 1]
    assert drive(lambda: P.flat_map(spy)(), [data], capacity=1) == [[0, 1, 2, 0, 1, 2, 3, 4, 0]]
    assert calls == data


def test_flat_map_item_stays_in_inbox_until_all_outputs_are_out() -> None:
    proc = P.flat_map(repeat_n)()
    outbox = Outbox(1, 2)
    proc.init(outbox, Context())
    inbox = Inbox([3, 1])
    proc.process(0, inbox)
    assert outbox.buckets[0] == [3, 3]
    assert list(inbox) == [3, 1]  # one result of item 3 is still pending
    outbox.buckets[0].clear()
    proc.process(0, inbox)
    assert outbox.buckets[0] == [3, 1]
    assert list(inbox) == []


# -- no_op -----------------------------------------------------------------------------


@given(batches=batches_st, capacity=st.integers(1, 5), ordinals=st.integers(1, 3))
def test_no_op_swallows_items(batches: list[list[int]], capacity: int, ordinals: int) -> None:
    assert drive(P.no_op(), batches, capacity=capacity, ordinal_count=ordinals) == [[]] * ordinals


def test_no_op_forwards_watermarks_only() -> None:
    """Jet's noopP: normal items are swallowed, watermarks go on, nothing else is emitted."""
    from slipstream.testing import verify_processor

    verify_processor(P.no_op()).input([1, ss.Watermark(5), 2, 3, ss.Watermark(9)]).expect_output(
        [ss.Watermark(5), ss.Watermark(9)]
    )
    verify_processor(P.no_op()).inputs([[1, ss.Watermark(5)], ["x"]]).expect_outputs(
        [[ss.Watermark(5)], [ss.Watermark(5)]]
    )


# -- through the engine ----------------------------------------------------------------


@pytest.mark.parametrize("members", [1, 2])
def test_engine_map_filter_flat_map_no_op(members: int) -> None:
    data = list(range(1000))
    assert Counter(run_dag(P.map(inc), data, members=members)) == Counter(map(inc, data))
    assert Counter(run_dag(P.filter(is_even), data, members=members)) == Counter(
        filter(is_even, data)
    )
    assert Counter(run_dag(P.flat_map(repeat_n), data, members=members)) == Counter(
        oracle_flat(repeat_n, data)
    )
    assert run_dag(P.no_op(), data, members=members) == []


def test_engine_chain_keeps_order_with_parallelism_one() -> None:
    data = [f"w{i} x{i}" for i in range(5000)]
    got = run_dag(P.flat_map(str.split), data, parallelism=1)
    assert got == oracle_flat(str.split, data)


def test_engine_two_outbound_edges_each_get_everything() -> None:
    dag = DAG()
    src = dag.new_vertex("source", sources.items(range(300)))
    m = dag.new_vertex("map", P.map(inc))
    a = dag.new_vertex("a", sinks.list_sink("a"))
    b = dag.new_vertex("b", sinks.list_sink("b"))
    dag.edge(Edge.between(src, m))
    dag.edge(Edge.from_(m, 0).to(a)).edge(Edge.from_(m, 1).to(b))
    engine = ss.local(members=2)
    engine.new_job(dag).join(timeout=30)
    expected = sorted(inc(x) for x in range(300))
    assert sorted(engine.get_list("a")) == expected
    assert sorted(engine.get_list("b")) == expected


# -- factories -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "argument"),
    [(P.map, "fn"), (P.filter, "predicate"), (P.flat_map, "fn")],
)
def test_factories_reject_non_callables_naming_the_argument(
    factory: Callable[[Any], Any], argument: str
) -> None:
    with pytest.raises(TypeError, match=argument):
        factory(42)


def test_suppliers_pickle_and_make_fresh_processors() -> None:
    for supplier in (P.map(inc), P.filter(is_even), P.flat_map(str.split), P.no_op()):
        clone = cloudpickle.loads(cloudpickle.dumps(supplier))
        a, b = clone(), clone()
        assert a is not b
        assert isinstance(a, Processor)


@settings(max_examples=25, deadline=None)
@given(data=st.lists(st.integers(0, 20), max_size=200), members=st.integers(1, 2))
def test_engine_flat_map_property(data: list[int], members: int) -> None:
    got = run_dag(P.flat_map(repeat_gen), data, members=members)
    assert Counter(got) == Counter(oracle_flat(repeat_gen, data))


# -- the processor test harness (slipstream.testing) ------------------------------------


@pytest.mark.parametrize(
    ("supplier", "data", "expected"),
    [
        (P.map(inc), [1, 2, 3], [2, 3, 4]),
        (P.map(to_none), [1, 2], []),
        (P.map(none_for_odd), [1, 2, 3, 4], [20, 40]),
        (P.filter(is_even), list(range(9)), [0, 2, 4, 6, 8]),
        (P.flat_map(repeat_n), [3, 0, 2, 5], [3, 3, 3, 2, 2, 5]),
        (P.flat_map(repeat_gen), [4, 1, 9], [4, 4, 4, 4, 1, 9, 9, 9, 9]),
        (P.flat_map(str.split), ["a b c", "", "d"], ["a", "b", "c", "d"]),
        (P.no_op(), ["x", None, 3], []),
    ],
)
def test_verify_processor_harness(supplier: Any, data: list[Any], expected: list[Any]) -> None:
    from slipstream.testing import verify_processor

    verify_processor(supplier).input(data).expect_output(expected)
    verify_processor(supplier).input(data).expect_outputs([expected, expected])
