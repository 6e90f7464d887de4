"""Items whose timestamps are not integers (NaN, infinite, fractional, strings): a clear
error naming the vertex and the item, or (``invalid_timestamps="late"``) dropped and
counted as late, and never a frame or session that no window frees."""

from __future__ import annotations

import math
import operator
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting, summing, to_list
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.watermark import with_fixed_lag
from slipstream.window import sliding_window_def, tumbling_window_def

key_of = operator.itemgetter(0)
ts_of = operator.itemgetter(1)
value_of = operator.itemgetter(2)
WD = sliding_window_def(20, 10)
BAD = [math.nan, math.inf, -math.inf, 1.5, "7", None]
OPS = {"counting": counting, "summing": lambda: summing(value_of), "to_list": to_list}


def wm_policy() -> Any:
    return with_fixed_lag(5)


def job_dag(
    events: list[Any], agg: str, invalid: str = "fail", session: bool = False, wm_invalid: str = "late"
) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(events)).local_parallelism(1)
    wms = dag.new_vertex(
        "wm", P.insert_watermarks(ts_of, wm_policy, invalid_timestamps=wm_invalid)
    ).local_parallelism(1)
    if session:
        sup = P.aggregate_to_session_window(
            session_timeout=15, key_fn=key_of, timestamp_fn=ts_of, agg_op=OPS[agg](),
            invalid_timestamps=invalid,
        )
    else:
        sup = P.aggregate_to_sliding_window(
            key_fn=key_of, timestamp_fn=ts_of, window_def=WD, agg_op=OPS[agg](),
            invalid_timestamps=invalid,
        )
    win = dag.new_vertex("window", sup)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, wms))
    dag.edge(Edge.between(wms, win).partitioned(key_of).distributed())
    dag.edge(Edge.between(win, sink))
    return dag


def run(events: list[Any], agg: str, invalid: str = "fail", session: bool = False) -> tuple[Counter, int]:
    engine = ss.local()
    job = engine.new_job(job_dag(events, agg, invalid, session))
    job.join(60)
    late = sum(m.get("late_items_dropped", 0) for m in job.metrics.values())
    return Counter(map(repr, engine.get_list("out"))), late


def good_events(n: int) -> list[tuple[str, Any, int]]:
    return [(f"k{i % 5}", i, i % 7) for i in range(n)]


@pytest.mark.parametrize("session", [False, True])
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_timestamp_fails_the_job_naming_vertex_and_item(bad: Any, session: bool) -> None:
    events: list[Any] = good_events(200)
    events.insert(120, ("culprit", bad, 1))
    for wm_invalid, vertex in (("fail", "wm"), ("late", "window")):
        engine = ss.local()
        job = engine.new_job(job_dag(events, "counting", session=session, wm_invalid=wm_invalid))
        with pytest.raises(ss.JobFailedError, match="culprit") as info:
            job.join(60)
        assert info.value.vertex == vertex
        assert f"'{vertex}'" in str(info.value) and "timestamp" in str(info.value)


@settings(max_examples=15, deadline=None)
@given(
    positions=st.lists(st.integers(0, 299), max_size=40),
    agg=st.sampled_from(sorted(OPS)),
    session=st.booleans(),
    bad=st.sampled_from(BAD),
)
def test_late_mode_counts_bad_items_and_gives_the_results_without_them(
    positions: list[int], agg: str, session: bool, bad: Any
) -> None:
    good = good_events(300)
    events: list[Any] = list(good)
    for p in sorted(positions, reverse=True):
        events.insert(p, ("bad", bad, 1))
    out, late = run(events, agg, "late", session)
    expected, expected_late = run(good, agg, "fail", session)
    assert expected_late == 0
    assert out == expected
    assert late == len(positions)


