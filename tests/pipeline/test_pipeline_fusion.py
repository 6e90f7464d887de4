"""Fused chains of random map/filter/flat_map/peek stages give exactly what running the
stages one after another in plain Python gives: as a function, as processors under the
test harness (outbox capacity 1, snapshot and restore between items), and end to end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import processors as P
from slipstream import sinks, sources
from slipstream.aggregate import counting
from slipstream.pipeline.fused import ChainFn, fused_chain, input_fused
from slipstream.testing import SAME_ITEMS_ANY_ORDER, verify_processor

# Picklable step functions over ints (module level, so the engine's submission check
# pickles them plainly).


def add3(x: int) -> int:
    return x + 3


def half_or_none(x: int) -> int | None:
    return x // 2 if x % 3 else None  # None drops the item


def double(x: int) -> int:
    return 2 * x


def is_even(x: int) -> bool:
    return x % 2 == 0


def not_div5(x: int) -> bool:
    return x % 5 != 0


def split2(x: int) -> list[int]:
    return [x, x + 1]


def none_or_three(x: int) -> tuple[int, ...]:
    return () if x % 4 == 0 else (x, x, x)


def up_to(x: int) -> range:
    return range(x % 4)


STEPS: dict[str, list[Callable[[int], Any]]] = {
    "map": [add3, half_or_none, double],
    "filter": [is_even, not_div5],
    "flat_map": [split2, none_or_three, up_to],
    "peek": [lambda x: None],
}

step_st = st.sampled_from(["map", "filter", "flat_map", "peek"]).flatmap(
    lambda kind: st.tuples(st.just(kind), st.sampled_from(STEPS[kind]))
)
chain_st = st.lists(step_st, min_size=1, max_size=6)
items_st = st.lists(st.integers(-50, 50), max_size=40)


def oracle(steps: list[tuple[str, Callable[[int], Any]]], items: list[int]) -> list[Any]:
    """The stages one after another, item lists in between."""
    out: list[Any] = list(items)
    for kind, fn in steps:
        if kind == "map":
            out = [y for y in map(fn, out) if y is not None]
        elif kind == "filter":
            out = [x for x in out if fn(x)]
        elif kind == "flat_map":
            out = [y for x in out for y in fn(x)]
        else:
            for x in out:
                fn(x)
    return out


@settings(deadline=None)
@given(chain_st, items_st)
def test_chain_fn_equals_the_stages_one_by_one(steps: Any, items: list[int]) -> None:
    assert ChainFn(steps)(items) == oracle(steps, items)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_st, items_st)
def test_fused_chain_processor_under_the_harness(steps: Any, items: list[int]) -> None:
    # no per-call time limit: a loaded test machine can stall any call for seconds
    verify_processor(fused_chain(ChainFn(steps))).cooperative_timeout(0).input(items).expect_output(
        oracle(steps, items)
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_st, items_st)
def test_chain_fused_into_an_aggregation_under_the_harness(steps: Any, items: list[int]) -> None:
    counts = Counter(oracle(steps, items))
    supplier = input_fused(P.aggregate_by_key(lambda x: x % 7, counting()), {0: ChainFn(steps)})
    expected: Counter[int] = Counter()
    for x, n in counts.items():
        expected[x % 7] += n
    verify_processor(supplier).cooperative_timeout(0).input(items).output_checker(
        SAME_ITEMS_ANY_ORDER
    ).expect_output(
        sorted(expected.items())
    )


def same(x: int) -> int:
    return x


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(STEPS["flat_map"]), items_st)
def test_a_flat_map_fused_into_a_count_by_the_item_under_the_harness(
    fn: Callable[[int], Any], items: list[int]
) -> None:
    """One flat_map into counting() keyed by the item itself: its results are counted
    item by item (core/counting.py, count_flat_mapped), with snapshots and restores between
    items, and with none."""
    expected = Counter(oracle([("flat_map", fn)], items))
    supplier = input_fused(P.aggregate_by_key(same, counting()), {0: ChainFn([("flat_map", fn)])})
    verify_processor(supplier).cooperative_timeout(0).input(items).output_checker(
        SAME_ITEMS_ANY_ORDER
    ).expect_output(sorted(expected.items()))


def no_sevens(line: str) -> list[str]:
    if "7" in line:
        raise ValueError("a seven")
    return line.split()


def word_count(text: list[str], tokenize: Callable[[str], list[str]]) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items(text)).flat_map(tokenize).group_by(same).aggregate(
        counting()
    ).write_to(sinks.list_sink("counts"))
    return p


def test_a_word_counts_tokenizer_error_names_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 1 counts each line's words as they are made; an error of the tokenizer
    still names the line it was on."""
    from slipstream.pipeline import fused

    calls: list[int] = []
    real = fused.count_flat_mapped

    def spy(fn: Any, items: Any, *rest: Any) -> int:
        calls.append(len(items))
        return real(fn, items, *rest)

    monkeypatch.setattr(fused, "count_flat_mapped", spy)
    engine = ss.local()
    engine.new_job(word_count(["a b", "b", ""], str.split)).join(timeout=20)
    assert sorted(engine.get_list("counts")) == [("a", 1), ("b", 2)]
    assert sum(calls) == 3
    with pytest.raises(ss.JobFailedError) as e:
        ss.local().new_job(word_count(["a b", "c d 7 e", "f"], no_sevens)).join(timeout=20)
    assert "on item 'c d 7 e': ValueError: a seven" in str(e.value)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_st, chain_st, st.lists(st.integers(-50, 50), min_size=1, max_size=200))
