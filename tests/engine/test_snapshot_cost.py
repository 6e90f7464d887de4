"""Snapshots of large state: entries handed over without serialisation on the cooperative
thread (values the processor could still change are copied), window state saved as one
batch per frame and routed back by key, and the per-snapshot figures in ``job.metrics``."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, JobStatus, ProcessingGuarantee, sinks
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.engine.snapshot import detached
from slipstream.state.keyed import KEYED, StateMap
from slipstream.state.keys import BroadcastKey, KeyedStateBatch, KeyedStateKey, expand_entries
from slipstream.watermark import with_fixed_lag
from slipstream.window import sliding_window_def

EO = ProcessingGuarantee.EXACTLY_ONCE
KEYS = 7
WD = sliding_window_def(200, 100)


def key_of(x: int) -> int:
    return x % KEYS


def ts_of(x: int) -> int:
    return x


def wm_policy() -> Any:
    return with_fixed_lag(0).throttle_by_frame(WD)


def window_dag(n: int, rate: float, window_lp: int = 2, fail_after: int = -1) -> DAG:
    """Paced ints -> (a mapper that may fail: x * 2) -> watermarks -> sliding count per
    key -> list sink."""
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, n, rate)).local_parallelism(1)
    fail = dag.new_vertex("map", functools.partial(stp.FailingMap, fail_after)).local_parallelism(1)
    wms = dag.new_vertex("wm", P.insert_watermarks(ts_of, wm_policy)).local_parallelism(1)
    win = dag.new_vertex(
        "window",
        P.aggregate_to_sliding_window(key_fn=key_of, timestamp_fn=ts_of, window_def=WD, agg_op=counting()),
    ).local_parallelism(window_lp)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, fail)).edge(Edge.between(fail, wms))
    dag.edge(Edge.between(wms, win).partitioned(key_of).distributed())
    dag.edge(Edge.between(win, sink))
    return dag


def oracle(n: int) -> Counter:
    engine = ss.local()
    engine.new_job(window_dag(n, 1e9)).join(60)
    return Counter(engine.get_list("out"))


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_window_state_is_handed_over_in_batches_and_restored_by_key_elsewhere(tmp_path: Any) -> None:
    n = 6000  # at 500 items/s: the job is suspended long before its end
    engine = ss.local(cooperative_threads=2)
    cfg = JobConfig(
        name="win", processing_guarantee=EO, snapshot_interval_ms=20, snapshot_store=str(tmp_path / "a")
    )
    job = engine.new_job(window_dag(n, 500.0), cfg)
    wait_for(lambda: job.metrics["window"]["items_in"] >= 300, "items in the windows")
    wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 2, "two snapshots")
    job.suspend()
    assert job.status is JobStatus.SUSPENDED
    snap = job.export_snapshot()
    assert snap is not None
    saved = [e for es in snap.vertices["window"].entries.values() for e in es]
    # frames, one map each, not an entry per key
    assert any(type(k) is StateMap and k.tag == KEYED for k, _ in saved)
    assert {type(k) for k, _ in expand_entries(saved)} == {KeyedStateKey, BroadcastKey}

    # job metrics: the figures of the snapshots taken
    m = job.metrics["__job__"]
    assert m["snapshots"] >= 3  # two periodic ones and the terminal one
    assert m["snapshot_bytes"] > 0 and m["snapshot_bytes_mean"] > 0
    assert m["snapshot_entries"] >= len(saved)
    assert 0 < m["snapshot_duration_us"] <= m["snapshot_duration_us_max"]
    assert 0 < m["snapshot_duration_us_mean"] <= m["snapshot_duration_us_max"]
    assert 0 <= m["snapshot_pause_us"] <= m["snapshot_pause_us_max"] <= m["snapshot_duration_us_max"]
    published = Counter(engine.get_list("out"))
    job.cancel()

    # the rest, restored with three window processors: keyed state goes where its key now
    # lives; together with what the first job published, exactly the oracle's output
    engine2 = ss.local()
    job2 = engine2.new_job(
        window_dag(n, 1e9, window_lp=3),
        JobConfig(processing_guarantee=EO, snapshot_store=str(tmp_path / "b")),
        restore_from=snap,
    )
    job2.join(60)
    assert published + Counter(engine2.get_list("out")) == oracle(n)


def test_exactly_once_window_job_with_a_failure_matches_the_oracle(tmp_path: Any) -> None:
    n = 3000
    stp.FAIL_BUDGET[0] = 1
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(
        window_dag(n, 10_000.0, fail_after=1500),
        JobConfig(processing_guarantee=EO, snapshot_interval_ms=10, snapshot_store=str(tmp_path)),
    )
    job.join(60)
    assert job.status is JobStatus.COMPLETED
    assert job.metrics["__job__"]["restarts"] == 1
    assert Counter(engine.get_list("out")) == oracle(n)


# -- handing entries over ---------------------------------------------------------------------


def test_immutable_entries_are_handed_over_as_they_are() -> None:
    entries = [(KeyedStateKey("a", 1), 3), ("b", (1, 2.5, ("x", None))), ("c", "text")]
    assert detached(entries) is entries
    batch = [(KeyedStateBatch(5), {"a": 1, "b": 2}), ("cursor", 7)]
    assert detached(batch) is batch


@pytest.mark.parametrize(
    "entries",
    [
        [("a", [1, 2])],
        [("a", 1), ("b", {"x": 1})],
        [("a", (1, [2]))],
        [(KeyedStateBatch(5), {"a": [1]})],
    ],
)
def test_values_the_processor_could_change_are_copied(entries: list[Any]) -> None:
    out = detached(entries)
    assert out == entries
    assert out is not entries
    # no value of the copy is a (mutable) object of the processor's
    mine = {id(v) for _, v in entries if not isinstance(v, int)}
    assert not mine & {id(v) for _, v in out}


class LockSaver(ss.AbstractProcessor):
    """Saves state that cannot be pickled (a lock), as key or as value."""

    def __init__(self, as_key: bool) -> None:
        self.as_key = as_key
        self.lock = threading.Lock()

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit(item)

    def save_to_snapshot(self) -> bool:
        if self.as_key:
            return self.try_emit_to_snapshot(self.lock, 1)
        return self.try_emit_to_snapshot("lock", self.lock)


@pytest.mark.parametrize("as_key", [False, True])
def test_state_that_cannot_be_pickled_fails_the_job_naming_the_vertex(
    tmp_path: Any, as_key: bool
) -> None:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(stp.PacedSource, 100_000, 1000.0)).local_parallelism(1)
    bad = dag.new_vertex("locked", functools.partial(LockSaver, as_key)).local_parallelism(1)
    sink = dag.new_vertex("sink", sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(src, bad)).edge(Edge.between(bad, sink))
    job = ss.local().new_job(
        dag,
        JobConfig(
            processing_guarantee=EO,
            snapshot_interval_ms=10,
            snapshot_store=str(tmp_path),
            auto_restart=False,
        ),
    )
    with pytest.raises(ss.JobFailedError, match="'locked'.*cannot be pickled") as info:
        job.join(60)
    assert info.value.vertex == "locked"


def test_keyed_state_batch_expands_to_keyed_entries() -> None:
    entries = [(KeyedStateBatch(4), {"a": 1, "b": 2}), ("x", 3)]
    assert sorted(expand_entries(entries), key=repr) == sorted(
        [(KeyedStateKey("a", 4), 1), (KeyedStateKey("b", 4), 2), ("x", 3)], key=repr
    )
