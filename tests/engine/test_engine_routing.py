"""Routing, locality, parallelism and priority on the embedded engine."""

from __future__ import annotations

import functools
import threading
from collections import Counter, defaultdict
from typing import Any

import pytest
from engine_test_procs import Collect, ListSource, Tagger

import slipstream as ss
from slipstream import DAG, Edge
from slipstream.core.items import Watermark
from slipstream.core.partition import default_partitioner
from slipstream.execution.queues import CrossMemberQueue, SpscQueue


def run(dag: DAG, members: int = 1, threads: int = 2) -> ss.LocalEngine:
    engine = ss.local(cooperative_threads=threads, members=members)
    engine.new_job(dag).join(timeout=30)
    return engine


def chain(routing, data, src_lp=2, tag_lp=3, members=1, distributed=False):
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, data)).local_parallelism(src_lp)
    t = dag.new_vertex("tag", Tagger).local_parallelism(tag_lp)
    c = dag.new_vertex("sink", functools.partial(Collect, "out")).local_parallelism(1)
    e = routing(Edge.between(s, t))
    if distributed:
        e.distributed()
    dag.edge(e).edge(Edge.between(t, c).distributed().all_to_one())
    engine = run(dag, members=members)
    return [item for (_g, _o, item) in engine.get_list("out")]


@pytest.mark.parametrize("members", [1, 2])
def test_unicast_delivers_each_item_once(members: int) -> None:
    data = list(range(5000))
    out = chain(lambda e: e, data, members=members)
    assert sorted(x[3] for x in out) == data


@pytest.mark.parametrize("members,distributed", [(1, False), (2, False), (2, True)])
def test_partitioned_sends_equal_keys_to_one_processor(members: int, distributed: bool) -> None:
    data = [i % 37 for i in range(3000)]
    out = chain(lambda e: e.partitioned(lambda x: x), data, members=members, distributed=distributed)
    assert Counter(x[3] for x in out) == Counter(data)
    # a local edge partitions within each member, a distributed one across the cluster
    owner: dict[tuple[int, int], set[int]] = defaultdict(set)
    for g, m, _o, item in out:
        owner[(m if not distributed else 0, item)].add(g)
    assert all(len(v) == 1 for v in owner.values())
    from slipstream.core.partition import partition_table

    for (m, key), gs in owner.items():
        table = partition_table(271, members, 3, distributed, m)
        assert gs == {table[default_partitioner(key, 271)]}


def test_member_local_edge_keeps_items_on_their_member() -> None:
    data = list(range(2000))
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, data)).local_parallelism(2)
    t = dag.new_vertex("tag", Tagger).local_parallelism(2)
    c = dag.new_vertex("sink", functools.partial(Collect, "out")).local_parallelism(1)
    dag.edge(Edge.between(s, t)).edge(Edge.between(t, c).distributed().all_to_one())
    engine = run(dag, members=2)
    out = [item for (_g, _o, item) in engine.get_list("out")]
    assert sorted(x[3] for x in out) == data
    # source processor g (member g // 2) got data[g::4]; its items must stay on that member
    for _g, member, _o, item in out:
        assert (item % 4) // 2 == member


def test_distributed_unicast_crosses_members() -> None:
    data = list(range(4000))
    out = chain(lambda e: e, data, src_lp=1, tag_lp=2, members=2, distributed=True)
    members_seen = {m for (_g, m, _o, item) in out if item % 2 == 0}
    assert members_seen == {0, 1}  # items of source on member 0 reach member 1 too


def test_broadcast_gives_every_consumer_every_item() -> None:
    data = list(range(300))
    out = chain(lambda e: e.broadcast(), data, tag_lp=3)
    per = defaultdict(list)
    for g, _m, _o, item in out:
        per[g].append(item)
    assert set(per) == {0, 1, 2}
    assert all(sorted(v) == data for v in per.values())


def test_isolated_edge_pairs_processors() -> None:
    data = list(range(600))
    out = chain(lambda e: e.isolated(), data, src_lp=3, tag_lp=3)
    for g, _m, _o, item in out:
        assert item % 3 == g


def test_all_to_one_uses_one_consumer() -> None:
    out = chain(lambda e: e.all_to_one(), list(range(500)), tag_lp=4)
    assert {g for (g, _m, _o, _i) in out} and len({g for (g, _m, _o, _i) in out}) == 1


def test_priority_edge_is_drained_first() -> None:
    dag = DAG()
    a = dag.new_vertex("build", functools.partial(ListSource, list(range(3000)))).local_parallelism(2)
    b = dag.new_vertex("probe", functools.partial(ListSource, list(range(3000)))).local_parallelism(2)
    c = dag.new_vertex("join", functools.partial(Collect, "out")).local_parallelism(1)
    dag.edge(Edge.from_(a).to(c, 0).priority(-1)).edge(Edge.from_(b).to(c, 1))
    engine = run(dag)
    ordinals = [o for (_g, o, _i) in engine.get_list("out")]
    assert ordinals == [0] * 3000 + [1] * 3000


def _diamond(lower_path: Any) -> DAG:
    """``src`` feeds ``join`` at priority -1 directly and at priority 0 through
    ``lower_path``; 5,000 items, queues of 16."""
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, list(range(5000)))).local_parallelism(1)
    mid = dag.new_vertex("mid", lower_path).local_parallelism(1)
    j = dag.new_vertex("join", functools.partial(Collect, "out")).local_parallelism(1)
    dag.edge(Edge.from_(s, 0).to(j, 0).priority(-1).queue_size(16))
    dag.edge(Edge.from_(s, 1).to(mid).queue_size(16))
    dag.edge(Edge.from_(mid).to(j, 1).queue_size(16))
    return dag


