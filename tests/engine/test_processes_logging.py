"""What member processes log reaches the coordinator's logging (``ss.local(processes=N)``):
a ``logger()`` sink's items at INFO, the engine's warnings (items set aside by
``on_item_error``), with the member named in the record's ``processName``, filtered by the
levels the coordinator's loggers had when the job started."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources

GUARD_S = 120


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
    skipped = [r for r in caplog.records if "on which user code raised" in r.getMessage()]
    assert skipped and all(r.levelno == logging.WARNING for r in skipped)
    said = " ".join(r.getMessage() for r in skipped)
    assert "item 'oops'" in said and "item 'c,x'" in said


@pytest.mark.timeout(GUARD_S)
def test_a_level_the_coordinator_filters_out_is_not_sent(caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    p = ss.Pipeline()
    p.read_from(sources.items(list(range(10)))).write_to(sinks.logger())
    engine = ss.local(processes=2)
    engine.new_job(p).join(timeout=GUARD_S)
    assert [r for r in caplog.records if r.name.startswith("slipstream.sink")] == []
