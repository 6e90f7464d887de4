"""What member processes log reaches the coordinator's logging (``ss.local(processes=N)``):
a ``logger()`` sink's items at INFO, the engine's warnings (items set aside by
``on_item_error``), with the member named in the record's ``processName``, filtered by the
levels the coordinator's loggers had when the job started."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import slipstream as ss
from process_support import functions_by_value
from slipstream import sinks, sources

GUARD_S = 120


@pytest.fixture(autouse=True, scope="module")
def _by_value() -> Iterator[None]:
    """This module's functions travel to the members by value, so a member does not
    import it (and pytest with it) at every job."""
    with functions_by_value(sys.modules[__name__]):
        yield


def parse(line: str) -> tuple[str, int]:
    key, value = line.split(",")
    return key, int(value)


@pytest.mark.timeout(GUARD_S)
def test_member_log_records_reach_the_coordinators_handlers(caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    p = ss.Pipeline()
    src = p.read_from(sources.items([f"k{i},{i}" for i in range(40)] + ["oops", "c,x"]))
    src.map(parse).write_to(sinks.logger())
    engine = ss.local(processes=2)
    job = engine.new_job(p, ss.JobConfig(name="logged", on_item_error="skip"))
    job.join(timeout=GUARD_S)
    items = [r for r in caplog.records if r.name.startswith("slipstream.sink")]
    assert sorted(r.getMessage() for r in items) == sorted(str((f"k{i}", i)) for i in range(40))
    assert all(r.levelno == logging.INFO for r in items)
    pids = {p.pid for p in job._execution._procs}
    assert {r.processName for r in items} <= {"member0", "member1"}
    assert {r.process for r in items} <= pids
    # one job-wide report, as with one process: the first item at once, the total at
    # the end (on main each member warned about its own, with its own counts)
    skipped = [r.getMessage() for r in caplog.records if "on which user code raised" in r.getMessage()]
    oops = "item 'oops': ValueError: not enough values to unpack (expected 2, got 1)"
    cx = "item 'c,x': ValueError: invalid literal for int() with base 10: 'x'"
    head = "job 'logged' skipped {} on which user code raised {} (vertex 'map': {}); the last: vertex 'map', {}. See docs/troubleshooting.md"
    first = {head.format("1 item", "so far", 1, last) + " (repeated at most once a minute while items fail)" for last in (oops, cx)}
    final = {head.format("2 items", "in all", 2, last) for last in (oops, cx)}
    assert len(skipped) == 2 and skipped[0] in first and skipped[1] in final, skipped


@pytest.mark.timeout(GUARD_S)
def test_a_level_the_coordinator_filters_out_is_not_sent(caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    p = ss.Pipeline()
    p.read_from(sources.items(list(range(10)))).write_to(sinks.logger())
    engine = ss.local(processes=2)
    engine.new_job(p).join(timeout=GUARD_S)
    assert [r for r in caplog.records if r.name.startswith("slipstream.sink")] == []


def late_event(seq: int) -> tuple[int, int]:
    """In order, except two of every 10 events (one of each generator processor), 1000
    time units behind."""
    return (seq * 10 - (1000 if seq % 10 in (8, 9) else 0), seq % 3)


@pytest.mark.timeout(GUARD_S)
def test_late_items_of_all_members_are_one_jobs_warnings(caplog: Any) -> None:
    from slipstream.aggregate import counting
    from slipstream.core.late_items import late_items_message
    from slipstream.window import tumbling_window_def

    caplog.set_level(logging.WARNING)
    p = ss.Pipeline()
    (
        p.read_from(sources.generator(late_event, None, max_items=3000))
        .with_timestamps(lambda e: e[0], 0)
        .group_by(lambda e: e[1])
        .window(tumbling_window_def(50))
        .aggregate(counting())
        .write_to(sinks.noop())
    )
    engine = ss.local(processes=2)
    job = engine.new_job(p, ss.JobConfig(name="late"))
    job.join(timeout=GUARD_S)
    vertex = "with_timestamps+window-accumulate"
    dropped = job.metrics[vertex]["late_items_dropped"]
    assert dropped > 0
    late = [r.getMessage() for r in caplog.records if "late item" in r.getMessage()]
    assert late[-1] == late_items_message("late", {vertex: dropped}, True, False)
    assert len(late) == 2 and "so far" in late[0]


def shout(x: int) -> None:
    print(f"peeked {x}")


@pytest.mark.timeout(GUARD_S)
def test_what_members_print_reaches_the_coordinators_sys_stdout_and_stderr() -> None:
    """A ``peek()``, a ``stdout()`` sink and a print to stderr in member processes land
    in the streams the user's process has now, here replaced with
    ``contextlib.redirect_stdout``/``redirect_stderr`` (on main they went past them, to
    descriptor 1 and 2)."""
    import contextlib
    import io

    def to_stderr(x: int) -> int:
        import sys

        print(f"err {x}", file=sys.stderr)
        return x

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        p = ss.Pipeline()
        (
            p.read_from(sources.items(list(range(30))))
            .peek(shout)
            .map(to_stderr)
            .write_to(sinks.stdout(lambda x: f"sunk {x}"))
        )
        ss.local(processes=2).new_job(p).join(timeout=GUARD_S)
    expected = [f"peeked {i}" for i in range(30)] + [f"sunk {i}" for i in range(30)]
    assert sorted(out.getvalue().splitlines()) == sorted(expected)
    assert sorted(err.getvalue().splitlines()) == sorted(f"err {i}" for i in range(30))
