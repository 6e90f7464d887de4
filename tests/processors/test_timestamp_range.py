"""Timestamps outside the 64-bit range (Jet's ``long``): one at or above 2**63 became a
watermark beyond every later item, which were all dropped as late (counted, never
reported). Now they fail naming the vertex, the item and the value wherever timestamps
enter (insert_watermarks, the windows' and sessions' timestamp functions, the event-time
mapper of sources, the Kafka source's timestamp_fn), or under
``invalid_timestamps="late"`` are dropped and counted like NaN."""

from __future__ import annotations

import operator
import re
from collections import Counter
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting, summing
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.watermark import with_fixed_lag
from slipstream.window import sliding_window_def

key_of = operator.itemgetter(0)
ts_of = operator.itemgetter(1)
value_of = operator.itemgetter(2)
TOO_BIG = 2**63
TOO_SMALL = -(2**63) - 1
RANGE = "outside the range of timestamps (64-bit: -2**63 .. 2**63 - 1)"
WINDOW_HINT = "(invalid_timestamps='late' counts such items as late instead)"
WM_HINT = "(invalid_timestamps='late' passes such items on to be counted as late)"


def events_with(bad: int) -> list[Any]:
    events: list[Any] = [(f"k{i % 5}", i, 1) for i in range(300)]
    events.insert(120, ("culprit", bad, 1))
    return events


def window_dag(
    events: list[Any], *, wm_invalid: str, invalid: str = "fail", session: bool = False,
    ts_fn: Any = ts_of, two_outputs: bool = False,
) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(events)).local_parallelism(1)
    wm = dag.new_vertex(
        "wm", P.insert_watermarks(ts_fn, lambda: with_fixed_lag(5), invalid_timestamps=wm_invalid)
    ).local_parallelism(1)
    if session:
        sup = P.aggregate_to_session_window(
            session_timeout=15, key_fn=key_of, timestamp_fn=ts_fn, agg_op=counting(),
            invalid_timestamps=invalid,
        )
    else:
        sup = P.aggregate_to_sliding_window(
            key_fn=key_of, timestamp_fn=ts_fn, window_def=sliding_window_def(20, 10),
            agg_op=summing(value_of), invalid_timestamps=invalid,
        )
    win = dag.new_vertex("window", sup).local_parallelism(1)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, wm)).edge(Edge.between(wm, win)).edge(Edge.between(win, out))
    if two_outputs:  # insert_watermarks then takes its per-item path (two buckets)
        extra = dag.new_vertex("extra", sinks.noop()).local_parallelism(1)
        dag.edge(Edge.from_(wm, 1).to(extra))
    return dag


def job_error(dag: DAG) -> str:
    with pytest.raises(ss.JobFailedError) as info:
        ss.local().new_job(dag).join(60)
    return str(info.value).split("\n")[0].split(" failed: ", 1)[1]


def run(dag: DAG) -> tuple[Counter[str], int]:
    engine = ss.local()
    job = engine.new_job(dag)
    job.join(60)
    late = sum(m.get("late_items_dropped", 0) for m in job.metrics.values())
    return Counter(map(repr, engine.get_list("out"))), late


@pytest.mark.parametrize("two_outputs", [False, True])
@pytest.mark.parametrize("bad", [TOO_BIG, 2**64 - 1, TOO_SMALL])
def test_insert_watermarks_rejects_a_timestamp_outside_int64(bad: int, two_outputs: bool) -> None:
    text = job_error(window_dag(events_with(bad), wm_invalid="fail", two_outputs=two_outputs))
    item = f"('culprit', {bad}, 1)"
    if bad < 0 and not two_outputs:
        # the fast path checks the chunk's maximum only (free: it is computed anyway); a
        # timestamp below the range cannot move a watermark, and the window rejects it
        assert text == (
            f"vertex 'window', processor 0: ValueError: aggregate_to_sliding_window (vertex "
            f"'window'): item {item} has timestamp {bad}, {RANGE} {WINDOW_HINT}"
        )
    else:
        assert text == (
            f"vertex 'wm', processor 0: ValueError: insert_watermarks (vertex 'wm'): item "
            f"{item} has timestamp {bad}, {RANGE} {WM_HINT}"
        )


@pytest.mark.parametrize("session", [False, True])
@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("bad", [TOO_BIG, TOO_SMALL])
def test_windows_reject_a_timestamp_outside_int64(bad: int, indexed: bool, session: bool) -> None:
    ts_fn = ts_of if indexed else (lambda e: e[1])
    dag = window_dag(events_with(bad), wm_invalid="late", session=session, ts_fn=ts_fn)
    kind = "aggregate_to_session_window" if session else "aggregate_to_sliding_window"
    assert job_error(dag) == (
        f"vertex 'window', processor 0: ValueError: {kind} (vertex 'window'): item "
        f"('culprit', {bad}, 1) has timestamp {bad}, {RANGE} {WINDOW_HINT}"
    )


