"""Restore routes a snapshot's keyed entries as a live item with that key is routed
(issue 22, item 0): a restored entry lands on the processor that the items of its key
reach through the job's real collectors, at another parallelism and member count, with
the default and a custom partitioner."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge
from slipstream.core.config import JobConfig, ProcessingGuarantee
from slipstream.core.partition import DEFAULT_PARTITION_COUNT, key_routing
from slipstream.execution.plan import build_vertex_plans, wire
from slipstream.state.keys import BroadcastKey, KeyedStateKey
from slipstream.state.restore import custom_partitioners, restore_plan
from slipstream.state.store import SnapshotData, VertexState

KEYS: list[Any] = [f"user-{i}" for i in range(150)] + list(range(100)) + [("t", 1), 2.5, None]


class Idle(ss.AbstractProcessor):
    """A processor that is only planned, never run."""


def by_length(key: Any, count: int) -> int:
    """A custom partitioner unlike the default: by the length of the key's text."""
    return (len(repr(key)) * 37) % count


def keyed_dag(partitioner: Any, lp: int) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", Idle).local_parallelism(2)
    keyed = dag.new_vertex("counts", Idle).local_parallelism(lp)
    dag.edge(Edge.between(src, keyed).partitioned(itemgetter(0), partitioner).distributed())
    return dag


def live_owners(dag: DAG, members: int, lp: int) -> dict[Any, int]:
    """Which processor of 'counts' each key reaches, sent by every source processor
    (on every member) through the collectors the engines build."""
    plans = build_vertex_plans(dag, JobConfig(), members, lp, None, "routing")
    specs = wire(dag, plans, ProcessingGuarantee.NONE)
    for spec in specs:
        if spec.vertex.vertex.name == "source":
            collector = spec.outbound[0]
            collector.add_chunk([(k, spec.global_index) for k in KEYS])
            assert collector.flush()
    owners: dict[Any, int] = {}
    for spec in specs:
        if spec.vertex.vertex.name != "counts":
            continue
        for queue in spec.inbound[0].queues:
            for chunk in queue.entries:
                for key, _producer in chunk:
                    assert owners.setdefault(key, spec.global_index) == spec.global_index, key
    assert sorted(map(repr, owners)) == sorted(map(repr, KEYS))
    return owners


@pytest.mark.parametrize("partitioner", [None, by_length], ids=["default", "custom"])
@pytest.mark.parametrize(
    ("saved", "members", "lp"),
    [((1, 4), 2, 1), ((1, 1), 2, 3), ((2, 3), 2, 3), ((2, 3), 1, 2), ((2, 2), 2, 4)],
    ids=["1x4->2x1", "1x1->2x3", "2x3->2x3", "2x3->1x2", "2x2->2x4"],
)
def test_a_restored_keyed_entry_lands_where_a_live_item_with_its_key_goes(
    partitioner: Any, saved: tuple[int, int], members: int, lp: int
) -> None:
    dag = keyed_dag(partitioner, lp)
    owners = live_owners(dag, members, lp)
    spread = len(set(owners.values()))
    assert spread == members * lp if partitioner is None else spread > 1

    # a snapshot taken at another shape: the keys spread over its processors anyhow
    saved_total = saved[0] * saved[1]
    vs = VertexState(saved_total)
    for i, key in enumerate(KEYS):
        vs.entries.setdefault(i % saved_total, []).append((KeyedStateKey(key, "count"), i))
    vs.entries[0].append((BroadcastKey("config"), "shared"))
    data = SnapshotData(5, "routing", {"counts": vs})
    plans = build_vertex_plans(dag, JobConfig(), members, lp, None, "routing")
    routed, completed = restore_plan(data, plans, custom_partitioners(dag))

    assert completed == set()
    restored: dict[Any, int] = {}
    for (vertex, g), entries in routed.items():
        assert vertex in ("source", "counts")
        if vertex == "source":
            assert entries == []
            continue
        assert (BroadcastKey("config"), "shared") in entries
        for k, _value in entries:
            if isinstance(k, KeyedStateKey):
                assert k.key not in restored
                restored[k.key] = g
    assert restored == owners


def test_key_routing_is_the_partition_table_and_the_partitioner() -> None:
    routing = key_routing(None, 2, 3)
    assert routing.partition_count == DEFAULT_PARTITION_COUNT
    # partitions are owned by member p % 2 and dealt round robin to its 3 processors
    assert routing.table[:6] == [0, 3, 1, 4, 2, 5]
    custom = key_routing(by_length, 2, 3)
    assert custom.owner("abc") == custom.table[by_length("abc", DEFAULT_PARTITION_COUNT)]
    local = key_routing(None, 2, 3, distributed=False, member_index=1)
    assert set(local.table) == {3, 4, 5}  # a member-local edge: the member's own processors
