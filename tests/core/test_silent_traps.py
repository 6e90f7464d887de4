"""DAGs that used to run and give silently wrong (or no) results are rejected or warned
about at ``new_job``, on both engines (the checks live in ``DAG.validate``):

* a keyed processor with global parallelism > 1 fed by an edge that does not send each
  key to one processor (unless the edge opts out with ``allow_unpartitioned()``);
* a sink vertex with an outbound edge;
* a windowing vertex with no watermark source upstream (a warning);
and metrics keys exist from the start.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, DagError, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.core.dag import DagWarning
from slipstream.pipeline.keyed import map_stateful
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def

WD = tumbling_window_def(10)


def ts_of(x: tuple[str, int]) -> int:
    return x[1]


def key_of(x: tuple[str, int]) -> str:
    return x[0]


KEYED: dict[str, Callable[[], Any]] = {
    "aggregate_by_key": lambda: P.aggregate_by_key(key_of, counting()),
    "combine_by_key": lambda: P.combine_by_key(counting()),
    "aggregate_to_sliding_window": lambda: P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of, window_def=WD, agg_op=counting()
    ),
    "combine_to_sliding_window": lambda: P.combine_to_sliding_window(
        window_def=WD, agg_op=counting()
    ),
    "aggregate_to_session_window": lambda: P.aggregate_to_session_window(
        key_fn=key_of, timestamp_fn=ts_of, session_timeout=5, agg_op=counting()
    ),
    "map_stateful (pipeline)": lambda: map_stateful(key_of, list, lambda s, k, x: x),
}


def keyed_dag(
    make: Callable[[], Any], route: Callable[[Edge], Edge], lp: int = 2
) -> tuple[DAG, Edge]:
    dag = DAG()
    src = dag.new_vertex("src", sources.items([("a", 1)] * 10))
    wm = dag.new_vertex("wm", P.insert_watermarks(ts_of, lambda: with_fixed_lag(0)))
    agg = dag.new_vertex("agg", make()).local_parallelism(lp)
    out = dag.new_vertex("out", sinks.list_sink("out"))
    dag.edge(Edge.between(src, wm))
    edge = route(Edge.between(wm, agg))
    dag.edge(edge).edge(Edge.between(agg, out))
    return dag, edge


@pytest.mark.parametrize("kind", sorted(KEYED))
@pytest.mark.parametrize(
    "route", ["unicast", "broadcast", "isolated"], ids=["unicast", "broadcast", "isolated"]
)
def test_keyed_vertex_fed_by_unpartitioned_edge_is_rejected(kind: str, route: str) -> None:
    dag, _ = keyed_dag(KEYED[kind], lambda e: getattr(e, route)())
    with pytest.raises(DagError, match=r"edge 'wm'\[0\] -> 'agg'\[0\]: .*keeps state per key"):
        ss.local(cooperative_threads=2).new_job(dag)


def test_keyed_check_counts_global_parallelism() -> None:
    # one processor, one member: any routing is fine
    dag, _ = keyed_dag(KEYED["aggregate_by_key"], lambda e: e, lp=1)
    ss.local().new_job(dag).join(30)
    # a member-local partitioned edge on 2 members splits a key over the members
    dag, _ = keyed_dag(KEYED["aggregate_by_key"], lambda e: e.partitioned(key_of), lp=1)
    with pytest.raises(DagError, match="member-local"):
        ss.local(members=2).new_job(dag)
    dag, _ = keyed_dag(
        KEYED["aggregate_by_key"], lambda e: e.partitioned(key_of).distributed(), lp=1
    )
    engine = ss.local(members=2)
    engine.new_job(dag).join(30)
    assert engine.get_list("out") == [("a", 10)]
    # all-to-one sends everything to one processor: correct
    dag, _ = keyed_dag(KEYED["aggregate_by_key"], lambda e: e.all_to_one(), lp=2)
    engine = ss.local()
    engine.new_job(dag).join(30)
    assert engine.get_list("out") == [("a", 10)]


def test_explicit_opt_out_runs_and_gives_per_processor_results() -> None:
    dag, _ = keyed_dag(KEYED["aggregate_by_key"], lambda e: e.allow_unpartitioned(), lp=2)
    engine = ss.local(cooperative_threads=2)
    engine.new_job(dag).join(30)
    got = engine.get_list("out")
    assert sum(v for _, v in got) == 10 and {k for k, _ in got} == {"a"}


def test_sink_with_outbound_edge_is_rejected() -> None:
    dag = DAG()
    src = dag.new_vertex("src", sources.items([1, 2]))
    sink = dag.new_vertex("sink", sinks.list_sink("l"))
    after = dag.new_vertex("after", sinks.noop())
    dag.edge(Edge.between(src, sink)).edge(Edge.between(sink, after))
    with pytest.raises(
        DagError, match=r"edge 'sink'\[0\] -> 'after'\[0\]: vertex 'sink' is a sink"
    ):
        ss.local().new_job(dag)


def window_dag(with_watermarks: bool) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items([("a", 1), ("a", 2)]))
    win = dag.new_vertex("win", KEYED["aggregate_to_sliding_window"]()).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("w"))
    if with_watermarks:
        wm = dag.new_vertex("wm", P.insert_watermarks(ts_of, lambda: with_fixed_lag(0)))
        dag.edge(Edge.between(src, wm)).edge(Edge.between(wm, win))
    else:
        dag.edge(Edge.between(src, win))
    dag.edge(Edge.between(win, out))
    return dag


def test_window_without_watermark_source_upstream_warns() -> None:
    with pytest.warns(
        DagWarning, match=r"vertex 'win' emits windows on watermarks, but no vertex upstream"
    ):
        ss.local().new_job(window_dag(False)).join(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DagWarning)
        ss.local().new_job(window_dag(True)).join(30)


class CustomSource(ss.AbstractProcessor):
    """Might emit watermarks itself: no warning for what the check cannot know."""

    def complete(self) -> bool:
        return self.try_emit(ss.Watermark(100))


def test_custom_upstream_processor_is_given_the_benefit_of_the_doubt() -> None:
    dag = DAG()
    src = dag.new_vertex("src", CustomSource)
    win = dag.new_vertex("win", KEYED["aggregate_to_sliding_window"]()).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("w"))
    dag.edge(Edge.between(src, win)).edge(Edge.between(win, out))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DagWarning)
        ss.local().new_job(dag).join(30)


def test_metrics_keys_exist_from_the_start() -> None:
    job = ss.local().new_job(window_dag(True))
    job.join(30)
    assert job.metrics["win"]["late_items_dropped"] == 0


def test_kafka_source_with_a_policy_counts_as_a_watermark_source() -> None:
    """A Kafka source given a watermark policy emits watermarks itself (no warning);
    without one, a window behind it would never see a watermark (warning)."""
    conf = {"bootstrap.servers": "127.0.0.1:9"}  # never contacted: validation only

    def dag_over(source: ss.ProcessorSupplier) -> DAG:
        dag = DAG()
        src = dag.new_vertex("src", source)
        win = dag.new_vertex("win", KEYED["aggregate_to_sliding_window"]()).local_parallelism(1)
        out = dag.new_vertex("out", sinks.list_sink("w"))
        dag.edge(Edge.between(src, win)).edge(Edge.between(win, out))
        return dag

    with warnings.catch_warnings():
        warnings.simplefilter("error", DagWarning)
        dag_over(sources.kafka("t", conf, policy=lambda: with_fixed_lag(0))).validate(1)
    with pytest.warns(DagWarning, match="vertex 'win' emits windows on watermarks"):
        dag_over(sources.kafka("t", conf)).validate(1)
