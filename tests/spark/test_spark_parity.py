"""The Jet-parity processors on the Spark engine: service calls (synchronous and
async), P.sort and batch co-grouping give the embedded engine's results."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import co_aggregate, counting, summing

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def make_service(context: Any) -> dict[str, int]:
    return {"factor": 3}


async def triple(service: dict[str, int], x: int) -> int:
    await asyncio.sleep(0)
    return x * service["factor"]


def is_odd(service: dict[str, int], x: int) -> bool:
    return x % 2 == 1


def mod5(x: Any) -> int:
    return x % 5


def first_mod5(x: Any) -> int:
    return x[0] % 5


def second(x: Any) -> int:
    return x[1]


def services_and_sort() -> DAG:
    factory = P.service_factory(make_service)
    dag = DAG()
    src = dag.new_vertex("src", sources.items(list(range(300))))
    f = dag.new_vertex("odd", P.filter_using_service(factory, is_odd))
    m = dag.new_vertex("triple", P.map_using_service_async(factory, triple, max_concurrent=8))
    srt = dag.new_vertex("sort", P.sort(reverse=True)).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, f)).edge(Edge.between(f, m))
    dag.edge(Edge.between(m, srt).distributed().all_to_one()).edge(Edge.between(srt, out))
    return dag


def co_group() -> DAG:
    op = co_aggregate(counting(), summing(second))
    dag = DAG()
    a = dag.new_vertex("a", sources.items(list(range(100))))
    b = dag.new_vertex("b", sources.items([(i, i) for i in range(60)]))
    g = dag.new_vertex("group", P.aggregate_by_key([mod5, first_mod5], op))
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.from_(a).to(g, 0).distributed().partitioned(mod5))
    dag.edge(Edge.from_(b).to(g, 1).distributed().partitioned(first_mod5))
    dag.edge(Edge.between(g, out))
    return dag


@pytest.mark.parametrize("members", [1, 2])
def test_services_sort_and_co_group_match_the_embedded_engine(spark_session: Any, members: int) -> None:
    expected_sorted = sorted((3 * x for x in range(300) if x % 2), reverse=True)
    expected_groups = sorted(
        (k, (20, sum(i for i in range(60) if i % 5 == k))) for k in range(5)
    )
    for build, check in (
        (services_and_sort, lambda got: got == expected_sorted),
        (co_group, lambda got: sorted(got) == expected_groups),
    ):
        local = ss.local(members=members)
        local.new_job(build()).join(60)
        spark = ss.spark(spark_session, members=members, local_parallelism=2)
        spark.new_job(build()).join(180)
        assert check(list(local.get_list("out"))), build.__name__
        assert check(list(spark.get_list("out"))), build.__name__
