"""A small never-ending streaming DAG for the dashboard and CLI tests: wall-clock event
times (so watermark lag is meaningful) and every 10th item a minute old, so the window
vertex drops late items. Test modules import it by its plain name."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def


def event(seq: int) -> tuple[int, int]:
    now = int(time.time() * 1000)
    return (now - 60_000 if seq % 10 == 9 else now, seq)


#: The vertex names of :func:`streaming_dag` with ``long_names``: as long as a real job's
#: (the dashboard must fit them at 1280 px without a horizontal scrollbar).
LONG_NAMES = {
    "events": "read-trades-from-kafka",
    "timestamps": "parse-and-timestamp-trades",
    "count-per-window": "count-trades-per-symbol-window",
    "sink": "write-counts-to-postgres",
}


def streaming_dag(rate: float = 400.0, long_names: bool = False) -> DAG:
    def name(short: str) -> str:
        return LONG_NAMES[short] if long_names else short

    dag = DAG()
    src = dag.new_vertex(name("events"), sources.generator(event, rate)).local_parallelism(1)
    wm = dag.new_vertex(
        name("timestamps"), P.insert_watermarks(lambda e: e[0], lambda: with_fixed_lag(50))
    ).local_parallelism(1)
    win = dag.new_vertex(
        name("count-per-window"),
        P.aggregate_to_sliding_window(
            key_fn=lambda e: e[1] % 4,
            timestamp_fn=lambda e: e[0],
            window_def=tumbling_window_def(100),
            agg_op=counting(),
        ),
    ).local_parallelism(2)
    out = dag.new_vertex(name("sink"), sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(src, wm))
    dag.edge(Edge.between(wm, win).partitioned(lambda e: e[1] % 4))
    dag.edge(Edge.between(win, out))
    return dag


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def wait_for(cond: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy (generous deadline: loaded CI)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last value {last!r}")


def member_pipeline(rate: float = 2000.0) -> Any:
    """A never-ending job for ``processes=2``: a rate-limited generator, a keyed running
    count behind a distributed edge (items cross between the member processes), a sink."""
    import slipstream as ss

    p = ss.Pipeline()
    (
        p.read_from(sources.generator(_seq, rate))
        .group_by(_mod7)
        .rolling_aggregate(counting())
        .write_to(sinks.noop())
    )
    return p


def _seq(seq: int) -> int:
    return seq


def _mod7(x: int) -> int:
    return x % 7