@pytest.mark.parametrize("session", [False, True])
@pytest.mark.parametrize("indexed", [True, False])
def test_late_mode_counts_them_and_the_results_stay_those_without_them(
    indexed: bool, session: bool
) -> None:
    ts_fn = ts_of if indexed else (lambda e: e[1])
    good: list[Any] = [(f"k{i % 5}", i, 1) for i in range(300)]
    events = list(good)
    for pos, bad in ((40, TOO_BIG), (41, 2**70), (150, TOO_SMALL)):
        events.insert(pos, ("bad", bad, 1))
    out, late = run(window_dag(events, wm_invalid="late", invalid="late", session=session, ts_fn=ts_fn))
    expected, expected_late = run(window_dag(good, wm_invalid="fail", session=session, ts_fn=ts_fn))
    assert expected_late == 0 and late == 3
    assert out == expected


@pytest.mark.parametrize("indexed", [True, False])
def test_a_frame_at_the_top_of_the_range_does_not_let_a_larger_timestamp_in(indexed: bool) -> None:
    # 2**63 - 1 and 2**63 share a 10 ms frame; the second must not ride on the first's
    p = P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of if indexed else (lambda e: e[1]),
        window_def=sliding_window_def(10, 10), agg_op=summing(value_of),
    )()
    p.init(Outbox(1, 1000), Context(vertex_name="w"))
    with pytest.raises(ValueError) as info:
        p.process(0, Inbox([("a", 2**63 - 2, 1), ("a", 2**63 - 1, 1), ("b", TOO_BIG, 1)]))
    assert str(info.value) == (
        f"aggregate_to_sliding_window (vertex 'w'): item ('b', {TOO_BIG}, 1) has timestamp "
        f"{TOO_BIG}, {RANGE} {WINDOW_HINT}"
    )
    p.init(Outbox(1, 1000), Context(vertex_name="w"))
    with pytest.raises(ValueError, match=re.escape(f"item ('b', {TOO_SMALL}, 1)")):
        p.process(0, Inbox([("a", -(2**63), 1), ("b", TOO_SMALL, 1)]))


def test_a_long_item_is_cut_in_the_message() -> None:
    p = P.aggregate_to_session_window(
        session_timeout=10, key_fn=key_of, timestamp_fn=ts_of, agg_op=counting()
    )()
    p.init(Outbox(1, 1000), Context(vertex_name="s"))
    item = ("x" * 500, TOO_BIG)
    with pytest.raises(ValueError) as info:
        p.process(0, Inbox([item]))
    assert str(info.value) == (
        f"aggregate_to_session_window (vertex 's'): item ('{'x' * 198}... ({len(repr(item))} "
        "characters) "
        f"has timestamp {TOO_BIG}, {RANGE} {WINDOW_HINT}"
    )


def test_the_event_time_mapper_rejects_them() -> None:
    from slipstream.sources.event_time import EventTimeMapper

    m = EventTimeMapper(lambda: with_fixed_lag(0), timestamp_fn=ts_of, idle_timeout_ms=None)
    m.add_partitions(1)
    assert m.flat_map_event(("a", 5), 0) == [Watermark(5), ("a", 5)]
    with pytest.raises(ValueError) as info:
        m.flat_map_event(("a", TOO_BIG), 0)
    assert str(info.value) == (
        f"EventTimeMapper: partition 0: item ('a', {TOO_BIG}) has timestamp {TOO_BIG}, {RANGE}"
    )
    with pytest.raises(ValueError) as info:
        m.observe_event(0, TOO_SMALL)
    assert str(info.value) == f"EventTimeMapper: partition 0: timestamp {TOO_SMALL} is {RANGE}"
    with pytest.raises(TypeError, match=r"partition 0: bad timestamp 1\.5: not an integer"):
        m.observe_event(0, 1.5)  # type: ignore[arg-type]
    assert m.flat_map_event(("a", 7), 0) == [Watermark(7), ("a", 7)]  # nothing moved


class _Record:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def topic(self) -> str:
        return "events"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 42

    def value(self) -> bytes:
        return self._value


def test_the_kafka_sources_timestamp_fn_is_checked() -> None:
    pytest.importorskip("confluent_kafka")
    from slipstream.sources.kafka import KafkaSourceP

    p = KafkaSourceP(
        ("events",), {}, None, lambda item: int(item[1]), lambda: with_fixed_lag(0), None,
        "fail", False, 5000,
    )
    p.context = Context(vertex_name="k")
    assert p._event_time(_Record(b"7"), (None, b"7")) == 7
    with pytest.raises(ValueError) as info:
        p._event_time(_Record(b"x"), (None, str(2**64).encode()))
    assert str(info.value) == (
        "kafka (vertex 'k'): the record at topic 'events', partition 3, offset 42: item "
        f"(None, b'{2**64}') has timestamp {2**64}, {RANGE}"
    )
