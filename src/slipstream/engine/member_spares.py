"""Member processes started before the job that uses them (``ss.local(processes=N)``).

A job's members used to be forked when the job started: the forkserver's fork, the
child's bootstrap and the wait for it were on every job's path (a 10-item job on a warm
engine took 10-17 ms, docs/performance.md). An engine now keeps, once a job of it has
ended, ``N`` **spare** member processes forked ahead: idle processes that wait on their
control pipe for a job (:func:`standby_main`). The next job (or the next execution of a
job that restarts) takes them and hands each its member index and its ends of the
cross-process channels (passed as file descriptors over the control pipe, so a spare
needs nothing of the job when it is forked); a spare missing, dead or whose pipe is
broken is replaced by a fresh fork then.

A spare runs **one** job and exits, as a member always did: nothing of a job (its
processors, the modules and classes its code imported or unpickled, their class and
module state, its lists, its errors) can be seen by the next, which gets fresh
processes. What a spare saves a job is the fork, not the job's own set-up (the job is
unpickled and its plan built in the member, as before).

Spares are forked after a job's execution ended and its members exited (not at the
engine's creation: an engine that never runs a job forks none beyond its first job's,
and the forks do not compete with a running job for the cores); an engine that runs no
job for :data:`SPARE_IDLE_S` closes them, as do ``engine.shutdown()``, the engine being
garbage collected and the interpreter's exit. A spare whose coordinator died sees its
pipe close and exits.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("slipstream.processes")

#: an engine whose spare members waited this long for a job closes them (the next job
#: forks its members then)
SPARE_IDLE_S = 30.0

#: file descriptors passed in one message (Linux takes at most 253 in one
#: ``SCM_RIGHTS``; a member of many processes and distributed edges holds more sockets)
FDS_PER_MESSAGE = 200

#: at exit, and at ``shutdown()``: how long a spare gets to exit by itself after its pipe
#: closed, before it is killed
CLOSE_WAIT_S = 2.0


def standby_main(conn: Any) -> None:
    """The target of every member process: wait for a job on the control pipe (its
    member index and the keys of its channel sockets, then the sockets themselves as file
    descriptors), then run it as :func:`slipstream.engine.member.member_main`. The pipe
    closing first (the engine closed its spares, or the coordinator died) ends the
    process."""
    from multiprocessing import reduction

    from slipstream.engine.member import member_main

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # member_main's reason
    try:
        member, keys = conn.recv()
        fds: list[int] = []
        if keys:
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                for i in range(0, len(keys), FDS_PER_MESSAGE):
                    fds += reduction.recvfds(s, len(keys[i : i + FDS_PER_MESSAGE]))
    except (EOFError, OSError):
        return
    sockets = {key: socket.socket(fileno=fd) for key, fd in zip(keys, fds, strict=True)}
    member_main(conn, member, sockets)


def hand_over(conn: Any, member: int, sockets: Mapping[Any, socket.socket]) -> None:
    """Give the member process on ``conn`` its member index and channel sockets
    (:func:`standby_main` reads them); ``OSError`` if its pipe is broken."""
    from multiprocessing import reduction

    keys = list(sockets)
    conn.send((member, keys))
    if keys:
        fds = [sockets[k].fileno() for k in keys]
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
            for i in range(0, len(fds), FDS_PER_MESSAGE):
                reduction.sendfds(s, fds[i : i + FDS_PER_MESSAGE])


class MemberSpares:
    """One engine's spare member processes (module docstring). ``start_one`` forks a
    member process waiting in :func:`standby_main` and returns ``(process, the
    coordinator's end of its control pipe)``."""

    def __init__(self, count: int, start_one: Callable[[], tuple[Any, Any]]) -> None:
        self.count = count
        self._start_one = start_one
        self._lock = threading.Lock()
        self._spares: list[tuple[Any, Any]] = []
        self._closed = False
        self._refilling = False
        #: clear while a refill forks a spare: a job that starts meanwhile waits for it
        #: (nearer done than a fork of its own), not for the old members' exit
        self._not_forking = threading.Event()
        self._not_forking.set()
        self._used = time.monotonic()
        self._timer: threading.Timer | None = None
        _track(self)

    def take(self, n: int) -> list[tuple[Any, Any]]:
        """``n`` member processes for a job: the spares that are alive, then fresh
        forks for the rest (in the calling thread)."""
        self._not_forking.wait(5.0)
        with self._lock:
            self._used = time.monotonic()
            taken, self._spares = self._spares[:n], self._spares[n:]
        from slipstream.engine.processes import reap

        alive = []
        for p, conn in taken:
            code = reap(p, 0)
            if code is None:
                alive.append((p, conn))
            else:  # it died while it waited
                log.warning(
                    "a spare member process (pid %s) had died (exit status %s); a fresh "
                    "one replaces it",
                    p.pid,
                    code,
                )
                _close(p, conn)
        try:
            while len(alive) < n:
                alive.append(self._start_one())
        except BaseException:
            for spare in alive:
                _close(*spare)
            raise
        return alive

    def replace(self, p: Any, conn: Any) -> tuple[Any, Any]:
        """A taken spare whose pipe turned out broken: ended, and a fresh fork instead."""
        log.warning(
            "a spare member process (pid %s) could not take its job; a fresh one replaces it",
            p.pid,
        )
        _close(p, conn)
        return self._start_one()

    def refill_after(self, procs: list[Any]) -> None:
        """Once ``procs`` (an execution's members) exited, fork spares up to
        :attr:`count`, on a thread of its own."""
        with self._lock:
            if self._closed or self._refilling or len(self._spares) >= self.count:
                return
            self._refilling = True
        try:
            threading.Thread(
                target=self._refill, args=(procs,), name="slipstream-member-spares", daemon=True
            ).start()
        except RuntimeError:  # no new thread at interpreter exit
            with self._lock:
                self._refilling = False

    def _refill(self, procs: list[Any]) -> None:
        from slipstream.engine.processes import reap

        try:
            for p in procs:
                reap(p, 5.0)
            while True:
                with self._lock:
                    if self._closed or len(self._spares) >= self.count or sys.is_finalizing():
                        break
                    self._not_forking.clear()
                try:
                    spare = self._start_one()
                except Exception:  # noqa: BLE001 - the next job forks its members itself
                    log.debug("forking a spare member process failed", exc_info=True)
                    break
                finally:
                    self._not_forking.set()
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._spares.append(spare)
                if closed:
                    _close(*spare)
                    break
            self._schedule_idle_close()
        finally:
            with self._lock:
                self._refilling = False

    def _schedule_idle_close(self, wait: float = SPARE_IDLE_S) -> None:
        with self._lock:
            if self._closed or self._timer is not None or not self._spares:
                return
            timer = self._timer = threading.Timer(wait, self._idle_close)
        timer.daemon = True
        timer.start()

    def _idle_close(self) -> None:
        """The idle timer: spares that waited :data:`SPARE_IDLE_S` since the last job
        took any are closed (a job since: the timer waits on)."""
        with self._lock:
            self._timer = None
            left = SPARE_IDLE_S - (time.monotonic() - self._used)
            spares: list[tuple[Any, Any]] = []
            if left <= 0:
                spares, self._spares = self._spares, []
        if left > 0:
            self._schedule_idle_close(left)
        for spare in spares:
            _close(*spare)

    def close(self) -> None:
        """Close every spare (``engine.shutdown()``, the engine collected, exit): no more
        are forked."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        # a fork under way ends first (its child would otherwise read a half-sent start
        # at the interpreter's exit); the refill then closes it
        self._not_forking.wait(CLOSE_WAIT_S)
        for _, conn in spares:
            try:
                conn.close()  # standby_main sees the pipe close and returns
            except OSError:
                pass
        deadline = time.monotonic() + CLOSE_WAIT_S
        for p, _ in spares:
            _stop(p, max(0.0, deadline - time.monotonic()))

    def __len__(self) -> int:
        return len(self._spares)


_every: weakref.WeakSet[MemberSpares] = weakref.WeakSet()
_every_lock = threading.Lock()
_at_exit_registered = False


def _track(spares: MemberSpares) -> None:
    global _at_exit_registered
    with _every_lock:
        _every.add(spares)
        if not _at_exit_registered:
            # before multiprocessing's own exit hook (registered earlier, run later),
            # which would terminate a spare in the middle of its start
            atexit.register(_close_at_exit)
            _at_exit_registered = True


def _close_at_exit() -> None:
    for spares in list(_every):
        spares.close()


def close_soon(spares: MemberSpares) -> None:
    """Close ``spares`` on a thread of its own: what an engine that is garbage collected
    calls (a collection may run in any thread, even one that holds a spares lock)."""
    try:
        threading.Thread(target=spares.close, name="slipstream-member-spares-close", daemon=True).start()
    except RuntimeError:  # at exit: the exit hook closes them
        pass


def _close(p: Any, conn: Any) -> None:
    try:
        conn.close()
    except OSError:
        pass
    _stop(p, CLOSE_WAIT_S)


def _stop(p: Any, wait: float) -> None:
    from slipstream.engine.processes import reap

    if p.pid is None:
        return
    if reap(p, wait) is None:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass
        reap(p, wait)
