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


def _pipeline(n: int | None, rate: float | None) -> ss.Pipeline:
    p = ss.Pipeline()
    src = p.read_from(sources.generator(_item, rate, max_items=n)).set_local_parallelism(1)
    keyed = src.group_by(_key)
    keyed.rolling_aggregate(counting()).write_to(sinks.list_sink("counts"))
    keyed.map_stateful(_new_list, _seen).write_to(sinks.list_sink("seen"))
    return p


def _job(tmp: Any, backend: str, n: int | None, rate: float | None) -> tuple[Any, Any]:
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
    return engine, job


def _wait_for(engine: Any, job: Any, n: int) -> None:
    """Until the sink holds ``n`` committed results (or the job ended)."""
    deadline = time.monotonic() + 60
    while len(engine.get_list("counts")) < n and not job.status.is_terminal:
        assert time.monotonic() < deadline, f"fewer than {n} results after 60 s"
        time.sleep(0.01)


def _expected(n: int) -> Counter[tuple[int, int]]:
    per_key = Counter(_key(_item(i)) for i in range(n))
    return Counter((k, c) for k, total in per_key.items() for c in range(1, total + 1))


def test_sqlite_backend_gives_the_memory_backends_output(tmp_path: Any) -> None:
    n = 3000
    outputs = {}
    for backend in ("sqlite", "memory"):
        engine, job = _job(tmp_path, backend, n, None)
        job.join(120)
        assert job.status is ss.JobStatus.COMPLETED
        outputs[backend] = (engine.get_list("counts"), engine.get_list("seen"))
    counts, seen = outputs["sqlite"]
    assert Counter(counts) == Counter(seen) == _expected(n)
    assert Counter(counts) == Counter(outputs["memory"][0])
    assert Counter(seen) == Counter(outputs["memory"][1])
    # every processor's private directory went with the job
    assert os.listdir(tmp_path / "sqlite" / "state") == []


def test_sqlite_state_restores_exactly_once_across_a_restart(tmp_path: Any) -> None:
    """An endless stream, restarted (a terminal snapshot, then a new execution that
    restores the state from it, full then deltas), then cancelled: the committed output
    holds every key's counts 1..c exactly once, the results of a prefix of the stream."""
    engine, job = _job(tmp_path, "sqlite", None, 20_000.0)
    _wait_for(engine, job, 500)
    job.restart()
    _wait_for(engine, job, 2000)
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(60)
    for name in ("counts", "seen"):
        out = engine.get_list(name)
        assert len(out) >= 2000
        per_key: dict[int, list[int]] = {}
        for key, count in out:
            per_key.setdefault(key, []).append(count)
        for key, counts in per_key.items():
            assert sorted(counts) == list(range(1, len(counts) + 1)), (name, key)
        # the counts are those of the stream's first items, one result per item
        firsts = Counter(_key(_item(i)) for i in range(len(out)))
        assert {k: len(c) for k, c in per_key.items()} == dict(firsts)
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


def _ts(e: tuple[int, int, int]) -> int:
    return e[1]


def _val(e: tuple[int, int, int]) -> int:
    return e[2]


def _key3(e: tuple[int, int, int]) -> int:
    return e[0]


def _others(tmp: Any, backend: str) -> list[list[Any]]:
    from slipstream.aggregate import summing, to_list
    from slipstream.window import session_window_def, sliding_window_def

    evs = [(i % 40, 1000 + 7 * i, i % 5) for i in range(3000)]
    p = ss.Pipeline()
    timed = p.read_from(sources.items(evs)).with_timestamps(_ts, 0)
    keyed = timed.group_by(_key3)
    keyed.aggregate(summing(_val)).write_to(sinks.list_sink("agg"))
    keyed.window(sliding_window_def(400, 200)).aggregate(counting()).write_to(
        sinks.list_sink("win")
    )
    keyed.window(session_window_def(150)).aggregate(to_list()).write_to(sinks.list_sink("sess"))
    engine = ss.local(cooperative_threads=2, work_dir=str(tmp / backend))
    engine.new_job(p, JobConfig(name="others", state_backend=backend)).join(timeout=60)
    return [sorted(map(repr, engine.get_list(n))) for n in ("agg", "win", "sess")]


def test_aggregations_windows_and_sessions_on_sqlite(tmp_path: Any) -> None:
    """group-by-key aggregation, window frames and sessions keep their maps on disk: the
    output is the in-memory backend's, and every map's directory is gone at the end."""
    disk = _others(tmp_path, "sqlite")
    assert all(disk)
    assert disk == _others(tmp_path, "memory")
    assert os.listdir(tmp_path / "sqlite" / "state") == []
