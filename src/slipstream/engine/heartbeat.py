"""The coordinator's heartbeat of its member processes (``ss.local(processes=N)``).

A member that dies closes its control pipe, and the coordinator sees that at once. A
member that stops *answering* without dying does not: a process stopped with SIGSTOP (or
by a debugger), or one whose processor is in a call that holds the GIL without end (a C
extension, a regular expression that backtracks for ever), keeps its pipe open and
sends nothing. So the coordinator pings each member every
:func:`ping_interval_s` and takes any message from it as a sign of life; the member
answers on its control thread (:mod:`slipstream.engine.member_control`), apart from its
processors, so a processor that is merely slow or blocked in a call that lets other
threads run (I/O, ``time.sleep``, a pure-Python loop: the interpreter switches threads)
does not make it miss a beat. A member not heard from for the engine's
``heartbeat_timeout_ms`` is reported (:class:`HeartbeatMonitor` calls ``on_silent``): the
coordinator kills it and fails the job naming it and, when the member's last answer
named a call that was running long (longer than ``slow_call_ms``), that call's vertex
and processor.

If the coordinator itself did not run for half the timeout (the machine was suspended,
this process was stopped or starved), it cannot tell who was silent: every member's
clock starts again instead of failing members that were as stopped as it was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from slipstream.engine.member_control import PING, Calls

#: the default of ``ss.local(heartbeat_timeout_ms=...)``: 60 s, as Jet's failure
#: detector (``hazelcast.max.no.heartbeat.seconds``). Only a member that answers nothing
#: for this long is killed, so the default must outlast what a loaded machine does to a
#: live member: a process under ``nice 19`` weighs 15 against 1024 for each busy process
#: at nice 0 in the kernel's scheduler, so beside a dozen of them on two cores a call
#: that holds the GIL for a tenth of a second of CPU (a large chunk pickled, a full
#: collection) can keep the member's control thread from answering for many seconds.
#: A test or a job that wants a hung member found sooner sets it lower.
HEARTBEAT_TIMEOUT_MS = 60_000.0


def ping_interval_s(timeout_s: float) -> float:
    """How often the coordinator pings: a quarter of the timeout, at most once a second
    (a missed ping or two is no silence)."""
    return min(1.0, timeout_s / 4.0)


class HeartbeatMonitor:
    """Pings ``members`` members through ``send(member, message)`` and calls
    ``on_silent(member, calls)`` (once) for one not heard from (:meth:`heard`) within
    ``timeout_s``; ``calls`` are the long calls its last answer named."""

    def __init__(
        self,
        members: int,
        timeout_s: float,
        send: Callable[[int, tuple[Any, ...]], None],
        on_silent: Callable[[int, Calls], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self._send = send
        self._on_silent = on_silent
        self._clock = clock
        now = clock()
        self._last = dict.fromkeys(range(members), now)
        #: per member: the long calls its last answer named
        self.calls: dict[int, Calls] = {}
        self._live = set(range(members))
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self, name: str) -> None:
        threading.Thread(target=self._run, name=f"slipstream-{name}-heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def heard(self, member: int, calls: Calls | None = None) -> None:
        """A message from ``member`` (``calls``: those of a pong)."""
        self._last[member] = self._clock()
        if calls is not None:
            self.calls[member] = calls

    def ended(self, member: int) -> None:
        """``member``'s pipe closed: nothing more to watch."""
        with self._lock:
            self._live.discard(member)

    def _run(self) -> None:
        interval = ping_interval_s(self.timeout_s)
        before = self._clock()
        while not self._stopped.wait(interval):
            now = self._clock()
            if now - before > self.timeout_s / 2:  # we did not run either: judge no one
                for m in list(self._last):
                    self._last[m] = now
            before = now
            silent: list[int] = []
            with self._lock:
                live = sorted(self._live)
                for m in live:
                    if now - self._last[m] > self.timeout_s:
                        self._live.discard(m)
                        silent.append(m)
            for m in silent:
                self._on_silent(m, self.calls.get(m, []))
            for m in live:
                if m not in silent:
                    self._send(m, (PING,))


def silence_text(member: int, pid: int | None, timeout_ms: float, calls: Calls) -> str:
    """Why a silent member failed the job, naming it and what it was last seen doing."""
    text = (
        f"member {member} (pid {pid}) stopped answering: no heartbeat within "
        f"heartbeat_timeout_ms={timeout_ms:g}, so it was killed; "
    )
    named = [c for c in calls if c[1] is not None] or calls
    if not named:
        return text + (
            "none of its processors was in a long call when it last answered (a stopped "
            "process, e.g. SIGSTOP or a debugger, or a call that began since and holds the GIL)"
        )
    vertex, index, callback, seconds = max(named, key=lambda c: c[3])
    who = f"vertex {vertex!r}, processor {index}" if index is not None else repr(vertex)
    return text + (
        f"when it last answered, {who} had been in a call to {callback}() for {seconds:.1f} s "
        "(a call that holds the GIL stops the whole process)"
    )