@pytest.mark.parametrize("agg", sorted(OPS))
def test_nan_timestamps_leave_no_frame_behind(agg: str) -> None:
    p = P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of, window_def=tumbling_window_def(10), agg_op=OPS[agg](),
        invalid_timestamps="late",
    )()
    outbox = Outbox(1, 10_000)
    ctx = Context(vertex_name="w")
    p.init(outbox, ctx)
    p.process(0, Inbox([("a", 1, 1), ("a", math.nan, 1), ("b", 2, 1), ("b", math.nan, 2)] * 100))
    assert p.try_process_watermark(Watermark(100))
    assert p._frames == {}  # every frame was emitted and freed
    assert ctx.metrics["late_items_dropped"] == 200


class IntLike:
    """An integer type that is not ``int`` (as numpy's integers are)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


def test_integer_like_timestamps_are_accepted() -> None:
    events = [("a", IntLike(i), 1) for i in range(50)]
    out, late = run(events, "counting")
    expected, _ = run([("a", i, 1) for i in range(50)], "counting")
    assert out == expected and late == 0


def test_insert_watermarks_never_moves_the_watermark_on_a_bad_timestamp() -> None:
    p = P.insert_watermarks(ts_of, lambda: with_fixed_lag(0), invalid_timestamps="late")()
    outbox = Outbox(1, 100)
    p.init(outbox, Context(vertex_name="wm"))
    items = [("a", 5, 0), ("a", math.inf, 0), ("a", "x", 0), ("a", math.nan, 0), ("a", 6, 0)]
    p.process(0, Inbox(items))
    wms = [x.timestamp for x in outbox.buckets[0] if isinstance(x, Watermark)]
    assert wms == [5, 6]
    assert [x for x in outbox.buckets[0] if not isinstance(x, Watermark)] == items


def test_a_value_that_cannot_be_added_is_named() -> None:
    events: list[Any] = good_events(100)
    events.insert(50, ("k1", 60, "not a number"))
    engine = ss.local()
    job = engine.new_job(job_dag(events, "summing"))
    with pytest.raises(ss.JobFailedError, match="not a number"):
        job.join(60)


def test_invalid_timestamps_argument_is_checked() -> None:
    with pytest.raises(ValueError, match="invalid_timestamps must be 'fail' or 'late'"):
        P.aggregate_to_sliding_window(
            key_fn=key_of, timestamp_fn=ts_of, window_def=WD, agg_op=counting(),
            invalid_timestamps="skip",
        )


def _window_run(events: list[Any], getters: bool, invalid: str) -> tuple[list[Any], Any]:
    """One tumbling-sum window processor fed ``events`` in batches, then flushed:
    (results, late count), or (error text, None)."""
    fns = (key_of, ts_of, value_of) if getters else (
        lambda e: e[0], lambda e: e[1], lambda e: e[2]
    )
    p = P.aggregate_to_sliding_window(
        key_fn=fns[0], timestamp_fn=fns[1], window_def=tumbling_window_def(10),
        agg_op=summing(fns[2]), invalid_timestamps=invalid,
    )()
    assert (p._indices is not None) == getters
    outbox = Outbox(1, 100_000)
    ctx = Context(vertex_name="w")
    p.init(outbox, ctx)
    try:
        for i in range(0, len(events), 7):
            p.process(0, Inbox(events[i : i + 7]))
            if i % 21 == 0:
                assert p.try_process_watermark(Watermark(events[i][1] - 15 if type(events[i][1]) is int else 0))
        assert p.complete()
    except TypeError as e:
        return [str(e)], None
    return [repr(x) for x in outbox.buckets[0]], ctx.metrics.get("late_items_dropped", 0)


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.one_of(st.integers(0, 200), st.sampled_from(BAD), st.builds(IntLike, st.integers(0, 200))),
            st.integers(-5, 5),
        ),
        max_size=80,
    ),
    invalid=st.sampled_from(["fail", "late"]),
)
def test_itemgetter_fast_path_matches_the_general_one(events: list[Any], invalid: str) -> None:
    """A sum whose functions are itemgetters runs a path of its own (one pass, a type
    check per item): same results, late counts and errors as with lambdas."""
    assert _window_run(events, True, invalid) == _window_run(events, False, invalid)


def ts_pipeline(rows: list[Any], ts_fn: Any) -> Any:
    from slipstream.window import tumbling_window_def as tumbling

    p = ss.Pipeline()
    stage = p.read_from(sources.items(rows)).with_timestamps(ts_fn, 100)
    stage.window(tumbling(1000)).aggregate(counting()).write_to(sinks.list_sink("out"))
    return p


PIPELINE_VERTEX = "with_timestamps+window-accumulate"
WHERE = f"insert_watermarks (vertex '{PIPELINE_VERTEX}')"


@pytest.mark.parametrize(
    ("value", "advice"),
    [
        (
            1.5,
            ", so a float of seconds needs int(seconds * 1000) in the timestamp function "
            "(a float of milliseconds: int(ms))",
        ),
        (
            "1700000000",
            "; parse the string in the timestamp function (int(s) for digits, "
            "int(datetime.fromisoformat(s).timestamp() * 1000) for an ISO date)",
        ),
        (
            __import__("datetime").datetime(2024, 1, 1),
            ", so a datetime needs int(dt.timestamp() * 1000) in the timestamp function",
        ),
        (
            math.nan,
            " (filter out the items without a time before with_timestamps(), or set "
            "on_item_error='skip')",
        ),
    ],
    ids=["float", "str", "datetime", "nan"],
)
def test_a_timestamp_that_is_no_int_gets_advice_that_fits_it(value: Any, advice: str) -> None:
    """Issue 21, item 3: on main a float timestamp's error held itself in its own message
    and advised invalid_timestamps='late', which would drop every item."""
    row = {"t": value, "k": "a"}
    with pytest.raises(ss.JobFailedError) as info:
        ss.local().new_job(ts_pipeline([row], lambda r: r["t"]), ss.JobConfig(name="t")).join(60)
    assert str(info.value) == (
        f"job 't' failed: vertex '{PIPELINE_VERTEX}', processor 0: TypeError: {WHERE}: the "
        f"timestamp of item {row!r} is {value!r}, not an int: timestamps are int "
        f"milliseconds{advice}"
    )


def test_the_core_api_advice_names_its_own_option() -> None:
    p, _ = _inserter()
    with pytest.raises(TypeError) as info:
        p.process(0, Inbox([("k", math.inf, 1)]))
    assert str(info.value) == (
        "insert_watermarks (vertex 'wm'): the timestamp of item ('k', inf, 1) is inf, not an "
        "int: timestamps are int milliseconds (invalid_timestamps='late' passes such items on "
        "to be counted as late)"
    )


def _inserter() -> tuple[Any, Outbox]:
    proc = P.insert_watermarks(ts_of, wm_policy)()
    outbox = Outbox(1, 100)
    proc.init(outbox, Context("wm"))
    return proc, outbox


def test_a_raising_timestamp_function_names_the_item_unwrapped() -> None:
    with pytest.raises(ss.JobFailedError) as info:
        ss.local().new_job(
            ts_pipeline([{"t": 1}, {"k": "b"}], lambda r: r["t"]), ss.JobConfig(name="t")
        ).join(60)
    assert str(info.value) == (
        f"job 't' failed: vertex '{PIPELINE_VERTEX}', processor 0, on item {{'k': 'b'}}: "
        "KeyError: 't'"
    )


def test_items_without_a_time_are_skipped_under_on_item_error() -> None:
    rows: list[Any] = [{"t": i * 100, "k": "a"} for i in range(50)]
    rows[10]["t"] = math.nan
    rows[20] = {"k": "b"}
    rows[30]["t"] = 3000.5
    engine = ss.local()
    job = engine.new_job(
        ts_pipeline(rows, lambda r: r["t"]), ss.JobConfig(on_item_error="skip")
    )
    job.join(60)
    assert [r.value for r in engine.get_list("out")] == [10, 9, 9, 9, 10]
    assert job.metrics[PIPELINE_VERTEX]["items_skipped"] == 3
