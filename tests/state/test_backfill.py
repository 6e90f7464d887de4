"""``ss.state.backfill`` on the embedded engine (issue 25, item 4; the Spark leg is in
tests/spark/test_spark_backfill.py): the streaming job's Pipeline built over history
files runs as a batch job whose stateful vertices save their state at the end of the
input instead of completing; the same Pipeline over a generator restores that snapshot
(``restore_from=``) and continues from the generator's offset where the history ends.
The history's output plus the live job's equals one uninterrupted run, for a rolling
count (at parallelism 2 restored at 3) and a tumbling window (whose open frames carry
over). A backfill whose state cannot carry over (a stateful vertex renamed, run by
another processor, or missing) is refused naming the vertex, and nothing is written."""

from __future__ import annotations

import operator
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting, summing
from slipstream.core.errors import SnapshotError
from slipstream.window import KeyedWindowResult, tumbling_window_def

TOTAL, CUT = 500, 330
WINDOW = 100


def line(seq: int) -> str:
    return f"k{seq % 7},{seq * 10},{seq % 5}"


def parse(text: str) -> tuple[str, int, int]:
    k, t, v = text.split(",")
    return k, int(t), int(v)


def rolling(source: Any, sink: Any, parallelism: int = -1) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(source).set_name("events").map(parse).group_by(
        operator.itemgetter(0)
    ).rolling_aggregate(counting()).set_local_parallelism(parallelism).write_to(sink)
    return p


def windowed(source: Any, sink: Any, parallelism: int = -1) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(source).set_name("events").map(parse).with_timestamps(
        operator.itemgetter(1), 0
    ).group_by(operator.itemgetter(0)).window(tumbling_window_def(WINDOW)).aggregate(
        summing(operator.itemgetter(2))
    ).set_local_parallelism(parallelism).write_to(sink)
    return p


def history_files(tmp_path: Path) -> Path:
    d = tmp_path / "history"
    d.mkdir()
    for n, lo in enumerate(range(0, CUT, 120)):
        (d / f"part-{n}.txt").write_text(
            "".join(line(s) + "\n" for s in range(lo, min(CUT, lo + 120)))
        )
    return d


def generator() -> Any:
    return sources.generator(line, None, max_items=TOTAL)


def flow(
    build: Callable[..., ss.Pipeline], tmp_path: Path, history_lp: int, live_lp: int
) -> tuple[list[Any], list[Any], list[Any], ss.state.Backfill]:
    """(history output, live output, uninterrupted output, the backfill)."""
    engine = ss.local()
    result = ss.state.backfill(
        build(sources.read_files(history_files(tmp_path)), sinks.list_sink("hist"), history_lp),
        build(generator(), sinks.list_sink("live"), live_lp),
        tmp_path / "seed",
        engine=engine,
        offsets={"events": CUT},
    )
    live = ss.local()
    config = JobConfig(
        name="live", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_store=tmp_path / "live",
    )  # fmt: skip
    live.new_job(
        build(generator(), sinks.list_sink("live"), live_lp), config, restore_from=tmp_path / "seed"
    ).join(120)
    whole = ss.local()
    whole.new_job(build(generator(), sinks.list_sink("whole"))).join(120)
    return (
        list(engine.get_list("hist")),
        list(live.get_list("live")),
        list(whole.get_list("whole")),
        result,
    )


def test_rolling_count_backfilled_continues_live(tmp_path: Path) -> None:
    hist, live, whole, result = flow(rolling, tmp_path, 2, 3)
    assert result.snapshot_id == 1 and result.entries == {"rolling_aggregate": 7}
    assert {r.processor for r in ss.state.read(tmp_path / "seed", "rolling_aggregate")} == {0, 1}
    assert len(hist) == CUT and len(live) == TOTAL - CUT  # nothing before the cutoff again
    assert Counter(hist) + Counter(live) == Counter(whole)
    assert result.job.status.name == "COMPLETED"


def test_tumbling_window_backfilled_continues_live(tmp_path: Path) -> None:
    """The batch job sees no watermark: it emits no window and the snapshot carries
    every frame of the history (the cutoff at t=3300 is inside no window, t=3290 is
    the end of the history), which the live job emits as its watermark passes them."""
    hist, live, whole, result = flow(windowed, tmp_path, 2, 1)
    sums: Counter[tuple[int, str]] = Counter()
    for k, t, v in map(parse, map(line, range(TOTAL))):
        sums[(t - t % WINDOW, k)] += v
    expected = Counter(KeyedWindowResult(s, s + WINDOW, k, v) for (s, k), v in sums.items())
    assert hist == []
    assert Counter(whole) == expected
    assert Counter(live) == expected
    frames = [r for r in ss.state.read(tmp_path / "seed", "window-combine") if r.kind == "window"]
    assert (
        len(frames)
        == result.entries["window-combine"]
        == len({(s, k) for s, k in sums if s < CUT * 10})
    )


