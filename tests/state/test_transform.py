"""Rewriting a job's state (issue 25, item 5): ``ss.state.transform`` writes a new signed
snapshot (a new id, committed atomically) with each entry of a vertex mapped or dropped;
a job restored from it continues from the transformed state (doubled accumulators, a
dropped key, a changed state type); a result that does not fit is refused naming the
entry with nothing committed; a tampered store is refused."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_bootstrap import (
    HISTORY,
    LIVE,
    config,
    event_of,
    generator_pipeline,
    oracle,
    per_key,
    rolling,
    run,
    timed_event,
    windowed,
)

import slipstream as ss
from slipstream import sinks, sources
from slipstream.core.errors import (
    JobCancelledError,
    SnapshotError,
    SnapshotStoreDamagedError,
    SnapshotStoreInUseError,
)
from slipstream.state.reader import StateRow
from slipstream.state.store import DirectorySnapshotStore


def seeded(tmp_path: Path) -> Path:
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        rolling([]), "rolling_aggregate", Counter(HISTORY).items(), seed, parallelism=2
    )
    return seed


def test_transform_doubles_every_accumulator(tmp_path: Path) -> None:
    seed = seeded(tmp_path)
    sid = ss.state.transform(seed, "rolling_aggregate", lambda r: r._replace(value=r.value * 2))
    assert sid == 2
    doubled = Counter({k: 2 * n for k, n in Counter(HISTORY).items()})
    rows = ss.state.read(seed, "rolling_aggregate")
    assert sorted((r.key, r.value) for r in rows) == sorted(doubled.items())
    # the snapshot it rewrote is still there (time travel)
    old = ss.state.read(seed, "rolling_aggregate", snapshot_id=1)
    assert sorted((r.key, r.value) for r in old) == sorted(Counter(HISTORY).items())
    out = run(rolling(LIVE, parallelism=2), tmp_path / "live", restore_from=seed)
    assert per_key(out) == per_key(oracle(list(doubled.elements()), LIVE))


def test_transform_drops_a_key(tmp_path: Path) -> None:
    seed = seeded(tmp_path)
    ss.state.transform(seed, "rolling_aggregate", lambda r: None if r.key == "b" else r)
    assert "b" not in {r.key for r in ss.state.read(seed, "rolling_aggregate")}
    out = run(rolling(LIVE), tmp_path / "live", restore_from=seed)
    assert per_key(out) == per_key(oracle([x for x in HISTORY if x != "b"], LIVE))


def test_transform_changes_the_state_type_to_another_store(tmp_path: Path) -> None:
    """Schema evolution: a map_stateful state ``[total]`` becomes ``{"total": t}``,
    written to another store; the new job's function reads the new type."""

    def build(items: list[int], new: bool) -> ss.Pipeline:
        def add_list(s: list[int], k: int, x: int) -> tuple[int, int]:
            s[0] += x
            return (k, s[0])

        def add_dict(s: dict[str, int], k: int, x: int) -> tuple[int, int]:
            s["total"] += x
            return (k, s["total"])

        p = ss.Pipeline()
        p.read_from(sources.items(items)).group_by(lambda x: x % 2).map_stateful(
            (lambda: {"total": 0}) if new else (lambda: [0]), add_dict if new else add_list
        ).write_to(sinks.list_sink("out"))
        return p

    old = tmp_path / "old"
    ss.state.bootstrap(build([], False), "map_stateful", [(0, [100]), (1, [1000])], old)
    new = tmp_path / "new"
    sid = ss.state.transform(
        old, "map_stateful", lambda r: (r.key, {"total": r.value[0]}), to_store=new
    )
    assert sid == 1
    assert sorted((r.key, r.value) for r in ss.state.read(old)) == [(0, [100]), (1, [1000])]
    assert sorted((r.key, r.value) for r in ss.state.read(new)) == [
        (0, {"total": 100}),
        (1, {"total": 1000}),
    ]
    out = run(build([1, 2, 3], True), tmp_path / "live", restore_from=new)
    assert sorted(out) == [(0, 102), (1, 1001), (1, 1004)]


def test_a_result_that_does_not_fit_is_refused_and_nothing_is_committed(tmp_path: Path) -> None:
    seed = seeded(tmp_path)
    files = sorted(os.listdir(seed))
    store = DirectorySnapshotStore(seed)
    ids = store.committed_ids()
    with pytest.raises(
        ValueError,
        match=r"snapshot 1, vertex 'rolling_aggregate', processor \d, entry '\w': fn returned a row "
        r"of vertex 'other' .*; it may only return rows of vertex 'rolling_aggregate'",
    ):
        ss.state.transform(seed, "rolling_aggregate", lambda r: r._replace(vertex="other"))
    with pytest.raises(
        TypeError,
        match=r"entry '\w': fn returned 7 \(int\); it returns a StateRow .*, a \(key, value\) "
        r"tuple, or None to drop the entry",
    ):
        ss.state.transform(seed, "rolling_aggregate", lambda r: 7)
    with pytest.raises(ValueError, match=r"fn returned key 'x', which snapshot 1, vertex"):
        ss.state.transform(seed, "rolling_aggregate", lambda r: ("x", r.value))
    with pytest.raises(TypeError, match=r"fn returned an unhashable key \['a'\]"):
        ss.state.transform(seed, "rolling_aggregate", lambda r: ([r.key], r.value))
    with pytest.raises(ValueError, match=r"fn returned a row of kind 'window'"):
        ss.state.transform(seed, "rolling_aggregate", lambda r: r._replace(kind="window"))
    with pytest.raises(
        ValueError,
        match=r"has no vertex 'nope'; its vertices: 'rolling_aggregate', 'sink', 'source'",
    ):
        ss.state.transform(seed, "nope", lambda r: r)

    def boom(r: StateRow) -> Any:
        if r.key == "d":
            raise RuntimeError("bad key")
        return r

    with pytest.raises(RuntimeError, match="bad key"):
        ss.state.transform(seed, "rolling_aggregate", boom)
    assert sorted(os.listdir(seed)) == files
    assert store.committed_ids() == ids


