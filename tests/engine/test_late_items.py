"""Late items are never dropped silently (issue 21, item 1).

The issue's case: a CSV whose rows are up to 1.5 s out of order, windowed with
``allowed_lag_ms=100``. On main the job exited cleanly and 6 % of the rows were gone;
only ``job.metrics["window"]["late_items_dropped"]`` said so. Now a batch job (every
source bounded) holds its watermarks until the input ends and keeps every row: the
result is the result of the sorted file. A job whose watermarks flow (a streaming job,
or ``batch_watermarks=True``) drops late items as before, and says so in a WARNING at
the first drop and at its end."""

from __future__ import annotations

import csv
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting
from slipstream.window import KeyedWindowResult, tumbling_window_def

N = 5000
FIX = (
    "they arrived behind the watermark. To keep them, allow more lag: allowed_lag_ms in "
    "with_timestamps() (Core API: the lag of the watermark policy given to "
    "P.insert_watermarks)"
)


def write_events(directory: Path, ordered: bool) -> list[tuple[str, int]]:
    rng = random.Random(21)
    rows = [(f"k{i % 5}", 1_000_000 + i * 10 + rng.randint(0, 1500)) for i in range(N)]
    if ordered:
        rows.sort(key=lambda r: r[1])
    directory.mkdir()
    with open(directory / "events.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["key", "ts"])
        w.writerows(rows)
    return rows


def ts_of(row: dict[str, str]) -> int:
    return int(row["ts"])


def key_of(row: dict[str, str]) -> str:
    return row["key"]


def windows(directory: Path, config: ss.JobConfig) -> tuple[list[Any], ss.Job]:
    p = ss.Pipeline()
    (
        p.read_from(sources.read_csv(directory))
        .with_timestamps(ts_of, allowed_lag_ms=100)
        .group_by(key_of)
        .window(tumbling_window_def(10_000))
        .aggregate(counting())
        .write_to(sinks.list_sink("out"))
    )
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(p, config)
    job.join(60)
    return sorted(engine.get_list("out")), job


def late_count(job: ss.Job) -> tuple[str, int]:
    """The window vertex that dropped items (its name depends on the compiled shape) and
    its count; ``("", 0)`` when none did."""
    counts = [(n, m.get("late_items_dropped", 0)) for n, m in job.metrics.items()]
    dropped = [(n, c) for n, c in counts if c]
    assert len(dropped) <= 1, dropped
    return dropped[0] if dropped else ("", 0)


def late_warnings(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if "late item" in r.getMessage()]


def test_a_batch_job_keeps_late_rows_as_if_the_file_were_sorted(
    tmp_path: Path, caplog: Any
) -> None:
    rows = write_events(tmp_path / "shuffled", ordered=False)
    write_events(tmp_path / "sorted", ordered=True)
    with caplog.at_level(logging.WARNING):
        got, job = windows(tmp_path / "shuffled", ss.JobConfig(name="csv"))
    assert late_count(job)[1] == 0
    oracle = Counter((t - t % 10_000, k) for k, t in rows)
    assert got == sorted(KeyedWindowResult(s, s + 10_000, k, n) for (s, k), n in oracle.items())
    assert got == windows(tmp_path / "sorted", ss.JobConfig(name="csv"))[0]
    assert late_warnings(caplog) == []


def test_flowing_watermarks_drop_late_rows_and_say_so(tmp_path: Path, caplog: Any) -> None:
    write_events(tmp_path / "shuffled", ordered=False)
    with caplog.at_level(logging.WARNING):
        got, job = windows(tmp_path / "shuffled", ss.JobConfig(name="csv", batch_watermarks=True))
    vertex, late = late_count(job)
    assert late > 0 and sum(r.value for r in got) == N - late
    lines = late_warnings(caplog)
    assert lines[0].startswith("job 'csv' dropped ") and " so far " in lines[0]
    assert lines[-1] == (
        f"job 'csv' dropped {late} late items in all (vertex {vertex!r}: {late}): {FIX}, "
        "or leave JobConfig(batch_watermarks=False) in this batch job. See "
        "docs/troubleshooting.md"
    )


class Disordered:
    """``fn(seq)`` of a generator: (key, ts) with up to 1.5 s of disorder (picklable)."""

    def __call__(self, seq: int) -> tuple[int, int]:
        return (seq % 3, 10 * seq + (seq * 7919) % 1500)


def test_a_streaming_job_warns_at_the_first_drop_and_at_its_end(caplog: Any) -> None:
    p = ss.Pipeline()
    (
        p.read_from(sources.generator(Disordered(), None, max_items=N))
        .with_timestamps(lambda e: e[1], allowed_lag_ms=100)
        .group_by(lambda e: e[0])
        .window(tumbling_window_def(1000))
        .aggregate(counting())
        .write_to(sinks.list_sink("out"))
    )
    engine = ss.local()
    with caplog.at_level(logging.WARNING):
        job = engine.new_job(p, ss.JobConfig(name="ticks"))
        job.join(60)
    vertex, late = late_count(job)
    assert late > 0 and sum(r.value for r in engine.get_list("out")) == N - late
    lines = late_warnings(caplog)
    assert lines[0].startswith("job 'ticks' dropped ") and lines[0].endswith(
        "See docs/troubleshooting.md (repeated at most once a minute while items come late)"
    )
    assert lines[-1] == (
        f"job 'ticks' dropped {late} late items in all (vertex {vertex!r}: {late}): {FIX}. "
        "See docs/troubleshooting.md"
    )