def test_batch_watermarks_emit_the_closed_windows_over_history(tmp_path: Path) -> None:
    """With ``batch_watermarks=True`` the batch job emits the windows its watermark
    closed (one history file, in order) and the snapshot keeps only the open ones: the
    live job emits the rest, none twice."""
    d = tmp_path / "one"
    d.mkdir()
    (d / "all.txt").write_text("".join(line(s) + "\n" for s in range(CUT)))
    engine = ss.local()
    ss.state.backfill(
        windowed(sources.read_files(d), sinks.list_sink("hist")),
        windowed(generator(), sinks.list_sink("live")),
        tmp_path / "seed",
        engine=engine,
        offsets={"events": CUT},
        config=JobConfig(batch_watermarks=True),
    )
    hist = list(engine.get_list("hist"))
    assert hist and max(r.end for r in hist) == 3200  # the watermark at 3290 closed them
    assert {r.detail["frame_end"] for r in ss.state.read(tmp_path / "seed", "window-combine")
            if r.kind == "window"} == {3300}  # fmt: skip
    live = ss.local()
    live.new_job(
        windowed(generator(), sinks.list_sink("live")), restore_from=tmp_path / "seed"
    ).join(120)
    whole = ss.local()
    whole.new_job(windowed(generator(), sinks.list_sink("whole"))).join(120)
    assert Counter(hist) + Counter(live.get_list("live")) == Counter(whole.get_list("whole"))


def test_state_that_cannot_carry_over_is_refused_naming_the_vertex(tmp_path: Path) -> None:
    files = history_files(tmp_path)
    engine = ss.local()

    def renamed(source: Any, sink: Any) -> ss.Pipeline:
        p = ss.Pipeline()
        p.read_from(source).set_name("events").map(parse).group_by(
            operator.itemgetter(0)
        ).rolling_aggregate(counting()).set_name("counts").write_to(sink)
        return p

    live = rolling(generator(), sinks.noop())
    with pytest.raises(
        ValueError,
        match=r"vertex 'counts' of the backfill job holds state but the live job has no "
        r"vertex 'counts' \(its vertices: 'events', 'map', 'rolling_aggregate', 'sink'\); "
        r"build both jobs with the same Pipeline code",
    ):
        ss.state.backfill(renamed(sources.read_files(files), sinks.noop()), live,
                          tmp_path / "a", engine=engine)  # fmt: skip

    custom = DAG()
    src = custom.new_vertex("events", sources.read_files(files))
    agg = custom.new_vertex("rolling_aggregate", P.aggregate_by_key(lambda x: x, counting()))
    out = custom.new_vertex("sink", sinks.noop())
    custom.edge(Edge.between(src, agg).partitioned(lambda x: x))
    custom.edge(Edge.between(agg, out))
    with pytest.raises(
        ValueError,
        match=r"vertex 'rolling_aggregate' runs slipstream\.processors\.aggregation\.GroupByKeyP "
        r"in the backfill job but slipstream\.pipeline\.keyed\.MapStatefulP in the live job",
    ):
        ss.state.backfill(custom, live, tmp_path / "b", engine=engine)
    assert (
        custom.vertex("rolling_aggregate").meta_supplier.__class__.__name__ != "_DumpMetaSupplier"
    )
    stateless = ss.Pipeline()
    stateless.read_from(sources.read_files(files)).set_name("events").map(parse).write_to(
        sinks.noop()
    )
    with pytest.raises(
        ValueError,
        match=r"vertex 'rolling_aggregate' of the live job keeps state \(MapStatefulP\) but "
        r"the backfill job has no vertex 'rolling_aggregate'",
    ):
        ss.state.backfill(stateless, live, tmp_path / "c", engine=engine)
    # a window stage with a parallelism of its own is not fused with the stages before
    # it: the same code with another set_local_parallelism compiles to other vertices
    with pytest.raises(
        ValueError,
        match=r"vertex 'map\+with_timestamps' of the backfill job holds state but the live "
        r"job has no vertex 'map\+with_timestamps' \(its vertices: 'events', "
        r"'map\+with_timestamps\+window-accumulate', 'sink', 'window-combine'\).*"
        r"\(a stage with a parallelism of its own is not fused into the next one\)",
    ):
        ss.state.backfill(
            windowed(sources.read_files(files), sinks.noop(), 1), windowed(generator(), sinks.noop()),
            tmp_path / "d", engine=engine,
        )  # fmt: skip
    for d in ("a", "b", "c", "d"):
        assert not (tmp_path / d).exists() or not any(
            n.endswith(".bin") for n in os.listdir(tmp_path / d)
        )


def test_a_store_with_snapshots_and_bad_offsets_are_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    files = history_files(tmp_path)
    engine = ss.local()
    ss.state.backfill(
        rolling(sources.read_files(files), sinks.noop()), rolling(generator(), sinks.noop()),
        tmp_path / "seed", engine=engine,
    )  # fmt: skip
    ran = len(engine.jobs)
    with pytest.raises(SnapshotError, match=r"already holds snapshots; a backfill writes"):
        ss.state.backfill(
            rolling(sources.read_files(files), sinks.noop()), rolling(generator(), sinks.noop()),
            tmp_path / "seed", engine=engine,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"offsets\['events'\]: a generator's offset is the"):
        ss.state.backfill(
            rolling(sources.read_files(files), sinks.noop()), rolling(generator(), sinks.noop()),
            tmp_path / "other", engine=engine, offsets={"events": -1},
        )  # fmt: skip
    assert len(engine.jobs) == ran
