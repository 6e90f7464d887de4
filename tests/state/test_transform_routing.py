"""Where ``ss.state.transform`` puts a renamed key (issue 25, item 5): on the processor a
restore gives it. With the job's DAG (``dag=``) that is the vertex's own edge
partitioner; and whatever the placement, a restore by member processes at the
snapshot's shape (which reads only the chains their flags say it needs) still finds
every renamed key: the flags of a vertex whose keys moved are dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.partition import key_routing
from slipstream.engine.member_snapshots import FLAGS
from slipstream.execution.plan import build_vertex_plans
from slipstream.pipeline.keyed import rolling_aggregate
from slipstream.state.bootstrap import _write
from slipstream.state.restore import chains_to_read, custom_partitioners, restore_plan
from slipstream.state.store import DirectorySnapshotStore


def ident(x: Any) -> Any:
    return x


def by_length(key: Any, count: int) -> int:
    """A custom partitioner unlike the default one: by the key's length."""
    return (len(key) * 37) % count


def counts_dag(items: list[str], lp: int = 2) -> DAG:
    """items -> a rolling count per item over an edge partitioned by :func:`by_length`."""
    dag = DAG()
    src = dag.new_vertex("events", sources.items(items)).local_parallelism(1)
    counts = dag.new_vertex("counts", rolling_aggregate(ident, counting())).local_parallelism(lp)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, counts).partitioned(ident, by_length).distributed())
    dag.edge(Edge.between(counts, out))
    return dag


CUSTOM = key_routing(by_length, 1, 2).owner
DEFAULT = key_routing(None, 1, 2).owner
#: a new name for key "a" that the custom partitioner and the default one put apart
MOVED = next(k for k in ("x" * n for n in range(1, 20)) if CUSTOM(k) != DEFAULT(k))


def rename(row: Any) -> Any:
    return (MOVED, row.value) if row.key == "a" else row


def placed(store: Path) -> set[tuple[Any, Any, int]]:
    return {(r.key, r.value, r.processor) for r in ss.state.read(store, "counts")}


def test_a_renamed_key_goes_where_the_dags_partitioner_routes_it(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    ss.state.bootstrap(counts_dag([]), "counts", [("a", 3), ("bb", 5)], seed)
    ss.state.transform(seed, "counts", rename, dag=counts_dag([]))
    assert placed(seed) == {(MOVED, 3, CUSTOM(MOVED)), ("bb", 5, CUSTOM("bb"))}
    # restored into the job, the key continues where its live items go
    engine = ss.local()
    cfg = JobConfig(name="counts", snapshot_store=str(tmp_path / "live"))
    cfg.processing_guarantee = ss.ProcessingGuarantee.EXACTLY_ONCE
    engine.new_job(counts_dag([MOVED, "bb", MOVED]), cfg, restore_from=str(seed)).join(120)
    assert sorted(engine.get_list("out")) == [("bb", 6), (MOVED, 4), (MOVED, 5)]


def member_restore(store: Path, dag: DAG) -> dict[Any, Any]:
    """What processes=2 (one 'counts' processor each) restore from the newest snapshot
    of ``store``: each member reads the chains :func:`chains_to_read` names for it and
    keeps the entries routed to its processors."""
    s = DirectorySnapshotStore(str(store))
    sid = s.committed_ids()[-1]
    manifest = s.read_manifest(sid)
    plans = build_vertex_plans(dag, JobConfig(), 2, 1, None, "counts")
    flags = manifest.extra.get(FLAGS)
    got: dict[Any, Any] = {}
    for member in (0, 1):
        mine = {
            (name, g)
            for name, vp in plans.items()
            for g in range(vp.total_parallelism)
            if vp.member_of(g) == member
        }
        wanted = chains_to_read(manifest, flags, plans, mine) if isinstance(flags, dict) else None
        routed, _done = restore_plan(s.read(sid, wanted), plans, custom_partitioners(dag))
        for (name, g), entries in routed.items():
            if name == "counts" and (name, g) in mine:
                got.update(entries)
    return got


def test_member_processes_restore_a_key_moved_without_the_dag(tmp_path: Path) -> None:
    dag = counts_dag([], lp=1)
    seed = tmp_path / "seed"
    ss.state.bootstrap(counts_dag([]), "counts", [("a", 3), ("bb", 5)], seed)
    data = DirectorySnapshotStore(str(seed)).latest()
    assert data is not None
    # the seed as member processes at two members would have saved it: each chain holds
    # only its processor's keys, and says so
    owner = key_routing(by_length, 2, 1).owner
    assert placed(seed) == {("a", 3, owner("a")), ("bb", 5, owner("bb"))}
    flagged = tmp_path / "flagged"
    chains = {str(i): [False, False] for i in data.vertices["counts"].entries}
    _write(
        DirectorySnapshotStore(str(flagged)),
        "counts",
        data.dag_shape,
        {FLAGS: {"counts": {"shape": [2, 1], "chains": chains}}},
        {n: vs.total_parallelism for n, vs in data.vertices.items()},
        {(n, i): es for n, vs in data.vertices.items() for i, es in vs.entries.items()},
    )
    assert member_restore(flagged, dag) == {"a": 3, "bb": 5}
    # renamed without the DAG: placed by the default partitioner, not where the job's
    # own partitioner routes it
    ss.state.transform(flagged, "counts", rename)
    assert member_restore(flagged, dag) == {MOVED: 3, "bb": 5}
