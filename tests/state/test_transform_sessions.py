"""``ss.state.transform`` of a session window (issue 25, item 5): ``fn`` sees each open
session as a ``session`` row (it was kept as it was, never passed to ``fn``); a session
dropped, changed or given another key is written in the form the session processor
restores, so the restored job's sessions are exactly the rewritten ones continued; an
identity transform of a job's own store restores as the store itself does; results
that do not fit are refused naming the entry, with nothing committed."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any

import pytest
from test_bootstrap_sessions import run, run_and_cancel, sessions

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting
from slipstream.core.partition import key_routing
from slipstream.state.reader import StateRow
from slipstream.state.store import DirectorySnapshotStore
from slipstream.window import KeyedWindowResult, session_window_def

OPEN = [("a", 100, 150, 2), ("a", 200, 260, 4), ("b", 100, 150, 1), ("c", 300, 350, 7)]


def live(events: list[tuple[str, int]]) -> ss.Pipeline:
    """The shape of ``sessions()`` over ``events``."""
    p = ss.Pipeline()
    p.read_from(sources.items(events)).set_name("events").with_timestamps(
        operator.itemgetter(1), 0
    ).group_by(operator.itemgetter(0)).window(session_window_def(50)).aggregate(
        counting()
    ).write_to(sinks.list_sink("out"))
    return p


def seeded(tmp_path: Path, parallelism: int = 1) -> Path:
    seed = tmp_path / "seed"
    ss.state.bootstrap(sessions(0), "window", OPEN, seed, parallelism=parallelism)
    return seed


def session_rows(store: Path, snapshot_id: int | None = None) -> list[tuple[Any, ...]]:
    return sorted(
        (r.key, r.detail["start"], r.detail["end"], r.value, r.processor)
        for r in ss.state.read(store, "window", snapshot_id=snapshot_id)
        if r.kind == "session"
    )


def test_fn_sees_each_session_and_rewrites_it(tmp_path: Path) -> None:
    seed = seeded(tmp_path)
    seen: list[StateRow] = []

    def fn(row: StateRow) -> Any:
        seen.append(row)
        if row.key == "b":
            return None  # a bot: its session goes
        if row.key == "c":
            return ("d", row.value)  # another key, the same bounds
        return row._replace(value=row.value * 10)

    sid = ss.state.transform(seed, "window", fn)
    assert sorted((r.key, r.detail["start"], r.detail["end"], r.value, r.kind) for r in seen) == [
        ("a", 100, 150, 2, "session"),
        ("a", 200, 260, 4, "session"),
        ("b", 100, 150, 1, "session"),
        ("c", 300, 350, 7, "session"),
    ]
    assert session_rows(seed, sid) == [
        ("a", 100, 150, 20, 0),
        ("a", 200, 260, 40, 0),
        ("d", 300, 350, 7, 0),
    ]
    changes = ss.state.changes(seed, sid - 1, sid, "window")
    assert sorted((c.key, c.detail["start"], c.change, c.previous, c.value) for c in changes) == [
        ("a", 100, "changed", 2, 20),
        ("a", 200, "changed", 4, 40),
        ("b", 100, "removed", 1, None),
        ("c", 300, "removed", 7, None),
        ("d", 300, "added", None, 7),
    ]
    out = run(live([("a", 240), ("b", 250), ("d", 320)]), tmp_path / "live", restore_from=seed)
    assert out == sorted(
        [
            KeyedWindowResult(100, 150, "a", 20),
            KeyedWindowResult(200, 290, "a", 41),
            KeyedWindowResult(250, 300, "b", 1),
            KeyedWindowResult(300, 370, "d", 8),
        ]
    )


def test_a_renamed_key_moves_to_its_owner(tmp_path: Path) -> None:
    seed = seeded(tmp_path, parallelism=2)
    owner = key_routing(None, 1, 2).owner
    moved = next(k for k in ("x", "y", "z", "w") if owner(k) != owner("c"))
    sid = ss.state.transform(seed, "window", lambda r: (moved, r.value) if r.key == "c" else r)
    rows = session_rows(seed, sid)
    assert (moved, 300, 350, 7, owner(moved)) in rows
    assert all(p == owner(k) for k, *_, p in rows)


def test_identity_of_a_jobs_own_store_restores_as_the_store(tmp_path: Path) -> None:
    first = tmp_path / "first"
    run_and_cancel(first, 3)
    (offset,) = [r for r in ss.state.read(first, "events") if r.kind == "offset"]
    total = offset.value["next_seq"] + 300
    copy = tmp_path / "copy"
    sid = ss.state.transform(first, "window", lambda r: r, to_store=copy)
    assert sorted(ss.state.read(copy, snapshot_id=sid), key=repr) == sorted(
        ss.state.read(first), key=repr
    )
    own = run(sessions(total), tmp_path / "own", restore_from=first)
    assert own and run(sessions(total), tmp_path / "again", restore_from=copy) == own


def test_sessions_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    seed = seeded(tmp_path)
    files = sorted(os.listdir(seed))
    where_a = r"snapshot 1, vertex 'window', processor 0, entry 'a'"
    with pytest.raises(
        ValueError,
        match=rf"{where_a} \(session \[200, 260\)\): fn returned session \[120, 260\) of key "
        rf"'a', which overlaps session \[100, 150\) that {where_a} \(session \[100, 150\)\) "
        r"returned",
    ):
        ss.state.transform(
            seed,
            "window",
            lambda r: (
                r._replace(detail={"start": 120, "end": 260}) if r.detail["start"] == 200 else r
            ),
        )
    with pytest.raises(
        ValueError,
        match=rf"{where_a} \(session \[100, 150\)\): a session row's detail is "
        r"\{'start': int, 'end': int\} with start < end, fn returned \{'start': 150, 'end': 150\}",
    ):
        ss.state.transform(seed, "window", lambda r: r._replace(detail={"start": 150, "end": 150}))
    with pytest.raises(
        ValueError,
        match=r"entry 'c' \(session \[300, 350\)\): fn returned key 'b', which snapshot 1, "
        r"vertex 'window', processor 0, entry 'b' \(session \[100, 150\)\) has too",
    ):
        ss.state.transform(seed, "window", lambda r: ("b", r.value) if r.key == "c" else r)
    with pytest.raises(
        ValueError, match=r"fn returned a row of kind 'keyed' for an entry of kind 'session'"
    ):
        ss.state.transform(seed, "window", lambda r: r._replace(kind="keyed"))
    assert sorted(os.listdir(seed)) == files
    assert DirectorySnapshotStore(seed).committed_ids() == [1]
