"""Reading a job's state as data (issue 25, item 1): ``ss.state.read`` of a Pipeline job's
store (a rolling aggregate, a tumbling window and a session window behind a generator,
exactly-once) equals a plain-Python oracle of the state at each retained snapshot (the
generator offsets in the snapshot say which items it covers), time travel to an older
snapshot, ``ss.state.changes`` between two, the errors, and ``job.state`` on a running
job."""

from __future__ import annotations

import operator
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting, summing
from slipstream.core.errors import JobCancelledError, SnapshotError, SnapshotStoreDamagedError
from slipstream.state.reader import StateRow
from slipstream.state.store import DirectorySnapshotStore
from slipstream.window import session_window_def, tumbling_window_def

KEYS = 3
WINDOW = 1000
TIMEOUT = 50


def event(seq: int) -> tuple[int, int, int]:
    """``(key, timestamp, value)``: per key an event every 30 ms, and a 130 ms gap every
    20 sequence numbers, so the 50 ms sessions hold several events each."""
    return (seq % KEYS, seq * 10 + (seq // 20) * 100, seq % 7)


def build(rate: float = 4000.0) -> ss.Pipeline:
    p = ss.Pipeline()
    s = p.read_from(sources.generator(event, rate)).with_timestamps(operator.itemgetter(1), 0)
    g = s.group_by(operator.itemgetter(0))
    g.rolling_aggregate(summing(operator.itemgetter(2))).write_to(sinks.noop())
    g.window(tumbling_window_def(WINDOW)).aggregate(counting()).write_to(sinks.noop())
    g.window(session_window_def(TIMEOUT)).aggregate(counting()).write_to(sinks.noop())
    return p


def config(store: Any) -> JobConfig:
    return JobConfig(
        name="reader",
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=20,
        snapshot_store=store,
    )


def commits(job: Any) -> int:
    return int(job.metrics["__job__"]["snapshots"])


def wait_until(job: Any, cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll ``cond`` (an event: a count reached); fail at once if the job ends."""
    deadline = time.monotonic() + timeout
    while not cond():
        if job.status.is_terminal:
            job.join(1)
            raise AssertionError(f"the job ended ({job.status}) while waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def run_and_cancel(store: Any, snapshots: int) -> None:
    engine = ss.local()
    try:
        job = engine.new_job(build(), config(store))
        wait_until(job, lambda: commits(job) >= snapshots, f"{snapshots} committed snapshots")
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store with several retained snapshots (none pruned: keep=50)."""
    directory = str(tmp_path_factory.mktemp("reader") / "store")
    run_and_cancel(DirectorySnapshotStore(directory, keep=50), 6)
    return directory


# -- the oracle --------------------------------------------------------------------------
def covered(rows: list[StateRow]) -> list[int]:
    """The sequence numbers the snapshot's generator offsets say it covers."""
    seqs: list[int] = []
    offsets = [r for r in rows if r.kind == "offset"]
    assert offsets, rows
    for r in offsets:
        assert r.key == ("generator", r.detail["processor"])
        p = r.value["parallelism"]
        seqs.extend(range(r.detail["processor"], r.value["next_seq"], p))
    return seqs


def broadcast(rows: list[StateRow], name: str) -> int:
    values = {r.value for r in rows if r.kind == "broadcast" and r.key == name}
    assert len(values) == 1, (name, values)
    return values.pop()


def oracle(rows: list[StateRow]) -> dict[str, Counter[Any]]:
    """What the keyed, window and session rows must be, from the items the snapshot
    covers, the window's emission cursor and the session vertex's watermark in it."""
    events = [event(s) for s in covered(rows)]
    sums: dict[int, int] = defaultdict(int)
    frames: dict[tuple[int, int], int] = defaultdict(int)
    times: dict[int, list[int]] = defaultdict(list)
    for k, t, v in events:
        sums[k] += v
        frames[(k, t - t % WINDOW + WINDOW)] += 1
        times[k].append(t)
    cursor = broadcast(rows, "window.next_win_to_emit")
    wm = broadcast(rows, "session_window.current_watermark")
    sessions: list[tuple[int, int, int, int]] = []
    for k, ts in times.items():
        ts.sort()
        start, end, n = ts[0], ts[0] + TIMEOUT, 1
        for t in ts[1:]:
            if t < end:
                end, n = t + TIMEOUT, n + 1
            else:
                sessions.append((k, start, end, n))
                start, end, n = t, t + TIMEOUT, 1
        sessions.append((k, start, end, n))
    return {
        "keyed": Counter((k, None, s) for k, s in sums.items()),
        "window": Counter((k, fe, c) for (k, fe), c in frames.items() if fe >= cursor),
        "session": Counter((k, s, e, n) for k, s, e, n in sessions if e >= wm),
    }


def observed(rows: list[StateRow]) -> dict[str, Counter[Any]]:
    return {
        "keyed": Counter((r.key, r.detail, r.value) for r in rows if r.kind == "keyed"),
        "window": Counter(
            (r.key, r.detail["frame_end"], r.value) for r in rows if r.kind == "window"
        ),
        "session": Counter(
            (r.key, r.detail["start"], r.detail["end"], r.value)
            for r in rows
            if r.kind == "session"
        ),
    }


def ids(store: str) -> list[int]:
    return DirectorySnapshotStore(store).committed_ids()


# -- read ---------------------------------------------------------------------------------
def test_every_retained_snapshot_reads_as_the_oracle_s_state(store: str) -> None:
    retained = ids(store)
    assert len(retained) >= 6
    latest = ss.state.read(store)
    assert latest == ss.state.read(store, snapshot_id=retained[-1])
    for sid in retained:
        rows = ss.state.read(store, snapshot_id=sid)
        assert observed(rows) == oracle(rows), f"snapshot {sid}"
    # the first snapshot is older: time travel reads fewer items than the newest
    assert len(covered(ss.state.read(store, snapshot_id=retained[0]))) < len(covered(latest))
    kinds = {(r.vertex, r.kind) for r in latest}
    assert {
        ("rolling_aggregate", "keyed"),
        ("source", "offset"),
        ("window-combine", "window"),
    } <= kinds
    assert any(k == "session" for _, k in kinds)


def test_rows_of_one_vertex_and_one_key(store: str) -> None:
    rows = ss.state.read(store, vertex="rolling_aggregate")
    assert {r.vertex for r in rows} == {"rolling_aggregate"}
    assert sorted(r.key for r in rows) == [0, 1, 2]
    assert all(type(r) is StateRow and r.detail is None and r.kind == "keyed" for r in rows)
    # a key the window holds frames of (a snapshot taken just after a window was emitted
    # holds only the keys the next window has seen yet, perhaps not key 1)
    held = {r.key for r in ss.state.read(store, vertex="window-combine") if r.kind == "window"}
    assert held
    k = min(held)
    one = ss.state.read(store, vertex="window-combine", key=k)
    assert one and {r.key for r in one} == {k}
    assert ss.state.read(store, vertex="sink", key=1) == []
    # key= looks the key up in each map: the same rows as filtering every row
    every = ss.state.read(store)
    for k in (0, 1, 2, 3, "window.next_win_to_emit", ("generator", 0)):
        assert ss.state.read(store, key=k) == [r for r in every if r.key == k], k
    assert ss.state.read(store, key=[1]) == []  # an unhashable key: compared with every row


def test_changes_between_two_retained_snapshots(store: str) -> None:
    retained = ids(store)
    old_id, new_id = retained[0], retained[-1]
    old = ss.state.read(store, snapshot_id=old_id)
    new = ss.state.read(store, snapshot_id=new_id)
    feed = ss.state.changes(store, old_id, new_id)
    assert {c.change for c in feed} <= {"added", "changed", "removed"}

    def table(rows: list[Any]) -> dict[Any, Any]:
        return {
            (r.vertex, r.kind, r.key, repr(r.detail)): r.value
            for r in rows
            if r.kind in ("keyed", "window", "session")
        }

    before, after = table(old), table(new)
    applied = dict(before)
    for c in feed:
        ident = (c.vertex, c.kind, c.key, repr(c.detail))
        if c.kind not in ("keyed", "window", "session"):
            continue
        if c.change == "removed":
            assert applied.pop(ident) == c.previous and c.value is None
        elif c.change == "added":
            assert ident not in applied and c.previous is None
            applied[ident] = c.value
        else:
            assert applied[ident] == c.previous != c.value
            applied[ident] = c.value
    assert applied == after
    # every key's rolling sum grew, so each is "changed" with its old and new sum, or
    # "added" (previous None) when the older snapshot was taken before the generator's
    # first item of that key (a loaded machine: snapshots every 20 ms)
    rolled = {c.key: (c.previous, c.value) for c in feed if c.vertex == "rolling_aggregate"}
    old_sums = {r.key: r.value for r in old if r.vertex == "rolling_aggregate"}
    new_sums = {r.key: r.value for r in new if r.vertex == "rolling_aggregate"}
    assert rolled == {k: (old_sums.get(k), new_sums[k]) for k in new_sums}
    assert ss.state.changes(store, new_id, new_id) == []


def test_data_frames(store: str) -> None:
    rows = ss.state.read(store, vertex="rolling_aggregate")
    table = ss.state.to_arrow(rows)
    assert table.column_names == ["vertex", "processor", "key", "detail", "value", "kind"]
    pairs = zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    assert sorted(pairs) == sorted((r.key, r.value) for r in rows)
    # keys of mixed types (ints and the generator's tuples) become their repr strings
    mixed = ss.state.to_arrow(ss.state.read(store))
    assert "('generator', 0)" in mixed.column("key").to_pylist()
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="slipstream.state.to_pandas needs pandas"):
            ss.state.to_pandas(rows)
    else:
        df = ss.state.to_pandas(rows)
        assert list(df.columns) == ["vertex", "processor", "key", "detail", "value", "kind"]
        assert len(df) == len(rows)


# -- errors ---------------------------------------------------------------------------------
def test_clear_errors(store: str, tmp_path: Path) -> None:
    retained = ids(store)
    with pytest.raises(SnapshotError, match=f"no snapshot store at {tmp_path / 'none'}: no such directory"):
        ss.state.read(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SnapshotError, match="holds no committed snapshot"):
        ss.state.read(tmp_path / "empty")
    with pytest.raises(ValueError) as e:
        ss.state.read(store, vertex="nope")
    assert str(e.value) == (
        f"snapshot {retained[-1]} in {store} has no vertex 'nope'; its vertices: "
        "'rolling_aggregate', 'sink', 'sink-2', 'sink-3', 'source', 'window-2', "
        "'window-accumulate', 'window-combine', 'with_timestamps'"
    )
    with pytest.raises(SnapshotError) as e2:
        ss.state.read(store, snapshot_id=10_000)
    assert str(e2.value) == (
        f"snapshot 10000 is not retained in snapshot store {store}; retained: "
        + ", ".join(map(str, retained))
    )


def test_a_damaged_store_is_reported_as_the_store_reports_it(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    run_and_cancel(str(directory), 3)
    newest = ids(str(directory))[-1]
    chunk = sorted(p for p in directory.iterdir() if p.name.startswith(f"chunk-{newest:010d}-"))[0]
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(SnapshotStoreDamagedError, match="its newest committed snapshot cannot be used"):
        ss.state.read(directory)
    with pytest.raises(SnapshotError, match=f"chunk {chunk} .*fails its signature check"):
        ss.state.read(directory, snapshot_id=newest)


def test_a_format_2_store_reads_as_it_did_in_format_3(tmp_path: Path) -> None:
    """A store written before the chunked format (one pickled SnapshotData per file)
    reads into the same rows, one vertex too."""
    from format2_store import convert_to_format2, is_format2

    directory = str(tmp_path / "store")
    run_and_cancel(directory, 3)
    before = {sid: ss.state.read(directory, snapshot_id=sid) for sid in ids(directory)}
    converted = convert_to_format2(directory)
    assert all(is_format2(directory, sid) for sid in converted)
    for sid, rows in before.items():
        assert ss.state.read(directory, snapshot_id=sid) == rows
    newest = max(before)
    assert ss.state.read(directory, "rolling_aggregate") == [
        r for r in before[newest] if r.vertex == "rolling_aggregate"
    ]
    with pytest.raises(ValueError, match="has no vertex 'nope'; its vertices: 'rolling_aggregate', "):
        ss.state.read(directory, "nope")


def test_a_store_without_its_key_is_refused_before_anything_is_read(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLIPSTREAM_KEY_DIR", str(tmp_path / "other-keys"))
    with pytest.raises(SnapshotError, match=f"no signing key for snapshot store {store}"):
        ss.state.read(store)
    assert not (tmp_path / "other-keys").exists()  # no key was made up


# -- job.state --------------------------------------------------------------------------------
def test_job_state_answers_from_the_last_committed_snapshot_while_the_job_runs(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "store")
    engine = ss.local()
    try:
        job = engine.new_job(build(), config(DirectorySnapshotStore(directory, keep=1000)))
        wait_until(job, lambda: commits(job) >= 2, "2 committed snapshots")
        before = max(ids(directory))
        rows = job.state("rolling_aggregate", 1)
        frames = job.state("window-combine", 1)
        n = commits(job)
        wait_until(job, lambda: commits(job) >= n + 2, "2 more committed snapshots")
        assert job.status is ss.JobStatus.RUNNING  # the query did not stop it
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
    finally:
        engine.shutdown()
    assert len(rows) == 1 and rows[0].key == 1 and rows[0].kind == "keyed"
    assert frames and all(r.key == 1 and r.kind == "window" for r in frames)
    # the answer is a committed snapshot's, one at least as new as those committed before
    matching = [
        sid
        for sid in ids(directory)
        if sid >= before
        and [r for r in ss.state.read(directory, "rolling_aggregate", sid) if r.key == 1] == rows
    ]
    assert matching, (rows, before)


def test_job_state_errors(tmp_path: Path) -> None:
    engine = ss.local()
    try:
        job = engine.new_job(build(), JobConfig(name="nostate"))
        with pytest.raises(SnapshotError, match="job 'nostate' takes no snapshots"):
            job.state("rolling_aggregate", 1)
        with pytest.raises(SnapshotError, match="takes no snapshots"):
            ss.state.read(job)
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
        directory = str(tmp_path / "store")
        later_config = config(directory)
        later_config.name, later_config.snapshot_interval_ms = "later", 3_600_000
        later = engine.new_job(build(), later_config)
        with pytest.raises(SnapshotError) as e:
            later.state("rolling_aggregate", 1)
        assert str(e.value) == (
            f"job 'later' has committed no snapshot yet (its store is {directory}): there is "
            "no state to read"
        )
        later.cancel()
        with pytest.raises(JobCancelledError):
            later.join(60)
    finally:
        engine.shutdown()


def test_size_counts_are_the_rows_and_keys_of_read(store: str) -> None:
    """What the dashboard shows per vertex (state.reader.size_counts, no rows made for a
    plain keyed map) equals counting ss.state.read's rows and their distinct keys: a
    rolling sum, a tumbling window's frames and a session window's sessions."""
    from slipstream.state.reader import newest_size_counts, size_counts

    for sid in ids(store):
        rows = ss.state.read(store, snapshot_id=sid)
        expected: dict[str, tuple[int, int]] = {}
        for name in {r.vertex for r in rows}:
            mine = [r for r in rows if r.vertex == name]
            keys = {r.key for r in mine if r.kind in ("keyed", "window", "session")}
            expected[name] = (len(mine), len(keys))
        counted = size_counts(DirectorySnapshotStore(store).read(sid))
        assert {n: c for n, c in counted.items() if c != (0, 0)} == expected
    kinds = {r.kind for r in ss.state.read(store)}
    assert {"keyed", "window", "session", "offset", "broadcast"} <= kinds
    assert newest_size_counts(store) == (max(ids(store)), size_counts(DirectorySnapshotStore(store).read(max(ids(store)))))
