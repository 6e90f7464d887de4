"""Co-aggregation over several inputs: aggregate operations with one accumulate
function per input ordinal (Jet's AggregateOperation2/3 and co-aggregation), batch
co-grouping by key with one key function per inbound edge, and sliding / tumbling /
session windows over several inputs, single and two-stage, against plain-Python
oracles."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks
from slipstream import processors as P
from slipstream.aggregate import (
    AggregateOperation,
    aggregate_operation2,
    aggregate_operation3,
    all_of,
    co_aggregate,
    counting,
    summing,
    to_list,
)
from slipstream.testing import verify_processor
from slipstream.window import KeyedWindowResult, sliding_window_def, tumbling_window_def

WM = ss.Watermark
R = KeyedWindowResult


# clicks are (ts, user); orders are (ts, user, amount); items of either carry their ts first
def ts_of(e: Any) -> int:
    return e[0]


def user_of(e: Any) -> Any:
    return e[1]


def amount_of(e: Any) -> int:
    return e[2]


def clicks_and_revenue() -> AggregateOperation[Any, Any, Any]:
    return co_aggregate(counting(), summing(amount_of))


# -- the operations -------------------------------------------------------------------------


def run2(op: AggregateOperation[Any, Any, Any], inputs: list[list[Any]]) -> Any:
    acc = op.create()
    for ordinal, items in enumerate(inputs):
        fn = op.accumulate_fn(ordinal)
        for item in items:
            acc = fn(acc, item)
    return op.finish(acc)


def test_co_aggregate_takes_each_input_with_its_own_op() -> None:
    op = co_aggregate(counting(), summing(amount_of), to_list())
    assert op.arity == 3
    assert run2(op, [["a", "b"], [(0, "u", 5), (1, "v", 7)], [9]]) == (2, 12, [9])
    assert op.deduct is None and op.combine is not None
    op2 = aggregate_operation2(counting(), summing(), finish_fn=lambda n, s: s / n)
    assert run2(op2, [["x", "y"], [3, 5]]) == 4.0
    op3 = aggregate_operation3(counting(), counting(), counting())
    assert run2(op3, [[1], [1, 2], []]) == (1, 2, 0)
    with pytest.raises(ValueError, match="arity 2.*input ordinal 2"):
        op2.accumulate_fn(2)
    with pytest.raises(ValueError, match="all_of argument 0 takes 2 inputs"):
        all_of(op2)


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.integers(-100, 100), max_size=20),
    b=st.lists(st.integers(-100, 100), max_size=20),
    cut_a=st.integers(0, 20),
    cut_b=st.integers(0, 20),
)
def test_co_aggregate_split_combine_and_deduct(a: list[int], b: list[int], cut_a: int, cut_b: int) -> None:
    op = co_aggregate(counting(), summing())
    assert op.combine is not None and op.deduct is not None
    whole = run2(op.with_identity_finish(), [a, b])
    left = run2(op.with_identity_finish(), [a[:cut_a], b[:cut_b]])
    right = run2(op.with_identity_finish(), [a[cut_a:], b[cut_b:]])
    assert op.combine(left, right) == whole
    assert op.deduct(whole, right) == left
    assert op.finish(whole) == (len(a), sum(b))


def test_custom_op_with_one_accumulate_per_ordinal() -> None:
    """The builder form: AggregateOperation(create, [accumulate0, accumulate1], ...)."""
    op = AggregateOperation(
        lambda: (0, 0), [lambda a, x: (a[0] + x, a[1]), lambda a, x: (a[0], a[1] + x)],
        lambda x, y: (x[0] + y[0], x[1] + y[1]),
    )
    assert op.arity == 2 and run2(op, [[1, 2], [10]]) == (3, 10)
    with pytest.raises(TypeError, match="accumulate\\[1\\] must be a callable"):
        AggregateOperation(int, [lambda a, x: a, 3])


# -- batch co-grouping -------------------------------------------------------------------------

CLICKS = [(i, f"u{i % 5}") for i in range(40)]
ORDERS = [(i, f"u{i % 7}", i * 3) for i in range(30)]


def cogroup_oracle() -> dict[Any, tuple[int, int]]:
    out: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
    for _, u in CLICKS:
        out[u][0] += 1
    for _, u, amount in ORDERS:
        out[u][1] += amount
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_co_group_by_key_in_the_harness() -> None:
    expected = sorted(cogroup_oracle().items())
    verify_processor(P.aggregate_by_key([user_of, user_of], clicks_and_revenue())).inputs(
        [CLICKS, ORDERS]
    ).output_checker(lambda exp, act: sorted(act) == exp).expect_output(expected)


class ListSource(ss.AbstractProcessor):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def complete(self) -> bool:
        if not hasattr(self, "_it"):
            c = self.context
            self._it = iter(self.items[c.global_processor_index :: c.total_parallelism])
        return self.emit_from(self._it)


def _entry_key(e: Any) -> Any:
    return e[0]


@pytest.mark.parametrize("two_stage", [False, True])
def test_co_group_by_key_on_the_engine(two_stage: bool) -> None:
    op = clicks_and_revenue()
    dag = DAG()
    clicks = dag.new_vertex("clicks", functools.partial(ListSource, CLICKS)).local_parallelism(2)
    orders = dag.new_vertex("orders", functools.partial(ListSource, ORDERS)).local_parallelism(2)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    if two_stage:
        acc = dag.new_vertex("acc", P.accumulate_by_key([user_of, user_of], op))
        comb = dag.new_vertex("comb", P.combine_by_key(op))
        dag.edge(Edge.from_(clicks).to(acc, 0).partitioned(user_of))
        dag.edge(Edge.from_(orders).to(acc, 1).partitioned(user_of))
        dag.edge(Edge.between(acc, comb).distributed().partitioned(_entry_key))
        dag.edge(Edge.between(comb, out))
    else:
        agg = dag.new_vertex("agg", P.aggregate_by_key([user_of, user_of], op))
        dag.edge(Edge.from_(clicks).to(agg, 0).distributed().partitioned(user_of))
        dag.edge(Edge.from_(orders).to(agg, 1).distributed().partitioned(user_of))
        dag.edge(Edge.between(agg, out))
    engine = ss.local(members=2)
    engine.new_job(dag).join(30)
    assert dict(engine.get_list("out")) == cogroup_oracle()


def test_unkeyed_aggregate_over_two_inputs() -> None:
    verify_processor(P.aggregate(clicks_and_revenue())).inputs([CLICKS, ORDERS]).expect_output(
        [(len(CLICKS), sum(o[2] for o in ORDERS))]
    )


def test_key_functions_must_match_the_inputs() -> None:
    with pytest.raises(ValueError, match="key_fn has 3 function\\(s\\) but agg_op takes 2 input"):
        P.aggregate_by_key([user_of] * 3, clicks_and_revenue())
    with pytest.raises(ValueError, match="input ordinal 1"):
        verify_processor(P.aggregate_by_key(user_of, counting())).inputs([[(0, "a")], [(0, "b")]]).expect_output([])


# -- windows over several inputs ---------------------------------------------------------------

clicks_st = st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["a", "b"])), max_size=12)
orders_st = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from(["a", "b", "c"]), st.integers(1, 9)), max_size=12
)


def window_oracle(clicks: list[Any], orders: list[Any], size: int, slide: int) -> list[R]:
    ends = set()
    for e in clicks + orders:
        first = e[0] - e[0] % slide + slide
        ends.update(range(first, first + size, slide))
    out = []
    for end in sorted(ends):
        keys = sorted({e[1] for e in clicks + orders if end - size <= e[0] < end})
        for k in keys:
            n = sum(1 for e in clicks if e[1] == k and end - size <= e[0] < end)
            s = sum(e[2] for e in orders if e[1] == k and end - size <= e[0] < end)
            out.append(R(end - size, end, k, (n, s)))
    return out


def _sorted_results(expected: list[Any], actual: list[Any]) -> bool:
    return sorted(map(tuple, actual)) == sorted(map(tuple, expected))


@settings(max_examples=25, deadline=None)
@given(clicks=clicks_st, orders=orders_st, tumbling=st.booleans())
def test_sliding_window_over_two_inputs_in_the_harness(clicks: list[Any], orders: list[Any], tumbling: bool) -> None:
    """Bounded inputs without watermarks: complete() emits every window."""
    wd = tumbling_window_def(10) if tumbling else sliding_window_def(10, 5)
    proc = P.aggregate_to_sliding_window(
        key_fn=[user_of, user_of], timestamp_fn=[ts_of, ts_of], window_def=wd, agg_op=clicks_and_revenue()
    )
    expected = window_oracle(clicks, orders, wd.window_size, wd.frame_size)
    verify_processor(proc).inputs([clicks, orders]).output_checker(_sorted_results).expect_output(expected)


@settings(max_examples=15, deadline=None)
@given(clicks=clicks_st, orders=orders_st)
def test_session_window_over_two_inputs_in_the_harness(clicks: list[Any], orders: list[Any]) -> None:
    timeout = 5
    proc = P.aggregate_to_session_window(
        session_timeout=timeout, key_fn=[user_of, user_of], timestamp_fn=[ts_of, ts_of],
        agg_op=clicks_and_revenue(),
    )
    # oracle: per key, merge [t, t + timeout) intervals of both inputs
    events: dict[Any, list[tuple[int, int, int]]] = defaultdict(list)
    for t, u in clicks:
        events[u].append((t, 1, 0))
    for t, u, amount in orders:
        events[u].append((t, 0, amount))
    expected = []
    for k, evs in events.items():
        evs.sort()
        start, end, n, s = evs[0][0], evs[0][0] + timeout, 0, 0
        for t, c, a in evs:
            if t >= end:
                expected.append(R(start, end, k, (n, s)))
                start, n, s = t, 0, 0
            end = max(end, t + timeout)
            n += c
            s += a
        expected.append(R(start, end, k, (n, s)))
    verify_processor(proc).inputs([clicks, orders]).output_checker(_sorted_results).expect_output(expected)


def _key(r: Any) -> Any:
    return r.key


@pytest.mark.parametrize("two_stage", [False, True])
def test_windows_over_two_inputs_on_the_engine_with_watermarks(two_stage: bool) -> None:
    wd = sliding_window_def(10, 5)
    op = clicks_and_revenue()
    clicks = [(t, "ab"[t % 2]) for t in range(0, 60, 3)]
    orders = [(t, "abc"[t % 3], t) for t in range(0, 60, 4)]
    dag = DAG()
    src_c = dag.new_vertex("clicks", functools.partial(ListSource, _with_wms(clicks))).local_parallelism(1)
    src_o = dag.new_vertex("orders", functools.partial(ListSource, _with_wms(orders))).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    if two_stage:
        s1 = dag.new_vertex("frames", P.accumulate_by_frame(
            key_fn=[user_of, user_of], timestamp_fn=[ts_of, ts_of], window_def=wd, agg_op=op))
        s2 = dag.new_vertex("windows", P.combine_to_sliding_window(window_def=wd, agg_op=op))
        dag.edge(Edge.from_(src_c).to(s1, 0).partitioned(user_of))
        dag.edge(Edge.from_(src_o).to(s1, 1).partitioned(user_of))
        dag.edge(Edge.between(s1, s2).distributed().partitioned(_key)).edge(Edge.between(s2, out))
    else:
        w = dag.new_vertex("windows", P.aggregate_to_sliding_window(
            key_fn=[user_of, user_of], timestamp_fn=[ts_of, ts_of], window_def=wd, agg_op=op))
        dag.edge(Edge.from_(src_c).to(w, 0).distributed().partitioned(user_of))
        dag.edge(Edge.from_(src_o).to(w, 1).distributed().partitioned(user_of))
        dag.edge(Edge.between(w, out))
    engine = ss.local(members=2)
    job = engine.new_job(dag)
    job.join(30)
    assert sorted(engine.get_list("out")) == window_oracle(clicks, orders, 10, 5)
    assert not job.metrics["windows"].get("late_items_dropped", 0)


def _with_wms(events: list[Any]) -> list[Any]:
    out: list[Any] = []
    for e in events:
        out.append(e)
        out.append(WM(e[0]))
    return out
