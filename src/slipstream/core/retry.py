"""Bounded retries of a sink's commits through a server outage (issue 20).

A sink whose server goes away for a few seconds (restarted, fails over, the network is
cut) should ride it out, and a longer outage must end the job loudly instead of freezing
it. :class:`CommitRetry` does that for one sink processor, cooperatively: a callback
(``snapshot_commit_finish``, ``process``, ...) calls :meth:`CommitRetry.attempt` and
returns ``False`` ("call me again") while it waits, so the tasklet stays responsive to
``cancel()``::

    def snapshot_commit_finish(self, success):
        if success and self.prepared.due(self.context):
            return self.retry.attempt(self._commit_due)
        return True

A failed attempt whose error is *transient* (``transient(error)``, e.g. a lost
connection) is retried with exponential back-off (0.1 s doubling to 5 s) until
``context.sink_outage_timeout`` seconds (``JobConfig.sink_outage_timeout``, 120 by
default) have passed since the first failure; then :class:`SinkUnavailableError` names
the sink, the server and the cause. The first failure logs a WARNING at once (and every
30 s while it lasts) and shows in ``context.warning`` / ``context.unavailable_since``,
which ``job.watch()``, ``job.metrics`` and the dashboard read; every failed attempt
counts in the processor's ``commit_retries`` metric. Any other error propagates as it
is. The operation must be idempotent (a retry after a lost answer finds it done).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from slipstream.core.errors import SinkUnavailableError

__all__ = [
    "CommitRetry",
    "transient_connection_error",
    "FIRST_DELAY_S",
    "MAX_DELAY_S",
    "WARN_EVERY_S",
    "SLOW_CALL_S",
]

#: The back-off after the first failed attempt; it doubles with each one...
FIRST_DELAY_S = 0.1
#: ... up to this, so an outage is noticed over within this time after it ends.
MAX_DELAY_S = 5.0
#: While an outage lasts, its WARNING is repeated this often.
WARN_EVERY_S = 30.0
#: A call that has not returned after this long is reported at once (a WARNING and
#: ``context.warning``), before its own timeout makes it a failed attempt: a hung server
#: is said early.
SLOW_CALL_S = 10.0

log = logging.getLogger("slipstream.sinks")


def transient_connection_error(error: BaseException) -> bool:
    """Whether ``error`` says the server or the connection to it failed, not the
    request: DB-API ``OperationalError`` / ``InterfaceError`` (psycopg: lost connection,
    server shutting down, statement timeout, ...), ``ConnectionError``, ``TimeoutError``
    and other socket errors."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    names = {c.__name__ for c in type(error).__mro__}
    if names & {"OperationalError", "InterfaceError"}:
        return True
    return isinstance(error, OSError) and error.errno is not None


