"""EventTimeMapper: per-partition event time in one source processor (Jet's
EventTimeMapperTest cases, with a hand-driven millisecond clock), a property test
against a plain-Python oracle, and a partitioned source on the engine."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.sources.event_time import EventTimeMapper
from slipstream.state.keys import BroadcastKey
from slipstream.watermark import IDLE, NO_WATERMARK, limiting_lag_and_delay, with_fixed_lag
from slipstream.window import tumbling_window_def

LAG = 3
WM = ss.Watermark


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def mapper(idle: int | None, clock: Clock, lag: int = LAG, ts_fn: Any = int) -> EventTimeMapper:
    return EventTimeMapper(lambda: with_fixed_lag(lag), timestamp_fn=ts_fn, idle_timeout_ms=idle, clock=clock)


def test_smoke() -> None:
    clock = Clock()
    m = mapper(5, clock)
    m.add_partitions(2)
    clock.now = 1
    assert m.flat_map_idle() == []  # both partitions active at first
    clock.now = 5
    assert m.flat_map_idle() == [IDLE]  # idle timeout passed for both
    assert m.flat_map_idle() == []  # said once
    # an event on partition 0: its watermark goes out at once, the other one is idle
    assert m.flat_map_event(100, 0) == [WM(100 - LAG), 100]
    assert m.flat_map_event(90, 0) == [90]  # older: no watermark
    assert m.flat_map_event(101, 0) == [WM(101 - LAG), 101]


def test_disabled_idle_timeout_waits_for_every_partition() -> None:
    clock = Clock()
    m = mapper(None, clock)
    m.add_partitions(2)
    assert m.flat_map_idle() == []
    assert m.flat_map_event(10, 0) == [10]
    assert m.flat_map_event(11, 0) == [11]
    clock.now = 10**9  # no idle timeout: partition 1 holds the watermark back forever
    assert m.flat_map_idle() == []
    assert m.flat_map_event(10, 1) == [WM(10 - LAG), 10]
    assert m.flat_map_event(11, 1) == [WM(11 - LAG), 11]
    assert m.flat_map_event(12, 1) == [12]  # partition 1 ahead of partition 0
    assert m.flat_map_event(13, 0) == [WM(12 - LAG), 13]


def test_zero_partitions_is_idle_at_once_and_added_partitions_count() -> None:
    m = mapper(None, Clock())
    assert m.flat_map_idle() == [IDLE]
    assert m.flat_map_idle() == []
    m.add_partitions(1)  # added while running
    assert m.partition_count == 1
    assert m.flat_map_idle() == []  # no value to emit yet
    assert m.flat_map_event(10, 0) == [WM(10 - LAG), 10]


def test_partition_added_later_holds_the_watermark_back_until_it_speaks() -> None:
    clock = Clock()
    m = mapper(100, clock)
    m.add_partitions(1)
    assert m.flat_map_event(10, 0) == [WM(7), 10]
    m.add_partitions(1)
    assert m.flat_map_event(20, 0) == [20]  # partition 1 has no watermark yet
    assert m.flat_map_event(15, 1) == [WM(12), 15]
    clock.now = 100  # partition 1 is idle from 100 ms after it was added... and 0 too
    assert m.flat_map_idle() == [WM(17), IDLE]


def test_idle_event_idle_gives_two_idle_marks() -> None:
    clock = Clock()
    m = mapper(10, clock)
    m.add_partitions(1)
    assert m.flat_map_event(10, 0) == [WM(7), 10]
    clock.now = 10
    assert m.flat_map_idle() == [IDLE]
    assert m.flat_map_event(10, 0) == [10]  # active again, no new watermark
    assert m.flat_map_idle() == []
    clock.now = 20
    assert m.flat_map_idle() == [IDLE]


def test_event_in_one_of_two_partitions_then_top_watermark_and_idle_after_timeout() -> None:
    clock = Clock()
    m = mapper(10, clock)
    m.add_partitions(2)
    assert m.flat_map_event(10, 0) == [10]
    clock.now = 10
    assert m.flat_map_idle() == [WM(10 - LAG), IDLE]


def test_native_timestamps_without_timestamp_fn() -> None:
    clock = Clock()
    m = mapper(5, clock, ts_fn=None)
    m.add_partitions(1)
    assert m.flat_map_event("a", 0, 11) == [WM(11 - LAG), "a"]
    assert m.flat_map_event("b", 0, 12) == [WM(12 - LAG), "b"]
    with pytest.raises(ValueError, match="neither timestamp_fn nor a native timestamp"):
        m.flat_map_event("c", 0)


def test_timestamp_fn_wins_over_native_timestamp() -> None:
    m = mapper(None, Clock(), lag=0)
    m.add_partitions(1)
    assert m.flat_map_event(5, 0, 1000) == [WM(5), 5]


def test_restored_watermark_does_not_go_back() -> None:
    m = mapper(5, Clock(), lag=0)
    m.add_partitions(1)
    m.restore_watermark(0, 10)
    assert m.flat_map_event(9, 0) == [9]
    assert m.flat_map_event(10, 0) == [10]
    assert m.flat_map_event(11, 0) == [WM(11), 11]
    assert m.watermark(0) == 11


def test_removing_the_lagging_partition_releases_the_watermark() -> None:
    m = mapper(5, Clock(), lag=0)
    m.add_partitions(2)
    assert m.flat_map_event(10, 0) == [10]
    assert m.remove_partition(1) == [WM(10)]


def test_removing_the_partition_ahead_releases_nothing() -> None:
    m = mapper(5, Clock(), lag=0)
    m.add_partitions(2)
    assert m.flat_map_event(10, 0) == [10]
    assert m.flat_map_event(11, 1) == [WM(10), 11]
    assert m.remove_partition(1) == []


def test_three_partitions_lagging_removed_other_lagging_idle() -> None:
    clock = Clock()
    m = mapper(5, clock, lag=0)
    m.add_partitions(3)
    assert m.flat_map_event(10, 0) == [10]
    clock.now = 1
    assert m.flat_map_event(11, 1) == [11]
    assert m.flat_map_event(12, 2) == [WM(10), 12]
    clock.now = 5  # partition 0 turns idle, partition 1 is removed: 12 goes out
    assert m.remove_partition(1) == [WM(12)]


class _Constant:
    def __init__(self, value: int) -> None:
        self.value = value

    def report_event(self, ts: int) -> int:
        return self.value

    def current_watermark(self) -> int:
        return self.value


def test_watermark_is_not_capped_at_the_event_timestamp() -> None:
    """A deliberate difference (docs/streaming.md): Jet 4.x would emit 41 (capped at the
    event); here the policy's 42 goes out and the event is late by the policy's rule."""
    m = EventTimeMapper(lambda: _Constant(42), timestamp_fn=int, idle_timeout_ms=None, clock=Clock())
    m.add_partitions(1)
    assert m.flat_map_event(41, 0) == [WM(42), 41]
    assert m.flat_map_event(40, 0) == [40]


def test_throttled_policies_throttle_the_processor_watermark() -> None:
    wd = tumbling_window_def(10)
    m = EventTimeMapper(
        lambda: with_fixed_lag(0).throttle_by_frame(wd), timestamp_fn=int, idle_timeout_ms=None
    )
    m.add_partitions(2)
    assert m.flat_map_event(15, 0) == [15]
    assert m.flat_map_event(27, 1) == [WM(10), 27]
    assert m.flat_map_event(29, 0) == [WM(20), 29]


def test_argument_errors_name_the_problem() -> None:
    with pytest.raises(TypeError, match="policy_factory must be a zero-argument callable"):
        EventTimeMapper(with_fixed_lag(3))
    with pytest.raises(ValueError, match="idle_timeout_ms"):
        EventTimeMapper(lambda: with_fixed_lag(3), idle_timeout_ms=-1)
    m = EventTimeMapper(lambda: with_fixed_lag(3))
    with pytest.raises(IndexError, match="no partition 0"):
        m.observe_event(0, 5)
    m2 = EventTimeMapper(lambda: 42)
    with pytest.raises(TypeError, match="not a watermark policy"):
        m2.add_partitions(1)


# -- property: the oracle -------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    parts=st.integers(0, 4),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("ev"), st.integers(0, 3), st.integers(0, 60)),
            st.tuples(st.just("tick"), st.integers(0, 8), st.just(0)),
            st.tuples(st.just("add"), st.just(0), st.just(0)),
        ),
        max_size=60,
    ),
    idle=st.sampled_from([None, 5, 20]),
)
def test_matches_a_plain_python_oracle(parts: int, steps: list[tuple[str, int, int]], idle: int | None) -> None:
    """Against a direct model of the rules: per-partition fixed-lag watermarks; the
    output is the minimum over partitions not idle now, emitted when it rises; when all
    are idle, the top one once and then the idle mark."""
    clock = Clock()
    m = mapper(idle, clock, lag=2)
    m.add_partitions(parts)
    wm = [NO_WATERMARK] * parts
    idle_at = [idle or 0] * parts
    last, top, said_idle = NO_WATERMARK, NO_WATERMARK, False

    def expect(now: int) -> list[Any]:
        nonlocal last, top, said_idle
        active = [i for i in range(len(wm)) if idle is None or now < idle_at[i]]
        top = max([top] + [wm[i] for i in active])
        out: list[Any] = []
        if active:
            said_idle = False
            lo = min(wm[i] for i in active)
        elif said_idle:
            return out
        else:
            said_idle = True
            lo = top
        if lo > last:
            last = lo
            out.append(WM(lo))
        if not active:
            out.append(IDLE)
        return out

    for kind, a, b in steps:
        if kind == "tick":
            clock.now += a
            assert m.flat_map_idle() == expect(clock.now)
        elif kind == "add":
            m.add_partitions(1)
            wm.append(NO_WATERMARK)
            idle_at.append(clock.now + (idle or 0))
        elif wm:
            p = a % len(wm)
            wm[p] = max(wm[p], b - 2)
            idle_at[p] = clock.now + (idle or 0)
            said_idle = False
            assert m.flat_map_event(b, p) == expect(clock.now) + [b]
    assert m.last_emitted == last


# -- on the engine: a multi-partition source ---------------------------------------------


class PartitionedSource(ss.AbstractProcessor):
    """Reads in-memory partitions ``(partition_id, [(value, native_ts), ...])``, this
    processor taking partitions ``i, i + n, ...``; one record per partition per call, a
    partition ending after its last record (then it is removed). Saves offsets and
    watermarks under broadcast keys of the partition ids, as the EventTimeMapper docs
    recommend."""

    def __init__(self, partitions: list[tuple[int, list[tuple[Any, int]]]], lag: int) -> None:
        self.partitions = partitions
        self.lag = lag
        self.pending: Any = iter(())

    def init_processor(self, context: ss.Context) -> None:
        n, i = context.total_parallelism, context.global_processor_index
        self.mine = [p for k, p in enumerate(self.partitions) if k % n == i]
        self.offsets = [0] * len(self.mine)
        self.mapper = EventTimeMapper(lambda: with_fixed_lag(self.lag), idle_timeout_ms=None)
        self.mapper.add_partitions(len(self.mine))
        self.ids = [pid for pid, _ in self.mine]

    def _records(self) -> Any:
        for i, (_pid, records) in enumerate(self.mine):
            if self.offsets[i] < len(records):
                value, ts = records[self.offsets[i]]
                self.offsets[i] += 1
                yield from self.mapper.flat_map_event(value, i, ts)

    def complete(self) -> bool:
        if not self.emit_from(self.pending):
            return False
        if all(self.offsets[i] >= len(r) for i, (_, r) in enumerate(self.mine)):
            return True
        self.pending = self._records()
        return False

    def save_to_snapshot(self) -> bool:
        return self.save_state(
            lambda: (
                (BroadcastKey(("part", pid)), (self.offsets[i], self.mapper.watermark(i)))
                for i, pid in enumerate(self.ids)
            )
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if key.name[1] in self.ids:
            i = self.ids.index(key.name[1])
            self.offsets[i] = value[0]
            self.mapper.restore_watermark(i, value[1])


def _key(v: Any) -> Any:
    return v[0]


def _ts(v: Any) -> int:
    return v[1]


def test_partitions_read_unevenly_lose_no_event_to_lateness() -> None:
    """Two partitions in one processor, one far ahead of the other in event time (as
    after a restart). One policy over the merged stream would make every event of the
    slow partition late; per-partition watermarks lose none."""
    fast = [((0, 1000 + t), 1000 + t) for t in range(200)]
    slow = [((1, t), t) for t in range(200)]
    dag = DAG()
    src = dag.new_vertex(
        "src", functools.partial(PartitionedSource, [(0, fast), (1, slow)], 5)
    ).local_parallelism(1)
    win = dag.new_vertex(
        "win",
        P.aggregate_to_sliding_window(
            key_fn=_key, timestamp_fn=_ts, window_def=tumbling_window_def(100), agg_op=counting()
        ),
    ).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, win)).edge(Edge.between(win, out))
    engine = ss.local()
    job = engine.new_job(dag)
    job.join(30)
    assert job.metrics["win"].get("late_items_dropped", 0) == 0
    assert sum(r.value for r in engine.get_list("out")) == 400


# -- observe_event's fast path: events below their policy's threshold -------------------


class _SlowPathMapper(EventTimeMapper):
    """Takes the full path for every event: the reference for the fast path."""

    __slots__ = ()

    def observe_event(self, partition: int, timestamp: int, now: int | None = None) -> Any:
        self._fast_until = NO_WATERMARK  # no clock time is before it
        return super().observe_event(partition, timestamp, now)


class _Counting:
    """A fixed-lag policy that counts the events reported to it."""

    def __init__(self) -> None:
        self.inner = with_fixed_lag(LAG)
        self.reported = 0

    def report_event(self, ts: int) -> int:
        self.reported += 1
        return self.inner.report_event(ts)

    def current_watermark(self) -> int:
        return self.inner.current_watermark()

    def report_threshold(self) -> int:
        return self.inner.report_threshold()


def test_events_below_the_threshold_are_not_reported() -> None:
    """Only an event that can move its partition's watermark reaches the policy (a
    fixed lag: a new maximum); the watermarks are the same."""
    policies: list[_Counting] = []

    def factory() -> _Counting:
        policies.append(_Counting())
        return policies[-1]

    clock = Clock()
    m = EventTimeMapper(factory, timestamp_fn=int, idle_timeout_ms=50, clock=clock)
    m.add_partitions(2)
    out = []
    for ts in [10, 11, 5, 9, 12, 3, 12, 13, 1]:
        for p in (0, 1):
            out.append(m.observe_event(p, ts + p))
    assert [w.timestamp for w in out if w is not None] == [10 - LAG, 11 - LAG, 12 - LAG, 13 - LAG]
    assert [p.reported for p in policies] == [4, 4]  # 10, 11, 12, 13: the new maxima


_policies = st.sampled_from(
    [
        lambda: with_fixed_lag(2),
        lambda: with_fixed_lag(0).throttle_by_frame(tumbling_window_def(10)),
        lambda: with_fixed_lag(3).throttle_by_min_step(7),
        lambda: limiting_lag_and_delay(2, 5, clock=_SHARED_CLOCK),
        lambda: _Constant(17),
    ]
)
_SHARED_CLOCK = Clock()


@settings(max_examples=120, deadline=None)
@given(
    policy=_policies,
    parts=st.integers(0, 3),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("ev"), st.integers(0, 3), st.integers(-5, 80)),
            st.tuples(st.just("tick"), st.integers(-2, 8), st.just(0)),
            st.tuples(st.just("idle"), st.just(0), st.just(0)),
            st.tuples(st.just("add"), st.just(0), st.just(0)),
            st.tuples(st.just("remove"), st.integers(0, 3), st.just(0)),
            st.tuples(st.just("restore"), st.integers(0, 3), st.integers(0, 40)),
        ),
        max_size=80,
    ),
    idle=st.sampled_from([None, 4, 20]),
)
def test_the_fast_path_emits_what_the_full_path_does(
    policy: Any, parts: int, steps: list[tuple[str, int, int]], idle: int | None
) -> None:
    """Policies with a threshold, throttled ones, one that moves with the clock and
    one without a threshold at all; idle timeouts, a clock that also goes back,
    partitions added, removed and restored: every step's output, the partitions'
    watermarks and the last one emitted match the full path's."""
    clock = Clock()
    _SHARED_CLOCK.now = 0
    fast = EventTimeMapper(policy, timestamp_fn=int, idle_timeout_ms=idle, clock=clock)
    slow = _SlowPathMapper(policy, timestamp_fn=int, idle_timeout_ms=idle, clock=clock)
    for m in (fast, slow):
        m.add_partitions(parts)
    for kind, a, b in steps:
        n = fast.partition_count
        if kind == "tick":
            clock.now += a
            _SHARED_CLOCK.now = clock.now
        elif kind == "idle":
            assert fast.flat_map_idle() == slow.flat_map_idle()
        elif kind == "add":
            fast.add_partitions(1)
            slow.add_partitions(1)
        elif kind == "remove" and n:
            assert fast.remove_partition(a % n) == slow.remove_partition(a % n)
        elif kind == "restore" and n:
            fast.restore_watermark(a % n, b)
            slow.restore_watermark(a % n, b)
        elif kind == "ev" and n:
            now = clock.now if a % 2 else None
            assert fast.observe_event(a % n, b, now) == slow.observe_event(a % n, b, now)
        assert fast.partition_count == slow.partition_count
        assert [fast.watermark(i) for i in range(fast.partition_count)] == [
            slow.watermark(i) for i in range(slow.partition_count)
        ]
        assert fast.last_emitted == slow.last_emitted
