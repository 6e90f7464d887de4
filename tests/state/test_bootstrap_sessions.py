"""Seeding a session window's state (issue 25, item 3): ``ss.state.bootstrap`` writes the
open sessions of a session-window vertex, from the ``session`` rows ``ss.state.read``
gives or ``(key, start, end, accumulator)`` tuples, in the form the session processor
restores (each key's sessions under the key, on the processor that owns it, and a
watermark of "none yet"). A job restored from that store emits exactly what the job
whose sessions were read emits when restored from its own store, and both are the
sessions of one uninterrupted run that were still open at the snapshot."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting
from slipstream.core.partition import key_routing
from slipstream.core.time import NO_WATERMARK
from slipstream.state.reader import StateRow
from slipstream.window import KeyedWindowResult, session_window_def
from store_support import run_restored, run_until_snapshots

TIMEOUT = 50


def session_event(seq: int) -> tuple[str, int]:
    """``(user, timestamp)``: per user an event every 30 ms and a 130 ms gap every 20
    sequence numbers, so each 50 ms session holds several events."""
    return ("abc"[seq % 3], seq * 10 + (seq // 20) * 100)


def sessions(max_items: int | None, rate: float | None = None) -> ss.Pipeline:
    """Vertices ``events`` (the generator), ``with_timestamps``, ``window`` (the
    sessions: a count per session) and ``sink``."""
    p = ss.Pipeline()
    p.read_from(sources.generator(session_event, rate, max_items=max_items)).set_name(
        "events"
    ).with_timestamps(operator.itemgetter(1), 0).group_by(operator.itemgetter(0)).window(
        session_window_def(TIMEOUT)
    ).aggregate(counting()).write_to(sinks.list_sink("out"))
    return p


def run(pipeline: ss.Pipeline, store: Path, restore_from: Any) -> list[KeyedWindowResult]:
    return run_restored(pipeline, "sessions", store, restore_from)


def run_and_cancel(store: Path, snapshots: int) -> None:
    run_until_snapshots(sessions(None, rate=4000.0), "sessions", store, snapshots)


def test_session_rows_round_trip(tmp_path: Path) -> None:
    """read -> bootstrap -> restore gives the same sessions as restoring the job's own
    store, at the parallelism the job ran at and seeded at 2 processors."""
    first = tmp_path / "first"
    run_and_cancel(first, 3)
    rows = ss.state.read(first, "window")
    open_sessions = [r for r in rows if r.kind == "session"]
    assert open_sessions, rows
    (wm,) = {r.value for r in rows if r.key == "session_window.current_watermark"}
    assert wm > NO_WATERMARK
    (offset,) = [r for r in ss.state.read(first, "events") if r.kind == "offset"]
    cut = offset.value["next_seq"]
    total = cut + 300

    # every row read (the watermark too) at 1 processor; the sessions only at 2
    seeds = [tmp_path / "seed1", tmp_path / "seed2"]
    for seed, parallelism, given, seeded_wm in (
        (seeds[0], 1, rows, wm),
        (seeds[1], 2, open_sessions, NO_WATERMARK),
    ):
        ss.state.bootstrap(
            sessions(total), "window", given, seed, offsets={"events": cut},
            parallelism=parallelism, job_name="sessions",
        )  # fmt: skip
        back = ss.state.read(seed, "window")
        assert sorted((r.key, r.detail["start"], r.detail["end"], r.value) for r in back if r.kind == "session") == sorted(
            (r.key, r.detail["start"], r.detail["end"], r.value) for r in open_sessions
        )  # fmt: skip
        owner = key_routing(None, 1, parallelism).owner
        assert all(r.processor == owner(r.key) for r in back if r.kind == "session")
        assert {(r.processor, r.value) for r in back if r.kind == "broadcast"} == {
            (i, seeded_wm) for i in range(parallelism)
        }

    own = run(sessions(total), tmp_path / "own", restore_from=first)
    whole = ss.local()
    whole.new_job(sessions(total)).join(120)
    # the sessions still open at the snapshot (end >= its watermark) and those after it
    expected = sorted(r for r in whole.get_list("out") if r.end >= wm)
    assert own == expected
    for seed in seeds:
        assert run(sessions(total), tmp_path / f"live-{seed.name}", restore_from=seed) == own


def test_session_tuples_are_seeded(tmp_path: Path) -> None:
    """``(key, start, end, accumulator)`` tuples: a key's sessions given out of order are
    kept sorted by start; the live events extend the seeded session and the rest close."""
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        sessions(0), "window", [("a", 200, 260, 4), ("a", 100, 150, 2), ("b", 100, 150, 1)], seed
    )
    p = ss.Pipeline()
    p.read_from(sources.items([("a", 240), ("c", 500)])).set_name("events").with_timestamps(
        operator.itemgetter(1), 0
    ).group_by(operator.itemgetter(0)).window(session_window_def(TIMEOUT)).aggregate(
        counting()
    ).write_to(sinks.list_sink("out"))
    # the same shape as sessions(): vertex names and edges
    out = run(p, tmp_path / "live", restore_from=seed)
    assert out == sorted(
        [
            KeyedWindowResult(100, 150, "a", 2),
            KeyedWindowResult(200, 290, "a", 5),
            KeyedWindowResult(100, 150, "b", 1),
            KeyedWindowResult(500, 550, "c", 1),
        ]
    )


def test_session_rows_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    p = sessions(0)
    with pytest.raises(
        ValueError,
        match=r"row 0 \(\('a', 1\)\) is not a \(key, start, end, accumulator\) tuple or a "
        r"session StateRow",
    ):
        ss.state.bootstrap(p, "window", [("a", 1)], seed)
    with pytest.raises(
        ValueError,
        match=r"row 0 \(\('a', 10, 10, 1\)\): a session's start 10 is not before its end 10",
    ):
        ss.state.bootstrap(p, "window", [("a", 10, 10, 1)], seed)
    with pytest.raises(
        ValueError,
        match=r"row 1: session \[40, 90\) of key 'a' overlaps session \[0, 50\) in row 0",
    ):
        ss.state.bootstrap(p, "window", [("a", 0, 50, 1), ("a", 40, 90, 1), ("b", 40, 90, 1)], seed)
    keyed = StateRow("window", 0, "a", None, 3, "keyed")
    with pytest.raises(
        ValueError,
        match=r"row 0 .* is 'keyed' state with detail None; session window vertex 'window' "
        r"keeps sessions",
    ):
        ss.state.bootstrap(p, "window", [keyed], seed)
    with pytest.raises(TypeError, match=r"row 0 .*: its key is unhashable"):
        ss.state.bootstrap(p, "window", [(["a"], 0, 50, 1)], seed)
    assert not seed.exists() or not any(n.endswith(".bin") for n in os.listdir(seed))
