"""The late-item warning's rate limit and text (slipstream.core.late_items): the first
drop at once, then at most once a minute with the running count, the total at the end."""

from __future__ import annotations

import logging
from typing import Any

from slipstream.core.late_items import LATE_METRIC, LateItemsReport

FIX = (
    "they arrived behind the watermark. To keep them, allow more lag: allowed_lag_ms in "
    "with_timestamps() (Core API: the lag of the watermark policy given to "
    "P.insert_watermarks). See docs/troubleshooting.md"
)
REPEAT = " (repeated at most once a minute while items come late)"


def test_first_drop_then_once_a_minute_then_the_total(caplog: Any) -> None:
    now = [100.0]
    report = LateItemsReport("trades", logging.getLogger("t"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        report.on_metric("window", "items_in", 5)  # other metrics are not late items
        report.on_metric("window", LATE_METRIC, 3)
        now[0] += 59.0
        report.on_metric("window", LATE_METRIC, 4)  # within the minute: counted only
        now[0] += 1.0
        report.on_metric("sessions", LATE_METRIC, 1)
        report.finish()
    assert [r.getMessage() for r in caplog.records] == [
        f"job 'trades' dropped 3 late items so far (vertex 'window': 3): {FIX}{REPEAT}",
        "job 'trades' dropped 8 late items so far (vertex 'sessions': 1, vertex 'window': 7): "
        f"{FIX}{REPEAT}",
        "job 'trades' dropped 8 late items in all (vertex 'sessions': 1, vertex 'window': 7): "
        f"{FIX}",
    ]
    assert report.counts == {"window": 7, "sessions": 1}


def test_nothing_dropped_nothing_said(caplog: Any) -> None:
    report = LateItemsReport("quiet", logging.getLogger("t"))
    with caplog.at_level(logging.WARNING):
        report.on_metric("window", LATE_METRIC, 0)
        report.finish()
    assert caplog.records == []


def test_a_batch_job_that_let_watermarks_flow_is_told_the_default_keeps_all(
    caplog: Any,
) -> None:
    report = LateItemsReport("csv", logging.getLogger("t"), batch=True)
    report.add("window", 1, warn=False)
    with caplog.at_level(logging.WARNING):
        report.finish()
    assert [r.getMessage() for r in caplog.records] == [
        "job 'csv' dropped 1 late item in all (vertex 'window': 1): they arrived behind the "
        "watermark. To keep them, allow more lag: allowed_lag_ms in with_timestamps() (Core "
        "API: the lag of the watermark policy given to P.insert_watermarks), or leave "
        "JobConfig(batch_watermarks=False) in this batch job. See docs/troubleshooting.md"
    ]