def test_priority_diamond_is_refused_at_new_job() -> None:
    """On main new_job warned and started the job, which hung for good once the 16-item
    queues of the lower-priority path filled."""
    with pytest.raises(ss.DagError, match=r"^vertex 'join' can hang \(a priority diamond\)"):
        ss.local().new_job(_diamond(ss.processors.map(abs)))


def test_priority_diamond_through_a_buffering_vertex_runs() -> None:
    engine = run(_diamond(ss.processors.sort(reverse=True)))
    assert [(o, i) for (_g, o, i) in engine.get_list("out")] == [
        (0, i) for i in range(5000)
    ] + [(1, i) for i in reversed(range(5000))]


def test_multiple_outbound_ordinals_and_offer_to_all() -> None:
    dag = DAG()
    s = dag.new_vertex("src", functools.partial(ListSource, list(range(100)))).local_parallelism(1)
    c0 = dag.new_vertex("c0", functools.partial(Collect, "a"))
    c1 = dag.new_vertex("c1", functools.partial(Collect, "b"))
    dag.edge(Edge.from_(s, 0).to(c0)).edge(Edge.from_(s, 1).to(c1))
    engine = run(dag)
    assert sorted(i for (_g, _o, i) in engine.get_list("a")) == list(range(100))
    assert sorted(i for (_g, _o, i) in engine.get_list("b")) == list(range(100))


def test_default_parallelism_is_cooperative_thread_count() -> None:
    seen = []

    class Probe(ss.AbstractProcessor):
        def init_processor(self, context: ss.Context) -> None:
            seen.append((context.local_parallelism, context.total_parallelism))

    dag = DAG()
    dag.new_vertex("p", Probe)
    ss.local(cooperative_threads=3, members=2).new_job(dag).join(10)
    assert seen == [(3, 6)] * 6


def test_meta_supplier_sees_every_member() -> None:
    from slipstream.core.suppliers import FactorySupplier, ProcessorMetaSupplier

    calls: list = []

    class Meta(ProcessorMetaSupplier):
        def get(self, addresses):
            calls.append(list(addresses))
            return lambda address: FactorySupplier(
                functools.partial(ListSource, [str(address)] * 2)
            )

    dag = DAG()
    s = dag.new_vertex("src", Meta()).local_parallelism(1)
    c = dag.new_vertex("sink", functools.partial(Collect, "out")).local_parallelism(1)
    dag.edge(Edge.between(s, c).distributed().all_to_one())
    engine = run(dag, members=3)
    assert len(calls) == 1 and len(calls[0]) == 3
    assert len(engine.get_list("out")) == 2  # 3 processors split each list of 2 by global index


class _EmitsLocks(ss.AbstractProcessor):
    """Processor 0 emits items that hold a lock (they cannot be pickled)."""

    def init_processor(self, context: ss.Context) -> None:
        mine = context.global_processor_index == 0
        self._it = iter([(n, threading.Lock()) for n in range(3)] if mine else [])

    def complete(self) -> bool:
        return self.emit_from(self._it)


def _lock_dag(distributed: bool) -> DAG:
    dag = DAG()
    src = dag.new_vertex("maker", _EmitsLocks).local_parallelism(1)
    out = dag.new_vertex("sink", functools.partial(Collect, "out")).local_parallelism(1)
    e = Edge.between(src, out).broadcast()
    dag.edge(e.distributed() if distributed else e)
    return dag


def test_an_unpicklable_item_between_members_fails_as_on_spark() -> None:
    """On main the job completed here, and the same DAG failed on Spark."""
    job = ss.local(members=2).new_job(_lock_dag(True), ss.JobConfig(name="locks"))
    with pytest.raises(ss.JobFailedError) as info:
        job.join(30)
    assert info.value.args[0] == (
        "job 'locks' failed: vertex 'maker', processor 0: PicklingError: edge 'maker' -> "
        "'sink' (ordinal 0), processor 0 (member 0) -> 1 (member 1): an item of type tuple "
        "cannot be pickled (TypeError: cannot pickle '_thread.lock' object); items that "
        "travel between members (distributed edges) must pickle, as between Spark tasks "
        "(ss.local(members=...) checks the first item between each two processors)"
    )
    assert info.value.vertex == "maker" and info.value.processor_index == 0


@pytest.mark.parametrize("members,distributed", [(2, False), (1, True)])
def test_unpicklable_items_that_stay_on_their_member_are_fine(
    members: int, distributed: bool
) -> None:
    engine = run(_lock_dag(distributed), members=members)
    assert sorted(n for (_g, _o, (n, _lock)) in engine.get_list("out")) == [0, 1, 2]


def test_a_cross_member_queue_checks_its_first_item_only() -> None:
    q = CrossMemberQueue(4, "edge 'a' -> 'b' (ordinal 0), processor 0 (member 0) -> 1 (member 1)")
    assert q.offer(Watermark(5), 1)  # special items are not data: not checked
    assert type(q) is CrossMemberQueue
    assert q.offer([1, threading.Lock()], 2)  # the first item pickles
    assert type(q) is SpscQueue  # checked: the plain queue from now on
    assert q.offer([threading.Lock()], 1)
    assert list(q.entries)[0] == Watermark(5) and q.size() == 4
