"""The DAG checks of ``DAG.validate`` (keyed vertex fed unpartitioned, sink with an
outbound edge, window without watermarks) apply on the Spark engine as on the embedded
one: the same DAG is rejected at ``new_job`` by both."""

from __future__ import annotations

from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, DagError, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.core.dag import DagWarning
from slipstream.window import tumbling_window_def

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def first(x: Any) -> Any:
    return x[0]


def keyed(route: str) -> DAG:
    dag = DAG()
    src = dag.new_vertex("src", sources.items([("a", 1)] * 1000))
    agg = dag.new_vertex("agg", P.aggregate_by_key(first, counting()))
    out = dag.new_vertex("out", sinks.list_sink("out"))
    e = Edge.between(src, agg)
    e = (
        e.allow_unpartitioned()
        if route == "opt-out"
        else e.partitioned(first)
        if route == "ok"
        else e
    )
    dag.edge(e).edge(Edge.between(agg, out))
    return dag


def test_both_engines_reject_and_accept_the_same_dags(spark_session: Any) -> None:
    engines = {
        "local": ss.local(cooperative_threads=2),
        "spark": ss.spark(spark_session, local_parallelism=2),
    }
    for name, engine in engines.items():
        with pytest.raises(DagError, match=r"edge 'src'\[0\] -> 'agg'\[0\]: .*keeps state"):
            engine.new_job(keyed("unicast"))
        engine.new_job(keyed("ok")).join(180)
        assert engine.get_list("out") == [("a", 1000)], name
        engine.new_job(keyed("opt-out")).join(180)
        dag = DAG()
        s = dag.new_vertex("s", sources.items([1]))
        k = dag.new_vertex("k", sinks.list_sink("x"))
        n = dag.new_vertex("n", sinks.noop())
        dag.edge(Edge.between(s, k)).edge(Edge.between(k, n))
        with pytest.raises(DagError, match="'k' is a sink"):
            engine.new_job(dag)
        dag = DAG()
        s = dag.new_vertex("s", sources.items([("a", 1)]))
        w = dag.new_vertex(
            "w",
            P.aggregate_to_sliding_window(
                key_fn=first,
                timestamp_fn=lambda x: x[1],
                window_def=tumbling_window_def(10),
                agg_op=counting(),
            ),
        ).local_parallelism(1)
        k = dag.new_vertex("k", sinks.list_sink("w"))
        dag.edge(Edge.between(s, w)).edge(Edge.between(w, k))
        with pytest.warns(DagWarning, match="no vertex upstream of it creates watermarks"):
            engine.new_job(dag).join(180)