class CommitRetry:
    """Retries one sink processor's idempotent server calls within the outage budget.

    ``what`` says what is attempted ("COMMIT PREPARED"), ``server`` where (a string, or a
    callable giving the current description), ``transient`` which errors are worth a
    retry, ``reset`` undoes a failed attempt's half-state (e.g. drops the connection so
    that the next attempt reconnects)."""

    def __init__(
        self,
        context: Any,
        what: str,
        server: str | Callable[[], str],
        transient: Callable[[BaseException], bool] = transient_connection_error,
        *,
        reset: Callable[[], None] | None = None,
        budget_s: float | None = None,
        first_delay_s: float = FIRST_DELAY_S,
        max_delay_s: float = MAX_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.context = context
        self.what = what
        self._server = server
        self.transient = transient
        self.reset = reset
        self._budget_s = budget_s
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.clock = clock
        #: failed attempts of the outage under way (0: none)
        self.failures = 0
        #: ``clock()`` at the first failure of the outage under way
        self.since: float | None = None
        self.next_try = 0.0
        self.last_error: BaseException | None = None
        self._warned_at: float | None = None
        self._slow = False  # a call was reported slow and has not succeeded since
        self.slow_call_s = SLOW_CALL_S

    @property
    def budget_s(self) -> float:
        """Seconds an outage may last (``context.sink_outage_timeout`` by default)."""
        if self._budget_s is not None:
            return self._budget_s
        return float(getattr(self.context, "sink_outage_timeout", 120.0))

    @property
    def server(self) -> str:
        s = self._server
        return s() if callable(s) else s

    def remaining_s(self) -> float:
        """Seconds left of the budget (the whole budget outside an outage): a bound for
        one call's own timeout."""
        if self.since is None:
            return self.budget_s
        return max(0.0, self.since + self.budget_s - self.clock())

    def attempt(
        self,
        fn: Callable[[], Any],
        *,
        timeout: float | None = None,
        interrupt: Callable[[], None] | None = None,
        what: str | None = None,
    ) -> bool:
        """Call ``fn()`` unless the back-off after the last failure still runs (then
        ``False`` at once). ``True`` when it returned; ``False`` when it failed with a
        transient error (retried at a later call); :class:`SinkUnavailableError` once the
        outage outlasted the budget. With ``timeout`` and ``interrupt``, ``interrupt()``
        is called from a timer thread if ``fn`` runs longer than ``timeout`` seconds
        (e.g. it shuts the connection's socket down, so that the blocked call fails
        with a transient error instead of hanging). ``what`` replaces the description of
        the call for this attempt (one retry object per processor and server: an outage
        is one, whichever call met it)."""
        if self.since is not None and self.clock() < self.next_try:
            return False
        if what is not None:
            self.what = what
        started = self.clock()
        timers = [_DEADLINES.add(self.slow_call_s, lambda: self._slow_call(started))]
        if timeout is not None and interrupt is not None:
            timers.append(_DEADLINES.add(timeout, interrupt))
        try:
            fn()
        except Exception as e:
            if not self.transient(e):
                raise
            self._failed(e)
            return False
        finally:
            for t in timers:
                _DEADLINES.cancel(t)
        if self.since is not None or self._slow:
            self._recovered()
        return True

    def _slow_call(self, started: float) -> None:
        """Timer thread: the call under way has not returned for ``slow_call_s``."""
        ctx = self.context
        self._slow = True
        if ctx.unavailable_since is None:
            ctx.unavailable_since = time.monotonic() - (self.clock() - started)
        text = (
            f"vertex {ctx.vertex_name!r}, processor {ctx.global_processor_index}: "
            f"{self.what} to {self.server} has not answered for {self.clock() - started:.0f} s"
        )
        ctx.warning = f"{text} (still waiting; the job fails after sink_outage_timeout={self.budget_s:g} s)"
        now = self.clock()
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s; still waiting (JobConfig.sink_outage_timeout=%g s)", text, self.budget_s)

    def describe(self, error: BaseException) -> str:
        ctx = self.context
        return (
            f"vertex {ctx.vertex_name!r}, processor {ctx.global_processor_index}: "
            f"{self.what} to {self.server} failed: {type(error).__name__}: "
            f"{str(error).strip() or '(no message)'}"
        )

    def _failed(self, error: BaseException) -> None:
        now = self.clock()
        ctx = self.context
        if self.since is None:
            self.since = now
            ctx.unavailable_since = time.monotonic()
        self.failures += 1
        self.last_error = error
        ctx.increment_metric("commit_retries")
        if self.reset is not None:
            try:
                self.reset()
            except Exception:  # noqa: BLE001 - resetting a broken connection
                log.debug("resetting after a failed %s raised", self.what, exc_info=True)
        elapsed = now - self.since
        budget = self.budget_s
        text = self.describe(error)
        if elapsed >= budget:
            raise SinkUnavailableError(
                f"{self.what} to {self.server} failed for {elapsed:.1f} s, "
                f"{self.failures} attempt{'s' if self.failures != 1 else ''} "
                f"(JobConfig.sink_outage_timeout={budget:g} s): {type(error).__name__}: "
                f"{str(error).strip() or '(no message)'}"
            ) from error
        ctx.warning = (
            f"{text} (retrying since {elapsed:.0f} s, {self.failures} attempt(s); the job "
            f"fails after sink_outage_timeout={budget:g} s)"
        )
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "%s; retrying for up to %g s (JobConfig.sink_outage_timeout), %d attempt(s) "
                "failed so far",
                text,
                budget,
                self.failures,
            )
        delay = min(self.max_delay_s, self.first_delay_s * 2.0 ** min(self.failures - 1, 30))
        # the last attempt comes when the budget is spent: its failure ends the job then
        self.next_try = min(now + delay, self.since + budget)

    def _recovered(self) -> None:
        ctx = self.context
        if self.since is not None:
            log.warning(
                "vertex %r, processor %d: %s to %s succeeded again after %.1f s (%d failed "
                "attempt(s))",
                ctx.vertex_name,
                ctx.global_processor_index,
                self.what,
                self.server,
                self.clock() - self.since,
                self.failures,
            )
        else:
            log.warning(
                "vertex %r, processor %d: %s to %s answered again",
                ctx.vertex_name,
                ctx.global_processor_index,
                self.what,
                self.server,
            )
        self._slow = False
        self.since = None
        self.failures = 0
        self.last_error = None
        self._warned_at = None
        ctx.warning = None
        ctx.unavailable_since = None


class _Deadlines:
    """One daemon thread that calls callbacks at their deadlines (unless cancelled): a
    timer per call without a thread per call (the SQL sink makes one call per inbox)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, delay_s: float, fn: Callable[[], None]) -> int:
        token = next(self._ids)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, token, fn))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="slipstream-call-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return token

    def cancel(self, token: int) -> None:
        with self._cond:
            if any(t == token for _d, t, _f in self._heap):
                self._cancelled.add(token)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][1] in self._cancelled:
                        self._cancelled.discard(heapq.heappop(self._heap)[1])
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        _due, _token, fn = heapq.heappop(self._heap)
                        break
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
            try:
                fn()
            except Exception:  # noqa: BLE001 - a watcher never dies
                log.debug("a call deadline callback raised", exc_info=True)


_DEADLINES = _Deadlines()
