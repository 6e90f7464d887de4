"""The read round trip of a window job (issue 25, "Done when"): the rows ``ss.state.read``
gives for a sliding or tumbling window's last stage (its frames and its emission
cursor), bootstrapped into a new store with the generator's offset, restore to exactly
the windows the job emits when restored from its own store: those of one uninterrupted
run that end at or after the cursor. Without the cursor rows the first watermark emits
every window of the frames (what bootstrap documents for frames alone)."""

from __future__ import annotations

import operator
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting
from slipstream.core.time import NO_WATERMARK
from slipstream.state import StateRow
from slipstream.window import KeyedWindowResult, sliding_window_def, tumbling_window_def
from store_support import run_restored, run_until_snapshots

DEFS = {
    "sliding": sliding_window_def(1000, 250),
    "tumbling": tumbling_window_def(500),
}


def timed_event(seq: int) -> tuple[str, int]:
    return ("abc"[seq % 3 if seq % 4 else 0], seq * 7)


def windowed(kind: str, max_items: int | None, rate: float | None = None) -> ss.Pipeline:
    """Vertices ``events``, ``with_timestamps``, ``window-accumulate``,
    ``window-combine`` (the frames and the cursor) and ``sink``."""
    p = ss.Pipeline()
    p.read_from(sources.generator(timed_event, rate, max_items=max_items)).set_name(
        "events"
    ).with_timestamps(operator.itemgetter(1), 0).group_by(operator.itemgetter(0)).window(
        DEFS[kind]
    ).aggregate(counting()).write_to(sinks.list_sink("out"))
    return p


def open_windows(kind: str, cut: int, cursor: int) -> list[tuple[Any, int, int, int]]:
    """A plain-Python oracle: ``(key, start, end, count)`` of every window not emitted
    yet (ending at or after ``cursor``) over the events ``0 .. cut - 1`` a snapshot
    covers."""
    wd = DEFS[kind]
    counts: Counter[tuple[Any, int]] = Counter()
    for key, ts in map(timed_event, range(cut)):
        end = ts - ts % wd.frame_size + wd.frame_size  # the frame's end (offset 0)
        for e in range(end, end + wd.window_size - wd.frame_size + 1, wd.frame_size):
            if e >= cursor:
                counts[(key, e)] += 1
    return sorted((k, e - wd.window_size, e, c) for (k, e), c in counts.items())


def windows_of(rows: list[Any]) -> list[tuple[Any, int, int, Any]]:
    return sorted(
        (r.key, r.detail["start"], r.detail["end"], r.value) for r in rows if r.kind == "window"
    )


def run(pipeline: ss.Pipeline, store: Path, restore_from: Any) -> list[KeyedWindowResult]:
    return run_restored(pipeline, "windows", store, restore_from)


@pytest.mark.parametrize("kind", ["sliding", "tumbling"])
def test_window_rows_round_trip(kind: str, tmp_path: Path) -> None:
    first = tmp_path / "first"
    run_until_snapshots(windowed(kind, None, rate=4000.0), "windows", first, 3)
    rows = ss.state.read(first, "window-combine")
    frames = [r for r in rows if r.kind == "window"]
    assert frames, rows
    (cursor,) = {r.value for r in rows if r.key == "window.next_win_to_emit"}
    assert cursor > NO_WATERMARK
    (offset,) = [r for r in ss.state.read(first, "events") if r.kind == "offset"]
    cut = offset.value["next_seq"]
    total = cut + 400
    # the rows are the windows a job would still emit (their accumulators), read with the
    # job's DAG; without it a sliding window's frames are rows of their own
    wanted = open_windows(kind, cut, cursor)
    assert windows_of(ss.state.read(first, "window-combine", dag=windowed(kind, None))) == wanted
    table = ss.state.read_arrow(first, "window-combine", dag=windowed(kind, None))
    assert windows_of([StateRow(*r.values()) for r in table.to_pylist()]) == wanted
    if kind == "tumbling":
        assert windows_of(rows) == wanted
        assert all(r.detail["frame_end"] == r.detail["end"] for r in frames)
    else:
        # a job's point query (the dashboard's key search) combines with the job's DAG
        from types import SimpleNamespace

        from slipstream.state.reader import point_query
        from slipstream.state.store import DirectorySnapshotStore

        job = SimpleNamespace(name="windows", store=DirectorySnapshotStore(str(first)))
        job.dag = windowed(kind, None).to_dag()
        assert windows_of(point_query(job, "window-combine")[1]) == wanted
        # a window combined from frames does not seed a store: frames do
        combined = ss.state.read(first, "window-combine", dag=job.dag)
        with pytest.raises(ValueError) as e:
            ss.state.bootstrap(job.dag, "window-combine", combined, tmp_path / "no")
        n = next(i for i, r in enumerate(combined) if r.kind == "window")
        assert str(e.value) == (
            f"row {n} ({combined[n]!r}) is one of a sliding window's windows, combined from "
            f"its frames; window vertex 'window-combine' is seeded with frames: read the "
            f"store without dag= (each frame a row with detail 'frame_end')"
        )
        slide = DEFS[kind].frame_size
        assert all(
            r.detail == {"start": r.detail["end"] - slide, "end": r.detail["end"], "frame": True,
                         "frame_end": r.detail["end"]}
            for r in frames
        )  # fmt: skip

    seed = tmp_path / "seed"
    ss.state.bootstrap(windowed(kind, total), "window-combine", rows, seed, offsets={"events": cut})
    back = ss.state.read(seed, "window-combine")
    assert sorted((r.key, r.detail["frame_end"], r.value) for r in back if r.kind == "window") == (
        sorted((r.key, r.detail["frame_end"], r.value) for r in frames)
    )
    assert [(r.key, r.value) for r in back if r.kind == "broadcast"] == [
        ("window.next_win_to_emit", cursor)
    ]
    assert windows_of(ss.state.read(seed, "window-combine", dag=windowed(kind, None))) == wanted

    own = run(windowed(kind, total), tmp_path / "own", restore_from=first)
    whole = ss.local()
    whole.new_job(windowed(kind, total)).join(120)
    assert own == sorted(r for r in whole.get_list("out") if r.end >= cursor)
    assert run(windowed(kind, total), tmp_path / "live", restore_from=seed) == own

    # the frames alone: no window emitted yet, so the first watermark emits every
    # window of them: for a tumbling window those are the unemitted ones; a sliding
    # window also emits again, from the frames it kept, windows that end before the cursor
    frames_only = tmp_path / "frames-only"
    ss.state.bootstrap(
        windowed(kind, total), "window-combine", frames, frames_only, offsets={"events": cut}
    )
    again = run(windowed(kind, total), tmp_path / "again", restore_from=frames_only)
    assert [r for r in again if r.end >= cursor] == own
    if kind == "tumbling":
        assert again == own
    else:
        assert [r for r in again if r.end < cursor]


