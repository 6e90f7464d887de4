"""Jobs with ``JobConfig(state_backend="sqlite")``: the keyed processors keep their state
on disk (state/disk.py) and give the output of the in-memory backend, also across a
restart that restores the state from a snapshot; the state's files go with the job."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import DagError

KEYS = 50


def _item(i: int) -> tuple[int, int]:
    return (i * 7919 % KEYS, i)


def _key(item: tuple[int, int]) -> int:
    return item[0]


def _new_list() -> list[int]:
    return []


def _seen(state: list[int], key: int, item: tuple[int, int]) -> tuple[int, int]:
    state.append(item[1])  # changed in place, never stored again
    return (key, len(state))


def _pipeline(n: int, rate: float | None) -> ss.Pipeline:
    p = ss.Pipeline()
    src = p.read_from(sources.generator(_item, rate, max_items=n)).set_local_parallelism(1)
    keyed = src.group_by(_key)
    keyed.rolling_aggregate(counting()).write_to(sinks.list_sink("counts"))
    keyed.map_stateful(_new_list, _seen).write_to(sinks.list_sink("seen"))
    return p


def _run(tmp: Any, backend: str, n: int, rate: float | None = None, restart: bool = False):
    engine = ss.local(cooperative_threads=2, work_dir=str(tmp / backend))
    job = engine.new_job(
        _pipeline(n, rate),
        JobConfig(
            name="disk",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=20,
            state_backend=backend,
            restart_delay_ms=1,
        ),
    )
    if restart:
        deadline = time.monotonic() + 60
        while len(engine.get_list("counts")) < n // 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # committed output: at least one snapshot holds state
        job.restart()
    job.join(120)
    assert job.status is ss.JobStatus.COMPLETED
    return engine.get_list("counts"), engine.get_list("seen")


def _expected(n: int) -> Counter[tuple[int, int]]:
    per_key = Counter(_key(_item(i)) for i in range(n))
    return Counter((k, c) for k, total in per_key.items() for c in range(1, total + 1))


@pytest.mark.parametrize("restart", [False, True])
def test_sqlite_backend_gives_the_memory_backends_output(tmp_path: Any, restart: bool) -> None:
    n = 3000
    counts, seen = _run(tmp_path, "sqlite", n, rate=20_000.0 if restart else None, restart=restart)
    assert Counter(counts) == _expected(n)  # exactly once, also across the restore
    assert Counter(seen) == _expected(n)
    mem_counts, mem_seen = _run(tmp_path, "memory", n)
    assert Counter(counts) == Counter(mem_counts) and Counter(seen) == Counter(mem_seen)
    # every processor's private directory went with the job
    assert os.listdir(tmp_path / "sqlite" / "state") == []


def test_a_vertex_takes_its_own_backend(tmp_path: Any) -> None:
    from slipstream import DAG, Edge
    from slipstream.pipeline.keyed import rolling_aggregate

    dag = DAG()
    src = dag.new_vertex("src", sources.generator(_item, None, max_items=500))
    agg = dag.new_vertex("agg", rolling_aggregate(_key, counting())).state_backend("sqlite")
    out = dag.new_vertex("out", sinks.list_sink("counts"))
    dag.edge(Edge.between(src, agg).partitioned(_key))
    dag.edge(Edge.between(agg, out))
    engine = ss.local(cooperative_threads=2, work_dir=str(tmp_path))
    job = engine.new_job(dag, JobConfig(name="per-vertex"))
    job.join(60)
    assert Counter(engine.get_list("counts")) == _expected(500)
    assert os.listdir(tmp_path / "state") == []  # it made (and removed) its files
    with pytest.raises(DagError, match="vertex 'agg': state_backend must be one of"):
        agg.state_backend("lmdb")