def test_pipeline_of_random_chains_end_to_end(first: Any, second: Any, items: list[int]) -> None:
    """Two chains: one into a grouped aggregation (fused into its first stage), one into
    a sink (a vertex of its own); results equal the plain-Python stages."""
    p = ss.Pipeline()
    src = p.read_from(sources.items(items))
    stage = src
    for kind, fn in first:
        stage = getattr(stage, kind)(fn)
    stage.group_by(lambda x: x % 7).aggregate(counting()).write_to(sinks.list_sink("agg"))
    stage = src
    for kind, fn in second:
        stage = getattr(stage, kind)(fn)
    stage.write_to(sinks.list_sink("all"))
    engine = ss.local(outbox_capacity=3)  # tiny buckets: every chain is interrupted often
    engine.new_job(p).join(timeout=60)
    expected: Counter[int] = Counter()
    for x in oracle(first, items):
        expected[x % 7] += 1
    assert sorted(engine.get_list("agg")) == sorted(expected.items())
    assert sorted(engine.get_list("all")) == sorted(oracle(second, items))


def test_pipe_of_watermarks_and_window_under_the_harness() -> None:
    """PipeP(insert_watermarks -> window): watermarks reach the window in order, the
    windows they close come out before them, state of both survives every restore."""
    from slipstream.core.items import Watermark
    from slipstream.pipeline.compiler import LagPolicy
    from slipstream.pipeline.fused import pipe
    from slipstream.window import KeyedWindowResult as R
    from slipstream.window import tumbling_window_def

    supplier = pipe(
        P.insert_watermarks(lambda x: x, LagPolicy(0, 10)),
        P.aggregate_to_sliding_window(
            key_fn=lambda x: x % 2,
            timestamp_fn=lambda x: x,
            window_def=tumbling_window_def(10),
            agg_op=counting(),
        ),
    )
    expected: list[Any] = []
    for start in (0, 10, 20):
        if start:
            expected += [R(start - 10, start, 0, 5), R(start - 10, start, 1, 5)]
        expected.append(Watermark(start))
    expected += [R(20, 30, 0, 5), R(20, 30, 1, 5)]
    # insert_watermarks emits one watermark per in-order input chunk (the harness's
    # modes chunk differently): the same windows in the same order and the same last
    # watermark, whichever watermarks came in between
    def same_windows(want: list[Any], got: list[Any]) -> bool:
        def wms(xs: list[Any]) -> list[Any]:
            return [x for x in xs if isinstance(x, Watermark)]

        def rest(xs: list[Any]) -> list[Any]:
            return [x for x in xs if not isinstance(x, Watermark)]

        return rest(want) == rest(got) and wms(want)[-1:] == wms(got)[-1:]

    verify_processor(supplier).cooperative_timeout(0).input(range(30)).output_checker(same_windows).expect_output(
        expected
    )


@pytest.mark.parametrize("chain_inside", [False, True])
def test_an_idle_mark_waits_for_what_a_pipe_holds_between_its_processors(
    chain_inside: bool,
) -> None:
    """The tasklet forwards an idle mark without the processor: behind what a PipeP
    (watermark inserter -> window stage 1) still holds between its two, as unfused.
    Here the inserter's last chunk ends with watermark 10, whose 8 frames stage 1 hands
    out 4 at a time (outbox capacity 4); before, the idle mark went out after 4 of them,
    and stage 2 (its other input already at 100, a step after each of stage 1's) took it
    to close [0, 10) without keys 4-7, dropping their frames as late.
    ``chain_inside``: a map fused in front, the PipeP inside an InputFusedP."""
    from slipstream.core.items import IDLE_MESSAGE, Watermark
    from slipstream.core.processor import Context
    from slipstream.execution.collectors import RoundRobinCollector
    from slipstream.execution.inbound import InboundEdgeStream
    from slipstream.execution.queues import SpscQueue
    from slipstream.execution.tasklet import ProcessorTasklet
    from slipstream.pipeline.compiler import LagPolicy
    from slipstream.pipeline.fused import pipe
    from slipstream.window import KeyedWindowResult as R
    from slipstream.window import tumbling_window_def

    tumbling = tumbling_window_def(10)
    supplier: Any = pipe(
        P.insert_watermarks(lambda x: x, LagPolicy(0, None)),
        P.accumulate_by_frame(
            key_fn=lambda x: x % 8, timestamp_fn=lambda x: x, window_def=tumbling, agg_op=counting()
        ),
    )
    if chain_inside:
        supplier = input_fused(supplier, {0: ChainFn([("map", lambda x: x - 100)])})
    q_in, q_mid, q_other, q_out = (SpscQueue(1024) for _ in range(4))
    stage1 = ProcessorTasklet(
        supplier(),
        Context(),
        [InboundEdgeStream(0, 0, [q_in])],
        [RoundRobinCollector([q_mid])],
        outbox_capacity=4,  # the inserter's chunks: 3 items and their watermark
    )
    stage2 = ProcessorTasklet(
        P.combine_to_sliding_window(window_def=tumbling, agg_op=counting())(),
        Context(),
        [InboundEdgeStream(0, 0, [q_mid, q_other])],
        [RoundRobinCollector([q_out])],
    )
    items = list(range(11))
    q_in.offer([x + 100 for x in items] if chain_inside else items, 11)
    q_in.offer(IDLE_MESSAGE, 1)
    q_other.offer(Watermark(100), 1)
    for t in (stage1, stage2):
        t.init()
    for _ in range(100):
        stage1.call()
        stage2.call()
    out = [x for e in q_out.entries if type(e) is list for x in e]
    assert out == [R(0, 10, k, 2 if k < 2 else 1) for k in range(8)]