def test_a_store_without_window_definitions_reads_frames(tmp_path: Path) -> None:
    """A store written before windows saved their definition reads as it always did:
    each frame a row with detail ``{"frame_end": E}`` (no start is known), and bootstrap
    takes those rows."""
    from slipstream.core.dag import as_dag
    from slipstream.state.bootstrap import _write
    from slipstream.state.keys import BroadcastKey, KeyedStateKey
    from slipstream.state.lineage import dag_shape

    dag = as_dag(windowed("sliding", 10))
    old = tmp_path / "old"
    cursor = (BroadcastKey("window.next_win_to_emit"), 500)
    entries = {("window-combine", 0): [(KeyedStateKey("a", 500), 2), cursor]}
    _write(_store(old), "windows", dag_shape(dag), {}, {v.name: 1 for v in dag.vertices}, entries)
    for read_dag in (None, dag):
        rows = ss.state.read(old, "window-combine", dag=read_dag)
        assert [(r.key, r.detail, r.value, r.kind) for r in rows] == [
            ("a", {"frame_end": 500}, 2, "window"),
            ("window.next_win_to_emit", None, 500, "broadcast"),
        ]
    seed = tmp_path / "seed"
    ss.state.bootstrap(dag, "window-combine", rows, seed)
    assert windows_of(ss.state.read(seed, "window-combine", dag=dag)) == [
        ("a", -500, 500, 2), ("a", -250, 750, 2), ("a", 0, 1000, 2), ("a", 250, 1250, 2)
    ]  # fmt: skip


def _store(directory: Path) -> Any:
    from slipstream.state.store import DirectorySnapshotStore

    return DirectorySnapshotStore(str(directory))


def test_a_windows_first_stage_is_refused_naming_it(tmp_path: Path) -> None:
    """A two-stage window's first stage hands its frames to the second at every snapshot:
    there is nothing of it to seed."""
    from slipstream import DAG, Edge
    from slipstream import processors as P

    dag = DAG()
    src = dag.new_vertex("events", sources.items([]))
    acc = dag.new_vertex(
        "frames",
        P.accumulate_by_frame(
            key_fn=operator.itemgetter(0),
            timestamp_fn=operator.itemgetter(1),
            window_def=DEFS["tumbling"],
            agg_op=counting(),
        ),
    )
    dag.edge(Edge.between(src, acc))
    with pytest.raises(ValueError) as e:
        ss.state.bootstrap(dag, "frames", [("a", 500, 1)], tmp_path / "seed")
    assert str(e.value) == (
        "vertex 'frames' keeps window state bootstrap cannot seed (its processor is "
        "slipstream.processors.windows._AccumulateByFrameP); it seeds the frames of a "
        "window's last stage (a two-stage window's '-combine' vertex), a session window's "
        "sessions and keyed vertices whose state is one value per key (a rolling aggregate, "
        "map_stateful, a group-by aggregation)"
    )
    assert not (tmp_path / "seed").exists()
