"""P.sort (Jet's sortP): sorted output of a bounded input, through the harness
(snapshot and restore at every point) and the engine."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.testing import verify_processor


def neg(x: int) -> int:
    return -x


def second(x: tuple[Any, Any]) -> Any:
    return x[1]


@settings(max_examples=30, deadline=None)
@given(items=st.lists(st.integers(-50, 50), max_size=30))
def test_sorts_like_sorted_in_every_harness_mode(items: list[int]) -> None:
    verify_processor(P.sort()).input(items).expect_output(sorted(items))
    verify_processor(P.sort(neg)).input(items).expect_output(sorted(items, key=neg))


def test_stable_and_reverse() -> None:
    items = [("a", 2), ("b", 1), ("c", 2), ("d", 1)]
    verify_processor(P.sort(second)).input(items).expect_output(sorted(items, key=second))
    verify_processor(P.sort(second, reverse=True)).input(items).expect_output(
        sorted(items, key=second, reverse=True)
    )


def test_two_inputs_are_sorted_together() -> None:
    verify_processor(P.sort()).inputs([[5, 1], [3, 2]]).expect_output([1, 2, 3, 5])


def test_engine_global_sort_behind_all_to_one() -> None:
    data = [(i * 7919) % 1000 for i in range(1000)]
    dag = DAG()
    src = dag.new_vertex("src", sources.items(data))
    srt = dag.new_vertex("sort", P.sort()).local_parallelism(1)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, srt).distributed().all_to_one()).edge(Edge.between(srt, out))
    engine = ss.local(members=2)
    engine.new_job(dag).join(30)
    assert engine.get_list("out") == sorted(data)


def test_restore_into_other_parallelism_keeps_every_item() -> None:
    """Saved chunks are dealt out over the processors of the restored job."""
    from slipstream.core.inbox import Inbox
    from slipstream.core.outbox import Outbox
    from slipstream.core.processor import Context

    saved: list[Any] = []
    for g in range(3):
        p = P.sort()()
        ob = Outbox(1, 10)
        p.init(ob, Context(global_processor_index=g, total_parallelism=3))
        p.process(0, Inbox(range(g * 10, g * 10 + 5)))
        assert p.save_to_snapshot()
        saved.extend(ob.snapshot_bucket)
    restored: list[int] = []
    for g in range(2):
        p = P.sort()()
        ob = Outbox(1, 100)
        p.init(ob, Context(global_processor_index=g, total_parallelism=2))
        p.restore_from_snapshot(Inbox(saved))
        assert p.finish_snapshot_restore() and p.complete()
        restored.extend(ob.buckets[0])
    assert sorted(restored) == sorted(x for g in range(3) for x in range(g * 10, g * 10 + 5))


def test_unorderable_items_fail_naming_the_vertex() -> None:
    with pytest.raises(TypeError, match="sort \\(vertex .*\\): cannot order the items"):
        verify_processor(P.sort()).input([1, "a"]).expect_output([])
    with pytest.raises(TypeError, match="key_fn must be callable"):
        P.sort(3)  # type: ignore[arg-type]


def test_supplier_pickles() -> None:
    import cloudpickle

    assert isinstance(cloudpickle.loads(cloudpickle.dumps(P.sort(functools.partial(max, 0))))(), P.sort().func)
