"""A member process's end of its control pipe: the thread that reads the coordinator's
messages (``ss.local(processes=N)``, :mod:`slipstream.engine.member`).

It starts as soon as the member has its setup, before the job is unpickled and its
processors are built, and runs apart from the processors' worker threads, so:

- it answers the coordinator's heartbeat (``("ping",)``) with ``("pong", calls)`` at any
  time, however long a supplier takes to build or a processor's call takes: the member
  is alive as long as this thread gets to run. ``calls`` are the calls of the member's
  processors running longer than the engine's ``slow_call_ms`` at that moment (vertex,
  processor, callback, seconds), so a member that then stops answering (a call that holds
  the GIL without end, SIGSTOP) can be reported with what it was doing
  (:mod:`slipstream.engine.heartbeat`);
- ``("cancel",)``, or the coordinator's end of the pipe closing (it died), calls the
  member's cancel callback, at once if it is set already, else when it is set.

Everything a member sends to the coordinator goes through :meth:`MemberControl.send` /
:meth:`send_bytes`, under one lock: reports from the member's main thread and pongs from
this thread never interleave on the pipe. Other message kinds can be handled with
:meth:`handle` (they are read and dispatched by this thread, in order); one that arrives
before its handler is registered (the coordinator may start a snapshot while this member
still builds its processors) is kept and handed to the handler when it is registered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: the coordinator's heartbeat and the member's answer
PING = "ping"
PONG = "pong"

#: a member asks the coordinator for a named list or map, or a share of one:
#: ``(NAMED, request id, kind, name, index, count)``; the answer is ``(NAMED_REPLY,
#: request id, ok, content or the error's text)`` (engine/member.py, MemberServices)
NAMED = "named"
NAMED_REPLY = "named_reply"

#: (vertex, processor index or None for a channel, callback, seconds running)
Calls = list[tuple[str, int | None, str, float]]


class MemberControl:
    """The control pipe ``conn`` of one member process (module docstring)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self.cancelled = False
        self._on_cancel: Callable[[], None] | None = None
        self._handlers: dict[str, Callable[[tuple[Any, ...]], None]] = {}
        # messages that came before their handler, and the lock that keeps dispatching
        # in order while they are handed over
        self._early: list[tuple[Any, ...]] = []
        self._dispatch = threading.Lock()
        #: the calls running long right now, for a pong (set once the member runs)
        self.running_calls: Callable[[], Calls] = list

    def start(self) -> None:
        threading.Thread(target=self._run, name="slipstream-member-control", daemon=True).start()

    def handle(self, kind: str, fn: Callable[[tuple[Any, ...]], None]) -> None:
        """Call ``fn(message)`` on this thread for each message of ``kind`` (first, on
        the caller's thread, for those that came already)."""
        with self._dispatch:
            self._handlers[kind] = fn
            early = [m for m in self._early if m[0] == kind]
            self._early = [m for m in self._early if m[0] != kind]
            for msg in early:
                fn(msg)

    def on_cancel(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the coordinator cancels (now, if it did already)."""
        with self._lock:
            self._on_cancel = fn
            now = self.cancelled
        if now:
            fn()

    def send(self, message: tuple[Any, ...]) -> bool:
        """Send ``message`` to the coordinator; ``False`` if it is gone."""
        with self._send_lock:
            try:
                self.conn.send(message)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                return False
        return True

    def send_bytes(self, data: bytes) -> bool:
        """Send an already pickled message; ``False`` if the coordinator is gone."""
        with self._send_lock:
            try:
                self.conn.send_bytes(data)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                return False
        return True

    def _run(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                kind = msg[0]
                if kind == PING:
                    try:
                        calls = self.running_calls()
                    except Exception:  # noqa: BLE001 - the answer matters, not the detail
                        calls = []
                    if not self.send((PONG, calls)):
                        break
                elif kind == "cancel":
                    break
                else:
                    with self._dispatch:
                        handler = self._handlers.get(kind)
                        if handler is None:
                            self._early.append(msg)
                        else:
                            handler(msg)
        except (EOFError, OSError):
            pass
        with self._lock:
            self.cancelled = True
            fn = self._on_cancel
        if fn is not None:
            fn()
