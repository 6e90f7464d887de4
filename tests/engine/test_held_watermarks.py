"""Watermarks a processor would only forward (below its ``min_relevant_watermark()``)
do not stop the inbound drain; while items keep coming the latest one is held and it is
delivered at a lull or before any other special item, so nothing is lost or reordered
against idle marks, barriers and the end of the stream."""

from __future__ import annotations

from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import summing
from slipstream.core.inbox import Inbox
from slipstream.core.items import DONE_ITEM, IDLE_MESSAGE, NO_WATERMARK, SnapshotBarrier, Watermark
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import SpscQueue
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def


def stream_of(*entries: Any) -> tuple[InboundEdgeStream, SpscQueue]:
    q = SpscQueue(1 << 20)
    for e in entries:
        q.offer(e, len(e) if type(e) is list else 1)
    return InboundEdgeStream(0, 0, [q]), q


def drain(s: InboundEdgeStream, relevant: int) -> tuple[bool, list[Any], Any]:
    inbox = Inbox()
    progress = s.drain_to(inbox, relevant)
    return progress, list(inbox), s.wm_out


def test_watermarks_below_the_relevant_one_are_held_while_items_flow() -> None:
    s, q = stream_of([1, 2], Watermark(5), [3], Watermark(7), [4])
    assert drain(s, 10) == (True, [1, 2, 3, 4], None)
    # a lull: the latest held watermark is reported
    assert drain(s, 10) == (True, [], 7)
    assert drain(s, 10) == (False, [], None)


def test_a_relevant_watermark_stops_the_drain_and_replaces_the_held_one() -> None:
    s, q = stream_of([1], Watermark(5), [2], Watermark(12), [3])
    assert drain(s, 10) == (True, [1, 2], 12)
    assert drain(s, 13) == (True, [3], None)


def test_the_held_watermark_goes_before_idle_barrier_and_end() -> None:
    for special in (IDLE_MESSAGE, SnapshotBarrier(1), DONE_ITEM):
        # skipped in the same drain: reported there, the special waits for the next
        s, q = stream_of([1], Watermark(5), special)
        assert drain(s, 10) == (True, [1], 5)
        check_special(s, special)
        # held from an earlier drain: reported before the special is taken
        s, q = stream_of([1], Watermark(5), [2])
        assert drain(s, 10) == (True, [1, 2], None)
        q.offer(special, 1)
        assert drain(s, 10) == (True, [], 5)
        check_special(s, special)


def check_special(s: InboundEdgeStream, special: Any) -> None:
    progress, items, wm = drain(s, 10)
    assert progress and items == []
    if special is IDLE_MESSAGE:
        assert wm is IDLE_MESSAGE
    elif special is DONE_ITEM:
        assert s.done and wm is None
    else:
        assert s.barrier_out == special and wm is None


def test_default_threshold_stops_at_every_watermark() -> None:
    s, q = stream_of([1], Watermark(5), [2])
    assert drain(s, NO_WATERMARK) == (True, [1], 5)


def test_unthrottled_window_job_equals_the_throttled_one() -> None:
    """End to end: a watermark per input chunk (unthrottled policy) through a window
    gives the results of the throttled job, also with late items."""
    events = [(i % 7, 1000 + i * 3 - (i * 37) % 250, 1) for i in range(20_000)]
    wd = tumbling_window_def(100)

    def run(throttle: bool) -> list[Any]:
        def policy() -> Any:
            p = with_fixed_lag(100)
            return p.throttle_by_frame(wd) if throttle else p

        dag = DAG()
        src = dag.new_vertex("src", sources.items(events))
        wms = dag.new_vertex("wms", P.insert_watermarks(lambda e: e[1], policy))
        win = dag.new_vertex(
            "win",
            P.aggregate_to_sliding_window(
                key_fn=lambda e: e[0],
                timestamp_fn=lambda e: e[1],
                window_def=wd,
                agg_op=summing(lambda e: e[2]),
            ),
        )
        out = dag.new_vertex("out", sinks.list_sink("out"))
        dag.edge(Edge.between(src, wms).isolated())
        dag.edge(Edge.between(wms, win).distributed().partitioned(lambda e: e[0]))
        dag.edge(Edge.between(win, out))
        engine = ss.local()
        # watermarks flow although the source is bounded (a batch job holds them)
        job = engine.new_job(dag, ss.JobConfig(batch_watermarks=True))
        job.join()
        late = job.metrics["win"]["late_items_dropped"]
        return sorted(engine.get_list("out")) + [("late", late)]

    throttled = run(True)
    assert throttled[-1][1] > 0  # the data has late items
    assert run(False) == throttled