def test_a_tampered_store_is_refused(tmp_path: Path) -> None:
    seed = seeded(tmp_path)
    chunk = sorted(n for n in os.listdir(seed) if n.startswith("chunk-"))[0]
    raw = bytearray((seed / chunk).read_bytes())
    raw[-2] ^= 0x01
    (seed / chunk).write_bytes(bytes(raw))
    with pytest.raises(
        SnapshotStoreDamagedError, match=rf"chunk {seed / chunk} .* fails its signature check"
    ):
        ss.state.transform(seed, "rolling_aggregate", lambda r: r)
    assert DirectorySnapshotStore(seed).committed_ids() == [1]


def test_transform_a_running_jobs_store_then_resume(tmp_path: Path) -> None:
    """A real job's store (its maps saved as deltas, the generator's offsets kept as they
    are): doubled, then the job resumed from it continues from the doubled counts."""
    store = tmp_path / "store"
    engine = ss.local()
    cfg = config(store, "gen")
    cfg.snapshot_interval_ms = 20
    job = engine.new_job(generator_pipeline(None, rate=20000.0), cfg)
    deadline = time.monotonic() + 120
    while job.metrics["__job__"]["snapshots"] < 3:
        assert not job.status.is_terminal and time.monotonic() < deadline
        time.sleep(0.005)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(60)
    before = {r.key: r.value for r in ss.state.read(store, "rolling_aggregate")}
    offsets = [r for r in ss.state.read(store) if r.kind == "offset"]
    ss.state.transform(store, "rolling_aggregate", lambda r: r._replace(value=r.value * 2))
    assert {r.key: r.value for r in ss.state.read(store, "rolling_aggregate")} == {
        k: 2 * v for k, v in before.items()
    }
    assert [r for r in ss.state.read(store) if r.kind == "offset"] == offsets
    cut = offsets[0].value["next_seq"]
    total = cut + 150
    e = ss.local()
    cfg.resume = True
    e.new_job(generator_pipeline(total), cfg).join(120)
    history = list(Counter({k: 2 * v for k, v in before.items()}).elements())
    assert per_key(list(e.get_list("out"))) == per_key(
        oracle(history, [event_of(s) for s in range(cut, total)])
    )


def test_a_snapshot_error_names_the_missing_store(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match=r"no snapshot store at .*nowhere: no such directory"):
        ss.state.transform(tmp_path / "nowhere", "v", lambda r: r)


def test_transform_window_frames(tmp_path: Path) -> None:
    """A window's frames are passed to fn as window rows (its cursor kept): doubling the
    open window's counts doubles the history's part of that window's results."""
    events = [timed_event(s) for s in range(1000)]
    history, live = events[:400], events[400:]
    open_end = (history[-1][1] // 1000 + 1) * 1000
    frames = Counter(k for k, ts in history if ts >= open_end - 1000)
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        windowed([]), "window-combine", [(k, open_end, n) for k, n in frames.items()], seed
    )
    seen: list[str] = []

    def double(r: StateRow) -> StateRow:
        seen.append(r.kind)
        return r._replace(value=2 * r.value)

    ss.state.transform(seed, "window-combine", double)
    assert seen == ["window"] * len(frames)
    rows = ss.state.read(seed, "window-combine")
    assert sorted((r.key, r.value) for r in rows if r.kind == "window") == sorted(
        (k, 2 * n) for k, n in frames.items()
    )
    assert [r.key for r in rows if r.kind == "broadcast"] == ["window.next_win_to_emit"]
    engine = ss.local()
    engine.new_job(windowed(live), config(tmp_path / "live"), restore_from=seed).join(120)
    live_in_open = Counter(k for k, ts in live if ts < open_end)
    first = {r.key: r.value for r in engine.get_list("out") if r.end == open_end}
    assert first == {k: 2 * frames[k] + live_in_open[k] for k in frames | live_in_open}


def test_a_store_a_running_job_holds_is_refused(tmp_path: Path) -> None:
    """Neither the job's own store object nor its directory is written while it runs;
    the job keeps its lock."""
    store = tmp_path / "store"
    engine = ss.local()
    cfg = config(store, "held")
    cfg.snapshot_interval_ms = 20
    job = engine.new_job(generator_pipeline(None, rate=20000.0), cfg)
    try:
        deadline = time.monotonic() + 120
        while job.metrics["__job__"]["snapshots"] < 1:
            assert not job.status.is_terminal and time.monotonic() < deadline
            time.sleep(0.005)
        for target in (job, store):
            with pytest.raises(SnapshotStoreInUseError, match=f"snapshot store {store} is in use"):
                ss.state.transform(target, "rolling_aggregate", lambda r: r)
        with pytest.raises(SnapshotStoreInUseError):
            DirectorySnapshotStore(store).lock()
    finally:
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
