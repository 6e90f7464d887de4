"""CommitRetry: a sink's idempotent server call retried through transient errors with
bounded back-off, within the outage budget, said at the first failure (log, context,
metric), then a failure naming the call, the server and the cause. A fake clock: no
sleeps, no timing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from slipstream.core.errors import SinkUnavailableError
from slipstream.core.processor import Context
from slipstream.core.retry import CommitRetry, transient_connection_error


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class OperationalError(Exception):
    """Named as the DB-API class a lost connection raises."""


def _retry(clock: Clock, budget: float = 10.0, **kw: Any) -> tuple[CommitRetry, Context]:
    ctx = Context(vertex_name="db", global_processor_index=1)
    ctx.sink_outage_timeout = budget
    return CommitRetry(ctx, "COMMIT PREPARED", "PostgreSQL at 127.0.0.1:5432", clock=clock, **kw), ctx


def _refused() -> None:
    raise OperationalError("connection refused")


def test_transient_errors_are_retried_with_doubling_back_off_until_the_budget() -> None:
    clock = Clock()
    resets: list[int] = []
    retry, ctx = _retry(clock, budget=3.0, reset=lambda: resets.append(1))
    tries: list[float] = []

    def call() -> None:
        tries.append(clock.now - 1000.0)
        _refused()

    with pytest.raises(SinkUnavailableError) as ei:
        for _ in range(100):
            assert not retry.attempt(call)
            assert not retry.attempt(call)  # within the back-off: not tried
            clock.now = retry.next_try
    # 0.1, 0.2, 0.4, 0.8, 1.6 s apart, the last one at the budget (3 s after the first)
    assert [round(t, 2) for t in tries] == [0.0, 0.1, 0.3, 0.7, 1.5, 3.0]
    assert len(resets) == 6
    assert str(ei.value) == (
        "COMMIT PREPARED to PostgreSQL at 127.0.0.1:5432 failed for 3.0 s, 6 attempts "
        "(JobConfig.sink_outage_timeout=3 s): OperationalError: connection refused"
    )
    assert isinstance(ei.value.__cause__, OperationalError)
    assert ctx.metrics["commit_retries"] == 6


def test_the_back_off_is_bounded() -> None:
    clock = Clock()
    retry, _ctx = _retry(clock, budget=1000.0)
    tries: list[float] = []

    def call() -> None:
        tries.append(clock.now)
        _refused()

    while len(tries) < 12:
        retry.attempt(call)
        clock.now = retry.next_try
    gaps = [round(b - a, 2) for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0, 5.0]


def test_first_failure_warns_names_sink_server_cause_and_recovery_clears_it(caplog: Any) -> None:
    clock = Clock()
    retry, ctx = _retry(clock, budget=120.0)
    caplog.set_level(logging.WARNING, logger="slipstream.sinks")
    assert not retry.attempt(_refused)
    (first,) = [r.getMessage() for r in caplog.records]
    assert first == (
        "vertex 'db', processor 1: COMMIT PREPARED to PostgreSQL at 127.0.0.1:5432 failed: "
        "OperationalError: connection refused; retrying for up to 120 s "
        "(JobConfig.sink_outage_timeout), 1 attempt(s) failed so far"
    )
    assert ctx.warning is not None and "PostgreSQL at 127.0.0.1:5432" in ctx.warning
    assert ctx.unavailable_since is not None
    assert not retry.attempt(_refused)  # in the back-off: not even tried
    clock.now += 0.1
    assert not retry.attempt(_refused)  # tried, failed: no second WARNING within 30 s
    assert len(caplog.records) == 1
    clock.now += 0.2
    assert retry.attempt(lambda: None)
    assert ctx.warning is None and ctx.unavailable_since is None
    assert caplog.records[-1].getMessage() == (
        "vertex 'db', processor 1: COMMIT PREPARED to PostgreSQL at 127.0.0.1:5432 succeeded "
        "again after 0.3 s (2 failed attempt(s))"
    )


def test_other_errors_are_not_retried() -> None:
    retry, ctx = _retry(Clock())

    def bad() -> None:
        raise ValueError("invalid input syntax for type integer")

    with pytest.raises(ValueError, match="invalid input syntax"):
        retry.attempt(bad)
    assert "commit_retries" not in ctx.metrics and ctx.warning is None


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (OperationalError("server closed the connection"), True),
        (ConnectionResetError(104, "reset"), True),
        (TimeoutError("timed out"), True),
        (OSError(113, "No route to host"), True),
        (ValueError("bad row"), False),
        (KeyError("k"), False),
    ],
)
def test_transient_connection_errors(error: BaseException, transient: bool) -> None:
    assert transient_connection_error(error) is transient
